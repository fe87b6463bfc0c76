//! dlock: a distributed lock in one line.
#![warn(missing_docs)]

pub use dlock_macros::distributed_lock;
pub use dlock_runtime::*;
