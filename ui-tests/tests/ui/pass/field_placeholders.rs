// `<param.field.field>` and tuple-index placeholders.
use dlock::{current_lease, distributed_lock, Locker};

struct User {
    tenant: Tenant,
    id: u64,
}

struct Tenant {
    name: String,
}

#[distributed_lock(key = "user:<user.tenant.name>:<user.id>:<pair.1>", locker = locker)]
async fn touch(locker: &Locker, user: &User, pair: (u8, &str)) -> Option<String> {
    Some(current_lease()?.key().to_owned())
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let locker = Locker::memory();
    let user = User { tenant: Tenant { name: "acme co".into() }, id: 9 };
    assert_eq!(touch(&locker, &user, (1, "x/y")).await.unwrap(), "user:acme%20co:9:x%2Fy");
}
