//! Compile-time UI tests for `#[derive(Model)]` and its attributes (and
//! `#[derive(Schema)]`), one directory per module of the derive
//! (`tests/ui/<module>/`): what a user
//! sees when an attribute is wrong (for shard keys, also when the key is one
//! of the traps the derive's lints refuse), and that the accepted forms
//! compile (and their consts and counter specs hold what they should).
//!
//! - `tests/ui/<module>/*.rs` must fail to compile with exactly the
//!   `.stderr` beside them. One mistake per file, except each pattern's
//!   `many_mistakes.rs` and `wrong_types.rs`, which show that all are
//!   reported together, and `wrong_type_then_unknown.rs`, that reading goes
//!   on after a value of the wrong kind. In
//!   `tests/ui/ensure/`, the actions `Model::ensure` and `Model::plan` are
//!   `#[must_use]`: left unawaited under `deny(unused_must_use)`, they fail.
//! - `tests/ui/<module>/pass/*.rs` must compile and run (no server: they only
//!   use consts such as the shard key's `SHARD`, type-check calls, and read
//!   counters' specs from handles on a client that never connects).
//!
//! A new pattern's directory needs no edit here.
//!
//! The expected `.stderr` is the compiler's own output and changes between
//! releases; it is pinned to the toolchain in `rust-toolchain.toml` (1.95.0).
//! After a deliberate change, regenerate with
//! `TRYBUILD=overwrite cargo test --test ui` and review the diff; never edit a
//! `.stderr` by hand.

#[test]
fn ui() {
    // trybuild's crate takes none of the workspace's `[profile]`: without
    // this its ~40 pass binaries and their dependencies carry full debug info
    // (3.7 GB of `target/tests/trybuild` against about 1 GB; CI ran out of
    // disk on it). Nothing here is debugged; a caller's own setting wins.
    if std::env::var_os("CARGO_PROFILE_DEV_DEBUG").is_none() {
        std::env::set_var("CARGO_PROFILE_DEV_DEBUG", "false");
    }
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/*/*.rs");
    t.pass("tests/ui/*/pass/*.rs");
}
