//! The change feed in a cluster: a key's channel lives on the key's shard, for keys with a hash
//! tag, without one, and with braces that are not a tag; a subscriber on the key's master (and
//! on its replica: sharded pub/sub forwards to the shard's replicas) hears every change.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;

use super::*;

/// A raw RESP2 subscriber on one node.
struct Listener {
    reader: BufReader<TcpStream>,
}

impl Listener {
    fn on(port: u16, channel: &[u8]) -> Listener {
        let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let mut frame = format!("*2\r\n$10\r\nSSUBSCRIBE\r\n${}\r\n", channel.len()).into_bytes();
        frame.extend_from_slice(channel);
        frame.extend_from_slice(b"\r\n");
        stream.write_all(&frame).unwrap();
        let mut l = Listener {
            reader: BufReader::new(stream),
        };
        let reply = l.frame();
        assert!(
            reply.starts_with("ssubscribe"),
            "SSUBSCRIBE on {port}: {reply}"
        );
        l
    }

    /// One frame flattened to its strings joined by '|'.
    fn frame(&mut self) -> String {
        let mut line = String::new();
        self.reader.read_line(&mut line).unwrap();
        let body = line[1..].trim_end().to_string();
        match line.as_bytes()[0] {
            b'*' => {
                let n: usize = body.parse().unwrap();
                (0..n).map(|_| self.frame()).collect::<Vec<_>>().join("|")
            }
            b'$' => {
                let n: usize = body.parse().unwrap();
                let mut buf = vec![0u8; n + 2];
                self.reader.read_exact(&mut buf).unwrap();
                String::from_utf8_lossy(&buf[..n]).into_owned()
            }
            _ => body,
        }
    }

    /// The next message's body (after `smessage|channel|`), past any `probe`.
    fn message(&mut self) -> String {
        loop {
            let f = self.frame();
            let mut parts = f.splitn(3, '|');
            assert_eq!(parts.next(), Some("smessage"), "{f}");
            let body = parts.nth(1).unwrap().to_string();
            if body != "probe" {
                return body;
            }
        }
    }

    /// True once a `probe` arrives within `wait`.
    fn probe_arrives(&mut self, wait: Duration) -> bool {
        self.reader.get_ref().set_read_timeout(Some(wait)).unwrap();
        let mut line = String::new();
        let got = self.reader.read_line(&mut line).is_ok();
        self.reader
            .get_ref()
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        if !got {
            return false;
        }
        // The rest of the frame (it is whole once its first line came).
        let n: usize = line[1..].trim_end().parse().unwrap();
        let parts: Vec<String> = (0..n).map(|_| self.frame()).collect();
        parts.last().is_some_and(|p| p == "probe")
    }
}

#[test]
fn a_keys_feed_lives_on_its_shard_and_reaches_its_replica() {
    let _turn = one_at_a_time();
    let cluster = Cluster::start();
    let mut any = cluster.nodes[0].conn();
    let keys = [
        "plain:feed".to_string(),
        "{orders}:feed".to_string(),
        "braces{}not{a}tag".to_string(),
    ];
    for key in &keys {
        let slot = keyslot(&mut any, key);
        let s = cluster.shard_of(slot);
        let mut master = cluster.master(s);
        let channel = match run(&mut master, &["LOCK.WATCH", key]) {
            Ok(Value::Array(v)) => match &v[0] {
                Value::BulkString(ch) => ch.clone(),
                other => panic!("{other:?}"),
            },
            other => panic!("LOCK.WATCH {key}: {}", reply_text(other)),
        };
        let channel_text = String::from_utf8(channel.clone()).unwrap();
        // The server's own routing: the channel hashes to the key's slot.
        assert_eq!(keyslot(&mut any, &channel_text), slot, "{channel_text}");
        assert!(
            channel_text.ends_with(&format!(":0:{key}")),
            "{channel_text}"
        );
        let master_port = cluster.master_node(s).port();
        let mut on_master = Listener::on(master_port, &channel);
        let replica_port = cluster.nodes[cluster.shards[s].replica].port();
        let mut on_replica = Listener::on(replica_port, &channel);
        // The master forwards shard messages to its replica over the cluster bus, which may not
        // be up yet right after the cluster formed (seen on Valkey 8.1: the replica heard
        // nothing): probe until the replica hears a message, then test.
        common::wait_until("the replica hears the shard channel", PATIENCE, || {
            let _: i64 = redis::cmd("SPUBLISH")
                .arg(&channel)
                .arg("probe")
                .query(&mut master)
                .unwrap();
            on_replica.probe_arrives(Duration::from_millis(200))
        });
        let token = must_acquire(&mut master, key, "alice", LONG_TTL);
        assert_eq!(release(&mut master, key, "alice"), 1);
        for l in [&mut on_master, &mut on_replica] {
            let acquired = l.message();
            let ttl: i64 = acquired
                .strip_prefix(&format!("1 acquired {token} "))
                .and_then(|rest| rest.strip_suffix(" alice"))
                .unwrap_or_else(|| panic!("{acquired}"))
                .parse()
                .unwrap();
            assert!((LONG_TTL - 1_000..=LONG_TTL).contains(&ttl), "{acquired}");
            assert_eq!(l.message(), format!("2 released {token} 0 alice"));
        }
        // Another master refuses the channel's shard, as for the key.
        let other = (s + 1) % MASTERS;
        let mut wrong =
            TcpStream::connect(("127.0.0.1", cluster.master_node(other).port())).unwrap();
        let mut frame = format!("*2\r\n$10\r\nSSUBSCRIBE\r\n${}\r\n", channel.len()).into_bytes();
        frame.extend_from_slice(&channel);
        frame.extend_from_slice(b"\r\n");
        wrong.write_all(&frame).unwrap();
        let mut reader = BufReader::new(wrong);
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        assert!(line.starts_with(&format!("-MOVED {slot} ")), "{line}");
    }
}
