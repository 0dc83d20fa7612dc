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
    let spec = check(cx, attrs[0], attr, model, &clean, of_buckets);
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

/// Judges the key, rule by rule: a hashed key, or a ranged key's options
/// that go together, the fields they name, and the lints.
fn check(
    cx: &Ctxt,
    first: &Attribute,
    attr: Attr,
    model: &Input,
    clean: &dyn Fn(&Ctxt) -> bool,
    of_buckets: bool,
) -> Option<Spec> {
    let key = Key::new(attr);
    if let Some(h) = &key.hashed {
        return check_hashed(cx, first, &key, h, model, clean, of_buckets);
    }
    if key.hashed_given {
        // `hashed` was given but could not be read (reported).
        return None;
    }
    check_some_key(cx, first, &key)?;
    check_from_has_coarse(cx, &key);
    check_granularity_has_from(cx, &key);
    let search = key
        .search
        .as_ref()
        .and_then(|l| Some((l, model.resolve(cx, l, SHARD, SEARCH)?)));
    let from_field = key
        .from
        .as_ref()
        .and_then(|l| model.resolve(cx, l, SHARD, FROM));
    let coarse = match &key.coarse {
        Some(c) => check_coarse(cx, &key, c, model, from_field)?,
        None => CoarseKey::default(),
    };
    check_missing_search(cx, &key);
    check_search_not_coarse(cx, search, coarse.name.as_ref())?;
    let small_check = check_lone_key(cx, &key, coarse.field, search);
    let search = search.map(|(_, f)| (f.bson_name.clone(), f.ty.clone()));
    if clean(cx) {
        require_id(cx, model, first, of_buckets)?;
    }
    Some(Spec {
        coarse: coarse.name,
        derived: coarse.derived,
        coarse_slot: coarse.slot,
        search,
        hashed: None,
        small_check,
    })
}

/// A hashed key: alone, on a field of the model that is not a bool (lint
/// `low_cardinality`; a one-byte type is refused at compile time), and,
/// when nothing else is wrong, on a model with an `_id`.
fn check_hashed(
    cx: &Ctxt,
    first: &Attribute,
    key: &Key,
    h: &LitStr,
    model: &Input,
    clean: &dyn Fn(&Ctxt) -> bool,
    of_buckets: bool,
) -> Option<Spec> {
    check_hashed_alone(cx, key, h);
    let f = model.resolve(cx, h, SHARD, HASHED)?;
    let small_check = (!key.allows(LOW_CARDINALITY)).then(|| (f.bson_name.clone(), f.ty.clone()));
    if is_bool(f.ty) && !key.allows(LOW_CARDINALITY) {
        low_cardinality(cx, h, &f.bson_name);
        return None;
    }
    if !clean(cx) {
        return None;
    }
    require_id(cx, model, first, of_buckets)?;
    Some(Spec {
        coarse: None,
        derived: None,
        coarse_slot: None,
        search: None,
        hashed: Some(f.bson_name.clone()),
        small_check,
    })
}

/// A hashed key stands alone: no `coarse`, `from`, `search` or
/// `granularity` beside `hashed`.
fn check_hashed_alone(cx: &Ctxt, key: &Key, h: &LitStr) {
    let with_hashed = |name: &str| {
        format!("`{name}` cannot be used with `hashed`: a hashed shard key is one field (`{{{}: \"hashed\"}}`)", h.value())
    };
    for (lit, name) in [
        (&key.coarse, COARSE),
        (&key.from, FROM),
        (&key.search, SEARCH),
    ] {
        if let Some(l) = lit {
            cx.error_spanned_by(l, with_hashed(name));
        }
    }
    if let Some((span, _)) = &key.granularity {
        cx.error_spanned_by(
            quote_spanned!(*span=> granularity),
            with_hashed(GRANULARITY),
        );
    }
}

/// A ranged key names `coarse`, `search`, or both.
fn check_some_key(cx: &Ctxt, first: &Attribute, key: &Key) -> Option<()> {
    if key.coarse_given || key.search_given {
        return Some(());
    }
    cx.error_spanned_by(
        first,
        "`#[shard_key]` needs a key: `coarse` and `search` (`{coarse: 1, search: 1}`), or `hashed`",
    );
    None
}

