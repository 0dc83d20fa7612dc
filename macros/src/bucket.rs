//! `#[bucket(size = N, key = "field", order = "field", items = "name")]`:
//! items stored many to a document per key. The runtime's `bucket` module
//! holds the pattern; this checks the options and wires the key field.

use proc_macro2::{TokenStream, TokenTree};
use quote::{quote, quote_spanned, ToTokens};
use syn::punctuated::Punctuated;
use syn::spanned::Spanned;
use syn::{Attribute, Data, DeriveInput, Fields, Ident, LitInt, LitStr, Meta, Token, Type};

use crate::ast::Input;
use crate::attr::{self, Opt};
use crate::ctxt::Ctxt;
use crate::private::Private;
use crate::shard_key::ShardKey;

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
/// And every name starting with this: the repository's own fields
/// (`mp_ops`, `mp_next`, ...). Generated code asserts that the two cover
/// the runtime's `bucket::RESERVED`, and nothing else.
const RESERVED_PREFIX: &str = "mp_";

/// Whether the bucket keeps `name` for itself.
fn reserved(name: &str) -> bool {
    RESERVED.contains(&name) || name.starts_with(RESERVED_PREFIX)
}

/// How a `#[bucket]` model's collection shards: on its bucket key alone.
pub enum BucketSharding {
    /// `#[shard_key(hashed = "<key>")]`.
    Hashed,
    /// `#[shard_key(search = "<key>")]`.
    Ranged,
}

/// What `#[shard_key]` on a `#[bucket]` model may say: the bucket key
/// alone. Otherwise the error says why (every item of a bucket has the same
/// bucket key, and only that field keeps a push and a page on one shard).
/// `None` without an error after one of the key's own.
pub fn sharding(
    cx: &Ctxt,
    input: &DeriveInput,
    bucket: &Bucket,
    shard: &ShardKey,
) -> Option<BucketSharding> {
    let key = bucket.key_name()?;
    let lone = shard.lone_field()?;
    let at = input
        .attrs
        .iter()
        .find(|a| a.path().is_ident("shard_key"))?;
    let use_key = format!(
        "shard it on the bucket key: `#[shard_key(hashed = \"{key}\")]` (the default), or `#[shard_key(search = \"{key}\")]` for ranges of keys"
    );
    match lone {
        Some((field, hashed)) if field == key => {
            return Some(if hashed {
                BucketSharding::Hashed
            } else {
                BucketSharding::Ranged
            })
        }
        Some((field, _)) => cx.error_spanned_by(
            at,
            format!("a `#[bucket]` model cannot be sharded on `{field}`: one bucket holds items with different `{field}`s (its items share only the bucket key `{key}`), so a push or a page could not stay on one shard; {use_key}"),
        ),
        None => cx.error_spanned_by(
            at,
            format!("a `#[bucket]` model cannot be sharded on a coarse time field and `{key}`: one bucket holds a `{key}`'s items across months (buckets fill by count, not by time), so its items would differ in the shard key; {use_key}"),
        ),
    }
    None
}

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

/// `#[bucket]` as written.
struct Attr<'c> {
    size: Opt<'c, LitInt>,
    key: Opt<'c, LitStr>,
    order: Opt<'c, LitStr>,
    items: Opt<'c, LitStr>,
    /// Options an unknown option looks like a typo of.
    meant: Vec<&'static str>,
}

/// Parses `#[bucket]` if present. Errors go to `cx`.
pub fn parse(cx: &Ctxt, input: &DeriveInput, model: &Input) -> Option<Bucket> {
    let attrs = attr::single(cx, &input.attrs, BUCKET)?;
    let Some(attr) = attr(cx, &attrs) else {
        return Some(Bucket {
            named_key: None,
            spec: None,
        });
    };
    // The field `key` names, even if it cannot be the key.
    let named_key = attr
        .key
        .value()
        .and_then(|lit| model.find(&lit.value()))
        .map(|f| (f.ident.clone(), f.ty.clone()));
    let spec = check(cx, attrs[0], attr, model);
    Some(Bucket { named_key, spec })
}

