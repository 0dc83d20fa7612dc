//! Derive macros for `mongo-patterns`. Depend on `mongo-patterns`, which
//! re-exports them; this crate's output names only its `__private` module.
//!
//! The pipeline, with each layer using only those below it:
//!
//! - `derive`: parse everything, check, then expand or fall back;
//! - one module per pattern (`model`, `keyset`, `bucket`, `rank_histogram`,
//!   `approx_counter`, `shard_key`), and `check`, the rules between them;
//! - `ast` (the struct as serde stores it, through `serde_rules`), `attr`
//!   (option parsing), `ctxt` (error collection) and `private` (the path to
//!   the runtime).
//!
//! Errors are collected so that a user sees all of their mistakes at once,
//! and after an error each pattern still emits a fallback impl, so that
//! calls elsewhere in their crate do not pile follow-on errors on top.

mod approx_counter;
mod ast;
mod attr;
mod bucket;
mod check;
mod ctxt;
mod derive;
mod keyset;
mod model;
mod private;
mod rank_histogram;
mod schema;
mod serde_rules;
mod shard_key;

use proc_macro::TokenStream;
use syn::{parse_macro_input, DeriveInput};

// The attribute reference: on this crate's page and, re-exported, on
// `mongo_patterns::Model`'s. Its examples are doc tests against the runtime
// (a dev-dependency by path, which `cargo publish` drops), so they compile.
#[doc = include_str!("reference.md")]
#[proc_macro_derive(
    Model,
    attributes(model, keyset, bucket, rank_histogram, approx_counter, shard_key)
)]
pub fn derive_model(input: TokenStream) -> TokenStream {
    let input = parse_macro_input!(input as DeriveInput);
    derive::derive(&input).into()
}

/// Derives `mongo_patterns::Schema` for a type stored inside a model (a
/// struct with named fields, an enum in any of serde's taggings), so that the
/// collection's validator checks its shape too. See the attribute
/// reference's section on validation.
#[proc_macro_derive(Schema, attributes(model))]
pub fn derive_schema(input: TokenStream) -> TokenStream {
    let input = parse_macro_input!(input as DeriveInput);
    schema::derive_schema(&input).into()
}