/// `from` names the timestamp `coarse` derives from: it needs `coarse`.
fn check_from_has_coarse(cx: &Ctxt, key: &Key) {
    if let (Some(f), false) = (&key.from, key.coarse_given) {
        cx.error_spanned_by(
            f,
            "`from` names the timestamp that `coarse` derives from; add `coarse = \"month\"` (the derived field's name)",
        );
    }
}

/// `granularity` says how `coarse` rounds `from`: it needs `from`.
fn check_granularity_has_from(cx: &Ctxt, key: &Key) {
    if let (Some((span, _)), false) = (&key.granularity, key.from_given) {
        cx.error_spanned_by(
            quote_spanned!(*span=> granularity),
            "`granularity` says how `coarse` rounds the `from` timestamp; add `from = \"ts\"`",
        );
    }
}

/// The coarse field is derived from `from`, or a field the model stores;
/// `None` ends the checks.
fn check_coarse<'m>(
    cx: &Ctxt,
    key: &Key,
    c: &LitStr,
    model: &'m Input,
    from_field: Option<&'m Field>,
) -> Option<CoarseKey<'m>> {
    match (&key.from, model.find(&c.value())) {
        (Some(from), f) => check_derived_coarse(cx, key, c, from, f, from_field),
        (None, Some(f)) => check_stored_coarse(cx, key, c, f, model),
        // Not a field, and not derived: misspelt, unless the user meant
        // to derive it and forgot `from` (reported above).
        (None, None) => {
            if !key.meant_derived() {
                model.resolve(cx, c, SHARD, COARSE);
            }
            None
        }
    }
}

/// A derived coarse field has a granularity (written, or its own name),
/// is another field than `from`, and is not `_id`. The struct may have the
/// field (it reads the date back) or not.
fn check_derived_coarse<'m>(
    cx: &Ctxt,
    key: &Key,
    c: &LitStr,
    from: &LitStr,
    field: Option<&'m Field>,
    from_field: Option<&'m Field>,
) -> Option<CoarseKey<'m>> {
    let stored = field.map_or(c.value(), |f| f.bson_name.clone());
    let g = key
        .granularity
        .map(|(_, g)| g)
        .or_else(|| Granularity::from_spelling(&stored));
    let mut derived = None;
    match (g, from_field) {
        (Some(g), Some(ff)) => {
            if ff.bson_name == stored {
                cx.error_spanned_by(c, "`coarse` and `from` name the same field; the coarse field is derived into a field of its own, such as `month`");
                return None;
            }
            derived = Some((ff.bson_name.clone(), ff.ty.clone(), g));
        }
        (None, _) if key.granularity_given => {}
        (None, _) => cx.error_spanned_by(
            c,
            format!("`#[shard_key]` cannot tell how far `{stored}` rounds `{}` down: `{stored}` is not a granularity; add `granularity = \"month\"` (or `hour`, `day`, `week`, `quarter`, `year`), or name the field after one, as in `coarse = \"month\"`", from.value()),
        ),
        (Some(_), None) => {}
    }
    if stored == "_id" {
        cx.error_spanned_by(c, "`coarse` cannot be `_id`: the repository derives the coarse field, and `_id` is the document's identity");
        return None;
    }
    Some(CoarseKey {
        name: Some(stored),
        derived,
        slot: field.map(|f| f.ty.clone()),
        field: None,
    })
}

/// A coarse field the model stores is a stored field, and one nothing
/// keeps coarse and ascending unless the user meant to derive it (lint
/// `coarse_not_derived`).
fn check_stored_coarse<'m>(
    cx: &Ctxt,
    key: &Key,
    c: &LitStr,
    f: &'m Field,
    model: &Input,
) -> Option<CoarseKey<'m>> {
    if f.not_stored.is_some() {
        model.resolve(cx, c, SHARD, COARSE)?;
    }
    if !key.meant_derived() && !key.allows(COARSE_NOT_DERIVED) {
        cx.error_spanned_by(
            c,
            format!("`coarse = \"{}\"` is a field the repository does not derive, so nothing keeps it coarse and ascending (lint `coarse_not_derived`); derive it from a timestamp, as in `coarse = \"month\", from = \"ts\"`, or add `allow(coarse_not_derived)` if `{}` already holds a coarse time", c.value(), f.bson_name),
        );
    }
    Some(CoarseKey {
        name: Some(f.bson_name.clone()),
        field: Some(f),
        ..CoarseKey::default()
    })
}

