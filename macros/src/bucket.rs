//! `#[bucket(size = N, key = "field", order = "field", items = "name")]`:
//! items stored many to a document per key. The runtime's `bucket` module
//! holds the pattern; this checks the options and wires the key field.

use proc_macro2::{TokenStream, TokenTree};
use quote::{quote, quote_spanned, ToTokens};
use syn::punctuated::Punctuated;
use syn::spanned::Spanned;
use syn::{Attribute, Data, DeriveInput, Fields, Ident, LitStr, Meta, Token, Type};

use crate::ast::Input;
use crate::attr::{self, Opt};
use crate::ctxt::Ctxt;
use crate::private::Private;

const BUCKET: &str = "bucket";
const SIZE: &str = "size";
const KEY: &str = "key";
const ORDER: &str = "order";
const ITEMS: &str = "items";
const OPTIONS: &[&str] = &[SIZE, KEY, ORDER, ITEMS];

/// The runtime's limit, repeated for the message; the expansion asserts
/// that they agree.
const MAX_SIZE: u64 = 10_000;
/// Field names the bucket document uses for its own bookkeeping.
const RESERVED: &[&str] = &["_id", "start", "count", "bytes", "sealed"];

/// What `#[bucket]` says, as far as it could be read.
pub struct Bucket {
    /// The field `key` names, found even when it cannot be the key: after an
    /// error, the fallback keeps its type, so that typed calls still check.
    named_key: Option<(Ident, Type)>,
    /// The whole declaration; `None` after an error.
    spec: Option<Spec>,
}

struct Spec {
    size: u64,
    key: (String, Ident, Type),
    order: Option<(String, Type)>,
    items: String,
}

/// Parses `#[bucket]` if present. Errors go to `cx`.
pub fn parse(cx: &Ctxt, input: &DeriveInput, model: &Input) -> Option<Bucket> {
    let attrs = attr::single(cx, &input.attrs, BUCKET)?;
    let mut named_key = None;
    let spec = parse_spec(cx, &attrs, model, &mut named_key);
    Some(Bucket { named_key, spec })
}

