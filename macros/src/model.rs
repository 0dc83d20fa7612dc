//! `#[derive(Model)]`: the struct as serde stores it (its fields under their
//! BSON names), `#[model(collection = "...")]`, and the expansion that wires
//! the patterns' attributes to the runtime.

use proc_macro2::TokenStream;
use quote::quote;
use syn::{Data, DeriveInput, Fields, GenericParam, Ident, LitStr, Type};

use crate::attr::{self, Opt};
use crate::ctxt::Ctxt;
use crate::{approx_counter, bucket, keyset, rank_histogram, shard_key};

const MODEL: &str = "model";
const COLLECTION: &str = "collection";
const SERDE: &str = "serde";

/// The struct as the patterns see it.
pub struct Input<'a> {
    pub ident: &'a Ident,
    pub fields: Vec<Field<'a>>,
    pub collection: String,
}

/// One field: its Rust name, its BSON name and whether serde stores it.
pub struct Field<'a> {
    pub ident: &'a Ident,
    pub ty: &'a Type,
    pub rust_name: String,
    pub bson_name: String,
    /// Why serde does not store it under its own name (`skip`, `flatten`).
    pub not_stored: Option<&'static str>,
}

pub fn derive(input: &DeriveInput) -> TokenStream {
    let cx = Ctxt::new();
    let model = Input::from_syn(&cx, input);
    let keyset = model.as_ref().and_then(|m| keyset::parse(&cx, input, m));
    let bucket = model.as_ref().and_then(|m| bucket::parse(&cx, input, m));
    let rank = model
        .as_ref()
        .and_then(|m| rank_histogram::parse(&cx, input, m));
    let counters = model
        .as_ref()
        .and_then(|m| approx_counter::parse(&cx, input, m));
    let shard = model.as_ref().and_then(|m| shard_key::parse(&cx, input, m));
    if let Some(errors) = cx.into_compile_errors() {
        let stub = stub(input);
        let shard_stub = model.as_ref().and_then(|m| shard_key::stub(input, m));
        let counter_stub = model.as_ref().and_then(|m| approx_counter::stub(input, m));
        let bucket_stub = model.as_ref().and_then(|m| bucket::stub(input, m));
        let rank_stub = model.as_ref().and_then(|m| rank_histogram::stub(input, m));
        return quote! { #errors #stub #bucket_stub #rank_stub #counter_stub #shard_stub };
    }
    let model = model.expect("no errors, so parsed");
    let repos = Repositories {
        bucket: bucket.is_some(),
        rank: rank.is_some(),
        shard: shard.is_some(),
        counters: counters.as_ref().map(|c| c.accessors()).unwrap_or_default(),
    };
    let mut out = expand(input, &model, keyset.as_ref(), &repos);
    out.extend(bucket.map(|b| b.expand(input)));
    out.extend(rank.map(|r| r.expand(input)));
    out.extend(counters.map(|c| c.expand(input)));
    out.extend(shard.map(|s| s.expand(input)));
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

fn expand(
    input: &DeriveInput,
    model: &Input,
    keyset: Option<&keyset::Keyset>,
    repos: &Repositories,
) -> TokenStream {
    let ident = model.ident;
    let (impl_g, ty_g, where_g) = input.generics.split_for_impl();
    let collection = &model.collection;
    let keyset_const = keyset.map(|k| k.expand_const());
    let keyset_checks = keyset.map(|k| k.expand_checks(input));
    let declared = expand_declared(repos);
    quote! {
        #[automatically_derived]
        impl #impl_g ::mongo_patterns::__private::Model for #ident #ty_g #where_g {
            const COLLECTION: &'static str = #collection;
            #keyset_const
            #declared
        }
        #keyset_checks
    }
}

/// `Model::declared` gathering every repository's declarations, after the
/// keyset's (the trait's default, used when the struct has no repository).
fn expand_declared(repos: &Repositories) -> Option<TokenStream> {
    let p = quote!(::mongo_patterns::__private);
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
    Some(quote! {
        fn declared(db: &#p::Database) -> #p::Vec<#p::Declared> {
            let mut all = #p::keyset_declared(
                db,
                <Self as #p::Model>::COLLECTION,
                <Self as #p::Model>::KEYSET,
            );
            #( #p::core::iter::Extend::extend(&mut all, #parts); )*
            all
        }
    })
}

