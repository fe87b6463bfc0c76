// A ttl literal is checked against the longest lease a call accepts, `i64::MAX` milliseconds
// (about 292 million years), not only against what fits in a `Duration`.
use dlock::distributed_lock;

#[distributed_lock(key = "k", ttl = "9223372036854775808ms")]
async fn submit() {}

#[distributed_lock(key = "k", ttl = "2562047788016h")]
async fn report() {}

fn main() {}
