//! `#[shard_key(coarse = "month", from = "ts", granularity = "month",
//! search = "type")]`, or `#[shard_key(hashed = "id")]`: the collection's
//! shard key. The runtime's `shard_key` module holds the routing; this
//! checks the key against the struct and refuses, with an explanation and an
//! opt-out each, the keys that spoil a shard key:
//!
//! - `monotonic`: a lone key on a timestamp, an ObjectId or a counter;
//! - `low_cardinality`: a lone key on a bool or a one-byte type (a
//!   fieldless enum), checked by the type's size;
//! - `coarse_not_derived`: a coarse field the repository does not derive
//!   from a timestamp, so nothing keeps it coarse and ascending;
//! - `missing_search`: no search field after the coarse one.

use proc_macro2::{Span, TokenStream};
use quote::{quote, quote_spanned, ToTokens};
use syn::spanned::Spanned;
use syn::{Attribute, DeriveInput, LitStr, Meta, Type};

use crate::ast::{Field, Input};
use crate::attr::{self, Opt, RawValue};
use crate::ctxt::Ctxt;
use crate::private::Private;

mod check;
mod lints;

use lints::{
    is_bool, is_timestamp, looks_monotonic, low_cardinality, low_cardinality_message,
    COARSE_NOT_DERIVED, LINTS, LOW_CARDINALITY, MISSING_SEARCH, MONOTONIC,
};

const SHARD: &str = "shard_key";
const COARSE: &str = "coarse";
const FROM: &str = "from";
const GRANULARITY: &str = "granularity";
const SEARCH: &str = "search";
const HASHED: &str = "hashed";
const ALLOW: &str = "allow";
const OPTIONS: &[&str] = &[COARSE, FROM, GRANULARITY, SEARCH, HASHED, ALLOW];

/// How far a derived coarse field rounds its timestamp down, as
/// `granularity = "..."` spells it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Granularity {
    Hour,
    Day,
    Week,
    Month,
    Quarter,
    Year,
}

impl Granularity {
    const ALL: [Granularity; 6] = [
        Granularity::Hour,
        Granularity::Day,
        Granularity::Week,
        Granularity::Month,
        Granularity::Quarter,
        Granularity::Year,
    ];

    fn spelling(self) -> &'static str {
        match self {
            Granularity::Hour => "hour",
            Granularity::Day => "day",
            Granularity::Week => "week",
            Granularity::Month => "month",
            Granularity::Quarter => "quarter",
            Granularity::Year => "year",
        }
    }

    fn from_spelling(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|g| g.spelling() == s)
    }
}

/// The variant's path under `__private`.
impl ToTokens for Granularity {
    fn to_tokens(&self, tokens: &mut TokenStream) {
        tokens.extend(match self {
            Granularity::Hour => quote!(Granularity::Hour),
            Granularity::Day => quote!(Granularity::Day),
            Granularity::Week => quote!(Granularity::Week),
            Granularity::Month => quote!(Granularity::Month),
            Granularity::Quarter => quote!(Granularity::Quarter),
            Granularity::Year => quote!(Granularity::Year),
        });
    }
}

/// What `#[shard_key]` says, as far as it could be read.
pub struct ShardKey {
    /// The type of the field `search` names, found even when it cannot be
    /// used: after an error, the fallback keeps it.
    named_search: Option<Type>,
    /// The whole key; `None` after an error.
    spec: Option<Spec>,
}

struct Spec {
    coarse: Option<String>,
    derived: Option<(String, Type, Granularity)>,
    coarse_slot: Option<Type>,
    search: Option<(String, Type)>,
    hashed: Option<String>,
    /// A lone key's type to refuse when it fits in one byte.
    small_check: Option<(String, Type)>,
}

