use dlock::distributed_lock;

const LABEL: &str = "billing::submit";

#[distributed_lock(key = "k", label = LABEL)]
async fn submit() {}

fn main() {}
