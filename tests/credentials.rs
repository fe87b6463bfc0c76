//! No credential is ever printed: not by `Debug`, not in an error, whatever characters the
//! password holds.

use dlock::backend::RedisBackend;
use dlock::Locker;

/// Passwords written the way users write them: with the characters that end a URL's parts.
const PASSWORDS: [&str; 4] = ["s3cret", "pa/ss", "p@ss:w/rd", "a%2Fb?c#d"];

fn assert_hidden(password: &str, printed: &str) {
    assert!(
        !printed.contains(password),
        "password `{password}` printed in `{printed}`"
    );
}

#[tokio::test]
async fn a_redis_password_never_shows_in_debug_or_errors() {
    for password in PASSWORDS {
        let url = format!("redis://:{password}@127.0.0.1:1/0");
        let builder = RedisBackend::builder(&url);
        assert_hidden(password, &format!("{builder:?}"));
        // A URL the client cannot use reports itself without the password.
        for bad in [
            format!("redis://:{password}@/0"),
            format!("redis://:{password}@127.0.0.1:notaport/0"),
            format!("nosuch://:{password}@127.0.0.1:1/0"),
        ] {
            if let Err(error) = Locker::connect(&bad).await {
                assert_hidden(password, &error.to_string());
                assert_hidden(password, &format!("{error:?}"));
            }
        }
    }
}

#[tokio::test]
async fn a_password_in_a_url_with_a_typo_never_shows() {
    for url in [
        "redis:/:hunter2@127.0.0.1:6379",
        "redis:hunter2@127.0.0.1:6379",
        "nosuch://:hunter2@127.0.0.1:1",
        "redis+unix:///tmp/redis.sock?pass=hunter2",
        "mysql://127.0.0.1:1/test?password=hunter2&x=1",
    ] {
        if let Err(error) = Locker::connect(url).await {
            assert_hidden("hunter2", &error.to_string());
            assert_hidden("hunter2", &format!("{error:?}"));
        }
    }
}

#[cfg(feature = "mysql")]
#[tokio::test]
async fn a_mysql_password_never_shows_in_debug_or_errors() {
    use dlock::backend::MysqlBackend;
    for password in PASSWORDS {
        let url = format!("mysql://root:{password}@127.0.0.1:1/test");
        if let Ok(builder) = MysqlBackend::builder(&url) {
            assert_hidden(password, &format!("{builder:?}"));
        }
        for bad in [
            format!("mysql://root:{password}@127.0.0.1:notaport/test"),
            format!("mysql://root:{password}@127.0.0.1:1/test"),
        ] {
            if let Err(error) = Locker::connect(&bad).await {
                assert_hidden(password, &error.to_string());
                assert_hidden(password, &format!("{error:?}"));
            }
        }
    }
}

#[cfg(feature = "postgres")]
#[tokio::test]
async fn a_postgres_password_never_shows_in_debug_or_errors() {
    use dlock::backend::PostgresBackend;
    for password in PASSWORDS {
        let url = format!("postgres://app:{password}@127.0.0.1:1/test?table=locks");
        if let Ok(builder) = PostgresBackend::builder(&url) {
            assert_hidden(password, &format!("{builder:?}"));
            if let Ok(builder) = builder.listen_url(&url) {
                assert_hidden(password, &format!("{builder:?}"));
            }
        }
        for bad in [
            format!("postgresql://app:{password}@127.0.0.1:notaport/test"),
            format!("postgres://app:{password}@127.0.0.1:1/test?connect_timeout=200ms"),
            format!("postgres://127.0.0.1:1/test?password={password}&connect_timeout=soon"),
        ] {
            if let Err(error) = Locker::connect(&bad).await {
                assert_hidden(password, &error.to_string());
                assert_hidden(password, &format!("{error:?}"));
            }
        }
    }
}

/// ZooKeeper URLs carry no credentials: one with user information is refused as it is parsed,
/// saying why, and the password shows neither in the error nor in its `Debug`; it never gets
/// as far as a host string that errors would print.
#[cfg(feature = "zookeeper")]
#[tokio::test]
async fn a_zookeeper_url_with_user_information_is_refused_without_showing_it() {
    use dlock::backend::ZookeeperBackend;
    use dlock::LockError;
    for password in PASSWORDS {
        for url in [
            format!("zk://app:{password}@127.0.0.1:1"),
            format!("zk://app:{password}@127.0.0.1:1,127.0.0.1:2/chroot?root=/locks"),
        ] {
            let error = Locker::connect(&url)
                .await
                .expect_err("user information taken");
            assert!(matches!(error, LockError::InvalidUrl { .. }), "{error:?}");
            let message = error.to_string();
            assert_hidden(password, &message);
            assert_hidden(password, &format!("{error:?}"));
            assert!(message.contains("credentials"), "{message}");
            let error = ZookeeperBackend::builder(&url).expect_err("user information taken");
            assert!(matches!(error, LockError::InvalidUrl { .. }), "{error:?}");
            assert_hidden(password, &error.to_string());
            assert_hidden(password, &format!("{error:?}"));
        }
    }
    // A user name alone is refused as well.
    let error = Locker::connect("zk://app@127.0.0.1:1").await.err();
    assert!(
        matches!(error, Some(LockError::InvalidUrl { .. })),
        "{error:?}"
    );
}
