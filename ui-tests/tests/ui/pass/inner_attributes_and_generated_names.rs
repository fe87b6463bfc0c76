// An inner attribute at the top of the body applies to the whole function, and parameters may
// carry the names the expansion uses for its own locals: those are hygienic.
use dlock::{distributed_lock, LockError, Locker};

#[distributed_lock(key = "job:<__dlock_key>:<__dlock_builder>", locker = __dlock_locker)]
async fn odd_names(
    __dlock_locker: &Locker,
    __dlock_key: u32,
    __dlock_builder: &str,
) -> Result<(u32, String), LockError> {
    #![allow(unused_variables)]
    let unused = 1;
    Ok((__dlock_key, __dlock_builder.to_owned()))
}

fn main() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let locker = Locker::memory();
    let (key, builder) = runtime.block_on(odd_names(&locker, 7, "b")).unwrap();
    assert_eq!((key, builder.as_str()), (7, "b"));
}
