//! The docs say what the server says: the `INFO lock` fields, the `lock.*` settings and each
//! command's options, as a running server reports them (`INFO lock`, `CONFIG GET lock.*`,
//! `COMMAND DOCS`), are all in README.md and docs/commands.md, in the server's order where a
//! doc shows a sample of the output.
//!
//! Why a test: the README's samples fell behind the code twice (issue 29: the `INFO lock`
//! sample lacked 8 fields, `CONFIG GET lock.*` showed 3 of 8 settings, the `LOCK.ACQUIRE`
//! synopsis lacked `SESSION` and `LOCKDELAY`). A field, setting or option added without its
//! docs now fails here, naming what is missing and where.

mod common;

use std::path::Path;

use common::*;
use redis::Value;

fn doc(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The field names of `INFO lock`, in the server's order.
fn info_fields(c: &mut redis::Connection) -> Vec<String> {
    let text: String = redis::cmd("INFO").arg("lock").query(c).unwrap();
    text.lines()
        .filter_map(|l| l.split_once(':').map(|(name, _)| name.to_string()))
        .collect()
}

/// The `lock.*` setting names, sorted.
fn settings(c: &mut redis::Connection) -> Vec<String> {
    let pairs: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("lock.*")
        .query(c)
        .unwrap();
    let mut names: Vec<String> = pairs.chunks(2).map(|p| p[0].clone()).collect();
    names.sort();
    names
}

/// The module's command names (`COMMAND LIST FILTERBY MODULE lock`), sorted.
fn commands(c: &mut redis::Connection) -> Vec<String> {
    let mut names: Vec<String> = redis::cmd("COMMAND")
        .arg("LIST")
        .arg("FILTERBY")
        .arg("MODULE")
        .arg("lock")
        .query(c)
        .unwrap();
    names.sort();
    names
}

/// The option keywords (`token`s) of a command's arguments in `COMMAND DOCS`.
fn option_tokens(c: &mut redis::Connection, command: &str) -> Vec<String> {
    let reply: Value = redis::cmd("COMMAND")
        .arg("DOCS")
        .arg(command)
        .query(c)
        .unwrap();
    let mut tokens = Vec::new();
    collect_tokens(&reply, &mut tokens);
    tokens
}

fn collect_tokens(v: &Value, out: &mut Vec<String>) {
    let items: Vec<&Value> = match v {
        Value::Array(items) | Value::Set(items) => items.iter().collect(),
        Value::Map(pairs) => pairs.iter().flat_map(|(k, v)| [k, v]).collect(),
        _ => return,
    };
    // Key-value lists are flat arrays in RESP2: keys at even places (`windows` would also
    // read an argument named "token" followed by the key "type" as a token).
    for pair in items.chunks_exact(2) {
        if let (Value::BulkString(k), Value::BulkString(token)) = (pair[0], pair[1]) {
            if k == b"token" {
                out.push(String::from_utf8_lossy(token).into_owned());
            }
        }
    }
    items.iter().for_each(|item| collect_tokens(item, out));
}

/// The lines of the first fenced block in `text` that follows a line containing `marker`.
fn block_after<'a>(text: &'a str, marker: &str) -> Vec<&'a str> {
    let start = text
        .find(marker)
        .unwrap_or_else(|| panic!("no {marker:?} in the doc"));
    text[start..]
        .lines()
        .skip(1)
        .take_while(|l| !l.starts_with("```"))
        .collect()
}

#[test]
fn readme_info_sample_shows_every_field_in_the_servers_order() {
    let server = Server::start();
    let mut c = server.conn();
    let fields = info_fields(&mut c);
    assert!(fields.len() > 10, "INFO lock: {fields:?}");
    let readme = doc("README.md");
    let sample: Vec<String> = block_after(&readme, "> INFO lock")
        .iter()
        .filter_map(|l| l.split_once(':').map(|(name, _)| name.to_string()))
        .collect();
    assert_eq!(
        sample, fields,
        "README.md's INFO lock sample against the server's"
    );
}

#[test]
fn commands_md_explains_every_info_field() {
    let server = Server::start();
    let mut c = server.conn();
    let reference = doc("docs/commands.md");
    let missing: Vec<String> = info_fields(&mut c)
        .into_iter()
        .filter(|f| !reference.contains(&format!("`{f}`")))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/commands.md does not explain {missing:?}"
    );
}

#[test]
fn every_setting_is_in_both_docs_and_in_the_readme_sample() {
    let server = Server::start();
    let mut c = server.conn();
    let names = settings(&mut c);
    assert!(names.len() >= 8, "CONFIG GET lock.*: {names:?}");
    for file in ["README.md", "docs/commands.md"] {
        let text = doc(file);
        let missing: Vec<&String> = names
            .iter()
            .filter(|n| !text.contains(&format!("| `{n}` |")))
            .collect();
        assert!(
            missing.is_empty(),
            "{file}'s settings table lacks {missing:?}"
        );
    }
    let readme = doc("README.md");
    let mut sample: Vec<String> = block_after(&readme, "> CONFIG GET lock.*")
        .iter()
        .map(|l| l.trim_start())
        .take_while(|l| l.starts_with(|ch: char| ch.is_ascii_digit()))
        .filter_map(|l| l.split_once(") \"").map(|(_, v)| v.trim_end_matches('"')))
        .filter(|v| v.starts_with("lock."))
        .map(str::to_string)
        .collect();
    sample.sort();
    assert_eq!(sample, names, "README.md's CONFIG GET lock.* sample");
}

