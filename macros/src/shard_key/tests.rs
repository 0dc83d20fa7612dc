use super::*;
use syn::parse_quote;

fn parsed(input: DeriveInput) -> Result<Option<Spec>, Vec<String>> {
    let (r, e) = crate::ctxt::collect(|cx| {
        Input::from_syn(cx, &input).and_then(|m| parse(cx, &input, &m, false)?.spec)
    });
    if e.is_empty() {
        Ok(r)
    } else {
        Err(e)
    }
}

#[test]
fn a_derived_coarse_key() {
    let k = parsed(parse_quote! {
        #[shard_key(coarse = "month", from = "ts", search = "type")]
        struct Log { #[serde(rename = "_id")] id: String, #[serde(rename = "type")] kind: String, ts: i64, msg: String }
    })
    .unwrap()
    .unwrap();
    assert_eq!(k.coarse.as_deref(), Some("month"));
    assert_eq!(
        k.derived.as_ref().map(|d| (d.0.as_str(), d.2)),
        Some(("ts", Granularity::Month))
    );
    assert_eq!(k.search.as_ref().map(|s| s.0.as_str()), Some("type"));
    assert!(k.coarse_slot.is_none() && k.small_check.is_none());
}

#[test]
fn lints_and_opt_outs() {
    let e = parsed(parse_quote! {
        #[shard_key(coarse = "ts")]
        struct Log { ts: DateTime }
    })
    .err()
    .unwrap();
    let lints: Vec<bool> = [COARSE_NOT_DERIVED, MISSING_SEARCH, MONOTONIC]
        .iter()
        .map(|l| e.iter().any(|m| m.contains(&format!("lint `{l}`"))))
        .collect();
    assert_eq!(lints, [true, true, true], "{e:#?}");
    assert!(parsed(parse_quote! {
        #[shard_key(coarse = "ts", allow(coarse_not_derived, missing_search, monotonic))]
        struct Log { _id: ObjectId, ts: DateTime }
    })
    .is_ok());

    let e = parsed(parse_quote! {
        #[shard_key(search = "active")]
        struct U { active: bool }
    })
    .err()
    .unwrap();
    assert!(e[0].contains("lint `low_cardinality`"), "{e:?}");
    // An enum's size is only known to the compiler: a const check.
    let k = parsed(parse_quote! {
        #[shard_key(search = "kind")]
        struct Log { _id: ObjectId, kind: LogType }
    })
    .unwrap()
    .unwrap();
    assert!(k.small_check.is_some());
}

#[test]
fn needs_a_stored_id() {
    let e = parsed(parse_quote! {
        #[shard_key(coarse = "month", from = "ts", search = "type")]
        struct Log { id: String, #[serde(rename = "type")] kind: String, ts: i64 }
    })
    .err()
    .unwrap();
    assert_eq!(e.len(), 1, "{e:#?}");
    assert!(
        e[0].contains("has no field stored as `_id`; mark `id`"),
        "{e:?}"
    );
    let e = parsed(parse_quote! {
        #[shard_key(hashed = "user")]
        struct Session { user: String, #[serde(skip)] _id: String }
    })
    .err()
    .unwrap();
    assert!(
        e[0].contains("has no field stored as `_id`; add one"),
        "{e:?}"
    );
    // Another mistake is reported alone.
    let e = parsed(parse_quote! {
        #[shard_key(coarse = "month", from = "ts", search = "tpye")]
        struct Log { r#type: String, ts: i64 }
    })
    .err()
    .unwrap();
    assert_eq!(e.len(), 1, "{e:#?}");
    assert!(!e[0].contains("`_id`"), "{e:?}");
}

#[test]
fn literals_from_macro_rules() {
    use proc_macro2::{Delimiter, Group};
    let g = |t: TokenStream| Group::new(Delimiter::None, t);
    let (c, f, s) = (g(quote!("month")), g(quote!("ts")), g(quote!("type")));
    let input: DeriveInput = syn::parse2(quote! {
        #[shard_key(coarse = #c, from = #f, search = #s)]
        struct Log { #[serde(rename = "_id")] id: i64, #[serde(rename = #s)] kind: String, ts: i64 }
    })
    .unwrap();
    let k = parsed(input).unwrap().unwrap();
    assert_eq!(k.coarse.as_deref(), Some("month"));
    assert_eq!(k.search.as_ref().map(|s| s.0.as_str()), Some("type"));
}

#[test]
fn mistakes() {
    let e = parsed(parse_quote! {
        #[shard_key(hashed = "id", search = "type", granularity = "mnth", alow(x))]
        struct Log { id: String, #[serde(rename = "type")] kind: String }
    })
    .err()
    .unwrap();
    assert_eq!(e.len(), 3, "{e:#?}");
    assert!(e[0].contains("did you mean `month`"));
    assert!(e[1].contains("did you mean `allow`"));
    assert!(e[2].contains("cannot be used with `hashed`"));
}

#[test]
fn every_option_is_read_after_a_wrong_value() {
    let e = parsed(parse_quote! {
        #[shard_key(coarse = month, from = 1, granularity = "mnth", search, allow(monotonic = true, monotonik), sharded = true)]
        struct Log { #[serde(rename = "_id")] id: String, kind: String, ts: i64 }
    })
    .err()
    .unwrap();
    assert_eq!(e.len(), 7, "{e:#?}");
    assert!(e[0].contains("`coarse` takes a string literal"), "{e:#?}");
    assert!(e[1].contains("`from` takes a string literal"), "{e:#?}");
    assert!(e[2].contains("granularity `mnth`"), "{e:#?}");
    assert!(e[3].contains("`search` needs a value"), "{e:#?}");
    assert!(e[4].contains("lint names alone"), "{e:#?}");
    assert!(e[5].contains("did you mean `monotonic`"), "{e:#?}");
    assert!(e[6].contains("option `sharded`"), "{e:#?}");
}
