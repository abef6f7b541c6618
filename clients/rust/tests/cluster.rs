//! The client in a Redis Cluster (sync): `Client::for_key` gives a client of the key's node, so
//! every command about the key goes straight there (no redirect is followed by a command, so
//! none can arrive after the caller's own release). Refused acquires hammered from threads
//! through such clients leave no grant behind (issue 28).

mod support;

use std::thread;

use redis_lock_client::Client;
use support::{cluster, ms, test_dir};

/// Six keys over three masters, eight threads, 150 tries each (one try, or a 3 ms wait in the
/// queue), each grant released at once; then `LOCK.INFO` of every key on every node: nothing.
#[test]
fn refused_acquires_hammered_through_for_key_clients_leave_no_grant_behind() {
    let dir = test_dir("client-cluster-hammer");
    let nodes = cluster::start(3, 0, &dir);
    let seed = Client::open(&nodes[0].url()).unwrap();
    let keys: Vec<String> = (0..6).map(|i| format!("hammer:{i}")).collect();
    let node_clients: Vec<Client> = keys.iter().map(|k| seed.for_key(k).unwrap()).collect();
    let served_by = |key: &str| {
        nodes
            .iter()
            .position(|n| {
                let r: redis::RedisResult<redis::Value> =
                    redis::cmd("LOCK.INFO").arg(key).query(&mut n.conn());
                r.is_ok()
            })
            .unwrap()
    };
    let spread: std::collections::HashSet<usize> = keys.iter().map(|k| served_by(k)).collect();
    assert!(spread.len() > 1, "the keys are spread over masters");

    let (mut granted, mut refused) = (0, 0);
    thread::scope(|s| {
        let workers: Vec<_> = (0..8)
            .map(|w| {
                let (keys, node_clients) = (&keys, &node_clients);
                s.spawn(move || {
                    let (mut granted, mut refused) = (0, 0);
                    for i in 0..150 {
                        let k = (w * 7 + i * 5) % keys.len();
                        let client = &node_clients[k];
                        let got = if i % 2 == 0 {
                            client.acquire(&keys[k], ms(60_000))
                        } else {
                            client.acquire_blocking(&keys[k], ms(60_000), ms(3))
                        };
                        match got.unwrap() {
                            Some(guard) => {
                                granted += 1;
                                assert!(guard.release().unwrap());
                            }
                            None => refused += 1,
                        }
                    }
                    (granted, refused)
                })
            })
            .collect();
        for w in workers {
            let (g, r) = w.join().unwrap();
            granted += g;
            refused += r;
        }
    });
    assert_eq!(granted + refused, 8 * 150);
    assert!(refused > 0, "{granted} granted, {refused} refused");
    for key in &keys {
        // MOVED from the nodes that do not serve it; nil (free) from the one that does.
        let answers: Vec<redis::RedisResult<Option<redis::Value>>> = nodes
            .iter()
            .map(|n| redis::cmd("LOCK.INFO").arg(key).query(&mut n.conn()))
            .collect();
        let served: Vec<_> = answers.iter().filter(|a| a.is_ok()).collect();
        assert_eq!(served.len(), 1, "{key}: {answers:?}");
        assert!(
            matches!(served[0], Ok(None)),
            "{key} still held: {answers:?}"
        );
        assert!(answers.iter().all(|a| match a {
            Err(e) => e.kind() == redis::ErrorKind::Moved,
            Ok(_) => true,
        }));
    }
}