impl ShardKey {
    /// The key when it is one field alone, by its stored name: `Some((field,
    /// true))` for `hashed = "field"`, `Some((field, false))` for `search =
    /// "field"` without `coarse`; `Some(None)` for any other key; `None`
    /// after an error in the key itself.
    pub fn lone_field(&self) -> Option<Option<(&str, bool)>> {
        let spec = self.spec.as_ref()?;
        Some(match (&spec.coarse, &spec.search, &spec.hashed) {
            (None, Some((field, _)), None) => Some((field.as_str(), false)),
            (None, None, Some(field)) => Some((field.as_str(), true)),
            _ => None,
        })
    }
}

/// `#[shard_key]` as written.
struct Attr<'c> {
    coarse: Opt<'c, LitStr>,
    from: Opt<'c, LitStr>,
    granularity: Opt<'c, Granularity>,
    search: Opt<'c, LitStr>,
    hashed: Opt<'c, LitStr>,
    /// The lints `allow(...)` names.
    allowed: Vec<String>,
    /// After a mistake that may hide what the user meant (a second
    /// attribute, a misspelt option or lint), the lints stay quiet: they
    /// would judge a key the user did not write.
    muted: bool,
}

/// Parses `#[shard_key]` if present. `refused`: another attribute rules it
/// out (an error already), so the key is not otherwise right. Errors go to
/// `cx`.
pub fn parse(cx: &Ctxt, input: &DeriveInput, model: &Input, refused: bool) -> Option<ShardKey> {
    let errors_before = cx.error_count();
    let attrs = attr::single(cx, &input.attrs, SHARD)?;
    let Some(attr) = attr(cx, &attrs) else {
        return Some(ShardKey {
            named_search: None,
            spec: None,
        });
    };
    // The search field's type, even if it cannot be used.
    let named_search = attr
        .search
        .value()
        .and_then(|l| model.find(&l.value()))
        .map(|f| f.ty.clone());
    // Whether nothing is wrong but what the last checks find.
    let clean = |cx: &Ctxt| !refused && cx.error_count() == errors_before;
    // On a `#[bucket]` model the key only says how its buckets shard.
    let of_buckets = input.attrs.iter().any(|a| a.path().is_ident("bucket"));
    let spec = check::check(cx, attrs[0], attr, model, &clean, of_buckets);
    Some(ShardKey { named_search, spec })
}