fn parse_spec(
    cx: &Ctxt,
    attrs: &[&Attribute],
    model: &Input,
    named_key: &mut Option<(Ident, Type)>,
) -> Option<Spec> {
    let first = attrs[0];
    if let Meta::Path(_) = first.meta {
        cx.error_spanned_by(
            first,
            "`#[bucket]` needs options, as in `#[bucket(size = 1000, key = \"customerId\")]`",
        );
        return None;
    }
    // A value that is given but wrong is `None`: it counts as given, so no
    // "missing" error lands on top of the error about the value.
    let mut size = Opt::new(cx, BUCKET, SIZE);
    let mut key = Opt::new(cx, BUCKET, KEY);
    let mut order = Opt::new(cx, BUCKET, ORDER);
    let mut items = Opt::new(cx, BUCKET, ITEMS);
    // Options an unknown option looks like a typo of.
    let mut meant: Vec<&str> = Vec::new();
    // The options of every `#[bucket]`, so that a split attribute is reported
    // once, as a duplicate, and not also as missing options.
    let mut read = true;
    for a in attrs.iter().filter(|a| !matches!(a.meta, Meta::Path(_))) {
        let parsed = a.parse_nested_meta(|meta| {
            // size = 1000
            if meta.path.is_ident(SIZE) {
                let Some(lit) = attr::recover(cx, &meta, attr::parse_lit_int(&meta, BUCKET))? else {
                    size.set(&meta.path, None);
                    return Ok(());
                };
                match lit.base10_parse::<u64>() {
                    Ok(0) => {
                        cx.error_spanned_by(&lit, "`bucket` option `size` must be at least 1");
                        size.set(&lit, None);
                    }
                    Ok(n) if n <= MAX_SIZE => size.set(&lit, Some(n)),
                    _ => {
                        cx.error_spanned_by(
                            &lit,
                            format!("`bucket` option `size` is at most {MAX_SIZE}: larger buckets are megabytes that every page read loads; for measurements over time, use a time-series collection"),
                        );
                        size.set(&lit, None);
                    }
                }
            // key = "field" | order = "field" | items = "name"
            } else if let Some(slot) = [(KEY, &mut key), (ORDER, &mut order), (ITEMS, &mut items)]
                .into_iter()
                .find_map(|(name, slot)| meta.path.is_ident(name).then_some(slot))
            {
                match attr::recover(cx, &meta, attr::parse_lit_str(&meta, BUCKET))? {
                    Some(lit) => slot.set(&lit, Some(lit.clone())),
                    None => slot.set(&meta.path, None),
                }
            } else {
                meant.extend(attr::did_you_mean(&attr::option_name(&meta), OPTIONS.iter().copied()));
                cx.syn_error(attr::unknown_option(&meta, BUCKET, OPTIONS));
                attr::skip_value(&meta)?;
            }
            Ok(())
        });
        if cx.ok(parsed).is_none() {
            read = false;
            break;
        }
    }

    let key: Option<Option<LitStr>> = key.get().map(|(_, k)| k);
    *named_key = key
        .iter()
        .flatten()
        .find_map(|lit| model.find(&lit.value()))
        .map(|f| (f.ident.clone(), f.ty.clone()));
    if !read {
        // The rest of the attribute went unread: "missing" would guess.
        return None;
    }
    let size = size.get().map(|(_, n)| n);
    let order = order.get().and_then(|(_, o)| o);
    let items = items.get().map(|(_, i)| i);
    for (missing, name, what) in [
        (
            size.is_none(),
            SIZE,
            "the items per bucket, as in `size = 1000`",
        ),
        (
            key.is_none(),
            KEY,
            "the field that groups items, as in `key = \"customerId\"`",
        ),
    ] {
        // A misspelt option was reported already, with this one as its hint.
        if missing && !meant.contains(&name) {
            cx.error_spanned_by(first, format!("`#[bucket]` needs option `{name}`, {what}"));
        }
    }
    let key = key.flatten().and_then(|lit| {
        let written = lit.value();
        // `_id` is checked before it is looked up: no field need be named so.
        let field = match written.as_str() {
            "_id" => None,
            _ => Some(model.resolve(cx, &lit, BUCKET, KEY)?),
        };
        let stored = field.map_or("_id", |f| f.bson_name.as_str());
        let named = if written == stored {
            format!("`{stored}`")
        } else {
            format!("`{written}`, stored as `{stored}`")
        };
        // The key sits at the top of each bucket, beside the bookkeeping.
        if stored == "_id" {
            cx.error_spanned_by(
                &lit,
                format!("`bucket` option `key` names {named}: each bucket has its own `_id`, so it cannot be a bucket key; name the field that groups items"),
            );
            return None;
        }
        if RESERVED.contains(&stored) {
            cx.error_spanned_by(
                &lit,
                format!("`bucket` option `key` names {named}, which the bucket keeps for itself (`start`, `count`, `bytes` and `sealed` are taken); store the field under another name with `#[serde(rename = \"...\")]`"),
            );
            return None;
        }
        let f = field?;
        Some((f.bson_name.clone(), f.ident.clone(), f.ty.clone()))
    });
    let order = order.and_then(|lit| {
        let f = model.resolve(cx, &lit, BUCKET, ORDER)?;
        if key.as_ref().is_some_and(|(k, _, _)| *k == f.bson_name) {
            cx.error_spanned_by(
                &lit,
                format!("`bucket` option `order` names the key field `{}`, which is the same for every item of a bucket; name a time or a number to sort items by, or leave `order` out to keep them in insertion order", f.bson_name),
            );
            return None;
        }
        Some((f.bson_name.clone(), f.ty.clone()))
    });
    let items = match items.flatten() {
        Some(lit) => {
            let name = lit.value();
            let clash = RESERVED.contains(&name.as_str())
                || key.as_ref().is_some_and(|(k, _, _)| *k == name);
            if name.is_empty() || name.contains('.') || name.starts_with('$') {
                cx.error_spanned_by(
                    &lit,
                    "`bucket` option `items` names the array field, so it must be a plain field name: not empty, no `.`, not starting with `$`",
                );
            } else if clash {
                cx.error_spanned_by(
                    &lit,
                    format!("`bucket` option `items` names `{name}`, which clashes with a field the bucket keeps: `_id`, the key, `start`, `count`, `bytes` and `sealed` are taken"),
                );
            }
            name
        }
        None => "items".to_owned(),
    };
    Some(Spec {
        size: size??,
        key: key?,
        order,
        items,
    })
}

