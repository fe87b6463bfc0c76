//! Locker URLs: the schemes dlock knows and the feature each needs, and the masking that keeps
//! their secrets out of errors, `Debug` output and logs.

/// The schemes, as an error lists them.
pub(crate) const KNOWN: &str =
    "memory://, redis://, rediss://, redis+cluster://, mysql:// or zk://";

/// A store a URL names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scheme {
    Memory,
    /// `redis://` and `rediss://`.
    Redis,
    /// `redis+cluster://` and `rediss+cluster://`.
    RedisCluster,
    Mysql,
    Zookeeper,
}

impl Scheme {
    /// The scheme of `url`, or `None` where dlock knows no such store.
    pub(crate) fn of(url: &str) -> Option<Scheme> {
        let (scheme, _) = url.split_once("://")?;
        Some(match scheme {
            "memory" => Scheme::Memory,
            "redis" | "rediss" => Scheme::Redis,
            "redis+cluster" | "rediss+cluster" => Scheme::RedisCluster,
            "mysql" => Scheme::Mysql,
            "zk" => Scheme::Zookeeper,
            _ => return None,
        })
    }

    /// The cargo feature a build needs to connect to this store.
    pub(crate) fn feature(self) -> &'static str {
        match self {
            Scheme::Memory => "memory",
            Scheme::Redis => "redis",
            Scheme::RedisCluster => "redis-cluster",
            Scheme::Mysql => "mysql",
            Scheme::Zookeeper => "zookeeper",
        }
    }
}

/// `url` with its secrets replaced by `***`, for errors and logs.
///
/// The secrets are the password of the user information and the values of query parameters
/// that carry one (`password`, `pass`, `auth`, `token`, `secret`). The user information is taken
/// to run from the scheme's `:` (and any slashes after it) to the last `@`, so a password holding
/// `/`, `@`, `:`, `?` or `#` (which users write unescaped), or a URL with a slash too few, is
/// masked whole; without a `:` in it, the whole user information is masked. Where that guess is
/// wrong it masks too much, never too little.
pub(crate) fn mask_password(url: &str) -> String {
    let mut masked = String::with_capacity(url.len());
    let mut from = 0;
    for (start, end) in secrets(url) {
        masked.push_str(&url[from..start]);
        masked.push_str("***");
        from = end;
    }
    masked.push_str(&url[from..]);
    masked
}

/// `text` with every secret of `url` replaced by `***`: for messages of other crates' parsers,
/// which may quote the URL they were given.
pub(crate) fn redact(text: &str, url: &str) -> String {
    secrets(url)
        .into_iter()
        .map(|(start, end)| &url[start..end])
        .fold(text.to_owned(), |text, secret| text.replace(secret, "***"))
}

/// The byte ranges of `url`'s secrets, in order, none empty.
fn secrets(url: &str) -> Vec<(usize, usize)> {
    let mut found = Vec::new();
    let Some(scheme_end) = url.find(':') else {
        return found;
    };
    let authority = scheme_end + 1 + url[scheme_end + 1..].len()
        - url[scheme_end + 1..].trim_start_matches('/').len();
    if let Some(at) = url.rfind('@').filter(|&at| at > authority) {
        let userinfo = &url[authority..at];
        let start = userinfo
            .find(':')
            .map_or(authority, |colon| authority + colon + 1);
        if start < at {
            found.push((start, at));
        }
    }
    let query_from = found.last().map_or(authority, |&(_, end)| end);
    if let Some(question) = url[query_from..].find('?') {
        let mut offset = query_from + question + 1;
        for pair in url[offset..].split('&') {
            if let Some((name, value)) = pair.split_once('=') {
                let secret = ["password", "pass", "auth", "token", "secret"]
                    .iter()
                    .any(|n| name.eq_ignore_ascii_case(n));
                if secret && !value.is_empty() {
                    let start = offset + name.len() + 1;
                    found.push((start, start + value.len()));
                }
            }
            offset += pair.len() + 1;
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::{mask_password, redact};

    #[test]
    fn masks_only_the_password() {
        assert_eq!(
            mask_password("redis://:secret@host:6379/0"),
            "redis://:***@host:6379/0"
        );
        assert_eq!(
            mask_password("mysql://root:pw@127.0.0.1/test"),
            "mysql://root:***@127.0.0.1/test"
        );
        assert_eq!(mask_password("redis://host:6379"), "redis://host:6379");
        assert_eq!(mask_password("memory://"), "memory://");
        assert_eq!(
            mask_password("redis://:p@ss:w/rd@host:6379/0"),
            "redis://:***@host:6379/0"
        );
        assert_eq!(
            mask_password("mysql://root:a/b?c#d@db/test"),
            "mysql://root:***@db/test"
        );
        assert_eq!(
            redact(
                "invalid port in mysql://root:a/b@db:x",
                "mysql://root:a/b@db:x"
            ),
            "invalid port in mysql://root:***@db:x"
        );
    }
}
