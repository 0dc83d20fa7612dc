//! Derive macros for `mongo-patterns`. Depend on `mongo-patterns`, which
//! re-exports them; this crate's output names only
//! `::mongo_patterns::__private`.
//!
//! The pipeline for every derive: parse the struct and its attributes into a
//! typed model (`model::Input`), check the rules that span attributes, then
//! expand. Errors are collected (`ctxt::Ctxt`) so that a user sees all of
//! their mistakes at once, and after an error a stub impl is still emitted so
//! that calls elsewhere in their crate do not pile follow-on errors on top.

mod approx_counter;
mod attr;
mod bucket;
mod ctxt;
mod keyset;
mod model;
mod rank_histogram;
mod shard_key;

use proc_macro::TokenStream;
use syn::{parse_macro_input, DeriveInput};

/// `#[derive(Model)]`: a struct stored in a MongoDB collection, with the
/// patterns its helper attributes name (`#[model]`, `#[keyset]`, `#[bucket]`,
/// `#[rank_histogram]`, `#[approx_counter]`, `#[shard_key]`).
#[proc_macro_derive(
    Model,
    attributes(model, keyset, bucket, rank_histogram, approx_counter, shard_key)
)]
pub fn derive_model(input: TokenStream) -> TokenStream {
    let input = parse_macro_input!(input as DeriveInput);
    model::derive(&input).into()
}
