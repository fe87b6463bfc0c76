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
    /// The key's permits: 1 for a mutex, more for a semaphore (a key is used with one value).
    pub permits: u32,
    /// `hold_at_least`, 0 for none.
    pub hold_ms: u64,
}

type CallFuture<'a> = Pin<Box<dyn Future<Output = Result<(), LockError>> + Send + 'a>>;

/// One annotated function per combination of ttl (short and long), wait, renew and on_lost, for
/// mutexes (0–39), semaphores of 2 and 3 permits (40–71, and 82–85 with a longer wait) and holds
/// (`hold_at_least`, 72–81); the attribute takes literals, so the combinations are spelled out.
macro_rules! variants {
    ($($index:literal => $name:ident: ttl = $ttl:tt, $ttl_ms:literal; wait = $wait:tt, $wait_ms:literal;
        renew = $renew:tt; on_lost = $on_lost:tt, $mode:ident; permits = $permits:literal;
        hold = $hold_ms:literal $(, $hold:tt)?;)*) => {
        $(
            #[distributed_lock(key = "<key>", ttl = $ttl, wait = $wait, renew = $renew, on_lost = $on_lost, permits = $permits, $(hold_at_least = $hold,)? locker = locker)]
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
            permits: $permits,
            hold_ms: $hold_ms,
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
    0 => ttl_30ms_wait_0s_renewed_cancel: ttl = "30ms", 30; wait = "0s", 0; renew = true; on_lost = "cancel", Cancel; permits = 1; hold = 0;
    1 => ttl_30ms_wait_0s_renewed_continue: ttl = "30ms", 30; wait = "0s", 0; renew = true; on_lost = "continue", Continue; permits = 1; hold = 0;
    2 => ttl_30ms_wait_0s_unrenewed_cancel: ttl = "30ms", 30; wait = "0s", 0; renew = false; on_lost = "cancel", Cancel; permits = 1; hold = 0;
    3 => ttl_30ms_wait_0s_unrenewed_continue: ttl = "30ms", 30; wait = "0s", 0; renew = false; on_lost = "continue", Continue; permits = 1; hold = 0;
    4 => ttl_30ms_wait_20ms_renewed_cancel: ttl = "30ms", 30; wait = "20ms", 20; renew = true; on_lost = "cancel", Cancel; permits = 1; hold = 0;
    5 => ttl_30ms_wait_20ms_renewed_continue: ttl = "30ms", 30; wait = "20ms", 20; renew = true; on_lost = "continue", Continue; permits = 1; hold = 0;
    6 => ttl_30ms_wait_20ms_unrenewed_cancel: ttl = "30ms", 30; wait = "20ms", 20; renew = false; on_lost = "cancel", Cancel; permits = 1; hold = 0;
    7 => ttl_30ms_wait_20ms_unrenewed_continue: ttl = "30ms", 30; wait = "20ms", 20; renew = false; on_lost = "continue", Continue; permits = 1; hold = 0;
    8 => ttl_100ms_wait_0s_renewed_cancel: ttl = "100ms", 100; wait = "0s", 0; renew = true; on_lost = "cancel", Cancel; permits = 1; hold = 0;
    9 => ttl_100ms_wait_0s_renewed_continue: ttl = "100ms", 100; wait = "0s", 0; renew = true; on_lost = "continue", Continue; permits = 1; hold = 0;
    10 => ttl_100ms_wait_0s_unrenewed_cancel: ttl = "100ms", 100; wait = "0s", 0; renew = false; on_lost = "cancel", Cancel; permits = 1; hold = 0;
    11 => ttl_100ms_wait_0s_unrenewed_continue: ttl = "100ms", 100; wait = "0s", 0; renew = false; on_lost = "continue", Continue; permits = 1; hold = 0;
    12 => ttl_100ms_wait_20ms_renewed_cancel: ttl = "100ms", 100; wait = "20ms", 20; renew = true; on_lost = "cancel", Cancel; permits = 1; hold = 0;
    13 => ttl_100ms_wait_20ms_renewed_continue: ttl = "100ms", 100; wait = "20ms", 20; renew = true; on_lost = "continue", Continue; permits = 1; hold = 0;
    14 => ttl_100ms_wait_20ms_unrenewed_cancel: ttl = "100ms", 100; wait = "20ms", 20; renew = false; on_lost = "cancel", Cancel; permits = 1; hold = 0;
    15 => ttl_100ms_wait_20ms_unrenewed_continue: ttl = "100ms", 100; wait = "20ms", 20; renew = false; on_lost = "continue", Continue; permits = 1; hold = 0;
    16 => ttl_300ms_wait_0s_renewed_cancel: ttl = "300ms", 300; wait = "0s", 0; renew = true; on_lost = "cancel", Cancel; permits = 1; hold = 0;
    17 => ttl_300ms_wait_0s_renewed_continue: ttl = "300ms", 300; wait = "0s", 0; renew = true; on_lost = "continue", Continue; permits = 1; hold = 0;
    18 => ttl_300ms_wait_0s_unrenewed_cancel: ttl = "300ms", 300; wait = "0s", 0; renew = false; on_lost = "cancel", Cancel; permits = 1; hold = 0;
    19 => ttl_300ms_wait_0s_unrenewed_continue: ttl = "300ms", 300; wait = "0s", 0; renew = false; on_lost = "continue", Continue; permits = 1; hold = 0;
    20 => ttl_300ms_wait_20ms_renewed_cancel: ttl = "300ms", 300; wait = "20ms", 20; renew = true; on_lost = "cancel", Cancel; permits = 1; hold = 0;
    21 => ttl_300ms_wait_20ms_renewed_continue: ttl = "300ms", 300; wait = "20ms", 20; renew = true; on_lost = "continue", Continue; permits = 1; hold = 0;
    22 => ttl_300ms_wait_20ms_unrenewed_cancel: ttl = "300ms", 300; wait = "20ms", 20; renew = false; on_lost = "cancel", Cancel; permits = 1; hold = 0;
    23 => ttl_300ms_wait_20ms_unrenewed_continue: ttl = "300ms", 300; wait = "20ms", 20; renew = false; on_lost = "continue", Continue; permits = 1; hold = 0;
    24 => ttl_600ms_wait_0s_renewed_cancel: ttl = "600ms", 600; wait = "0s", 0; renew = true; on_lost = "cancel", Cancel; permits = 1; hold = 0;
    25 => ttl_600ms_wait_0s_renewed_continue: ttl = "600ms", 600; wait = "0s", 0; renew = true; on_lost = "continue", Continue; permits = 1; hold = 0;
    26 => ttl_600ms_wait_0s_unrenewed_cancel: ttl = "600ms", 600; wait = "0s", 0; renew = false; on_lost = "cancel", Cancel; permits = 1; hold = 0;
    27 => ttl_600ms_wait_0s_unrenewed_continue: ttl = "600ms", 600; wait = "0s", 0; renew = false; on_lost = "continue", Continue; permits = 1; hold = 0;
    28 => ttl_600ms_wait_20ms_renewed_cancel: ttl = "600ms", 600; wait = "20ms", 20; renew = true; on_lost = "cancel", Cancel; permits = 1; hold = 0;
    29 => ttl_600ms_wait_20ms_renewed_continue: ttl = "600ms", 600; wait = "20ms", 20; renew = true; on_lost = "continue", Continue; permits = 1; hold = 0;
    30 => ttl_600ms_wait_20ms_unrenewed_cancel: ttl = "600ms", 600; wait = "20ms", 20; renew = false; on_lost = "cancel", Cancel; permits = 1; hold = 0;
    31 => ttl_600ms_wait_20ms_unrenewed_continue: ttl = "600ms", 600; wait = "20ms", 20; renew = false; on_lost = "continue", Continue; permits = 1; hold = 0;
    32 => ttl_2s_wait_0s_renewed_cancel: ttl = "2s", 2000; wait = "0s", 0; renew = true; on_lost = "cancel", Cancel; permits = 1; hold = 0;
    33 => ttl_2s_wait_0s_renewed_continue: ttl = "2s", 2000; wait = "0s", 0; renew = true; on_lost = "continue", Continue; permits = 1; hold = 0;
    34 => ttl_2s_wait_0s_unrenewed_cancel: ttl = "2s", 2000; wait = "0s", 0; renew = false; on_lost = "cancel", Cancel; permits = 1; hold = 0;
    35 => ttl_2s_wait_0s_unrenewed_continue: ttl = "2s", 2000; wait = "0s", 0; renew = false; on_lost = "continue", Continue; permits = 1; hold = 0;
    36 => ttl_2s_wait_20ms_renewed_cancel: ttl = "2s", 2000; wait = "20ms", 20; renew = true; on_lost = "cancel", Cancel; permits = 1; hold = 0;
    37 => ttl_2s_wait_20ms_renewed_continue: ttl = "2s", 2000; wait = "20ms", 20; renew = true; on_lost = "continue", Continue; permits = 1; hold = 0;
    38 => ttl_2s_wait_20ms_unrenewed_cancel: ttl = "2s", 2000; wait = "20ms", 20; renew = false; on_lost = "cancel", Cancel; permits = 1; hold = 0;
    39 => ttl_2s_wait_20ms_unrenewed_continue: ttl = "2s", 2000; wait = "20ms", 20; renew = false; on_lost = "continue", Continue; permits = 1; hold = 0;
    40 => ttl_100ms_wait_0s_renewed_cancel_2_permits: ttl = "100ms", 100; wait = "0s", 0; renew = true; on_lost = "cancel", Cancel; permits = 2; hold = 0;
    41 => ttl_100ms_wait_0s_renewed_continue_2_permits: ttl = "100ms", 100; wait = "0s", 0; renew = true; on_lost = "continue", Continue; permits = 2; hold = 0;
    42 => ttl_100ms_wait_0s_unrenewed_cancel_2_permits: ttl = "100ms", 100; wait = "0s", 0; renew = false; on_lost = "cancel", Cancel; permits = 2; hold = 0;
    43 => ttl_100ms_wait_0s_unrenewed_continue_2_permits: ttl = "100ms", 100; wait = "0s", 0; renew = false; on_lost = "continue", Continue; permits = 2; hold = 0;
    44 => ttl_100ms_wait_20ms_renewed_cancel_2_permits: ttl = "100ms", 100; wait = "20ms", 20; renew = true; on_lost = "cancel", Cancel; permits = 2; hold = 0;
    45 => ttl_100ms_wait_20ms_renewed_continue_2_permits: ttl = "100ms", 100; wait = "20ms", 20; renew = true; on_lost = "continue", Continue; permits = 2; hold = 0;
    46 => ttl_100ms_wait_20ms_unrenewed_cancel_2_permits: ttl = "100ms", 100; wait = "20ms", 20; renew = false; on_lost = "cancel", Cancel; permits = 2; hold = 0;
    47 => ttl_100ms_wait_20ms_unrenewed_continue_2_permits: ttl = "100ms", 100; wait = "20ms", 20; renew = false; on_lost = "continue", Continue; permits = 2; hold = 0;
    48 => ttl_600ms_wait_0s_renewed_cancel_2_permits: ttl = "600ms", 600; wait = "0s", 0; renew = true; on_lost = "cancel", Cancel; permits = 2; hold = 0;
    49 => ttl_600ms_wait_0s_renewed_continue_2_permits: ttl = "600ms", 600; wait = "0s", 0; renew = true; on_lost = "continue", Continue; permits = 2; hold = 0;
    50 => ttl_600ms_wait_0s_unrenewed_cancel_2_permits: ttl = "600ms", 600; wait = "0s", 0; renew = false; on_lost = "cancel", Cancel; permits = 2; hold = 0;
    51 => ttl_600ms_wait_0s_unrenewed_continue_2_permits: ttl = "600ms", 600; wait = "0s", 0; renew = false; on_lost = "continue", Continue; permits = 2; hold = 0;
    52 => ttl_600ms_wait_20ms_renewed_cancel_2_permits: ttl = "600ms", 600; wait = "20ms", 20; renew = true; on_lost = "cancel", Cancel; permits = 2; hold = 0;
    53 => ttl_600ms_wait_20ms_renewed_continue_2_permits: ttl = "600ms", 600; wait = "20ms", 20; renew = true; on_lost = "continue", Continue; permits = 2; hold = 0;
    54 => ttl_600ms_wait_20ms_unrenewed_cancel_2_permits: ttl = "600ms", 600; wait = "20ms", 20; renew = false; on_lost = "cancel", Cancel; permits = 2; hold = 0;
    55 => ttl_600ms_wait_20ms_unrenewed_continue_2_permits: ttl = "600ms", 600; wait = "20ms", 20; renew = false; on_lost = "continue", Continue; permits = 2; hold = 0;
    56 => ttl_30ms_wait_0s_renewed_cancel_3_permits: ttl = "30ms", 30; wait = "0s", 0; renew = true; on_lost = "cancel", Cancel; permits = 3; hold = 0;
    57 => ttl_30ms_wait_0s_renewed_continue_3_permits: ttl = "30ms", 30; wait = "0s", 0; renew = true; on_lost = "continue", Continue; permits = 3; hold = 0;
    58 => ttl_30ms_wait_0s_unrenewed_cancel_3_permits: ttl = "30ms", 30; wait = "0s", 0; renew = false; on_lost = "cancel", Cancel; permits = 3; hold = 0;
    59 => ttl_30ms_wait_0s_unrenewed_continue_3_permits: ttl = "30ms", 30; wait = "0s", 0; renew = false; on_lost = "continue", Continue; permits = 3; hold = 0;
    60 => ttl_30ms_wait_20ms_renewed_cancel_3_permits: ttl = "30ms", 30; wait = "20ms", 20; renew = true; on_lost = "cancel", Cancel; permits = 3; hold = 0;
    61 => ttl_30ms_wait_20ms_renewed_continue_3_permits: ttl = "30ms", 30; wait = "20ms", 20; renew = true; on_lost = "continue", Continue; permits = 3; hold = 0;
    62 => ttl_30ms_wait_20ms_unrenewed_cancel_3_permits: ttl = "30ms", 30; wait = "20ms", 20; renew = false; on_lost = "cancel", Cancel; permits = 3; hold = 0;
    63 => ttl_30ms_wait_20ms_unrenewed_continue_3_permits: ttl = "30ms", 30; wait = "20ms", 20; renew = false; on_lost = "continue", Continue; permits = 3; hold = 0;
    64 => ttl_300ms_wait_0s_renewed_cancel_3_permits: ttl = "300ms", 300; wait = "0s", 0; renew = true; on_lost = "cancel", Cancel; permits = 3; hold = 0;
    65 => ttl_300ms_wait_0s_renewed_continue_3_permits: ttl = "300ms", 300; wait = "0s", 0; renew = true; on_lost = "continue", Continue; permits = 3; hold = 0;
    66 => ttl_300ms_wait_0s_unrenewed_cancel_3_permits: ttl = "300ms", 300; wait = "0s", 0; renew = false; on_lost = "cancel", Cancel; permits = 3; hold = 0;
    67 => ttl_300ms_wait_0s_unrenewed_continue_3_permits: ttl = "300ms", 300; wait = "0s", 0; renew = false; on_lost = "continue", Continue; permits = 3; hold = 0;
    68 => ttl_300ms_wait_20ms_renewed_cancel_3_permits: ttl = "300ms", 300; wait = "20ms", 20; renew = true; on_lost = "cancel", Cancel; permits = 3; hold = 0;
    69 => ttl_300ms_wait_20ms_renewed_continue_3_permits: ttl = "300ms", 300; wait = "20ms", 20; renew = true; on_lost = "continue", Continue; permits = 3; hold = 0;
    70 => ttl_300ms_wait_20ms_unrenewed_cancel_3_permits: ttl = "300ms", 300; wait = "20ms", 20; renew = false; on_lost = "cancel", Cancel; permits = 3; hold = 0;
    71 => ttl_300ms_wait_20ms_unrenewed_continue_3_permits: ttl = "300ms", 300; wait = "20ms", 20; renew = false; on_lost = "continue", Continue; permits = 3; hold = 0;
    72 => ttl_100ms_wait_0s_renewed_cancel_hold_50ms: ttl = "100ms", 100; wait = "0s", 0; renew = true; on_lost = "cancel", Cancel; permits = 1; hold = 50, "50ms";
    73 => ttl_100ms_wait_0s_renewed_continue_hold_50ms: ttl = "100ms", 100; wait = "0s", 0; renew = true; on_lost = "continue", Continue; permits = 1; hold = 50, "50ms";
    74 => ttl_100ms_wait_0s_renewed_cancel_hold_200ms: ttl = "100ms", 100; wait = "0s", 0; renew = true; on_lost = "cancel", Cancel; permits = 1; hold = 200, "200ms";
    75 => ttl_100ms_wait_0s_renewed_continue_hold_200ms: ttl = "100ms", 100; wait = "0s", 0; renew = true; on_lost = "continue", Continue; permits = 1; hold = 200, "200ms";
    76 => ttl_300ms_wait_0s_renewed_cancel_hold_100ms: ttl = "300ms", 300; wait = "0s", 0; renew = true; on_lost = "cancel", Cancel; permits = 1; hold = 100, "100ms";
    77 => ttl_300ms_wait_0s_renewed_continue_hold_100ms: ttl = "300ms", 300; wait = "0s", 0; renew = true; on_lost = "continue", Continue; permits = 1; hold = 100, "100ms";
    78 => ttl_300ms_wait_0s_unrenewed_cancel_hold_200ms: ttl = "300ms", 300; wait = "0s", 0; renew = false; on_lost = "cancel", Cancel; permits = 1; hold = 200, "200ms";
    79 => ttl_300ms_wait_0s_unrenewed_continue_hold_200ms: ttl = "300ms", 300; wait = "0s", 0; renew = false; on_lost = "continue", Continue; permits = 1; hold = 200, "200ms";
    80 => ttl_100ms_wait_20ms_renewed_cancel_hold_50ms: ttl = "100ms", 100; wait = "20ms", 20; renew = true; on_lost = "cancel", Cancel; permits = 1; hold = 50, "50ms";
    81 => ttl_100ms_wait_20ms_renewed_continue_hold_50ms: ttl = "100ms", 100; wait = "20ms", 20; renew = true; on_lost = "continue", Continue; permits = 1; hold = 50, "50ms";
    82 => ttl_100ms_wait_150ms_renewed_cancel_2_permits: ttl = "100ms", 100; wait = "150ms", 150; renew = true; on_lost = "cancel", Cancel; permits = 2; hold = 0;
    83 => ttl_100ms_wait_150ms_renewed_continue_2_permits: ttl = "100ms", 100; wait = "150ms", 150; renew = true; on_lost = "continue", Continue; permits = 2; hold = 0;
    84 => ttl_300ms_wait_150ms_unrenewed_cancel_3_permits: ttl = "300ms", 300; wait = "150ms", 150; renew = false; on_lost = "cancel", Cancel; permits = 3; hold = 0;
    85 => ttl_300ms_wait_150ms_unrenewed_continue_3_permits: ttl = "300ms", 300; wait = "150ms", 150; renew = false; on_lost = "continue", Continue; permits = 3; hold = 0;
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
    let mut inside =
        ctx.run
            .checker
            .enter(ctx.worker, &ctx.frames, on_lost, &VARIANTS[plan.variant]);
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
