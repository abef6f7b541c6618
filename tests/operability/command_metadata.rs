//! `COMMAND DOCS`, `COMMAND INFO` and `COMMAND GETKEYS` for every command of the module.

use super::*;

/// A bulk or simple string reply as text.
#[track_caller]
pub(super) fn text(v: &Value) -> String {
    match v {
        Value::BulkString(b) => String::from_utf8(b.clone()).expect("non-UTF-8 string"),
        Value::SimpleString(s) => s.clone(),
        other => panic!("expected a string, got {other:?}"),
    }
}

/// A RESP2 flat `name value name value ...` array (or a RESP3 map) as ordered pairs.
#[track_caller]
pub(super) fn pairs(v: &Value) -> Vec<(String, Value)> {
    match v {
        Value::Array(items) => {
            assert!(items.len() % 2 == 0, "odd field/value array {items:?}");
            items
                .chunks(2)
                .map(|kv| (text(&kv[0]), kv[1].clone()))
                .collect()
        }
        Value::Map(kvs) => kvs.iter().map(|(k, v)| (text(k), v.clone())).collect(),
        other => panic!("expected field/value pairs, got {other:?}"),
    }
}

/// The value of `name` among `pairs`.
#[track_caller]
pub(super) fn field<'a>(pairs: &'a [(String, Value)], name: &str) -> &'a Value {
    &pairs
        .iter()
        .find(|(k, _)| k == name)
        .unwrap_or_else(|| panic!("no field {name:?} in {pairs:?}"))
        .1
}

/// A reply array of strings (e.g. command flags) as text.
#[track_caller]
fn strings(v: &Value) -> Vec<String> {
    match v {
        Value::Array(items) | Value::Set(items) => items.iter().map(text).collect(),
        other => panic!("expected an array of strings, got {other:?}"),
    }
}

