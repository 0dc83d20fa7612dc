//! The shard key's rules, one function each: what a hashed key allows,
//! the options a ranged key needs together, the fields they name, and the
//! lints (`lints`) that refuse keys known to hurt.

use super::*;

/// Judges the key, rule by rule: a hashed key, or a ranged key's options
/// that go together, the fields they name, and the lints.
pub(super) fn check(
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
