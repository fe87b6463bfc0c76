//! Nothing but tests: see `tests/ui.rs`.