impl Bucket {
    pub fn expand(&self, input: &DeriveInput, p: &Private) -> Option<TokenStream> {
        let spec = self.spec.as_ref()?;
        let ident = &input.ident;
        let (impl_g, ty_g, where_g) = input.generics.split_for_impl();
        let size = spec.size as u32;
        let (key_name, key_ident, key_ty) = &spec.key;
        let order = match &spec.order {
            Some((name, _)) => quote!(#p::core::option::Option::Some(#name)),
            None => quote!(#p::core::option::Option::None),
        };
        let items = &spec.items;
        // `Bucketed::Key` requires `BucketKey`: the error lands on the field.
        let key_assoc = quote_spanned! {key_ty.span()=> type Key = #key_ty; };
        let decode_item = keyless_decoder(input, key_name, key_ident, p);
        let order_check = spec.order.as_ref().map(|(_, ty)| {
            let p = p.at(ty.span());
            quote_spanned! {ty.span()=>
                #p::assert_order_key::<#ty>();
            }
        });
        Some(quote! {
            #[automatically_derived]
            impl #impl_g #p::Bucketed for #ident #ty_g #where_g {
                #key_assoc
                const BUCKET: #p::BucketSpec = #p::BucketSpec {
                    size: #size,
                    key: #key_name,
                    order: #order,
                    items: #items,
                };
                fn bucket_key(&self) -> &Self::Key {
                    &self.#key_ident
                }
                #decode_item
            }
            const _: () = {
                #[allow(dead_code)]
                fn __bucket_fields #impl_g () #where_g { #order_check }
            };
            const _: () = #p::core::assert!(
                #MAX_SIZE == #p::limits::BUCKET_MAX_SIZE as u64,
                "`#[bucket]` checks `size` against another maximum than the runtime's",
            );
        })
    }

