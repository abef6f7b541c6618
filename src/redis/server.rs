//! Which server this is, from `INFO server`: a few behaviours differ by release, and Valkey
//! reports `redis_version:7.2.4` for compatibility, so its own `valkey_version` decides there.

use std::sync::OnceLock;

use redis_module::{Context, RedisValue};

/// A `major.minor` release.
pub type Release = (u32, u32);

/// The server's family and release.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Server {
    Redis(Release),
    Valkey(Release),
}

impl Server {
    /// This server (`None` if `INFO server` cannot be read or parsed): read once, at load, and
    /// remembered, as the process's release never changes.
    pub fn read(ctx: &Context) -> Option<Server> {
        static SERVER: OnceLock<Option<Server>> = OnceLock::new();
        *SERVER.get_or_init(|| {
            let info = match ctx.call("INFO", &["server"]) {
                Ok(RedisValue::SimpleString(s) | RedisValue::BulkString(s)) => s,
                Ok(RedisValue::StringBuffer(b)) => String::from_utf8_lossy(&b).into_owned(),
                _ => return None,
            };
            Server::parse(&info)
        })
    }

    fn parse(info: &str) -> Option<Server> {
        let field = |name: &str| {
            info.lines()
                .find_map(|l| l.trim().strip_prefix(name)?.strip_prefix(':'))
                .and_then(release)
        };
        match field("valkey_version") {
            Some(r) => Some(Server::Valkey(r)),
            None => field("redis_version").map(Server::Redis),
        }
    }
}

fn release(version: &str) -> Option<Release> {
    let mut parts = version.split('.').map(|p| p.parse::<u32>().ok());
    Some((parts.next()??, parts.next()??))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn valkey_is_read_from_its_own_field() {
        let info =
            "# Server\r\nredis_version:7.2.4\r\nserver_name:valkey\r\nvalkey_version:9.1.0\r\n";
        assert_eq!(Server::parse(info), Some(Server::Valkey((9, 1))));
    }

    #[test]
    fn redis_is_read_from_redis_version() {
        let info = "# Server\r\nredis_version:7.0.15\r\nredis_git_sha1:00000000\r\n";
        assert_eq!(Server::parse(info), Some(Server::Redis((7, 0))));
        assert_eq!(
            Server::parse("redis_version:8.2.3\n"),
            Some(Server::Redis((8, 2)))
        );
    }

    #[test]
    fn unreadable_versions_are_none() {
        assert_eq!(Server::parse("redis_version:x.y\n"), None);
        assert_eq!(Server::parse("redis_version_x:7.0.1\n"), None);
        assert_eq!(Server::parse(""), None);
    }
}