/// After an error, an impl that claims nothing, so that uses elsewhere in the
/// user's crate do not add errors of their own.
fn stub(input: &DeriveInput) -> TokenStream {
    let ident = &input.ident;
    let (impl_g, ty_g, where_g) = input.generics.split_for_impl();
    quote! {
        #[automatically_derived]
        impl #impl_g ::mongo_patterns::__private::Model for #ident #ty_g #where_g {
            const COLLECTION: &'static str = "";
        }
    }
}

impl<'a> Input<'a> {
    /// Parses the struct; `None` when its shape cannot be a model at all.
    pub fn from_syn(cx: &Ctxt, input: &'a DeriveInput) -> Option<Self> {
        let fields = match &input.data {
            Data::Struct(s) => match &s.fields {
                Fields::Named(named) => &named.named,
                Fields::Unnamed(_) => {
                    cx.error_spanned_by(
                        &input.ident,
                        "`Model` needs a struct with named fields: a document's fields have names, a tuple struct's do not",
                    );
                    return None;
                }
                Fields::Unit => {
                    cx.error_spanned_by(
                        &input.ident,
                        "`Model` needs a struct with named fields; a unit struct stores nothing",
                    );
                    return None;
                }
            },
            Data::Enum(e) => {
                cx.error_spanned_by(
                    e.enum_token,
                    "`Model` cannot be derived for an enum; derive it on a struct with named fields",
                );
                return None;
            }
            Data::Union(u) => {
                cx.error_spanned_by(
                    u.union_token,
                    "`Model` cannot be derived for a union; derive it on a struct with named fields",
                );
                return None;
            }
        };
        for param in &input.generics.params {
            if let GenericParam::Lifetime(l) = param {
                cx.error_spanned_by(
                    l,
                    "a `Model` cannot borrow: documents are read back as owned values (`DeserializeOwned`); use owned types such as `String`",
                );
            }
        }
        let rule = container_rename_rule(cx, input);
        let fields = fields.iter().map(|f| Field::from_syn(f, rule)).collect();
        let collection = collection_name(cx, input);
        Some(Input {
            ident: &input.ident,
            fields,
            collection,
        })
    }

    /// The stored field that `name` means, by BSON name or Rust name. Reports
    /// an unknown or unstored field at `name` and returns `None`.
    pub fn resolve(
        &self,
        cx: &Ctxt,
        name: &LitStr,
        attr: &str,
        option: &str,
    ) -> Option<&Field<'a>> {
        let value = name.value();
        let found = self
            .fields
            .iter()
            .find(|f| f.bson_name == value)
            .or_else(|| self.fields.iter().find(|f| f.rust_name == value));
        match found {
            Some(f) => {
                if let Some(why) = f.not_stored {
                    cx.error_spanned_by(
                        name,
                        format!(
                            "`{attr}` option `{option}` cannot use field `{}`: it is {why}",
                            f.rust_name
                        ),
                    );
                    return None;
                }
                Some(f)
            }
            None => {
                let names: Vec<String> = self
                    .fields
                    .iter()
                    .filter(|f| f.not_stored.is_none())
                    .map(|f| format!("`{}`", f.bson_name))
                    .collect();
                let mut msg = format!(
                    "`{attr}` option `{option}` names `{value}`, which is not a field of `{}`; its stored fields are {}",
                    self.ident,
                    if names.is_empty() { "none".to_owned() } else { names.join(", ") }
                );
                let candidates = self
                    .fields
                    .iter()
                    .flat_map(|f| [f.bson_name.as_str(), f.rust_name.as_str()]);
                if let Some(s) = attr::did_you_mean(&value, candidates) {
                    let f = self
                        .fields
                        .iter()
                        .find(|f| f.bson_name == s || f.rust_name == s)
                        .expect("a candidate");
                    msg.push_str(&format!("\nhelp: did you mean `{}`?", f.bson_name));
                }
                cx.error_spanned_by(name, msg);
                None
            }
        }
    }
}

