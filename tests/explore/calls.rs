//! The annotated functions the workers call, one per combination of the attribute's arguments,
//! and the body they share, which reports to the checker and runs the call's steps.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use dlock::{distributed_lock, LockError, Locker};

use crate::checker::Frame;
use crate::driver::Run;
use crate::plan::{Call, Step};

/// What a body does when its lease is lost, as its attribute says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnLost {
    Cancel,
    Continue,
}

/// The arguments of one annotated function.
#[derive(Clone, Copy, Debug)]
pub struct Variant {
    pub ttl_ms: u64,
    pub wait_ms: u64,
    pub renew: bool,
    pub on_lost: OnLost,
}

type CallFuture<'a> = Pin<Box<dyn Future<Output = Result<(), LockError>> + Send + 'a>>;

/// One annotated function per combination of ttl (short and long), wait, renew and on_lost; the
/// attribute takes literals, so the combinations are spelled out.
macro_rules! variants {
    ($($index:literal => $name:ident: ttl = $ttl:tt, $ttl_ms:literal; wait = $wait:tt, $wait_ms:literal;
        renew = $renew:tt; on_lost = $on_lost:tt, $mode:ident;)*) => {
        $(
            #[distributed_lock(key = "<key>", ttl = $ttl, wait = $wait, renew = $renew, on_lost = $on_lost, locker = locker)]
            async fn $name(locker: &Locker, key: &str, ctx: Ctx, call: &Call) -> Result<(), LockError> {
                body(ctx, call, OnLost::$mode).await
            }
        )*

        /// Every annotated function, by index.
        pub const VARIANTS: &[Variant] = &[$(Variant {
            ttl_ms: $ttl_ms,
            wait_ms: $wait_ms,
            renew: $renew,
            on_lost: OnLost::$mode,
        }),*];

        fn dispatch<'a>(
            variant: usize,
            locker: &'a Locker,
            key: &'a str,
            ctx: Ctx,
            call: &'a Call,
        ) -> CallFuture<'a> {
            match variant {
                $($index => Box::pin($name(locker, key, ctx, call)),)*
                _ => unreachable!("no variant {variant}"),
            }
        }
    };
}

