//! The Lua scripts, how they are sent, and what their replies say.
//!
//! Each script runs its uncontended path before it defines the functions the other paths share
//! (common.lua is spliced in after it), and takes only the names it needs: Redis spends about as
//! long on a script's overhead as on a plain `SET`, so every command and argument saved shows.
//! Defining a function costs every call that runs past the definition, so only `grant`, the
//! fence logic (grant.lua), comes before acquire's uncontended path, which grants; release's,
//! which does not, has it spliced in after, with the rest.
//!
//! A script is sent by `EVALSHA`. A server that does not know it (restarted, say, or a replica
//! just promoted) answers `NOSCRIPT` without running it: only then is it loaded and sent again.
//! Nothing here sends a call again after a timeout or a broken connection, where the first copy
//! may still run; what to do then is the connection's decision (see conn.rs).

use std::sync::LazyLock;
use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::{Cmd, ErrorKind, RedisResult, Script, ScriptInvocation, ServerErrorKind, Value};

use super::conn::Conn;

pub(super) static ACQUIRE: LazyLock<Script> =
    LazyLock::new(|| Script::new(&spliced(include_str!("acquire.lua"))));
pub(super) static RELEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(&spliced(include_str!("release.lua"))));
pub(super) static RENEW: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("renew.lua")));
pub(super) static FORCE: LazyLock<Script> =
    LazyLock::new(|| Script::new(&spliced(include_str!("force.lua"))));
pub(super) static INSPECT: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("inspect.lua")));

/// A script's file with grant.lua spliced in where a line says `--!grant`, and common.lua where
/// one says `--!common`.
fn spliced(file: &str) -> String {
    file.replacen("--!grant\n", include_str!("grant.lua"), 1)
        .replacen("--!common\n", include_str!("common.lua"), 1)
}

/// Runs `call`, an invocation of `script`, and answers its reply.
///
/// On one server, redis-rs's `invoke_async` does it: `EVALSHA`, and after a `NOSCRIPT` reply
/// `SCRIPT LOAD` and `EVALSHA` again. Not on a cluster: there its `SCRIPT LOAD` goes to every
/// node and waits for each, so one node that stalls (paused, or cut off with its connection
/// still open) holds up, then fails, a call whose keys live on a node that is up — a key never
/// locked there before, or a replica just promoted, which has not seen the script. On a cluster
/// the load rides in one pipeline with the call instead, which goes to the node that owns the
/// call's keys alone.
#[cfg_attr(not(feature = "redis-cluster"), allow(unused_variables))]
pub(super) async fn invoke(
    mut conn: Conn,
    script: &Script,
    call: &ScriptInvocation<'_>,
) -> RedisResult<Value> {
    #[cfg(feature = "redis-cluster")]
    if matches!(conn, Conn::Cluster(_)) {
        let mut replies = invoke_pipelined(conn, script, std::slice::from_ref(call), None).await?;
        let reply = replies
            .pop()
            .ok_or_else(|| unexpected(&Value::Array(Vec::new())))?;
        return reply.extract_error();
    }
    call.invoke_async(&mut conn).await
}

/// Runs `calls`, invocations of `script`, then `then`, in one pipeline: one round trip. Answers a
/// reply per command, errors included.
///
/// Where a call answers `NOSCRIPT`, the server did not run it: the pipeline is sent again behind
/// a `SCRIPT LOAD`, in a second round trip, whole. (The calls of one pipeline are either one
/// call, which did not run, or renewals, which may run twice.) redis-rs loads nothing for a
/// pipeline by itself.
pub(super) async fn invoke_pipelined(
    mut conn: Conn,
    script: &Script,
    calls: &[ScriptInvocation<'_>],
    then: Option<Cmd>,
) -> RedisResult<Vec<Value>> {
    let pipeline = |load: bool| {
        let mut pipe = redis::pipe();
        if load {
            pipe.load_script(script);
        }
        for call in calls {
            pipe.invoke_script(call);
        }
        if let Some(then) = &then {
            pipe.add_command(then.clone());
        }
        pipe
    };
    let count = calls.len() + usize::from(then.is_some());
    let replies = conn.req_packed_commands(&pipeline(false), 0, count).await?;
    if !replies[..calls.len().min(replies.len())]
        .iter()
        .any(is_noscript)
    {
        return Ok(replies);
    }
    let mut replies = conn
        .req_packed_commands(&pipeline(true), 0, count + 1)
        .await?;
    if replies.len() != count + 1 {
        return Err(unexpected(&Value::Array(replies)));
    }
    // A load that failed (the calls then answer NOSCRIPT again) says why.
    replies.remove(0).extract_error()?;
    Ok(replies)
}

/// Whether `reply` is the server's `NOSCRIPT`: it does not know the script, and did not run it.
fn is_noscript(reply: &Value) -> bool {
    matches!(
        reply,
        Value::ServerError(error) if error.kind() == Some(ServerErrorKind::NoScript)
    )
}

/// How a run of the acquire script treats a busy lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mode {
    /// A first try, in no queue: answer busy.
    FirstTry,
    /// Queue up (or stay queued), refreshing the waiter's liveness.
    Queue,
    /// A waiter's last try: leave the queue.
    Leave,
}