    /// After an error in a `#[bucket]` model, an impl that claims nothing, so
    /// that `Trade::buckets(&db)` elsewhere adds no error of its own. It keeps
    /// the key's type when the key names a field, so typed calls still check.
    pub fn fallback(&self, input: &DeriveInput, p: &Private) -> TokenStream {
        let (key_ty, key_ref) = match &self.named_key {
            Some((ident, ty)) => (quote_spanned!(ty.span()=> #ty), quote!(&self.#ident)),
            // Any key type the runtime accepts: `Bucketed::Key` requires one.
            None => (quote!(bool), quote!(&false)),
        };
        let ident = &input.ident;
        let (impl_g, ty_g, where_g) = input.generics.split_for_impl();
        quote! {
            #[automatically_derived]
            impl #impl_g #p::Bucketed for #ident #ty_g #where_g {
                type Key = #key_ty;
                const BUCKET: #p::BucketSpec = #p::BucketSpec::FALLBACK;
                fn bucket_key(&self) -> &Self::Key {
                    #key_ref
                }
            }
        }
    }
}

/// Container attributes of serde that a decoder of the model without its
/// key keeps, and those that do not change how fields are read.
const KEEP: &[&str] = &["rename_all", "deny_unknown_fields"];
const IRRELEVANT: &[&str] = &["rename", "expecting", "crate", "into"];
/// Serde attributes of the key field that do not change how it reads, given
/// that the key is handed over as a value and not looked up by name.
const KEY_IRRELEVANT: &[&str] = &["rename", "alias", "skip_serializing_if", "serialize_with"];

/// Stored items lack the key: the runtime hands it over. A shadow of the
/// model without its key field, with the same serde attributes, decodes an
/// item straight from its bytes, and the model is built from it and the key.
/// `None` (the runtime's generic decoder) when an attribute could change
/// what the shadow reads (`from`, container `default`, a `with` on the key,
/// a `cfg` on a field), or the shadow could not name a field's type
/// (generics, `Self`).
fn keyless_decoder(
    input: &DeriveInput,
    key_name: &str,
    key_ident: &Ident,
    p: &Private,
) -> Option<TokenStream> {
    if !input.generics.params.is_empty() {
        return None;
    }
    let Data::Struct(data) = &input.data else {
        return None;
    };
    let Fields::Named(fields) = &data.fields else {
        return None;
    };
    let mut container = Vec::new();
    for a in &input.attrs {
        if a.path().is_ident("cfg_attr") {
            return None;
        }
        if !a.path().is_ident("serde") {
            continue;
        }
        for meta in serde_metas(a)? {
            let name = meta.path().get_ident()?.to_string();
            if KEEP.contains(&name.as_str()) {
                container.push(meta);
            } else if !IRRELEVANT.contains(&name.as_str()) {
                return None;
            }
        }
    }
    let mut aliases = Vec::new();
    let mut own = Vec::new();
    for f in &fields.named {
        let ident = f.ident.as_ref()?;
        if f.attrs
            .iter()
            .any(|a| a.path().is_ident("cfg") || a.path().is_ident("cfg_attr"))
        {
            return None;
        }
        if mentions_self(f.ty.to_token_stream()) {
            return None;
        }
        let serde: Vec<&Attribute> = f
            .attrs
            .iter()
            .filter(|a| a.path().is_ident("serde"))
            .collect();
        if ident != key_ident {
            own.push((ident, &f.ty, serde));
            continue;
        }
        for a in serde {
            for meta in serde_metas(a)? {
                let name = meta.path().get_ident()?.to_string();
                match &meta {
                    Meta::NameValue(nv) if name == "alias" => aliases.push(nv.value.clone()),
                    Meta::NameValue(_) if KEY_IRRELEVANT.contains(&name.as_str()) => {}
                    _ => return None,
                }
            }
        }
    }
    let krate = format!("{}::serde", quote!(#p));
    let container = (!container.is_empty()).then(|| quote!(#[serde(#(#container),*)]));
    let idents: Vec<_> = own.iter().map(|(i, _, _)| *i).collect();
    let fields = own
        .iter()
        .map(|(ident, ty, attrs)| quote!(#(#attrs)* #ident: #ty));
    Some(quote! {
        #[inline]
        fn __decode_item<'de, __D: #p::serde::Deserializer<'de>>(
            key: &#p::Bson,
            _field: &'static str,
            d: __D,
        ) -> #p::core::result::Result<Self, __D::Error> {
            #[derive(#p::serde::Deserialize)]
            #[serde(crate = #krate)]
            #container
            #[allow(dead_code)]
            struct __MpItem {
                #[serde(rename = #key_name, #(alias = #aliases,)* default)]
                __mp_key_in_item: #p::KeyInItem,
                #(#fields,)*
            }
            let item = <__MpItem as #p::serde::Deserialize>::deserialize(d)?;
            #p::core::result::Result::Ok(Self {
                #key_ident: #p::bucket_key_of::<_, __D::Error>(key)?,
                #(#idents: item.#idents,)*
            })
        }
    })
}

/// Whether a field's type names `Self`, which inside the shadow would mean
/// the shadow.
fn mentions_self(tokens: TokenStream) -> bool {
    tokens.into_iter().any(|tt| match tt {
        TokenTree::Ident(i) => i == "Self",
        TokenTree::Group(g) => mentions_self(g.stream()),
        _ => false,
    })
}

/// The options of one `#[serde(...)]`; `None` when they do not parse as
/// attribute syntax (serde reports its own errors).
fn serde_metas(a: &Attribute) -> Option<Punctuated<Meta, Token![,]>> {
    a.parse_args_with(Punctuated::<Meta, Token![,]>::parse_terminated)
        .ok()
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

    #[test]
    fn resolves_through_serde() {
        let input: DeriveInput = parse_quote! {
            #[serde(rename_all = "camelCase")]
            #[bucket(size = 1000, key = "customerId", order = "date", items = "trades")]
            struct Trade { customer_id: i64, date: i64 }
        };
        let (b, e) = crate::ctxt::collect(|cx| {
            let m = Input::from_syn(cx, &input).unwrap();
            parse(cx, &input, &m).unwrap().spec.unwrap()
        });
        assert!(e.is_empty(), "{e:?}");
        assert_eq!(b.size, 1000);
        assert_eq!(b.key.0, "customerId");
        assert_eq!(b.key.1.to_string(), "customer_id");
        assert_eq!(b.order.as_ref().unwrap().0, "date");
        assert_eq!(b.items, "trades");
    }

    #[test]
    fn mistakes() {
        let e = errors(
            parse_quote! { #[bucket(size = 0, key = "custmer_id", sise = 3)] struct T { customer_id: i64 } },
        );
        assert_eq!(e.len(), 3, "{e:#?}");
        assert!(e[0].contains("at least 1"));
        assert!(
            e[1].contains("did you mean `sort`") || e[1].contains("did you mean `size`"),
            "{e:#?}"
        );
        assert!(e[2].contains("did you mean `customer_id`"), "{e:#?}");
        let e = errors(parse_quote! { #[bucket(key = "a")] struct T { a: i64 } });
        assert!(e[0].contains("needs option `size`"), "{e:#?}");
        let e = errors(
            parse_quote! { #[bucket(size = 10001, key = "a", items = "count")] struct T { a: i64 } },
        );
        assert!(e[0].contains("time-series"), "{e:#?}");
        assert!(e[1].contains("clashes"), "{e:#?}");
        let e = errors(
            parse_quote! { #[bucket(size = 10, key = "a", order = "a")] struct T { a: i64 } },
        );
        assert!(e[0].contains("names the key field"), "{e:#?}");
    }

    #[test]
    fn items_decode_without_the_key_unless_an_attribute_could_change_them() {
        let ident: Ident = parse_quote!(customer_id);
        let decoder = |input: DeriveInput| {
            keyless_decoder(&input, "customerId", &ident, &Private::default())
                .map(|t| t.to_string())
        };
        let kept = decoder(parse_quote! {
            #[serde(rename_all = "camelCase", deny_unknown_fields, rename = "T")]
            struct T {
                #[serde(alias = "cid")] customer_id: i64,
                #[serde(default, with = "m")] a: u64,
                #[serde(skip)] b: u8,
            }
        })
        .expect("a decoder without the key");
        for part in [
            "rename_all = \"camelCase\" , deny_unknown_fields",
            "rename = \"customerId\" , alias = \"cid\" , default",
            "# [serde (default , with = \"m\")] a : u64",
            "# [serde (skip)] b : u8",
            "customer_id : :: mongo_patterns :: __private :: bucket_key_of",
        ] {
            assert!(kept.contains(part), "{part} in {kept}");
        }
        assert!(!kept.contains("rename = \"T\""), "{kept}");
        for (why, input) in [
            (
                "generic",
                parse_quote! { struct T<V> { customer_id: i64, v: V } },
            ),
            (
                "container default",
                parse_quote! { #[serde(default)] struct T { customer_id: i64 } },
            ),
            (
                "from",
                parse_quote! { #[serde(from = "U")] struct T { customer_id: i64 } },
            ),
            (
                "key read with",
                parse_quote! { struct T { #[serde(with = "m")] customer_id: i64 } },
            ),
            (
                "key renamed per side",
                parse_quote! {
                    struct T { #[serde(rename(deserialize = "c"))] customer_id: i64 }
                },
            ),
            (
                "cfg field",
                parse_quote! { struct T { customer_id: i64, #[cfg(test)] a: u8 } },
            ),
            (
                "Self in a field",
                parse_quote! { struct T { customer_id: i64, next: Option<Box<Self>> } },
            ),
        ] {
            assert!(decoder(input).is_none(), "{why}");
        }
    }

    #[test]
    fn key_cannot_be_bookkeeping() {
        // By Rust name, stored as `_id`: the same mistake as `key = "_id"`.
        let e = errors(parse_quote! {
            #[bucket(size = 10, key = "id")]
            struct T { #[serde(rename = "_id")] id: i64, a: i64 }
        });
        assert_eq!(e.len(), 1, "{e:#?}");
        assert!(e[0].contains("`id`, stored as `_id`"), "{e:#?}");
        let e =
            errors(parse_quote! { #[bucket(size = 10, key = "count")] struct T { count: i64 } });
        assert_eq!(e.len(), 1, "{e:#?}");
        assert!(e[0].contains("keeps for itself"), "{e:#?}");
    }

    #[test]
    fn one_error_per_mistake() {
        // A wrong value type counts as given, and parsing goes on.
        let e = errors(parse_quote! { #[bucket(size = "10", key = "a")] struct T { a: i64 } });
        assert_eq!(e.len(), 1, "{e:#?}");
        assert!(e[0].contains("integer literal"), "{e:#?}");
        let e = errors(parse_quote! { #[bucket(size = 10, key = a)] struct T { a: i64 } });
        assert_eq!(e.len(), 1, "{e:#?}");
        // A misspelt option is not also missing.
        let e = errors(parse_quote! { #[bucket(sise = 10, key = "a")] struct T { a: i64 } });
        assert_eq!(e.len(), 1, "{e:#?}");
        assert!(e[0].contains("did you mean `size`"), "{e:#?}");
        // Options split over two attributes: only the duplicate.
        let e =
            errors(parse_quote! { #[bucket(size = 10)] #[bucket(key = "a")] struct T { a: i64 } });
        assert_eq!(e.len(), 1, "{e:#?}");
        assert!(e[0].contains("duplicate `#[bucket]`"), "{e:#?}");
    }
}
