//! Locker URLs: the schemes dlock knows and the feature each needs, and the masking that keeps
//! their secrets out of errors, `Debug` output and logs.

/// The schemes, as an error lists them.
pub(crate) const KNOWN: &str =
    "memory://, redis://, rediss://, redis+cluster://, mysql://, postgres://, postgresql://, zk:// or etcd://";

/// A store a URL names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scheme {
    Memory,
    /// `redis://` and `rediss://`.
    Redis,
    /// `redis+cluster://` and `rediss+cluster://`.
    RedisCluster,
    Mysql,
    /// `postgres://` and `postgresql://`.
    Postgres,
    Zookeeper,
    Etcd,
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
            "postgres" | "postgresql" => Scheme::Postgres,
            "zk" => Scheme::Zookeeper,
            "etcd" => Scheme::Etcd,
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
            Scheme::Postgres => "postgres",
            Scheme::Zookeeper => "zookeeper",
            Scheme::Etcd => "etcd",
        }
    }
}

#[cfg(any(feature = "redis", feature = "postgres"))]
pub(crate) use settings::bool_param;
#[cfg(any(feature = "redis", feature = "mysql", feature = "postgres"))]
pub(crate) use settings::number_param;
#[cfg(feature = "postgres")]
pub(crate) use settings::without_params;
#[cfg(any(
    feature = "redis",
    feature = "mysql",
    feature = "postgres",
    feature = "zookeeper",
    feature = "etcd"
))]
pub(crate) use settings::{duration_param, query_param};

/// The settings a store's URL carries in its query (`…?name=value&…`), for the stores that have
/// any.
#[cfg(any(
    feature = "redis",
    feature = "mysql",
    feature = "postgres",
    feature = "zookeeper",
    feature = "etcd"
))]
mod settings {
    use std::time::Duration;

    use crate::LockError;