#[test]
fn every_command_has_a_heading_or_synopsis_in_the_reference() {
    let server = Server::start();
    let mut c = server.conn();
    let reference = doc("docs/commands.md");
    let missing: Vec<String> = commands(&mut c)
        .into_iter()
        .map(|n| n.to_uppercase())
        // `LOCK.SESSION|OPEN` and its siblings are documented under `LOCK.SESSION`.
        .filter(|n| !n.contains('|'))
        .filter(|n| {
            !reference.lines().any(|l| {
                (l.starts_with("## ") && l.ends_with(n.as_str())) || l.starts_with(&format!("{n} "))
            })
        })
        .collect();
    assert!(
        missing.is_empty(),
        "docs/commands.md has neither a heading nor a synopsis line for {missing:?}"
    );
}

#[test]
fn each_synopsis_names_every_option_of_its_command() {
    let server = Server::start();
    let mut c = server.conn();
    let readme = doc("README.md");
    let reference = doc("docs/commands.md");
    for command in ["lock.acquire", "lock.macquire"] {
        let upper = command.to_uppercase();
        let tokens = option_tokens(&mut c, command);
        assert!(
            tokens.contains(&"BLOCK".to_string()),
            "{command}: {tokens:?}"
        );
        for (file, text) in [("README.md", &readme), ("docs/commands.md", &reference)] {
            let synopsis = text
                .lines()
                .find(|l| l.starts_with(&format!("{upper} ")) && l.contains('['))
                .unwrap_or_else(|| panic!("{file}: no synopsis line for {upper}"));
            let missing: Vec<&String> = tokens
                .iter()
                .filter(|t| {
                    !synopsis.contains(&format!("[{t} ")) && !synopsis.contains(&format!("[{t}]"))
                })
                .collect();
            assert!(
                missing.is_empty(),
                "{file}'s synopsis {synopsis:?} lacks {missing:?}"
            );
        }
    }
}

/// The summary `COMMAND DOCS` gives a command (internal forms say "Internal: ...").
fn summary(c: &mut redis::Connection, command: &str) -> String {
    let reply: Value = redis::cmd("COMMAND")
        .arg("DOCS")
        .arg(command)
        .query(c)
        .unwrap();
    let mut found = Vec::new();
    collect_field(&reply, b"summary", &mut found);
    found.into_iter().next().unwrap_or_default()
}

fn collect_field(v: &Value, field: &[u8], out: &mut Vec<String>) {
    let items: Vec<&Value> = match v {
        Value::Array(items) | Value::Set(items) => items.iter().collect(),
        Value::Map(pairs) => pairs.iter().flat_map(|(k, v)| [k, v]).collect(),
        _ => return,
    };
    // Key-value lists are flat arrays in RESP2: keys at even places (`windows` would also
    // read an argument named "token" followed by the key "type" as a token).
    for pair in items.chunks_exact(2) {
        if let (Value::BulkString(k), Value::BulkString(value)) = (pair[0], pair[1]) {
            if k == field {
                out.push(String::from_utf8_lossy(value).into_owned());
            }
        }
    }
    items
        .iter()
        .for_each(|item| collect_field(item, field, out));
}

/// Every public command and subcommand (`LOCK.SESSION OPEN` for `lock.session|open`) has a
/// synopsis line in docs/commands.md, and it names every option keyword `COMMAND DOCS` gives
/// it: an option added to a command without its synopsis fails here, naming both.
#[test]
fn every_commands_synopsis_in_the_reference_names_its_options() {
    let server = Server::start();
    let mut c = server.conn();
    let reference = doc("docs/commands.md");
    let mut checked = 0;
    for command in commands(&mut c) {
        if command == "lock.session" || summary(&mut c, &command).starts_with("Internal") {
            continue; // the container (its subcommands are checked) and the replication forms
        }
        let spelled = command.to_uppercase().replace('|', " ");
        let synopsis = reference
            .lines()
            .find(|l| l.starts_with(&format!("{spelled} ")))
            .unwrap_or_else(|| panic!("docs/commands.md: no synopsis line for {spelled}"));
        let missing: Vec<String> = option_tokens(&mut c, &command)
            .into_iter()
            .filter(|t| {
                !synopsis.contains(&format!("[{t} ")) && !synopsis.contains(&format!("[{t}]"))
            })
            .collect();
        assert!(
            missing.is_empty(),
            "docs/commands.md's synopsis {synopsis:?} lacks {missing:?}"
        );
        checked += 1;
    }
    assert!(checked >= 13, "{checked} commands checked");
}