impl<'a> Field<'a> {
    fn from_syn(field: &'a syn::Field, rule: RenameRule) -> Self {
        let ident = field.ident.as_ref().expect("named field");
        let rust_name = ident.to_string().trim_start_matches("r#").to_owned();
        let mut bson_name = rule.apply(&rust_name);
        let mut not_stored = None;
        for a in field.attrs.iter().filter(|a| a.path().is_ident(SERDE)) {
            // Serde reports its own syntax errors; here only the names matter.
            let _ = a.parse_nested_meta(|meta| {
                let key = attr::option_name(&meta);
                match key.as_str() {
                    // rename = "x" | rename(serialize = "x", ...)
                    "rename" => {
                        if meta.input.peek(syn::Token![=]) {
                            bson_name = meta.value()?.parse::<LitStr>()?.value();
                        } else {
                            meta.parse_nested_meta(|inner| {
                                if inner.path.is_ident("serialize") {
                                    bson_name = inner.value()?.parse::<LitStr>()?.value();
                                } else {
                                    attr::skip_value(&inner)?;
                                }
                                Ok(())
                            })?;
                        }
                    }
                    "skip" => not_stored = Some("`#[serde(skip)]`, so serde never stores it"),
                    "skip_serializing" => not_stored = Some("`#[serde(skip_serializing)]`, so serde never stores it"),
                    "flatten" => not_stored = Some("`#[serde(flatten)]`, so its fields are stored at the top level, not under its name"),
                    _ => attr::skip_value(&meta)?,
                }
                Ok(())
            });
        }
        Field {
            ident,
            ty: &field.ty,
            rust_name,
            bson_name,
            not_stored,
        }
    }
}

/// `#[model(collection = "...")]`, or the struct's name in snake_case.
fn collection_name(cx: &Ctxt, input: &DeriveInput) -> String {
    let mut collection = Opt::new(cx, MODEL, COLLECTION);
    let mut seen = false;
    for a in input.attrs.iter().filter(|a| a.path().is_ident(MODEL)) {
        if seen {
            cx.error_spanned_by(a, "duplicate `#[model]` attribute; put all options in one");
            continue;
        }
        seen = true;
        let parsed = a.parse_nested_meta(|meta| {
            // collection = "name"
            if meta.path.is_ident(COLLECTION) {
                let lit = attr::parse_lit_str(&meta, MODEL)?;
                if let Some(why) = bad_collection_name(&lit.value()) {
                    cx.error_spanned_by(&lit, format!("invalid collection name: {why}"));
                }
                collection.set(&lit, lit.value());
                Ok(())
            } else {
                cx.syn_error(attr::unknown_option(&meta, MODEL, &[COLLECTION]));
                attr::skip_value(&meta)
            }
        });
        if let Err(e) = parsed {
            cx.syn_error(e);
        }
    }
    collection
        .get()
        .map(|(_, name)| name)
        .unwrap_or_else(|| snake_case(&input.ident.to_string()))
}

pub fn bad_collection_name(name: &str) -> Option<&'static str> {
    if name.is_empty() {
        Some("it is empty")
    } else if name.contains('$') {
        Some("MongoDB reserves `$` in collection names")
    } else if name.contains('\0') {
        Some("it contains a NUL character")
    } else if name.starts_with("system.") {
        Some("`system.` collections belong to the server")
    } else {
        None
    }
}

/// `PageView` → `page_view`, `HTTPLog` → `http_log`.
pub fn snake_case(name: &str) -> String {
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

/// serde's `rename_all` rules, as serde applies them to field names.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RenameRule {
    None,
    Lower,
    Upper,
    Pascal,
    Camel,
    Snake,
    ScreamingSnake,
    Kebab,
    ScreamingKebab,
}

