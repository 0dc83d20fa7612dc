//! `#[model(collection = "...", crate = "...")]`, and the `Model` impl
//! every derive emits.

use proc_macro2::TokenStream;
use quote::quote;
use syn::{DeriveInput, LitStr, Meta, Path};

use crate::attr::{self, Opt};
use crate::ctxt::Ctxt;
use crate::private::Private;

const MODEL: &str = "model";
const COLLECTION: &str = "collection";
const CRATE: &str = "crate";
const VALIDATE: &str = "validate";
const OPTIONS: &[&str] = &[COLLECTION, CRATE, VALIDATE];
/// `validate`'s values and the runtime's `Validation` variants.
const LEVELS: &[(&str, &str)] = &[
    ("moderate", "Moderate"),
    ("strict", "Strict"),
    ("warn", "Warn"),
    ("off", "Off"),
];

pub struct Model {
    pub collection: String,
    /// The `Validation` variant `validate` names, when given.
    pub validation: Option<&'static str>,
    /// Where the expansion finds the runtime.
    pub private: Private,
}

/// `#[model]` as written.
struct Attr<'c> {
    collection: Opt<'c, LitStr>,
    krate: Opt<'c, LitStr>,
    validate: Opt<'c, LitStr>,
}

/// Parses `#[model]`; without one, the collection is the struct's name in
/// snake_case.
pub fn parse(cx: &Ctxt, input: &DeriveInput) -> Model {
    let attr = attr(cx, input);
    check(cx, input, attr)
}

/// Reads `#[model]`'s options.
fn attr<'c>(cx: &'c Ctxt, input: &DeriveInput) -> Attr<'c> {
    let mut out = Attr {
        collection: Opt::new(cx, MODEL, COLLECTION),
        krate: Opt::new(cx, MODEL, CRATE),
        validate: Opt::new(cx, MODEL, VALIDATE),
    };
    let Some(attrs) = attr::single(cx, &input.attrs, MODEL) else {
        return out;
    };
    if let Meta::Path(_) = attrs[0].meta {
        cx.error_spanned_by(
            attrs[0],
            "`#[model]` needs options, as in `#[model(collection = \"history\")]`; without `#[model]`, the collection is the struct's name in snake_case",
        );
    }
    for opt in attr::read(cx, attrs[0]) {
        match opt.name.as_str() {
            // collection = "name"
            COLLECTION => {
                let lit = opt.lit_str(cx, MODEL, "collection = \"history\"");
                out.collection.take(&opt, lit);
            }
            // crate = "path::to::mongo_patterns"
            CRATE => {
                let lit = opt.lit_str(cx, MODEL, "crate = \"my_facade::mongo_patterns\"");
                out.krate.take(&opt, lit);
            }
            // validate = "moderate" | "strict" | "warn" | "off"
            VALIDATE => {
                let lit = opt.lit_str(cx, MODEL, "validate = \"strict\"");
                out.validate.take(&opt, lit);
            }
            _ => opt.unknown(cx, MODEL, OPTIONS),
        }
    }
    out
}

/// Judges the collection name and the crate path.
fn check(cx: &Ctxt, input: &DeriveInput, attr: Attr) -> Model {
    let collection = attr.collection.get().map(|(_, lit)| {
        if let Some(why) = attr::bad_collection_name(&lit.value()) {
            cx.error_spanned_by(&lit, format!("invalid collection name: {why}"));
        }
        lit.value()
    });
    let krate = attr.krate.get().and_then(|(_, lit)| match lit.parse::<Path>() {
        Ok(path) => Some(path),
        Err(_) => {
            cx.error_spanned_by(
                &lit,
                format!("`model` option `crate` takes a path to the `mongo_patterns` crate or a re-export of it, as in `crate = \"my_facade::mongo_patterns\"`; `{}` is not a path", lit.value()),
            );
            None
        }
    });
    let validation = attr.validate.get().and_then(|(_, lit)| {
        let value = lit.value();
        let found = LEVELS.iter().find(|(name, _)| *name == value);
        if found.is_none() {
            cx.error_spanned_by(
                &lit,
                format!("`validate` is one of \"moderate\" (the default: inserts and updates of valid documents are checked), \"strict\" (every write), \"warn\" (logged, not refused) or \"off\" (no validator); not \"{value}\""),
            );
        }
        found.map(|(_, variant)| *variant)
    });
    Model {
        collection: collection.unwrap_or_else(|| snake_case(&input.ident.to_string())),
        validation,
        private: Private::new(krate),
    }
}

impl Model {
    /// The `Model` impl, with `items` (the keyset's const, `declared`) in it.
    /// `documents`: the model is stored one document per value (it has
    /// no `#[bucket]`), so it also gets `Documents` (`collection`,
    /// `keyset`).
    pub fn expand(&self, input: &DeriveInput, items: TokenStream, documents: bool) -> TokenStream {
        let p = &self.private;
        let ident = &input.ident;
        let (impl_g, ty_g, where_g) = input.generics.split_for_impl();
        let collection = &self.collection;
        let validation = self.validation.map(|v| {
            let v = syn::Ident::new(v, proc_macro2::Span::call_site());
            quote!(const VALIDATION: #p::Validation = #p::Validation::#v;)
        });
        let documents = documents.then(|| {
            quote! {
                #[automatically_derived]
                impl #impl_g #p::Documents for #ident #ty_g #where_g {}
            }
        });
        quote! {
            #[automatically_derived]
            impl #impl_g #p::Model for #ident #ty_g #where_g {
                const COLLECTION: &'static str = #collection;
                #validation
                #items
            }
            #documents
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
            #[automatically_derived]
            impl #impl_g #p::Documents for #ident #ty_g #where_g {}
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
        assert!(err[0].contains("did you mean `collection`"));
        assert!(err[1].contains("reserves `$`"));

        // A wrongly typed value does not stop the reading.
        let input: DeriveInput = parse_quote! { #[model(collection = 5, crate = history, colour = "x")] struct T { a: i32 } };
        let (_, err) = collect(|cx| parse(cx, &input));
        assert_eq!(err.len(), 3, "{err:?}");
        assert!(
            err[0].contains("`collection` takes a string literal"),
            "{err:?}"
        );
        assert!(err[1].contains("`crate` takes a string literal"), "{err:?}");

        // Forms without options.
        for input in [
            parse_quote! { #[model] struct T { a: i32 } },
            parse_quote! { #[model = "x"] struct T { a: i32 } },
        ] {
            let input: DeriveInput = input;
            let (_, err) = collect(|cx| parse(cx, &input));
            assert_eq!(err.len(), 1, "{err:?}");
        }
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
