//! `#[model(collection = "...", crate = "...")]`, and the `Model` impl
//! every derive emits.

use proc_macro2::TokenStream;
use quote::quote;
use syn::{DeriveInput, Path};

use crate::attr::{self, Opt};
use crate::ctxt::Ctxt;
use crate::private::Private;

const MODEL: &str = "model";
const COLLECTION: &str = "collection";
const CRATE: &str = "crate";
const OPTIONS: &[&str] = &[COLLECTION, CRATE];

pub struct Model {
    pub collection: String,
    /// Where the expansion finds the runtime.
    pub private: Private,
}

/// Parses `#[model]`; without one, the collection is the struct's name in
/// snake_case.
pub fn parse(cx: &Ctxt, input: &DeriveInput) -> Model {
    let mut collection = Opt::new(cx, MODEL, COLLECTION);
    let mut krate = Opt::new(cx, MODEL, CRATE);
    if let Some(attrs) = attr::single(cx, &input.attrs, MODEL) {
        let parsed = attrs[0].parse_nested_meta(|meta| {
            // collection = "name"
            if meta.path.is_ident(COLLECTION) {
                let lit = attr::parse_lit_str(&meta, MODEL)?;
                if let Some(why) = attr::bad_collection_name(&lit.value()) {
                    cx.error_spanned_by(&lit, format!("invalid collection name: {why}"));
                }
                collection.set(&lit, lit.value());
            // crate = "path::to::mongo_patterns"
            } else if meta.path.is_ident(CRATE) {
                let lit = attr::parse_lit_str(&meta, MODEL)?;
                match lit.parse::<Path>() {
                    Ok(path) => krate.set(&lit, path),
                    Err(_) => cx.error_spanned_by(
                        &lit,
                        format!("`model` option `crate` takes a path to the `mongo_patterns` crate or a re-export of it, as in `crate = \"my_facade::mongo_patterns\"`; `{}` is not a path", lit.value()),
                    ),
                }
            } else {
                cx.syn_error(attr::unknown_option(&meta, MODEL, OPTIONS));
                attr::skip_value(&meta)?;
            }
            Ok(())
        });
        cx.ok(parsed);
    }
    Model {
        collection: collection
            .get()
            .map(|(_, name)| name)
            .unwrap_or_else(|| snake_case(&input.ident.to_string())),
        private: Private::new(krate.get().map(|(_, p)| p)),
    }
}

impl Model {
    /// The `Model` impl, with `items` (the keyset's const, `declared`) in it.
    pub fn expand(&self, input: &DeriveInput, items: TokenStream) -> TokenStream {
        let p = &self.private;
        let ident = &input.ident;
        let (impl_g, ty_g, where_g) = input.generics.split_for_impl();
        let collection = &self.collection;
        quote! {
            #[automatically_derived]
            impl #impl_g #p::Model for #ident #ty_g #where_g {
                const COLLECTION: &'static str = #collection;
                #items
            }
        }
    }

    /// After an error, an impl that claims nothing, so that uses elsewhere in
    /// the user's crate do not add errors of their own.
    pub fn fallback(&self, input: &DeriveInput) -> TokenStream {
        let p = &self.private;
        let ident = &input.ident;
        let (impl_g, ty_g, where_g) = input.generics.split_for_impl();
        quote! {
            #[automatically_derived]
            impl #impl_g #p::Model for #ident #ty_g #where_g {
                const COLLECTION: &'static str = "";
            }
        }
    }
}

/// `PageView` → `page_view`, `HTTPLog` → `http_log`.
fn snake_case(name: &str) -> String {
    let chars: Vec<char> = name.trim_start_matches("r#").chars().collect();
    let mut out = String::new();
    for (i, &c) in chars.iter().enumerate() {
        if c.is_uppercase() {
            let prev_lower =
                i > 0 && (chars[i - 1].is_lowercase() || chars[i - 1].is_ascii_digit());
            let acronym_end = i > 0
                && chars[i - 1].is_uppercase()
                && chars.get(i + 1).is_some_and(|n| n.is_lowercase());
            if prev_lower || acronym_end {
                out.push('_');
            }
            out.extend(c.to_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ctxt::collect;
    use syn::parse_quote;

    #[test]
    fn default_collection_is_snake_case() {
        assert_eq!(snake_case("PageView"), "page_view");
        assert_eq!(snake_case("HTTPLog"), "http_log");
        assert_eq!(snake_case("Trade"), "trade");
        assert_eq!(snake_case("Log2Entry"), "log2_entry");
    }

    #[test]
    fn collection_attribute() {
        let input: DeriveInput =
            parse_quote! { #[model(collection = "history")] struct T { a: i32 } };
        let (m, err) = collect(|cx| parse(cx, &input));
        assert!(err.is_empty(), "{err:?}");
        assert_eq!(m.collection, "history");

        let input: DeriveInput =
            parse_quote! { #[model(collection = "a$b", colection = "x")] struct T { a: i32 } };
        let (_, err) = collect(|cx| parse(cx, &input));
        assert_eq!(err.len(), 2, "{err:?}");
        assert!(err[0].contains("reserves `$`"));
        assert!(err[1].contains("did you mean `collection`"));
    }

    #[test]
    fn crate_attribute() {
        let input: DeriveInput =
            parse_quote! { #[model(crate = "crate::facade")] struct T { a: i32 } };
        let (m, err) = collect(|cx| parse(cx, &input));
        assert!(err.is_empty(), "{err:?}");
        let p = &m.private;
        assert_eq!(quote!(#p).to_string(), "crate :: facade :: __private");

        let input: DeriveInput = parse_quote! { #[model(crate = "a b")] struct T { a: i32 } };
        let (_, err) = collect(|cx| parse(cx, &input));
        assert!(err[0].contains("takes a path"), "{err:?}");
        let input: DeriveInput = parse_quote! { #[model(crat = "x")] struct T { a: i32 } };
        let (_, err) = collect(|cx| parse(cx, &input));
        assert!(
            err[0].contains("expected one of `collection`, `crate`"),
            "{err:?}"
        );
    }
}
