use dlock::distributed_lock;

#[derive(Debug)]
struct AppError;

#[distributed_lock(key = "k")]
async fn submit() -> Result<(), AppError> {
    Ok(())
}

fn main() {}
