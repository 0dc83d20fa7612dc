//! `#[keyset(sort = "...", order = "asc" | "desc", page_size = N)]`: the
//! model's default paging order. The runtime's `keyset` module holds the
//! paging itself; this checks the options and wires the field names.

use proc_macro2::TokenStream;
use quote::{quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{DeriveInput, Expr, ExprArray, ExprLit, Lit, LitStr, Meta, Type};

use crate::ast::{Input, Order};
use crate::attr::{self, Opt};
use crate::ctxt::Ctxt;
use crate::private::Private;

const KEYSET: &str = "keyset";
const SORT: &str = "sort";
const ORDER: &str = "order";
const PAGE_SIZE: &str = "page_size";
const OPTIONS: &[&str] = &[SORT, ORDER, PAGE_SIZE];

/// The runtime's limits, repeated for the messages; the expansion asserts
/// that they agree.
const MAX_PAGE_SIZE: u64 = 100_000;
const DEFAULT_PAGE_SIZE: u64 = 100;

pub struct Keyset {
    /// BSON names and field types, most significant first.
    sort: Vec<(String, Type)>,
    order: Order,
    page_size: u64,
}

/// Parses `#[keyset]` if present. Errors go to `cx`.
pub fn parse(cx: &Ctxt, input: &DeriveInput, model: &Input) -> Option<Keyset> {
    let first = attr::single(cx, &input.attrs, KEYSET)?[0];
    let mut sort = Opt::new(cx, KEYSET, SORT);
    let mut order = Opt::new(cx, KEYSET, ORDER);
    let mut page_size = Opt::new(cx, KEYSET, PAGE_SIZE);
    // `#[keyset]` alone means the defaults.
    if !matches!(first.meta, Meta::Path(_)) {
        let parsed = first.parse_nested_meta(|meta| {
            // sort = "field" | sort = ["field", ...]
            if meta.path.is_ident(SORT) {
                let names = parse_sort(&meta)?;
                sort.set(&meta.path, names);
            // order = "asc" | "desc"
            } else if meta.path.is_ident(ORDER) {
                let lit = attr::parse_lit_str(&meta, KEYSET)?;
                let other = lit.value();
                match Order::from_spelling(&other) {
                    Some(o) => order.set(&lit, o),
                    None => {
                        let msg = format!(
                            "unknown `keyset` order `{other}`; expected `asc` or `desc`{}",
                            attr::hint(&other, ["asc", "desc", "ascending", "descending"])
                        );
                        cx.error_spanned_by(&lit, msg);
                    }
                }
            // page_size = 100
            } else if meta.path.is_ident(PAGE_SIZE) {
                let lit = attr::parse_lit_int(&meta, KEYSET)?;
                match lit.base10_parse::<u64>() {
                    Ok(n) if (1..=MAX_PAGE_SIZE).contains(&n) => page_size.set(&lit, n),
                    Ok(0) => cx.error_spanned_by(
                        &lit,
                        format!("`keyset` option `page_size` must be in 1..={MAX_PAGE_SIZE}"),
                    ),
                    _ => cx.error_spanned_by(
                        &lit,
                        format!("`keyset` option `page_size` must be in 1..={MAX_PAGE_SIZE}; to read more, stream the query"),
                    ),
                }
            } else {
                cx.syn_error(attr::unknown_option(&meta, KEYSET, OPTIONS));
                attr::skip_value(&meta)?;
            }
            Ok(())
        });
        cx.ok(parsed);
    }

    let mut fields: Vec<(String, Type)> = Vec::new();
    // How each sort key was written, to name both spellings of a duplicate.
    let mut written: Vec<String> = Vec::new();
    for name in sort.get().map(|(_, n)| n).unwrap_or_default() {
        if name.value() == "_id" {
            cx.error_spanned_by(
                &name,
                "`_id` is always the last keyset sort key (the tie-break); leave it out of `sort`, or leave `sort` out to page by `_id` alone",
            );
            continue;
        }
        let Some(field) = model.resolve(cx, &name, KEYSET, SORT) else {
            continue;
        };
        if let Some(i) = fields.iter().position(|(n, _)| *n == field.bson_name) {
            let mut msg = format!("duplicate `keyset` sort key `{}`", field.bson_name);
            if written[i] != name.value() {
                msg.push_str(&format!(
                    "; `{}` and `{}` name the same field",
                    written[i],
                    name.value()
                ));
            }
            cx.error_spanned_by(&name, msg);
            continue;
        }
        fields.push((field.bson_name.clone(), field.ty.clone()));
        written.push(name.value());
    }
    Some(Keyset {
        sort: fields,
        order: order.get().map_or(Order::Asc, |(_, o)| o),
        page_size: page_size.get().map_or(DEFAULT_PAGE_SIZE, |(_, n)| n),
    })
}

fn parse_sort(meta: &syn::meta::ParseNestedMeta) -> syn::Result<Vec<LitStr>> {
    let expr = attr::parse_value(meta)?;
    let hint = "`keyset` option `sort` takes a field name or a list of them, as in `sort = \"date\"` or `sort = [\"day\", \"score\"]`";
    let lit = |e: &Expr| match attr::ungroup(e.clone()) {
        Expr::Lit(ExprLit {
            lit: Lit::Str(s), ..
        }) => Ok(s),
        other => Err(syn::Error::new_spanned(other, hint)),
    };
    match &expr {
        Expr::Array(ExprArray { elems, .. }) => {
            if elems.is_empty() {
                return Err(syn::Error::new(
                    expr.span(),
                    "`keyset` option `sort` is empty; name at least one field, or leave `sort` out to page by `_id`",
                ));
            }
            elems.iter().map(lit).collect()
        }
        other => Ok(vec![lit(other)?]),
    }
}

impl Keyset {
    /// `Model::KEYSET`.
    pub fn expand_const(&self, p: &Private) -> TokenStream {
        let names = self.sort.iter().map(|(n, _)| n);
        let descending = self.order.is_descending();
        let page_size = self.page_size as u32;
        quote! {
            const KEYSET: #p::KeysetSpec = #p::KeysetSpec {
                sort: &[#(#names),*],
                descending: #descending,
                page_size: #page_size,
            };
        }
    }

    /// Each sort key's type must have one BSON order; the error lands on the
    /// field's type. And the limits checked here are the runtime's.
    pub fn expand_checks(&self, input: &DeriveInput, p: &Private) -> TokenStream {
        let (impl_g, _, where_g) = input.generics.split_for_impl();
        let checks = self.sort.iter().map(|(_, ty)| {
            let p = p.at(ty.span());
            quote_spanned! {ty.span()=>
                #p::assert_sort_key::<#ty>();
            }
        });
        quote! {
            const _: () = {
                #[allow(dead_code)]
                fn __keyset_sort_keys #impl_g () #where_g { #(#checks)* }
            };
            const _: () = #p::core::assert!(
                #MAX_PAGE_SIZE == #p::limits::MAX_PAGE_SIZE as u64,
                "`#[keyset]` checks `page_size` against another maximum than the runtime's",
            );
            const _: () = #p::core::assert!(
                #DEFAULT_PAGE_SIZE == #p::limits::DEFAULT_PAGE_SIZE as u64,
                "`#[keyset]` fills in another default `page_size` than the runtime's",
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use syn::parse_quote;

    fn errors(input: DeriveInput) -> Vec<String> {
        crate::ctxt::collect(|cx| {
            if let Some(m) = Input::from_syn(cx, &input) {
                parse(cx, &input, &m);
            }
        })
        .1
    }

    fn parsed(input: DeriveInput) -> Keyset {
        let (k, e) = crate::ctxt::collect(|cx| {
            let m = Input::from_syn(cx, &input).unwrap();
            parse(cx, &input, &m).unwrap()
        });
        assert!(e.is_empty(), "{e:?}");
        k
    }

    #[test]
    fn sort_list_resolves_rust_and_bson_names() {
        let k = parsed(parse_quote! {
            #[serde(rename_all = "camelCase")]
            #[keyset(sort = ["init_time", "visitorId"], order = "desc", page_size = 500)]
            struct V { init_time: i64, visitor_id: String }
        });
        assert_eq!(
            k.sort.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
            ["initTime", "visitorId"]
        );
        assert_eq!(k.order, Order::Desc);
        assert_eq!(k.page_size, 500);
    }

    #[test]
    fn defaults() {
        let k = parsed(parse_quote! { #[keyset] struct V { a: i64 } });
        assert!(k.sort.is_empty() && k.order == Order::Asc && k.page_size == 100);
    }

    #[test]
    fn every_mistake_is_reported_at_once() {
        let e = errors(parse_quote! {
            #[keyset(sort = ["_id", "a", "a", "nope"], order = "up", page_size = 0, colour = 1)]
            struct V { a: i64 }
        });
        assert_eq!(e.len(), 6, "{e:#?}");
        assert!(e[0].contains("order `up`"), "{e:#?}");
        assert!(e[2].contains("option `colour`"), "{e:#?}");
        assert!(e[3].contains("`_id` is always"), "{e:#?}");
        assert!(e[4].contains("duplicate `keyset` sort key `a`"), "{e:#?}");
        assert!(e[5].contains("not a field"), "{e:#?}");
    }

    #[test]
    fn wrong_value_types() {
        let e = errors(parse_quote! { #[keyset(sort = 5)] struct V { a: i64 } });
        assert!(e[0].contains("takes a field name"), "{e:?}");
        let e = errors(parse_quote! { #[keyset(page_size = "5")] struct V { a: i64 } });
        assert!(e[0].contains("integer literal"), "{e:?}");
        let e = errors(parse_quote! { #[keyset(sort = [])] struct V { a: i64 } });
        assert!(e[0].contains("is empty"), "{e:?}");
    }
}
