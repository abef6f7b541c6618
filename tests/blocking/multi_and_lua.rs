//! Contexts that must not block: `BLOCK` inside `MULTI` or a Lua script behaves as without it.

use super::*;

#[test]
fn block_inside_multi_behaves_as_without_block() {
    let (_server, mut c) = start();
    let (held, free) = (new_key(), new_key());
    let holder_token = must_acquire(&mut c, &held, "holder", LONG_TTL);

    let replies: Vec<Value> = redis::pipe()
        .atomic()
        .cmd("LOCK.ACQUIRE")
        .arg(&held)
        .arg("other")
        .arg(1_000)
        .arg("BLOCK")
        .arg(0)
        .cmd("LOCK.ACQUIRE")
        .arg(&free)
        .arg("other")
        .arg(1_000)
        .arg("BLOCK")
        .arg(0)
        .query(&mut c)
        .expect("MULTI/EXEC");
    assert_eq!(replies.len(), 2, "EXEC replies {replies:?}");
    assert_eq!(replies[0], Value::Nil, "held key inside MULTI");
    let token = match replies[1] {
        Value::Int(t) => t,
        ref other => panic!("free key inside MULTI: expected a token, got {other:?}"),
    };
    assert_held(&mut c, &free, token, 1_000);
    assert_eq!(blocked_clients(&mut c), 0);

    // Nothing was queued: the release frees the key entirely.
    assert_held(&mut c, &held, holder_token, LONG_TTL);
    release_last(&mut c, &held, "holder");
}

#[test]
fn block_inside_lua_behaves_as_without_block() {
    let (_server, mut c, key, holder_token) = held_key();
    let script = "return redis.call('LOCK.ACQUIRE', KEYS[1], ARGV[1], ARGV[2], 'BLOCK', '0')";

    assert_eq!(
        call(&mut c, "EVAL", &[script, "1", &key, "other", "1000"]),
        Ok(Value::Nil)
    );
    assert_eq!(blocked_clients(&mut c), 0);
    // The holder itself gets its token back from Lua too.
    assert_eq!(
        call(&mut c, "EVAL", &[script, "1", &key, "holder", "1000"]),
        Ok(Value::Int(holder_token))
    );

    // Nothing was queued: the release frees the key entirely.
    release_last(&mut c, &key, "holder");
}
