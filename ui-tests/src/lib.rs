//! Nothing but tests: see `tests/ui.rs`.
#![forbid(unsafe_code)]