impl RenameRule {
    const NAMES: [(&'static str, RenameRule); 8] = [
        ("lowercase", RenameRule::Lower),
        ("UPPERCASE", RenameRule::Upper),
        ("PascalCase", RenameRule::Pascal),
        ("camelCase", RenameRule::Camel),
        ("snake_case", RenameRule::Snake),
        ("SCREAMING_SNAKE_CASE", RenameRule::ScreamingSnake),
        ("kebab-case", RenameRule::Kebab),
        ("SCREAMING-KEBAB-CASE", RenameRule::ScreamingKebab),
    ];

    fn from_str(s: &str) -> Option<Self> {
        Self::NAMES.iter().find(|(n, _)| *n == s).map(|(_, r)| *r)
    }

    pub fn apply(self, field: &str) -> String {
        match self {
            RenameRule::None | RenameRule::Lower | RenameRule::Snake => field.to_owned(),
            RenameRule::Upper | RenameRule::ScreamingSnake => field.to_ascii_uppercase(),
            RenameRule::Pascal => {
                let mut out = String::new();
                let mut cap = true;
                for c in field.chars() {
                    if c == '_' {
                        cap = true;
                    } else if cap {
                        out.push(c.to_ascii_uppercase());
                        cap = false;
                    } else {
                        out.push(c);
                    }
                }
                out
            }
            RenameRule::Camel => {
                let pascal = RenameRule::Pascal.apply(field);
                let mut chars = pascal.chars();
                match chars.next() {
                    Some(first) => first.to_ascii_lowercase().to_string() + chars.as_str(),
                    None => pascal,
                }
            }
            RenameRule::Kebab => field.replace('_', "-"),
            RenameRule::ScreamingKebab => field.to_ascii_uppercase().replace('_', "-"),
        }
    }
}

/// The container's `#[serde(rename_all = "...")]` (the serialize side: that is
/// what is stored).
fn container_rename_rule(cx: &Ctxt, input: &DeriveInput) -> RenameRule {
    let mut rule = RenameRule::None;
    let mut set = |lit: LitStr| match RenameRule::from_str(&lit.value()) {
        Some(r) => rule = r,
        None => cx.error_spanned_by(&lit, format!("unknown serde rename rule `{}`", lit.value())),
    };
    for a in input.attrs.iter().filter(|a| a.path().is_ident(SERDE)) {
        let _ = a.parse_nested_meta(|meta| {
            if meta.path.is_ident("rename_all") {
                if meta.input.peek(syn::Token![=]) {
                    set(meta.value()?.parse()?);
                } else {
                    meta.parse_nested_meta(|inner| {
                        if inner.path.is_ident("serialize") {
                            set(inner.value()?.parse()?);
                        } else {
                            attr::skip_value(&inner)?;
                        }
                        Ok(())
                    })?;
                }
                Ok(())
            } else {
                attr::skip_value(&meta)
            }
        });
    }
    rule
}

#[cfg(test)]
mod tests {
    use super::*;
    use syn::parse_quote;

    fn names(input: DeriveInput) -> Vec<(String, String)> {
        let cx = Ctxt::new();
        let m = Input::from_syn(&cx, &input).unwrap();
        let out = m
            .fields
            .iter()
            .map(|f| (f.rust_name.clone(), f.bson_name.clone()))
            .collect();
        cx.check().unwrap();
        out
    }

    #[test]
    fn serde_names_resolve() {
        let n = names(parse_quote! {
            #[serde(rename_all = "camelCase")]
            struct Trade {
                customer_id: i64,
                #[serde(rename = "_id")] id: i64,
                #[serde(rename(serialize = "ts", deserialize = "t"))] at: i64,
                #[serde(default, skip_serializing_if = "Option::is_none", with = "x")] r#type: Option<i32>,
            }
        });
        assert_eq!(
            n,
            [
                ("customer_id", "customerId"),
                ("id", "_id"),
                ("at", "ts"),
                ("type", "type")
            ]
            .map(|(a, b)| (a.to_owned(), b.to_owned()))
        );
    }

    #[test]
    fn rename_rules_match_serde() {
        let f = "customer_id_2";
        let got: Vec<String> = RenameRule::NAMES.iter().map(|(_, r)| r.apply(f)).collect();
        assert_eq!(
            got,
            [
                "customer_id_2",
                "CUSTOMER_ID_2",
                "CustomerId2",
                "customerId2",
                "customer_id_2",
                "CUSTOMER_ID_2",
                "customer-id-2",
                "CUSTOMER-ID-2"
            ]
        );
    }

    #[test]
    fn default_collection_is_snake_case() {
        assert_eq!(snake_case("PageView"), "page_view");
        assert_eq!(snake_case("HTTPLog"), "http_log");
        assert_eq!(snake_case("Trade"), "trade");
        assert_eq!(snake_case("Log2Entry"), "log2_entry");
    }

    #[test]
    fn collection_attribute() {
        let cx = Ctxt::new();
        let input: DeriveInput =
            parse_quote! { #[model(collection = "history")] struct T { a: i32 } };
        assert_eq!(Input::from_syn(&cx, &input).unwrap().collection, "history");
        cx.check().unwrap();

        let cx = Ctxt::new();
        let input: DeriveInput =
            parse_quote! { #[model(collection = "a$b", colection = "x")] struct T { a: i32 } };
        Input::from_syn(&cx, &input);
        let err = cx
            .check()
            .unwrap_err()
            .into_iter()
            .map(|e| e.to_string())
            .collect::<Vec<_>>();
        assert_eq!(err.len(), 2, "{err:?}");
        assert!(err[0].contains("reserves `$`"));
        assert!(err[1].contains("did you mean `collection`"));
    }
}
