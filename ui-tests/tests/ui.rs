//! Compile-time behaviour of `#[distributed_lock]`: what it accepts, and the error for each
//! mistake the docs list. The `.stderr` files are pinned to the toolchain CI uses; re-bless with
//! `TRYBUILD=overwrite cargo test -p dlock-ui-tests` after a deliberate change.

#[test]
fn ui() {
    let cases = trybuild::TestCases::new();
    cases.pass("tests/ui/pass/*.rs");
    cases.compile_fail("tests/ui/fail/*.rs");
}
