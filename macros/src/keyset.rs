//! `#[keyset(sort = "...", order = "asc" | "desc", page_size = N)]`: the
//! model's default paging order. The runtime's `keyset` module holds the
//! paging itself; this checks the options and wires the field names.

use proc_macro2::TokenStream;
use quote::{quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{DeriveInput, Expr, ExprArray, ExprLit, Lit, LitInt, LitStr, Type};

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
const MAX_PAGE_SIZE: u64 = 10_000;
const DEFAULT_PAGE_SIZE: u64 = 100;

pub struct Keyset {
    /// BSON names and field types, most significant first.
    sort: Vec<(String, Type)>,
    order: Order,
    page_size: u64,
}

/// `#[keyset]` as written.
struct Attr<'c> {
    sort: Opt<'c, Vec<LitStr>>,
    order: Opt<'c, Order>,
    page_size: Opt<'c, LitInt>,
}

/// Parses `#[keyset]` if present. Errors go to `cx`.
pub fn parse(cx: &Ctxt, input: &DeriveInput, model: &Input) -> Option<Keyset> {
    let attr = attr(cx, input)?;
    Some(check(cx, attr, model))
}

/// Reads `#[keyset]`'s options; `#[keyset]` alone means the defaults.
fn attr<'c>(cx: &'c Ctxt, input: &DeriveInput) -> Option<Attr<'c>> {
    let first = attr::single(cx, &input.attrs, KEYSET)?[0];
    let mut out = Attr {
        sort: Opt::new(cx, KEYSET, SORT),
        order: Opt::new(cx, KEYSET, ORDER),
        page_size: Opt::new(cx, KEYSET, PAGE_SIZE),
    };
    for opt in attr::read(cx, first) {
        match opt.name.as_str() {
            // sort = "field" | sort = ["field", ...]
            SORT => match sort_names(cx, &opt) {
                Some(names) => out.sort.set(&opt.path, names),
                None => out.sort.set_bad(&opt.path),
            },
            // order = "asc" | "desc"
            ORDER => {
                let Some(lit) = opt.lit_str(cx, KEYSET, "order = \"desc\"") else {
                    out.order.set_bad(&opt.path);
                    continue;
                };
                let other = lit.value();
                match Order::from_spelling(&other) {
                    Some(o) => out.order.set(&lit, o),
                    None => {
                        let msg = format!(
                            "unknown `keyset` order `{other}`; expected `asc` or `desc`{}",
                            attr::hint(&other, ["asc", "desc", "ascending", "descending"])
                        );
                        cx.error_spanned_by(&lit, msg);
                        out.order.set_bad(&lit);
                    }
                }
            }
            // page_size = 100
            PAGE_SIZE => {
                let lit = opt.lit_int(cx, KEYSET, "page_size = 100");
                out.page_size.take(&opt, lit);
            }
            _ => opt.unknown(cx, KEYSET, OPTIONS),
        }
    }
    Some(out)
}

/// `sort = "field"` or `sort = ["field", ...]`: the names, or `None` with
/// every element that is not a string reported.
fn sort_names(cx: &Ctxt, opt: &attr::RawOpt) -> Option<Vec<LitStr>> {
    let example = "sort = [\"day\", \"score\"]";
    let expr = opt.value(cx, KEYSET, example)?;
    let hint = "`keyset` option `sort` takes a field name or a list of them, as in `sort = \"date\"` or `sort = [\"day\", \"score\"]`";
    let lit = |e: &Expr| match attr::ungroup(e.clone()) {
        Expr::Lit(ExprLit {
            lit: Lit::Str(s), ..
        }) => Some(s),
        other => {
            cx.error_spanned_by(other, hint);
            None
        }
    };
    match expr {
        Expr::Array(ExprArray { elems, .. }) => {
            if elems.is_empty() {
                cx.error_spanned_by(
                    expr,
                    "`keyset` option `sort` is empty; name at least one field, or leave `sort` out to page by `_id`",
                );
                return None;
            }
            // Every element is judged, so that all bad ones are reported.
            let names: Vec<Option<LitStr>> = elems.iter().map(lit).collect();
            names.into_iter().collect()
        }
        other => Some(vec![lit(other)?]),
    }
}

/// Judges the page size and the sort keys against the struct.
fn check(cx: &Ctxt, attr: Attr, model: &Input) -> Keyset {
    let page_size = attr.page_size.get().and_then(|(_, lit)| {
        match lit.base10_parse::<u64>() {
            Ok(n) if (1..=MAX_PAGE_SIZE).contains(&n) => Some(n),
            Ok(0) => {
                cx.error_spanned_by(
                    &lit,
                    format!("`keyset` option `page_size` must be in 1..={MAX_PAGE_SIZE}"),
                );
                None
            }
            _ => {
                cx.error_spanned_by(
                    &lit,
                    format!("`keyset` option `page_size` must be in 1..={MAX_PAGE_SIZE}; to read more, stream the query"),
                );
                None
            }
        }
    });
    let mut fields: Vec<(String, Type)> = Vec::new();
    // How each sort key was written, to name both spellings of a duplicate.
    let mut written: Vec<String> = Vec::new();
    for name in attr.sort.get().map(|(_, n)| n).unwrap_or_default() {
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
    Keyset {
        sort: fields,
        order: attr.order.get().map_or(Order::Asc, |(_, o)| o),
        page_size: page_size.unwrap_or(DEFAULT_PAGE_SIZE),
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
        let e = errors(parse_quote! { #[keyset = "a"] struct V { a: i64 } });
        assert!(e[0].contains("takes options in parentheses"), "{e:?}");
    }

    #[test]
    fn every_mistake_is_reported_at_once() {
        let e = errors(parse_quote! {
            #[keyset(sort = ["_id", "a", "a", "nope"], order = "up", page_size = 0, colour = 1)]
            struct V { a: i64 }
        });
        assert_eq!(e.len(), 6, "{e:#?}");
        assert!(e[0].contains("order `up`"), "{e:#?}");
        assert!(e[1].contains("option `colour`"), "{e:#?}");
        assert!(e[2].contains("`page_size` must be in"), "{e:#?}");
        assert!(e[3].contains("`_id` is always"), "{e:#?}");
        assert!(e[4].contains("duplicate `keyset` sort key `a`"), "{e:#?}");
        assert!(e[5].contains("not a field"), "{e:#?}");
    }

    #[test]
    fn wrong_value_types() {
        // Every wrongly typed value is reported, and reading goes on.
        let e = errors(parse_quote! {
            #[keyset(sort = ["a", 1, b], page_size = "5", order = 3, sotr = "a")]
            struct V { a: i64 }
        });
        assert_eq!(e.len(), 5, "{e:#?}");
        assert!(e[0].contains("takes a field name") && e[1].contains("takes a field name"));
        assert!(e[2].contains("integer literal") && e[3].contains("string literal"));
        assert!(e[4].contains("did you mean `sort`"), "{e:#?}");
        let e = errors(parse_quote! { #[keyset(sort = 5)] struct V { a: i64 } });
        assert!(e[0].contains("takes a field name"), "{e:?}");
        let e = errors(parse_quote! { #[keyset(page_size = "5")] struct V { a: i64 } });
        assert!(e[0].contains("integer literal"), "{e:?}");
        let e = errors(parse_quote! { #[keyset(sort = [])] struct V { a: i64 } });
        assert!(e[0].contains("is empty"), "{e:?}");
    }
}
