//! Waiting for a condition that another task makes true and then announces on a [`Notify`].

use tokio::sync::Notify;

/// Resolves once `condition` holds, checking it whenever `notify` announces a change. The
/// waiter is registered before each check, so an announcement made between the check and the
/// wait is not missed (announcers call `notify_waiters` after making the condition true).
pub(crate) async fn until(notify: &Notify, condition: impl Fn() -> bool) {
    loop {
        let woken = notify.notified();
        tokio::pin!(woken);
        woken.as_mut().enable();
        if condition() {
            return;
        }
        woken.await;
    }
}
