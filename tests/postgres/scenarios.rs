//! The scenarios PostgreSQL shares with the other stores: an operator's eviction
//! (`support::force`), the SQL stores' scenarios (`support::sql_store`), and every property and
//! scenario again on simple queries.

/// An operator's eviction (`support::force`), each on a table of its own.
mod force_release {
    use crate::support::force;
    use crate::Postgres;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn evicts_the_holder_and_hands_the_key_on() {
        let db = Postgres::fresh().await;
        force::evicts_and_hands_on(db.locker().await).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn keeps_a_holder_that_took_the_key_since() {
        let db = Postgres::fresh().await;
        force::keeps_a_holder_that_took_the_key_since(db.locker().await).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_copy_sent_again_leaves_the_next_holder_alone() {
        let db = Postgres::fresh().await;
        force::a_copy_sent_again_leaves_the_next_holder_alone(db.locker().await).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_eviction_keeps_the_fence_for_the_next_grant() {
        crate::support::sql_store::an_eviction_keeps_the_fence_for_the_next_grant::<Postgres>()
            .await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn hands_the_key_to_a_waiter_of_another_process() {
        let db = Postgres::fresh().await;
        force::hands_the_key_to_a_waiter_of_another_process(db.locker().await, db.locker().await)
            .await;
    }
}

/// The scenarios PostgreSQL shares with MySQL (`support::sql_store`).
mod sql_scenarios {
    use crate::support::sql_store as scenario;
    use crate::Postgres;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_contended_holder_keeps_its_lease() {
        scenario::a_contended_holder_keeps_its_lease::<Postgres>().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_held_row_locked_by_another_transaction_costs_the_other_leases_nothing() {
        scenario::a_held_row_locked_by_another_transaction_costs_the_other_leases_nothing::<Postgres>()
            .await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_row_locked_by_another_transaction_neither_holds_up_tries_nor_starves_renewals() {
        scenario::a_row_locked_by_another_transaction_neither_holds_up_tries_nor_starves_renewals::<
            Postgres,
        >()
        .await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn tries_stuck_on_a_locked_row_do_not_keep_other_keys_from_being_locked() {
        scenario::tries_stuck_on_a_locked_row_do_not_keep_other_keys_from_being_locked::<Postgres>(
        )
        .await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_grant_its_caller_never_came_back_for_is_undone_after_the_claim_window() {
        scenario::a_grant_its_caller_never_came_back_for_is_undone_after_the_claim_window::<
            Postgres,
        >()
        .await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_late_copy_of_an_acquire_does_not_keep_an_unclaimed_grant_from_its_undo() {
        scenario::a_late_copy_of_an_acquire_does_not_keep_an_unclaimed_grant_from_its_undo::<
            Postgres,
        >()
        .await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_acquisition_abandoned_while_its_insert_waits_leaves_no_row() {
        scenario::an_acquisition_abandoned_while_its_insert_waits_leaves_no_row::<Postgres>().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_grant_whose_answer_was_lost_and_whose_retry_met_a_locked_row_is_undone() {
        scenario::a_grant_whose_answer_was_lost_and_whose_retry_met_a_locked_row_is_undone::<
            Postgres,
        >()
        .await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_waiting_acquisition_that_ends_after_a_lost_grant_is_undone() {
        scenario::a_waiting_acquisition_that_ends_after_a_lost_grant_is_undone::<Postgres>().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_busy_key_reads_busy_after_a_broken_connection() {
        scenario::a_busy_key_reads_busy_after_a_broken_connection::<Postgres>().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_late_acquire_of_the_holder_never_shortens_its_lease() {
        scenario::a_late_acquire_of_the_holder_never_shortens_its_lease::<Postgres>().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_lease_with_a_huge_ttl_keeps_rivals_out() {
        scenario::a_lease_with_a_huge_ttl_keeps_rivals_out::<Postgres>().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_late_renewal_never_shortens_its_lease() {
        scenario::a_late_renewal_never_shortens_its_lease::<Postgres>().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_released_key_s_next_fence_is_above_its_last_whatever_the_clock() {
        scenario::a_released_key_s_next_fence_is_above_its_last_whatever_the_clock::<Postgres>()
            .await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_released_row_is_free_after_a_step_back_of_the_clock() {
        scenario::a_released_row_is_free_after_a_step_back_of_the_clock::<Postgres>().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn inspect_describes_the_holder_and_counts_its_waiters() {
        scenario::inspect_describes_the_holder_and_counts_its_waiters::<Postgres>().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn list_names_the_held_keys_under_a_prefix_literally() {
        scenario::list_names_the_held_keys_under_a_prefix_literally::<Postgres>().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn list_reads_every_page() {
        scenario::list_reads_every_page::<Postgres>().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_table_of_an_earlier_version_is_upgraded_and_keeps_working() {
        scenario::a_table_of_an_earlier_version_is_upgraded_and_keeps_working::<Postgres>().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_upgrade_that_cannot_lock_the_table_gives_up_and_leaves_it_working() {
        scenario::an_upgrade_that_cannot_lock_the_table_gives_up_and_leaves_it_working::<Postgres>(
        )
        .await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_table_of_an_earlier_version_left_as_it_is_keeps_working() {
        scenario::a_table_of_an_earlier_version_left_as_it_is_keeps_working::<Postgres>().await;
    }
}

/// Every property and shared scenario again with the statements sent as simple queries, their
/// values written into the SQL (`prepared_statements(false)`, for poolers that cannot follow
/// prepared statements): the same promises, by the same statements.
mod simple_queries {
    use crate::lock_properties;
    use crate::support::{self, sql_store as scenario};

    /// A table whose backends send no prepared statement.
    type Simple = crate::Postgres<false>;

    lock_properties!(Simple::new_table().await);

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_row_locked_by_another_transaction_neither_holds_up_tries_nor_starves_renewals() {
        scenario::a_row_locked_by_another_transaction_neither_holds_up_tries_nor_starves_renewals::<
            Simple,
        >()
        .await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn tries_stuck_on_a_locked_row_do_not_keep_other_keys_from_being_locked() {
        scenario::tries_stuck_on_a_locked_row_do_not_keep_other_keys_from_being_locked::<Simple>()
            .await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_grant_its_caller_never_came_back_for_is_undone_after_the_claim_window() {
        scenario::a_grant_its_caller_never_came_back_for_is_undone_after_the_claim_window::<
            Simple,
        >()
        .await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_late_copy_of_an_acquire_does_not_keep_an_unclaimed_grant_from_its_undo() {
        scenario::a_late_copy_of_an_acquire_does_not_keep_an_unclaimed_grant_from_its_undo::<
            Simple,
        >()
        .await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_acquisition_abandoned_while_its_insert_waits_leaves_no_row() {
        scenario::an_acquisition_abandoned_while_its_insert_waits_leaves_no_row::<Simple>().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_grant_whose_answer_was_lost_and_whose_retry_met_a_locked_row_is_undone() {
        scenario::a_grant_whose_answer_was_lost_and_whose_retry_met_a_locked_row_is_undone::<
            Simple,
        >()
        .await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_busy_key_reads_busy_after_a_broken_connection() {
        scenario::a_busy_key_reads_busy_after_a_broken_connection::<Simple>().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_lease_with_a_huge_ttl_keeps_rivals_out() {
        scenario::a_lease_with_a_huge_ttl_keeps_rivals_out::<Simple>().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_late_renewal_never_shortens_its_lease() {
        scenario::a_late_renewal_never_shortens_its_lease::<Simple>().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn inspect_describes_the_holder_and_counts_its_waiters() {
        scenario::inspect_describes_the_holder_and_counts_its_waiters::<Simple>().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn list_names_the_held_keys_under_a_prefix_literally() {
        scenario::list_names_the_held_keys_under_a_prefix_literally::<Simple>().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn list_reads_every_page() {
        scenario::list_reads_every_page::<Simple>().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_table_of_an_earlier_version_is_upgraded_and_keeps_working() {
        scenario::a_table_of_an_earlier_version_is_upgraded_and_keeps_working::<Simple>().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_upgrade_that_cannot_lock_the_table_gives_up_and_leaves_it_working() {
        scenario::an_upgrade_that_cannot_lock_the_table_gives_up_and_leaves_it_working::<Simple>()
            .await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_table_of_an_earlier_version_left_as_it_is_keeps_working() {
        scenario::a_table_of_an_earlier_version_left_as_it_is_keeps_working::<Simple>().await;
    }
}
