//! `#[keyset(sort = "...", order = "asc" | "desc", page_size = N)]`: the
//! model's default paging order. The runtime (`runtime/src/keyset.rs`) holds
//! the paging itself; this checks the options and wires the field names.

use proc_macro2::TokenStream;
use quote::{quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{DeriveInput, Expr, ExprArray, ExprLit, Lit, LitStr, Meta, Type};

use crate::attr::{self, Opt};
use crate::ctxt::Ctxt;
use crate::model::Input;

const KEYSET: &str = "keyset";
const SORT: &str = "sort";
const ORDER: &str = "order";
const PAGE_SIZE: &str = "page_size";
const OPTIONS: &[&str] = &[SORT, ORDER, PAGE_SIZE];

/// Must equal `mongo_patterns::keyset::MAX_PAGE_SIZE` (a UI test pins both).
const MAX_PAGE_SIZE: u64 = 100_000;
const DEFAULT_PAGE_SIZE: u64 = 100;

pub struct Keyset {
    /// BSON names and field types, most significant first.
    sort: Vec<(String, Type)>,
    descending: bool,
    page_size: u64,
}

/// Parses `#[keyset]` if present. Errors go to `cx`.
pub fn parse(cx: &Ctxt, input: &DeriveInput, model: &Input) -> Option<Keyset> {
    let mut attrs = input.attrs.iter().filter(|a| a.path().is_ident(KEYSET));
    let first = attrs.next()?;
    for dup in attrs {
        cx.error_spanned_by(
            dup,
            "duplicate `#[keyset]` attribute; put all options in one",
        );
    }
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
                match lit.value().as_str() {
                    "asc" | "ascending" => order.set(&lit, false),
                    "desc" | "descending" => order.set(&lit, true),
                    other => {
                        let msg = format!(
                            "unknown `keyset` order `{other}`; expected `asc` or `desc`{}",
                            attr::hint(other, ["asc", "desc", "ascending", "descending"])
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
        if let Err(e) = parsed {
            cx.syn_error(e);
        }
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
        descending: order.get().is_some_and(|(_, d)| d),
        page_size: page_size.get().map_or(DEFAULT_PAGE_SIZE, |(_, n)| n),
    })
}

fn parse_sort(meta: &syn::meta::ParseNestedMeta) -> syn::Result<Vec<LitStr>> {
    let expr = crate::attr::parse_value(meta)?;
    let hint = "`keyset` option `sort` takes a field name or a list of them, as in `sort = \"date\"` or `sort = [\"day\", \"score\"]`";
    let lit = |e: &Expr| match crate::attr::ungroup(e.clone()) {
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
    pub fn expand_const(&self) -> TokenStream {
        let names = self.sort.iter().map(|(n, _)| n);
        let descending = self.descending;
        let page_size = self.page_size as u32;
        quote! {
            const KEYSET: ::mongo_patterns::__private::KeysetSpec = ::mongo_patterns::__private::KeysetSpec {
                sort: &[#(#names),*],
                descending: #descending,
                page_size: #page_size,
            };
        }
    }

    /// Each sort key's type must have one BSON order; the error lands on the
    /// field's type.
    pub fn expand_checks(&self, input: &DeriveInput) -> TokenStream {
        let (impl_g, _, where_g) = input.generics.split_for_impl();
        let checks = self.sort.iter().map(|(_, ty)| {
            quote_spanned! {ty.span()=>
                ::mongo_patterns::__private::assert_sort_key::<#ty>();
            }
        });
        quote! {
            const _: () = {
                #[allow(dead_code)]
                fn __keyset_sort_keys #impl_g () #where_g { #(#checks)* }
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use syn::parse_quote;

    fn errors(input: DeriveInput) -> Vec<String> {
        let cx = Ctxt::new();
        if let Some(m) = Input::from_syn(&cx, &input) {
            parse(&cx, &input, &m);
        }
        cx.check()
            .err()
            .map_or(vec![], |e| e.into_iter().map(|e| e.to_string()).collect())
    }

    fn parsed(input: DeriveInput) -> Keyset {
        let cx = Ctxt::new();
        let m = Input::from_syn(&cx, &input).unwrap();
        let k = parse(&cx, &input, &m).unwrap();
        cx.check().unwrap();
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
        assert!(k.descending);
        assert_eq!(k.page_size, 500);
    }

    #[test]
    fn defaults() {
        let k = parsed(parse_quote! { #[keyset] struct V { a: i64 } });
        assert!(k.sort.is_empty() && !k.descending && k.page_size == 100);
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