/// Reads the options of every `#[bucket]`, so that a split attribute is
/// reported once, as a duplicate, and not also as missing options. `None`
/// for a bare `#[bucket]`.
fn attr<'c>(cx: &'c Ctxt, attrs: &[&Attribute]) -> Option<Attr<'c>> {
    let first = attrs[0];
    if !matches!(first.meta, Meta::List(_)) {
        cx.error_spanned_by(
            first,
            "`#[bucket]` needs options, as in `#[bucket(size = 1000, key = \"customerId\")]`",
        );
        return None;
    }
    let mut out = Attr {
        size: Opt::new(cx, BUCKET, SIZE),
        key: Opt::new(cx, BUCKET, KEY),
        order: Opt::new(cx, BUCKET, ORDER),
        items: Opt::new(cx, BUCKET, ITEMS),
        meant: Vec::new(),
    };
    for opt in attrs.iter().flat_map(|a| attr::read(cx, a)) {
        match opt.name.as_str() {
            // size = 1000
            SIZE => {
                let lit = opt.lit_int(cx, BUCKET, "size = 1000");
                out.size.take(&opt, lit);
            }
            // key = "field"
            KEY => {
                let lit = opt.lit_str(cx, BUCKET, "key = \"customerId\"");
                out.key.take(&opt, lit);
            }
            // order = "field"
            ORDER => {
                let lit = opt.lit_str(cx, BUCKET, "order = \"date\"");
                out.order.take(&opt, lit);
            }
            // items = "name"
            ITEMS => {
                let lit = opt.lit_str(cx, BUCKET, "items = \"trades\"");
                out.items.take(&opt, lit);
            }
            _ => {
                out.meant
                    .extend(attr::did_you_mean(&opt.name, OPTIONS.iter().copied()));
                opt.unknown(cx, BUCKET, OPTIONS);
            }
        }
    }
    Some(out)
}

/// Judges the attribute, rule by rule: the options that must be there, the
/// size, and the fields the options name.
fn check(cx: &Ctxt, first: &Attribute, attr: Attr, model: &Input) -> Option<Spec> {
    check_required(cx, first, &attr);
    let size = attr.size.get().and_then(|(_, lit)| check_size(cx, &lit));
    let key = attr
        .key
        .get()
        .and_then(|(_, lit)| check_key(cx, &lit, model));
    let order = attr
        .order
        .get()
        .and_then(|(_, lit)| check_order(cx, &lit, model, key.as_ref()));
    let items = match attr.items.get() {
        Some((_, lit)) => check_items(cx, &lit, key.as_ref()),
        None => "items".to_owned(),
    };
    Some(Spec {
        size: size?,
        key: key?,
        order,
        items,
    })
}

/// `size` and `key` are required. A value given but wrong is reported
/// already: it is not also missing; nor is one a misspelt option meant.
fn check_required(cx: &Ctxt, first: &Attribute, attr: &Attr) {
    for (missing, name, what) in [
        (
            !attr.size.given(),
            SIZE,
            "the items per bucket, as in `size = 1000`",
        ),
        (
            !attr.key.given(),
            KEY,
            "the field that groups items, as in `key = \"customerId\"`",
        ),
    ] {
        // A misspelt option was reported already, with this one as its hint.
        if missing && !attr.meant.contains(&name) {
            cx.error_spanned_by(first, format!("`#[bucket]` needs option `{name}`, {what}"));
        }
    }
}

/// `size` is from 1 to [`MAX_SIZE`] items.
fn check_size(cx: &Ctxt, lit: &LitInt) -> Option<u64> {
    match lit.base10_parse::<u64>() {
        Ok(0) => {
            cx.error_spanned_by(lit, "`bucket` option `size` must be at least 1");
            None
        }
        Ok(n) if n <= MAX_SIZE => Some(n),
        _ => {
            cx.error_spanned_by(
                lit,
                format!("`bucket` option `size` is at most {MAX_SIZE}: larger buckets are megabytes that every page read loads; for measurements over time, use a time-series collection"),
            );
            None
        }
    }
}