variants! {
    0 => ttl_30ms_wait_0s_renewed_cancel: ttl = "30ms", 30; wait = "0s", 0; renew = true; on_lost = "cancel", Cancel;
    1 => ttl_30ms_wait_0s_renewed_continue: ttl = "30ms", 30; wait = "0s", 0; renew = true; on_lost = "continue", Continue;
    2 => ttl_30ms_wait_0s_unrenewed_cancel: ttl = "30ms", 30; wait = "0s", 0; renew = false; on_lost = "cancel", Cancel;
    3 => ttl_30ms_wait_0s_unrenewed_continue: ttl = "30ms", 30; wait = "0s", 0; renew = false; on_lost = "continue", Continue;
    4 => ttl_30ms_wait_20ms_renewed_cancel: ttl = "30ms", 30; wait = "20ms", 20; renew = true; on_lost = "cancel", Cancel;
    5 => ttl_30ms_wait_20ms_renewed_continue: ttl = "30ms", 30; wait = "20ms", 20; renew = true; on_lost = "continue", Continue;
    6 => ttl_30ms_wait_20ms_unrenewed_cancel: ttl = "30ms", 30; wait = "20ms", 20; renew = false; on_lost = "cancel", Cancel;
    7 => ttl_30ms_wait_20ms_unrenewed_continue: ttl = "30ms", 30; wait = "20ms", 20; renew = false; on_lost = "continue", Continue;
    8 => ttl_100ms_wait_0s_renewed_cancel: ttl = "100ms", 100; wait = "0s", 0; renew = true; on_lost = "cancel", Cancel;
    9 => ttl_100ms_wait_0s_renewed_continue: ttl = "100ms", 100; wait = "0s", 0; renew = true; on_lost = "continue", Continue;
    10 => ttl_100ms_wait_0s_unrenewed_cancel: ttl = "100ms", 100; wait = "0s", 0; renew = false; on_lost = "cancel", Cancel;
    11 => ttl_100ms_wait_0s_unrenewed_continue: ttl = "100ms", 100; wait = "0s", 0; renew = false; on_lost = "continue", Continue;
    12 => ttl_100ms_wait_20ms_renewed_cancel: ttl = "100ms", 100; wait = "20ms", 20; renew = true; on_lost = "cancel", Cancel;
    13 => ttl_100ms_wait_20ms_renewed_continue: ttl = "100ms", 100; wait = "20ms", 20; renew = true; on_lost = "continue", Continue;
    14 => ttl_100ms_wait_20ms_unrenewed_cancel: ttl = "100ms", 100; wait = "20ms", 20; renew = false; on_lost = "cancel", Cancel;
    15 => ttl_100ms_wait_20ms_unrenewed_continue: ttl = "100ms", 100; wait = "20ms", 20; renew = false; on_lost = "continue", Continue;
    16 => ttl_300ms_wait_0s_renewed_cancel: ttl = "300ms", 300; wait = "0s", 0; renew = true; on_lost = "cancel", Cancel;
    17 => ttl_300ms_wait_0s_renewed_continue: ttl = "300ms", 300; wait = "0s", 0; renew = true; on_lost = "continue", Continue;
    18 => ttl_300ms_wait_0s_unrenewed_cancel: ttl = "300ms", 300; wait = "0s", 0; renew = false; on_lost = "cancel", Cancel;
    19 => ttl_300ms_wait_0s_unrenewed_continue: ttl = "300ms", 300; wait = "0s", 0; renew = false; on_lost = "continue", Continue;
    20 => ttl_300ms_wait_20ms_renewed_cancel: ttl = "300ms", 300; wait = "20ms", 20; renew = true; on_lost = "cancel", Cancel;
    21 => ttl_300ms_wait_20ms_renewed_continue: ttl = "300ms", 300; wait = "20ms", 20; renew = true; on_lost = "continue", Continue;
    22 => ttl_300ms_wait_20ms_unrenewed_cancel: ttl = "300ms", 300; wait = "20ms", 20; renew = false; on_lost = "cancel", Cancel;
    23 => ttl_300ms_wait_20ms_unrenewed_continue: ttl = "300ms", 300; wait = "20ms", 20; renew = false; on_lost = "continue", Continue;
    24 => ttl_600ms_wait_0s_renewed_cancel: ttl = "600ms", 600; wait = "0s", 0; renew = true; on_lost = "cancel", Cancel;
    25 => ttl_600ms_wait_0s_renewed_continue: ttl = "600ms", 600; wait = "0s", 0; renew = true; on_lost = "continue", Continue;
    26 => ttl_600ms_wait_0s_unrenewed_cancel: ttl = "600ms", 600; wait = "0s", 0; renew = false; on_lost = "cancel", Cancel;
    27 => ttl_600ms_wait_0s_unrenewed_continue: ttl = "600ms", 600; wait = "0s", 0; renew = false; on_lost = "continue", Continue;
    28 => ttl_600ms_wait_20ms_renewed_cancel: ttl = "600ms", 600; wait = "20ms", 20; renew = true; on_lost = "cancel", Cancel;
    29 => ttl_600ms_wait_20ms_renewed_continue: ttl = "600ms", 600; wait = "20ms", 20; renew = true; on_lost = "continue", Continue;
    30 => ttl_600ms_wait_20ms_unrenewed_cancel: ttl = "600ms", 600; wait = "20ms", 20; renew = false; on_lost = "cancel", Cancel;
    31 => ttl_600ms_wait_20ms_unrenewed_continue: ttl = "600ms", 600; wait = "20ms", 20; renew = false; on_lost = "continue", Continue;
    32 => ttl_2s_wait_0s_renewed_cancel: ttl = "2s", 2000; wait = "0s", 0; renew = true; on_lost = "cancel", Cancel;
    33 => ttl_2s_wait_0s_renewed_continue: ttl = "2s", 2000; wait = "0s", 0; renew = true; on_lost = "continue", Continue;
    34 => ttl_2s_wait_0s_unrenewed_cancel: ttl = "2s", 2000; wait = "0s", 0; renew = false; on_lost = "cancel", Cancel;
    35 => ttl_2s_wait_0s_unrenewed_continue: ttl = "2s", 2000; wait = "0s", 0; renew = false; on_lost = "continue", Continue;
    36 => ttl_2s_wait_20ms_renewed_cancel: ttl = "2s", 2000; wait = "20ms", 20; renew = true; on_lost = "cancel", Cancel;
    37 => ttl_2s_wait_20ms_renewed_continue: ttl = "2s", 2000; wait = "20ms", 20; renew = true; on_lost = "continue", Continue;
    38 => ttl_2s_wait_20ms_unrenewed_cancel: ttl = "2s", 2000; wait = "20ms", 20; renew = false; on_lost = "cancel", Cancel;
    39 => ttl_2s_wait_20ms_unrenewed_continue: ttl = "2s", 2000; wait = "20ms", 20; renew = false; on_lost = "continue", Continue;
}

/// Where a call is made from: its worker, and the bodies it runs inside, innermost last.
#[derive(Clone)]
pub struct Ctx {
    pub run: Arc<Run>,
    pub locker: Locker,
    pub worker: usize,
    pub frames: Vec<Frame>,
}

/// Makes `call` from `ctx`: the annotated function of its variant, on its key.
pub fn call<'a>(ctx: &'a Ctx, call: &'a Call) -> CallFuture<'a> {
    dispatch(
        call.variant,
        &ctx.locker,
        &ctx.run.keys[call.key],
        ctx.clone(),
        call,
    )
}

/// The body of every annotated function: reports itself to the checker as it starts, at each
/// later poll (under `on_lost = "cancel"`, where the runtime must never poll it on an invalid
/// lease) and as it ends, and runs the call's steps in between.
async fn body(ctx: Ctx, plan: &Call, on_lost: OnLost) -> Result<(), LockError> {
    let mut inside = ctx.run.checker.enter(ctx.worker, &ctx.frames, on_lost);
    let mut inner = ctx.clone();
    inner.frames.push(inside.frame.clone());
    let mut steps = std::pin::pin!(steps(&inner, plan));
    let mut first = true;
    std::future::poll_fn(|cx| {
        if !first && on_lost == OnLost::Cancel {
            inside.check_poll(false);
        }
        first = false;
        steps.as_mut().poll(cx)
    })
    .await
}

async fn steps(ctx: &Ctx, plan: &Call) -> Result<(), LockError> {
    for step in &plan.steps {
        match step {
            Step::Sleep(time) => tokio::time::sleep(*time).await,
            Step::Yield => tokio::task::yield_now().await,
            Step::Block(time) => {
                std::thread::sleep(*time);
                tokio::task::yield_now().await;
            }
            Step::Nested(inner) => {
                let _ = call(ctx, inner).await;
            }
            Step::Joined(a, b) => {
                let _ = tokio::join!(call(ctx, a), call(ctx, b));
            }
        }
    }
    Ok(())
}