/// Reads `#[shard_key]`'s options; `None` when it has none.
fn attr<'c>(cx: &'c Ctxt, attrs: &[&Attribute]) -> Option<Attr<'c>> {
    let first = attrs[0];
    if !matches!(first.meta, Meta::List(_)) {
        cx.error_spanned_by(
            first,
            "`#[shard_key]` needs a key, as in `#[shard_key(coarse = \"month\", from = \"ts\", search = \"type\")]` or `#[shard_key(hashed = \"id\")]`",
        );
        return None;
    }
    let mut out = Attr {
        coarse: Opt::new(cx, SHARD, COARSE),
        from: Opt::new(cx, SHARD, FROM),
        granularity: Opt::new(cx, SHARD, GRANULARITY),
        search: Opt::new(cx, SHARD, SEARCH),
        hashed: Opt::new(cx, SHARD, HASHED),
        allowed: Vec::new(),
        muted: attrs.len() > 1,
    };
    for opt in attr::read(cx, first) {
        match opt.name.as_str() {
            // coarse = "field"
            COARSE => {
                let lit = opt.lit_str(cx, SHARD, "coarse = \"month\"");
                out.coarse.take(&opt, lit);
            }
            // from = "field"
            FROM => {
                let lit = opt.lit_str(cx, SHARD, "from = \"ts\"");
                out.from.take(&opt, lit);
            }
            // search = "field"
            SEARCH => {
                let lit = opt.lit_str(cx, SHARD, "search = \"type\"");
                out.search.take(&opt, lit);
            }
            // hashed = "field"
            HASHED => {
                let lit = opt.lit_str(cx, SHARD, "hashed = \"id\"");
                out.hashed.take(&opt, lit);
            }
            // granularity = "hour" | "day" | "week" | "month" | "quarter" | "year"
            GRANULARITY => {
                let Some(lit) = opt.lit_str(cx, SHARD, "granularity = \"month\"") else {
                    out.granularity.set_bad(&opt.path);
                    continue;
                };
                match Granularity::from_spelling(&lit.value()) {
                    Some(g) => out.granularity.set(&lit, g),
                    None => {
                        let hint =
                            attr::hint(&lit.value(), Granularity::ALL.map(Granularity::spelling));
                        cx.error_spanned_by(
                            &lit,
                            format!("unknown `shard_key` granularity `{}`; expected `hour`, `day`, `week`, `month`, `quarter` or `year`{hint}", lit.value()),
                        );
                        out.granularity.set_bad(&lit);
                    }
                }
            }
            // allow(monotonic, missing_search)
            ALLOW => {
                let Some(lints) = opt.list(cx, SHARD, "allow(monotonic)") else {
                    out.muted = true;
                    continue;
                };
                for lint in lints {
                    if !LINTS.contains(&lint.name.as_str()) {
                        out.muted = true;
                        lint.unknown(cx, "shard_key(allow)", LINTS);
                    } else if !matches!(lint.value, RawValue::Flag) {
                        out.muted = true;
                        cx.error_spanned_by(
                            &lint.path,
                            format!(
                                "`shard_key(allow)` takes lint names alone, as in `allow({})`",
                                lint.name
                            ),
                        );
                    } else {
                        out.allowed.push(lint.name.clone());
                    }
                }
            }
            _ => {
                out.muted = true;
                opt.unknown(cx, SHARD, OPTIONS);
            }
        }
    }
    Some(out)
}

/// `#[shard_key]` as the checks read it: each option's value when it could
/// be read, whether it was written at all (a value written but not read is
/// reported already), and the lints it allows.
struct Key {
    coarse: Option<LitStr>,
    from: Option<LitStr>,
    granularity: Option<(Span, Granularity)>,
    search: Option<LitStr>,
    hashed: Option<LitStr>,
    coarse_given: bool,
    from_given: bool,
    granularity_given: bool,
    /// What the user wrote, resolved or not: a misspelt search field is not
    /// a missing one.
    search_given: bool,
    hashed_given: bool,
    allowed: Vec<String>,
    /// The lints stay quiet (see `Attr::muted`).
    muted: bool,
}

impl Key {
    fn new(attr: Attr) -> Self {
        // A value given but not read (reported) may hide what the user meant.
        let unread = [&attr.coarse, &attr.from, &attr.search, &attr.hashed]
            .iter()
            .any(|o| o.given() && o.value().is_none());
        Key {
            coarse_given: attr.coarse.given(),
            from_given: attr.from.given(),
            granularity_given: attr.granularity.given(),
            search_given: attr.search.given(),
            hashed_given: attr.hashed.given(),
            coarse: attr.coarse.get().map(|(_, l)| l),
            from: attr.from.get().map(|(_, l)| l),
            granularity: attr.granularity.get(),
            search: attr.search.get().map(|(_, l)| l),
            hashed: attr.hashed.get().map(|(_, l)| l),
            allowed: attr.allowed,
            muted: attr.muted || unread,
        }
    }

    /// Whether `lint` stays quiet: allowed, or muted.
    fn allows(&self, lint: &str) -> bool {
        self.muted || self.allowed.iter().any(|a| a == lint)
    }

    /// Whether the user meant a derived coarse field: `from` or
    /// `granularity` written. Without `coarse` (or `granularity` without
    /// `from`) that is reported, and the key is not judged as written.
    fn meant_derived(&self) -> bool {
        self.from_given || self.granularity_given
    }
}

