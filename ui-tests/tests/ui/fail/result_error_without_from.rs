// An error type with no `From<LockError>` is reported on it, with the return types that work and
// how to make this one work (not as a list of `String`'s unrelated `From` impls).
use dlock::distributed_lock;

#[distributed_lock(key = "acct:<id>")]
async fn count(id: u32) -> Result<u32, String> {
    Ok(id)
}

fn main() {}