/// What one run of the acquire script said.
#[derive(Debug)]
pub(super) enum Attempt {
    Granted(u64),
    /// Granted on the primary, but acknowledged by fewer replicas than `min_replicas`: it does
    /// not count.
    Unreplicated {
        acknowledged: u64,
    },
    /// Busy; `pttl` is the holder's remaining ttl where it has one, `first` whether this owner
    /// heads the queue.
    Busy {
        pttl: Option<Duration>,
        first: bool,
    },
}

/// What one run of the release script said.
#[derive(Debug)]
pub(super) struct Released {
    /// Whether the owner held the lock.
    pub(super) held: bool,
    /// The waiter the lock was handed to, for its claim window.
    pub(super) handed_to: Option<HandOff>,
}

/// A grant to a waiter, as a release's reply or its message names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct HandOff {
    /// The waiter's owner.
    pub(super) owner: String,
    /// The grant's fence.
    pub(super) fence: u64,
    /// The number of the waiter's call that last wrote its waiter key, which reached the server
    /// before the grant (see `hand_to` in common.lua); none for an older dlock's waiter.
    pub(super) call: Option<u64>,
}

impl HandOff {
    /// Reads a hand-off message: `<owner> <fence> <call>`. An older dlock's release publishes
    /// `<owner>` or `<owner> <fence>`, and a waiter of an older dlock names no call: a message
    /// without all three is a wake-up only (the waiter claims the lock with an acquire call).
    pub(super) fn parse(message: &str) -> (&str, Option<Grant>) {
        let mut words = message.split(' ');
        let owner = words.next().unwrap_or_default();
        let fence = words.next().and_then(|fence| fence.parse().ok());
        let call = words.next().and_then(|call| call.parse().ok());
        let grant = match (fence, call, words.next()) {
            (Some(fence), Some(call), None) => Some(Grant { fence, call }),
            _ => None,
        };
        (owner, grant)
    }

    /// What the waiter is told: the grant, where the waiter's call is known.
    pub(super) fn grant(&self) -> Option<Grant> {
        self.call.map(|call| Grant {
            fence: self.fence,
            call,
        })
    }
}

/// A hand-off as its waiter learns it: the fence, and the number of the waiter's call the grant
/// came after.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Grant {
    pub(super) fence: u64,
    pub(super) call: u64,
}

pub(super) fn parse_release(reply: Value) -> Result<Released, redis::RedisError> {
    let held = |held: i64| match held {
        0 | 1 => Ok(held == 1),
        _ => Err(unexpected(&reply)),
    };
    match &reply {
        // Nobody was handed the lock: the common case, a bare integer.
        Value::Int(n) => Ok(Released {
            held: held(*n)?,
            handed_to: None,
        }),
        Value::Array(items) => {
            // {held, head, the hand-off's fence, the number of the head's call ('' if none)}
            let [Value::Int(n), Value::BulkString(head), Value::Int(fence), Value::BulkString(call)] =
                items.as_slice()
            else {
                return Err(unexpected(&reply));
            };
            let head = std::str::from_utf8(head).map_err(|_| unexpected(&reply))?;
            let fence = u64::try_from(*fence).map_err(|_| unexpected(&reply))?;
            let call = match call.as_slice() {
                b"" => None,
                digits => Some(
                    std::str::from_utf8(digits)
                        .ok()
                        .and_then(|call| call.parse().ok())
                        .ok_or_else(|| unexpected(&reply))?,
                ),
            };
            Ok(Released {
                held: held(*n)?,
                handed_to: Some(HandOff {
                    owner: head.to_owned(),
                    fence,
                    call,
                }),
            })
        }
        _ => Err(unexpected(&reply)),
    }
}

pub(super) fn parse_attempt(reply: Value) -> Result<Attempt, redis::RedisError> {
    match &reply {
        // Granted: the fence, a bare integer.
        Value::Int(fence) => u64::try_from(*fence)
            .map(Attempt::Granted)
            .map_err(|_| unexpected(&reply)),
        Value::Array(items) => {
            let [Value::Int(pttl), Value::Int(first)] = items.as_slice() else {
                return Err(unexpected(&reply));
            };
            Ok(Attempt::Busy {
                // Negative where the caller does not head the queue (only the head is told), the
                // lock has no ttl (-1), or it is gone (-2).
                pttl: u64::try_from(*pttl).ok().map(Duration::from_millis),
                first: *first == 1,
            })
        }
        _ => Err(unexpected(&reply)),
    }
}