/// A coarse field has a search field after it (lint `missing_search`):
/// alone, a period's documents share one key value.
fn check_missing_search(cx: &Ctxt, key: &Key) {
    if key.search_given || key.allows(MISSING_SEARCH) {
        return;
    }
    if let Some(c) = &key.coarse {
        cx.error_spanned_by(
            c,
            "the shard key has no search field (lint `missing_search`): with a coarse field alone, all of a period's documents share one key value, so its chunk cannot split (jumbo) and takes every insert; add the field queries filter by, as in `search = \"type\"`, or `allow(missing_search)`",
        );
    }
}

/// `search` and `coarse` name two fields.
fn check_search_not_coarse(
    cx: &Ctxt,
    search: Option<(&LitStr, &Field)>,
    coarse: Option<&String>,
) -> Option<()> {
    if let (Some((l, s)), Some(c)) = (search, coarse) {
        if s.bson_name == *c {
            cx.error_spanned_by(l, "`search` and `coarse` name the same field; the key is `{coarse: 1, search: 1}`, two fields");
            return None;
        }
    }
    Some(())
}

/// A lone key (one field, nothing after it nor meant to be) is not
/// monotonic (lint `monotonic`) nor a bool (lint `low_cardinality`).
/// Returns the field to refuse at compile time when its type fits in one
/// byte.
fn check_lone_key(
    cx: &Ctxt,
    key: &Key,
    coarse_field: Option<&Field>,
    search: Option<(&LitStr, &Field)>,
) -> Option<(String, Type)> {
    let (lit, f) = match (coarse_field, search, &key.coarse) {
        (Some(f), None, Some(l)) if !key.search_given && !key.meant_derived() => (l, f),
        (None, Some((l, f)), None) if !key.meant_derived() => (l, f),
        _ => return None,
    };
    check_monotonic(cx, key, lit, f);
    if key.allows(LOW_CARDINALITY) {
        return None;
    }
    if is_bool(f.ty) {
        low_cardinality(cx, lit, &f.bson_name);
        return None;
    }
    Some((f.bson_name.clone(), f.ty.clone()))
}

/// A lone key's values do not only grow (lint `monotonic`): every insert
/// would go to the last chunk, on one shard.
fn check_monotonic(cx: &Ctxt, key: &Key, lit: &LitStr, f: &Field) {
    if key.allows(MONOTONIC) || !looks_monotonic(f) {
        return;
    }
    let name = &f.bson_name;
    // Only a timestamp can be `from`: an ObjectId's time is not one.
    let derive = if is_timestamp(f.ty) {
        format!("a coarse field derived from it and a search field, as in `coarse = \"month\", from = \"{name}\", search = \"type\"`")
    } else {
        "a coarse field derived from the document's timestamp and a search field, as in `coarse = \"month\", from = \"ts\", search = \"type\"`".to_owned()
    };
    cx.error_spanned_by(
        lit,
        format!("`{name}` alone is a monotonic shard key (lint `monotonic`): its values only grow, so every insert goes to the last chunk, on one shard; use {derive}, or hash it (`hashed = \"{name}\"`), or `allow(monotonic)`"),
    );
}

/// `upsert` and `replace` find a document by its `_id` and its full shard
/// key: a model without a stored `_id` could insert but never replace.
/// Reported only for a key that is otherwise right, so that it never adds
/// to another mistake's errors. A `#[bucket]` model needs none: its key
/// only says how the buckets shard, and no document is replaced by `_id`.
fn require_id(cx: &Ctxt, model: &Input, attr: &Attribute, of_buckets: bool) -> Option<()> {
    if of_buckets || model.stored_id().is_some() {
        return Some(());
    }
    let fix = match model.fields.iter().find(|f| f.rust_name == "id") {
        Some(_) => "mark `id` with `#[serde(rename = \"_id\")]`".to_owned(),
        None => "add one, as in `#[serde(rename = \"_id\")] id: ObjectId`".to_owned(),
    };
    cx.error_spanned_by(
        attr,
        format!("`#[shard_key]` replaces and upserts a document by its `_id` and full shard key, and `{}` has no field stored as `_id`; {fix}", model.ident),
    );
    None
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
