//! `#[derive(Model)]` from end to end, the one place that names every
//! pattern: parse the struct and every attribute, check the rules that span
//! attributes, then expand; or, after any error, emit the errors with each
//! pattern's fallback, built from the same parse.

use proc_macro2::{Ident, TokenStream};
use quote::quote;
use syn::DeriveInput;

use crate::ast::Input;
use crate::ctxt::Ctxt;
use crate::private::Private;
use crate::{approx_counter, bucket, check, keyset, model, rank_histogram, shard_key};

pub fn derive(input: &DeriveInput) -> TokenStream {
    let cx = Ctxt::new();
    let Some(ast) = Input::from_syn(&cx, input) else {
        // A shape that cannot be a model: its attributes are not judged, but
        // the fallback still honours `#[model(crate = "...")]`.
        let quiet = Ctxt::new();
        let model = model::parse(&quiet, input);
        let _ = quiet.check();
        let errors = cx.into_compile_errors();
        let fallback = model.fallback(input);
        return quote! { #errors #fallback };
    };
    let model = model::parse(&cx, input);
    let broken = check::broken(input);
    let keyset = keyset::parse(&cx, input, &ast);
    let bucket = bucket::parse(&cx, input, &ast);
    let rank = rank_histogram::parse(&cx, input, &ast, &model.collection);
    let counters = approx_counter::parse(&cx, input, &ast);
    let shard = shard_key::parse(&cx, input, &ast, check::refuses(&broken, "shard_key"));
    check::report(&cx, input, &broken);
    // A `#[bucket]` model's `#[shard_key]` says how its buckets shard; it
    // gets no `Sharded` repository (its documents are buckets).
    let bucket_sharding = match (&bucket, &shard) {
        (Some(b), Some(s)) => bucket::sharding(&cx, input, b, s),
        _ => None,
    };
    let shard = if bucket.is_some() { None } else { shard };
    let p = &model.private;

    if let Some(errors) = cx.into_compile_errors() {
        let fallback = model.fallback(input);
        let bucket = bucket.map(|b| b.fallback(input, p));
        let rank = rank.map(|r| r.fallback(input, p));
        let counters = counters.and_then(|c| c.fallback(input, p));
        let shard = shard.map(|s| s.fallback(input, p));
        return quote! { #errors #fallback #bucket #rank #counters #shard };
    }
    let bucket_impl = bucket.and_then(|b| b.expand(input, p, bucket_sharding));
    let rank_impl = rank.and_then(|r| r.expand(input, p));
    let accessors = counters.as_ref().map(|c| c.accessors()).unwrap_or_default();
    let counters_impl = counters.and_then(|c| c.expand(input, p));
    let shard_impl = shard.and_then(|s| s.expand(input, p));
    let repos = Repositories {
        bucket: bucket_impl.is_some(),
        rank: rank_impl.is_some(),
        shard: shard_impl.is_some(),
        counters: accessors,
    };
    let keyset_const = keyset.as_ref().map(|k| k.expand_const(p));
    let fields = crate::schema::expand_fields(&ast, p);
    let nested = crate::schema::expand_nested(&ast, &input.generics, p);
    let declared = expand_declared(p, &repos);
    let mut out = model.expand(
        input,
        quote! { #keyset_const #fields #nested #declared },
        !repos.bucket,
    );
    out.extend(keyset.map(|k| k.expand_checks(input, p)));
    out.extend(bucket_impl);
    out.extend(rank_impl);
    out.extend(counters_impl);
    out.extend(shard_impl);
    out
}

/// The repositories the struct's attributes give it, whose declarations
/// `Model::declared` gathers.
struct Repositories {
    bucket: bool,
    rank: bool,
    shard: bool,
    /// The counters' accessors.
    counters: Vec<Ident>,
}

/// `Model::declared` gathering every repository's declarations, after the
/// keyset's (the trait's default, used when the struct has no repository).
fn expand_declared(p: &Private, repos: &Repositories) -> Option<TokenStream> {
    let mut parts = Vec::new();
    if repos.bucket {
        parts.push(quote!(#p::Buckets::<Self>::new(db).declared()));
    }
    if repos.rank {
        parts.push(quote!(#p::Ranks::<Self>::new(db).declared()));
    }
    if repos.shard {
        parts.push(quote!(#p::Sharded::<Self>::new(db).declared()));
    }
    for c in &repos.counters {
        parts.push(quote!(#p::Counter::declared(&Self::#c(db))));
    }
    if parts.is_empty() {
        return None;
    }
    // The fields' types, on the model's documents (a bucket model's are in
    // its buckets' items: `Buckets::declared` puts them there).
    let fields = (!repos.bucket).then(|| {
        quote! {
            let all = #p::with_fields(
                all,
                <Self as #p::Model>::COLLECTION,
                <Self as #p::Model>::FIELDS,
                &<Self as #p::Model>::nested(),
            );
        }
    });
    Some(quote! {
        fn declared(db: &#p::Database) -> #p::Vec<#p::Declared> {
            let mut all = #p::keyset_declared(
                db,
                <Self as #p::Model>::COLLECTION,
                <Self as #p::Model>::KEYSET,
            );
            #( #p::core::iter::Extend::extend(&mut all, #parts); )*
            #fields
            #p::for_model::<Self>(all, <Self as #p::Model>::VALIDATION)
        }
    })
}
