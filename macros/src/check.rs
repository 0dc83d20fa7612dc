//! The rules that span attributes: patterns a model cannot combine. One
//! table, so that a new pattern states its exclusions in one place.

use syn::DeriveInput;

use crate::ctxt::Ctxt;

/// `#[at]` cannot be used with `#[with]`; the error points at `#[at]`.
pub struct Exclusion {
    at: &'static str,
    with: &'static str,
    /// Whether `#[with]` also counts on a field.
    with_on_fields: bool,
    message: &'static str,
}

const EXCLUSIONS: &[Exclusion] = &[
    Exclusion {
        at: "keyset",
        with: "bucket",
        with_on_fields: false,
        message: "`#[keyset]` cannot be used with `#[bucket]`: it pages documents, and a `#[bucket]` model's documents are buckets; page items with `Buckets::page`",
    },
    Exclusion {
        at: "bucket",
        with: "rank_histogram",
        with_on_fields: false,
        message: "`#[bucket]` cannot be used with `#[rank_histogram]`: a histogram counts one score per document, and a `#[bucket]` model's documents are buckets of many items",
    },
    Exclusion {
        at: "bucket",
        with: "approx_counter",
        with_on_fields: true,
        message: "`#[bucket]` cannot be used with `#[approx_counter]`: a counter is a field of one document, and a `#[bucket]` model's documents are buckets of many items",
    },
];

/// The exclusions `input` breaks, in the table's order.
pub fn broken(input: &DeriveInput) -> Vec<&'static Exclusion> {
    let on_struct = |name: &str| input.attrs.iter().any(|a| a.path().is_ident(name));
    let on_a_field = |name: &str| match &input.data {
        syn::Data::Struct(s) => s
            .fields
            .iter()
            .any(|f| f.attrs.iter().any(|a| a.path().is_ident(name))),
        _ => false,
    };
    EXCLUSIONS
        .iter()
        .filter(|e| {
            on_struct(e.at) && (on_struct(e.with) || (e.with_on_fields && on_a_field(e.with)))
        })
        .collect()
}

/// Whether a broken exclusion names `attr`: its other errors then come on
/// top of one already reported.
pub fn refuses(broken: &[&Exclusion], attr: &str) -> bool {
    broken.iter().any(|e| e.at == attr || e.with == attr)
}

/// One error per broken exclusion, at the first `#[at]`.
pub fn report(cx: &Ctxt, input: &DeriveInput, broken: &[&Exclusion]) {
    for e in broken {
        if let Some(at) = input.attrs.iter().find(|a| a.path().is_ident(e.at)) {
            cx.error_spanned_by(at, e.message);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use syn::parse_quote;

    fn messages(input: DeriveInput) -> Vec<String> {
        let broken = broken(&input);
        crate::ctxt::collect(|cx| report(cx, &input, &broken)).1
    }

    #[test]
    fn each_exclusion() {
        let e = messages(
            parse_quote! { #[bucket(size = 10, key = "a")] #[keyset] struct T { a: i64 } },
        );
        assert_eq!(e.len(), 1, "{e:?}");
        assert!(e[0].contains("pages documents"), "{e:?}");
        let e = messages(parse_quote! {
            #[bucket(size = 10, key = "a")]
            struct T { a: i64, #[approx_counter(every = 10)] n: i64 }
        });
        assert!(
            e[0].contains("cannot be used with `#[approx_counter]`"),
            "{e:?}"
        );
        let e = messages(parse_quote! {
            #[bucket] #[rank_histogram] #[shard_key(hashed = "a")] struct T { a: i64 }
        });
        // `#[shard_key]` shards a bucket model (the bucket module checks
        // the key), so only the histogram is refused.
        assert_eq!(e.len(), 1, "{e:?}");
        assert!(e[0].contains("`#[rank_histogram]`"), "{e:?}");
        assert!(messages(parse_quote! { #[keyset] #[shard_key] struct T { a: i64 } }).is_empty());
    }
}
