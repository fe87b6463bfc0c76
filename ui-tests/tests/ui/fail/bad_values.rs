use dlock::distributed_lock;

// Every mistake is reported at once, each on its own token.
#[distributed_lock(key = "k", renew = "yes", on_lost = "retry", crate = "not a path")]
async fn submit() {}

fn main() {}