/// The coarse field as judged: its stored name, what the repository derives
/// it from, the struct field that reads the derived date back, and the
/// field that stores it when the model does.
#[derive(Default)]
struct CoarseKey<'m> {
    name: Option<String>,
    derived: Option<(String, Type, Granularity)>,
    slot: Option<Type>,
    field: Option<&'m Field<'m>>,
}

impl ShardKey {
    pub fn expand(&self, input: &DeriveInput, p: &Private) -> Option<TokenStream> {
        let spec = self.spec.as_ref()?;
        let ident = &input.ident;
        let (impl_g, ty_g, where_g) = input.generics.split_for_impl();
        let some = |v: TokenStream| quote!(#p::core::option::Option::Some(#v));
        let none = quote!(#p::core::option::Option::None);
        let opt_str = |s: &Option<String>| s.as_ref().map_or(none.clone(), |s| some(quote!(#s)));
        let search = opt_str(&spec.search.as_ref().map(|(n, _)| n.clone()));
        let search_ty = spec
            .search
            .as_ref()
            .map_or(quote!(()), |(_, ty)| quote!(#ty));
        let derived = match &spec.derived {
            Some((from, ty, g)) => some(quote! {
                #p::Derived {
                    from: #from,
                    repr: <#ty as #p::Timestamp>::REPR,
                    granularity: #p::#g,
                }
            }),
            None => none.clone(),
        };
        let shard = match (&spec.hashed, &spec.coarse) {
            (Some(h), _) => quote!(#p::ShardSpec::Hashed(#h)),
            (None, Some(c)) => quote! {
                #p::ShardSpec::Ranged {
                    coarse: #p::core::option::Option::Some(
                        #p::Coarse { field: #c, derived: #derived },
                    ),
                    search: #search,
                }
            },
            (None, None) => quote! {
                #p::ShardSpec::Ranged {
                    coarse: #p::core::option::Option::None,
                    search: #search,
                }
            },
        };
        // `from`'s type is checked by `<#ty as Timestamp>::REPR` above, at
        // the field's type; a second check would repeat the error.
        let slot_check = spec.coarse_slot.as_ref().map(|ty| {
            let p = p.at(ty.span());
            quote_spanned! {ty.span()=> #p::assert_coarse_slot::<#ty>(); }
        });
        // One byte holds at most 256 values: a bool, a `u8`, a fieldless
        // enum. Generic structs skip it (a const cannot name their params).
        let small = spec
            .small_check
            .as_ref()
            .filter(|_| input.generics.params.is_empty())
            .map(|(name, ty)| {
                let msg = low_cardinality_message(name);
                let p = p.at(ty.span());
                quote_spanned! {ty.span()=>
                    const _: () = if #p::core::mem::size_of::<#ty>() <= 1 {
                        #p::core::panic!(#msg)
                    };
                }
            });
        Some(quote! {
            #[automatically_derived]
            impl #impl_g #p::ShardKeyed for #ident #ty_g #where_g {
                type Search = #search_ty;
                const SHARD: #p::ShardSpec = #shard;
            }
            const _: () = {
                #[allow(dead_code)]
                fn __shard_fields #impl_g () #where_g { #slot_check }
            };
            #small
        })
    }

    /// After an error, an impl that claims nothing, so that uses elsewhere
    /// add no errors of their own. It keeps the search field's type.
    pub fn fallback(&self, input: &DeriveInput, p: &Private) -> TokenStream {
        let search_ty = self
            .named_search
            .as_ref()
            .map_or(quote!(()), |ty| quote!(#ty));
        let ident = &input.ident;
        let (impl_g, ty_g, where_g) = input.generics.split_for_impl();
        quote! {
            #[automatically_derived]
            impl #impl_g #p::ShardKeyed for #ident #ty_g #where_g {
                type Search = #search_ty;
                const SHARD: #p::ShardSpec = #p::ShardSpec::FALLBACK;
            }
        }
    }
}

#[cfg(test)]
mod tests;