pub(super) fn unexpected(value: &Value) -> redis::RedisError {
    redis::RedisError::from((
        ErrorKind::UnexpectedReturnType,
        "unexpected reply from a dlock script",
        format!("{value:?}"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn release_replies_name_the_waiter_handed_the_lock() {
        let reply = |held: i64, head: &str, fence: i64, call: &str| {
            Value::Array(vec![
                Value::Int(held),
                Value::BulkString(head.as_bytes().to_vec()),
                Value::Int(fence),
                Value::BulkString(call.as_bytes().to_vec()),
            ])
        };
        let released = parse_release(reply(1, "abc", 9, "4")).unwrap();
        assert!(released.held);
        let handed = released.handed_to.unwrap();
        assert_eq!(
            (handed.owner.as_str(), handed.fence, handed.call),
            ("abc", 9, Some(4))
        );
        assert_eq!(handed.grant(), Some(Grant { fence: 9, call: 4 }));
        let released = parse_release(reply(0, "abc", 3, "")).unwrap();
        assert!(!released.held);
        let handed = released.handed_to.unwrap();
        assert_eq!((handed.owner.as_str(), handed.call), ("abc", None));
        assert_eq!(handed.grant(), None);
        assert!(parse_release(reply(1, "abc", 3, "x")).is_err());
        for (reply, held) in [(Value::Int(1), true), (Value::Int(0), false)] {
            let released = parse_release(reply).unwrap();
            assert_eq!(released.held, held);
            assert_eq!(released.handed_to, None);
        }
        assert!(parse_release(Value::Int(2)).is_err());
        assert!(parse_release(Value::Array(vec![Value::Int(1)])).is_err());
    }

    #[test]
    fn hand_off_messages_name_the_owner_and_the_grant_where_they_can() {
        let grant = Some(Grant { fence: 42, call: 7 });
        assert_eq!(HandOff::parse("abc 42 7"), ("abc", grant));
        // An older dlock's release, or a grant to an older dlock's waiter: a wake-up only.
        assert_eq!(HandOff::parse("abc"), ("abc", None));
        assert_eq!(HandOff::parse("abc 42"), ("abc", None));
        assert_eq!(HandOff::parse("abc 42 7 9"), ("abc", None));
        assert_eq!(HandOff::parse("abc x 7"), ("abc", None));
    }

    #[test]
    fn shared_functions_are_spliced_in_after_the_uncontended_path() {
        let files = [
            (&ACQUIRE, include_str!("acquire.lua")),
            (&RELEASE, include_str!("release.lua")),
        ];
        for (script, file) in files {
            assert_eq!(file.matches("--!grant\n").count(), 1, "{file}");
            assert_eq!(file.matches("--!common\n").count(), 1, "{file}");
            let (uncontended, rest) = file.split_once("--!common\n").unwrap();
            assert!(uncontended.contains("return"), "{uncontended}");
            assert!(!uncontended.contains("local function"), "{uncontended}");
            let (before_grant, after_grant) = file.split_once("--!grant\n").unwrap();
            let spliced = [
                before_grant,
                include_str!("grant.lua"),
                &after_grant.replacen("--!common\n", include_str!("common.lua"), 1),
            ]
            .concat();
            assert_eq!(script.get_hash(), Script::new(&spliced).get_hash());
            assert!(
                !rest.contains("--!grant"),
                "grant comes before the shared functions"
            );
        }
        let renew = Script::new(include_str!("renew.lua"));
        assert_eq!(RENEW.get_hash(), renew.get_hash());
    }

    /// Fences are counted by `grant` alone, written once in grant.lua: no script counts them
    /// on its own.
    #[test]
    fn the_fence_logic_is_written_once() {
        let grant = include_str!("grant.lua");
        assert_eq!(grant.matches("local function grant(").count(), 1);
        for file in [
            include_str!("acquire.lua"),
            include_str!("release.lua"),
            include_str!("common.lua"),
            include_str!("renew.lua"),
            include_str!("force.lua"),
        ] {
            for fence_logic in ["'TIME'", "3600000", "function grant("] {
                assert!(!file.contains(fence_logic), "{fence_logic} in {file}");
            }
        }
    }

    #[test]
    fn acquire_replies_are_a_fence_or_a_busy_answer() {
        assert!(matches!(
            parse_attempt(Value::Int(7)).unwrap(),
            Attempt::Granted(7)
        ));
        let busy = Value::Array(vec![Value::Int(1500), Value::Int(1)]);
        let Attempt::Busy { pttl, first } = parse_attempt(busy).unwrap() else {
            panic!("not busy");
        };
        assert_eq!((pttl, first), (Some(Duration::from_millis(1500)), true));
        let gone = Value::Array(vec![Value::Int(-2), Value::Int(0)]);
        assert!(matches!(
            parse_attempt(gone).unwrap(),
            Attempt::Busy { pttl: None, .. }
        ));
        assert!(parse_attempt(Value::Int(-1)).is_err());
        assert!(parse_attempt(Value::Nil).is_err());
    }
}