    /// The value of the query parameter `name` of `url` (`…?name=value&…`), if it has one, as
    /// written.
    pub(crate) fn query_param<'a>(url: &'a str, name: &str) -> Option<&'a str> {
        let query = url.split_once('?')?.1;
        let query = query.split('#').next().unwrap_or(query);
        query
            .split('&')
            .find_map(|pair| pair.strip_prefix(name)?.strip_prefix('='))
    }

    /// `url` without the query parameters `names`, for a driver that warns about parameters it
    /// does not know (and would print their values).
    #[cfg(feature = "postgres")]
    pub(crate) fn without_params(url: &str, names: &[&str]) -> String {
        let Some((base, rest)) = url.split_once('?') else {
            return url.to_owned();
        };
        let (query, fragment) = match rest.split_once('#') {
            Some((query, fragment)) => (query, Some(fragment)),
            None => (rest, None),
        };
        let kept: Vec<&str> = query
            .split('&')
            .filter(|pair| {
                let name = pair.split_once('=').map_or(*pair, |(name, _)| name);
                !pair.is_empty() && !names.contains(&name)
            })
            .collect();
        let mut url = base.to_owned();
        if !kept.is_empty() {
            url.push('?');
            url.push_str(&kept.join("&"));
        }
        if let Some(fragment) = fragment {
            url.push('#');
            url.push_str(fragment);
        }
        url
    }

    /// The query parameter `name` of `url` as a duration: whole numbers with units, `500ms`, `3s`,
    /// `2m`, `1h`, combinable (`1m30s`), as the attribute writes them.
    pub(crate) fn duration_param(url: &str, name: &str) -> Result<Option<Duration>, LockError> {
        let Some(text) = query_param(url, name) else {
            return Ok(None);
        };
        parse_duration(text).map(Some).ok_or_else(|| {
            LockError::invalid_url(
                url,
                format!("{name}=`{text}`: expected a duration such as 500ms, 3s or 1m30s"),
            )
        })
    }

    /// The query parameter `name` of `url` as a number (no ZooKeeper setting is one).
    #[cfg(any(feature = "redis", feature = "mysql", feature = "postgres"))]
    pub(crate) fn number_param<T: std::str::FromStr>(
        url: &str,
        name: &str,
    ) -> Result<Option<T>, LockError> {
        let Some(text) = query_param(url, name) else {
            return Ok(None);
        };
        text.parse()
            .map(Some)
            .map_err(|_| LockError::invalid_url(url, format!("{name}=`{text}`: expected a number")))
    }

    /// The query parameter `name` of `url` as `true` or `false`.
    #[cfg(any(feature = "redis", feature = "postgres"))]
    pub(crate) fn bool_param(url: &str, name: &str) -> Result<Option<bool>, LockError> {
        match query_param(url, name) {
            None => Ok(None),
            Some("true") => Ok(Some(true)),
            Some("false") => Ok(Some(false)),
            Some(text) => Err(LockError::invalid_url(
                url,
                format!("{name}=`{text}`: expected true or false"),
            )),
        }
    }

    fn parse_duration(text: &str) -> Option<Duration> {
        let mut total = Duration::ZERO;
        let mut rest = text;
        if rest.is_empty() {
            return None;
        }
        while !rest.is_empty() {
            let digits = rest
                .find(|c: char| !c.is_ascii_digit())
                .unwrap_or(rest.len());
            let value: u64 = rest[..digits].parse().ok()?;
            rest = &rest[digits..];
            let unit_len = rest
                .find(|c: char| c.is_ascii_digit())
                .unwrap_or(rest.len());
            let unit = match &rest[..unit_len] {
                "ms" => Duration::from_millis(1),
                "s" => Duration::from_secs(1),
                "m" => Duration::from_secs(60),
                "h" => Duration::from_secs(3600),
                _ => return None,
            };
            total = total.checked_add(unit.checked_mul(u32::try_from(value).ok()?)?)?;
            rest = &rest[unit_len..];
        }
        Some(total)
    }

    #[cfg(test)]
    mod tests {
        use std::time::Duration;

        use super::{duration_param, parse_duration, query_param};

        #[test]
        fn query_parameters_are_found_by_their_whole_name() {
            let url = "redis://:pw@h:1/0?min_replicas=2&key_prefix=app:locks:#frag";
            assert_eq!(query_param(url, "key_prefix"), Some("app:locks:"));
            assert_eq!(query_param(url, "min_replicas"), Some("2"));
            assert_eq!(query_param(url, "replicas"), None);
            assert_eq!(query_param("redis://h", "key_prefix"), None);
        }

        #[cfg(feature = "postgres")]
        #[test]
        fn settings_are_taken_out_of_a_url_whole() {
            use super::without_params;
            let url = "postgres://u:p@h/db?table=t&sslmode=disable&tables=x&max_connections=2";
            assert_eq!(
                without_params(url, &["table", "max_connections"]),
                "postgres://u:p@h/db?sslmode=disable&tables=x"
            );
            assert_eq!(
                without_params("postgres://h/db?table=t", &["table"]),
                "postgres://h/db"
            );
            assert_eq!(
                without_params("postgres://h/db", &["table"]),
                "postgres://h/db"
            );
        }

        #[test]
        fn durations_in_a_query_read_as_the_attribute_writes_them() {
            assert_eq!(parse_duration("500ms"), Some(Duration::from_millis(500)));
            assert_eq!(parse_duration("1m30s"), Some(Duration::from_secs(90)));
            assert_eq!(parse_duration("2h"), Some(Duration::from_secs(7200)));
            for bad in ["", "3", "s", "3 s", "1.5s", "3sec", "-1s", "99999999999h"] {
                assert_eq!(parse_duration(bad), None, "{bad:?}");
            }
            let error =
                duration_param("redis://:secret@h/?connect_timeout=soon", "connect_timeout")
                    .unwrap_err()
                    .to_string();
            assert!(
                error.contains("connect_timeout=`soon`") && !error.contains("secret"),
                "{error}"
            );
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
///
/// Public for tools that print a locker URL (the `dlock` command-line tool does, in every
/// header and error): the one masking every message of dlock uses.
///
/// ```
/// assert_eq!(dlock::mask_password("redis://:secret@10.0.0.7:6379/0"), "redis://:***@10.0.0.7:6379/0");
/// assert_eq!(dlock::mask_password("mysql://app:pw@db/test?password=pw"), "mysql://app:***@db/test?password=***");
/// assert_eq!(dlock::mask_password("redis://127.0.0.1"), "redis://127.0.0.1");
/// ```
pub fn mask_password(url: &str) -> String {
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