#[test]
fn command_docs_describe_every_command() {
    let (_server, mut c) = start();
    let reply: Value = redis::cmd("COMMAND")
        .arg("DOCS")
        .arg("lock.acquire")
        .arg("lock.release")
        .arg("lock.extend")
        .arg("lock.fence")
        .arg("lock.info")
        .arg("lock.session")
        .query(&mut c)
        .unwrap();
    let mut docs: BTreeMap<String, Vec<(String, Value)>> = pairs(&reply)
        .into_iter()
        .map(|(name, doc)| (name, pairs(&doc)))
        .collect();
    // LOCK.SESSION is a container: its subcommands carry the arguments.
    let session = docs
        .remove("lock.session")
        .expect("COMMAND DOCS lock.session");
    assert!(!text(field(&session, "summary")).trim().is_empty());
    let subcommands: BTreeMap<String, Vec<(String, Value)>> = pairs(field(&session, "subcommands"))
        .into_iter()
        .map(|(name, doc)| (name, pairs(&doc)))
        .collect();
    assert_eq!(
        subcommands.keys().map(String::as_str).collect::<Vec<_>>(),
        [
            "lock.session|attach",
            "lock.session|close",
            "lock.session|ended",
            "lock.session|help",
            "lock.session|info",
            "lock.session|keepalive",
            "lock.session|kill",
            "lock.session|list",
            "lock.session|open",
            "lock.session|renew",
            "lock.session|restore"
        ]
    );
    for sub in [
        "open",
        "keepalive",
        "close",
        "attach",
        "info",
        "list",
        "kill",
    ] {
        let name = format!("lock.session|{sub}");
        docs.insert(name.clone(), subcommands[&name].clone());
    }

    // name, then per argument: (name, token, optional).
    type ArgSpec = (&'static str, Option<&'static str>, bool);
    let expected: [(&str, &[ArgSpec]); 12] = [
        (
            "lock.session|open",
            &[
                ("ttl-ms", None, false),
                ("bound", Some("BOUND"), true),
                ("grace-ms", Some("GRACE"), true),
                ("lockdelay-ms", Some("LOCKDELAY"), true),
            ],
        ),
        (
            "lock.session|keepalive",
            &[("id", None, false), ("ttl-ms", None, true)],
        ),
        ("lock.session|close", &[("id", None, false)]),
        ("lock.session|attach", &[("id", None, false)]),
        ("lock.session|info", &[("id", None, false)]),
        (
            "lock.session|list",
            &[("cursor", None, true), ("count", Some("COUNT"), true)],
        ),
        ("lock.session|kill", &[("serial", None, false)]),
        (
            "lock.acquire",
            &[
                ("key", None, false),
                ("owner", None, false),
                ("ttl-ms", None, false),
                ("shared", Some("SHARED"), true),
                ("limit", Some("LIMIT"), true),
                ("timeout-ms", Some("BLOCK"), true),
                ("session-id", Some("SESSION"), true),
                ("lockdelay-ms", Some("LOCKDELAY"), true),
            ],
        ),
        (
            "lock.release",
            &[("key", None, false), ("owner", None, false)],
        ),
        (
            "lock.extend",
            &[
                ("key", None, false),
                ("owner", None, false),
                ("ttl-ms", None, false),
            ],
        ),
        ("lock.fence", &[("key", None, false), ("token", None, true)]),
        ("lock.info", &[("key", None, false)]),
    ];
    let mut names: Vec<&str> = expected.iter().map(|(n, _)| *n).collect();
    names.sort_unstable();
    assert_eq!(
        docs.keys().map(String::as_str).collect::<Vec<_>>(),
        names,
        "COMMAND DOCS names: {reply:?}"
    );

    for (name, args) in expected {
        let doc = &docs[name];
        let summary = text(field(doc, "summary"));
        assert!(!summary.trim().is_empty(), "{name}: empty summary");
        assert!(!text(field(doc, "since")).is_empty(), "{name}: empty since");
        let complexity = text(field(doc, "complexity"));
        assert!(
            complexity.starts_with("O("),
            "{name} complexity: {complexity}"
        );
        assert_eq!(text(field(doc, "module")), "lock", "{name} module");

        let Value::Array(got) = field(doc, "arguments") else {
            panic!("{name}: arguments is not an array: {doc:?}");
        };
        let got: Vec<Vec<(String, Value)>> = got.iter().map(pairs).collect();
        let names: Vec<String> = got.iter().map(|a| text(field(a, "name"))).collect();
        let want: Vec<&str> = args.iter().map(|(n, _, _)| *n).collect();
        assert_eq!(names, want, "{name} argument names");
        for (arg, (arg_name, token, optional)) in got.iter().zip(args) {
            let has = |f: &str| arg.iter().any(|(k, _)| k == f);
            let got_token = has("token").then(|| text(field(arg, "token")));
            assert_eq!(
                got_token.as_deref(),
                *token,
                "{name} {arg_name} token: {arg:?}"
            );
            let flags = if has("flags") {
                strings(field(arg, "flags"))
            } else {
                Vec::new()
            };
            assert_eq!(
                flags.iter().any(|f| f == "optional"),
                *optional,
                "{name} {arg_name} optional: {arg:?}"
            );
            if *arg_name == "key" || *arg_name == "id" {
                assert_eq!(text(field(arg, "type")), "key", "{name} key type: {arg:?}");
            }
        }
    }
}

#[test]
fn command_info_flags_and_getkeys() {
    let (_server, mut c) = start();
    let flags = |c: &mut Connection, name: &str| -> Vec<String> {
        let reply: Value = redis::cmd("COMMAND")
            .arg("INFO")
            .arg(name)
            .query(c)
            .unwrap();
        let Value::Array(entries) = reply else {
            panic!("COMMAND INFO {name}: {reply:?}");
        };
        assert_eq!(entries.len(), 1, "COMMAND INFO {name}: {entries:?}");
        let Value::Array(ref info) = entries[0] else {
            panic!("COMMAND INFO {name}: not found: {entries:?}");
        };
        assert_eq!(text(&info[0]), name, "COMMAND INFO {name}");
        strings(&info[2])
    };

    let fence_flags = flags(&mut c, "lock.fence");
    for f in ["readonly", "fast"] {
        assert!(
            fence_flags.iter().any(|g| g == f),
            "lock.fence flags {fence_flags:?} lack {f}"
        );
    }
    let acquire_flags = flags(&mut c, "lock.acquire");
    for f in ["write", "denyoom"] {
        assert!(
            acquire_flags.iter().any(|g| g == f),
            "lock.acquire flags {acquire_flags:?} lack {f}"
        );
    }

    let keys: Vec<String> = redis::cmd("COMMAND")
        .arg("GETKEYS")
        .arg("LOCK.ACQUIRE")
        .arg("mykey")
        .arg("o")
        .arg(10)
        .query(&mut c)
        .unwrap();
    assert_eq!(keys, ["mykey"]);
}