/// `key` names a field of the model, stored neither as `_id` nor under a
/// name the bucket keeps for itself: the key sits at the top of each
/// bucket, beside the bookkeeping.
fn check_key(cx: &Ctxt, lit: &LitStr, model: &Input) -> Option<(String, Ident, Type)> {
    let written = lit.value();
    // `_id` is checked before it is looked up: no field need be named so.
    let field = match written.as_str() {
        "_id" => None,
        _ => Some(model.resolve(cx, lit, BUCKET, KEY)?),
    };
    let stored = field.map_or("_id", |f| f.bson_name.as_str());
    let named = if written == stored {
        format!("`{stored}`")
    } else {
        format!("`{written}`, stored as `{stored}`")
    };
    if stored == "_id" {
        cx.error_spanned_by(
            lit,
            format!("`bucket` option `key` names {named}: each bucket has its own `_id`, so it cannot be a bucket key; name the field that groups items"),
        );
        return None;
    }
    if reserved(stored) {
        cx.error_spanned_by(
            lit,
            format!("`bucket` option `key` names {named}, which the bucket keeps for itself (`start`, `count`, `bytes`, `sealed` and names starting with `mp_` are taken); store the field under another name with `#[serde(rename = \"...\")]`"),
        );
        return None;
    }
    let f = field?;
    Some((f.bson_name.clone(), f.ident.clone(), f.ty.clone()))
}

/// `order` names a field of the model other than the key, which is the
/// same for every item of a bucket.
fn check_order(
    cx: &Ctxt,
    lit: &LitStr,
    model: &Input,
    key: Option<&(String, Ident, Type)>,
) -> Option<(String, Type)> {
    let f = model.resolve(cx, lit, BUCKET, ORDER)?;
    if key.is_some_and(|(k, _, _)| *k == f.bson_name) {
        cx.error_spanned_by(
            lit,
            format!("`bucket` option `order` names the key field `{}`, which is the same for every item of a bucket; name a time or a number to sort items by, or leave `order` out to keep them in insertion order", f.bson_name),
        );
        return None;
    }
    Some((f.bson_name.clone(), f.ty.clone()))
}

/// `items` is a plain field name (not empty, no `.`, no leading `$`) that
/// no field the bucket keeps has. Reported, it is kept as written.
fn check_items(cx: &Ctxt, lit: &LitStr, key: Option<&(String, Ident, Type)>) -> String {
    let name = lit.value();
    let clash = reserved(&name) || key.is_some_and(|(k, _, _)| *k == name);
    if name.is_empty() || name.contains('.') || name.starts_with('$') {
        cx.error_spanned_by(
            lit,
            "`bucket` option `items` names the array field, so it must be a plain field name: not empty, no `.`, not starting with `$`",
        );
    } else if clash {
        cx.error_spanned_by(
            lit,
            format!("`bucket` option `items` names `{name}`, which clashes with a field the bucket keeps: `_id`, the key, `start`, `count`, `bytes`, `sealed` and names starting with `mp_` are taken"),
        );
    }
    name
}

impl Bucket {
    /// The bucket key's stored (BSON) name; `None` after an error.
    pub fn key_name(&self) -> Option<&str> {
        self.spec.as_ref().map(|s| s.key.0.as_str())
    }

    /// `sharding`: what `#[shard_key]` on the same struct chose (hashed
    /// when absent).
    pub fn expand(
        &self,
        input: &DeriveInput,
        p: &Private,
        sharding: Option<BucketSharding>,
    ) -> Option<TokenStream> {
        let spec = self.spec.as_ref()?;
        let sharding = match sharding {
            Some(BucketSharding::Ranged) => quote!(#p::KeySharding::Ranged),
            Some(BucketSharding::Hashed) | None => quote!(#p::KeySharding::Hashed),
        };
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
        let (kept, kept_prefix) = (RESERVED, RESERVED_PREFIX);
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
                    sharding: #sharding,
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
            const _: () = #p::core::assert!(
                #p::limits::bucket_reserved_is(&[#(#kept),*], #kept_prefix),
                "`#[bucket]` refuses other field names than the ones the runtime keeps",
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
mod tests;
