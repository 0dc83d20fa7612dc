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
    // What cannot be read first, then what is read but wrong.
    assert!(e[0].contains("did you mean `size`"), "{e:#?}");
    assert!(e[1].contains("at least 1"), "{e:#?}");
    assert!(e[2].contains("did you mean `customer_id`"), "{e:#?}");
    let e = errors(parse_quote! { #[bucket(key = "a")] struct T { a: i64 } });
    assert!(e[0].contains("needs option `size`"), "{e:#?}");
    let e = errors(
        parse_quote! { #[bucket(size = 10001, key = "a", items = "count")] struct T { a: i64 } },
    );
    assert!(e[0].contains("time-series"), "{e:#?}");
    assert!(e[1].contains("clashes"), "{e:#?}");
    let e =
        errors(parse_quote! { #[bucket(size = 10, key = "a", order = "a")] struct T { a: i64 } });
    assert!(e[0].contains("names the key field"), "{e:#?}");
}

#[test]
fn items_decode_without_the_key_unless_an_attribute_could_change_them() {
    let ident: Ident = parse_quote!(customer_id);
    let decoder = |input: DeriveInput| {
        keyless_decoder(&input, "customerId", &ident, &Private::default()).map(|t| t.to_string())
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
    let e = errors(parse_quote! { #[bucket(size = 10, key = "count")] struct T { count: i64 } });
    assert_eq!(e.len(), 1, "{e:#?}");
    assert!(e[0].contains("keeps for itself"), "{e:#?}");
}

#[test]
fn every_option_is_read_after_a_wrong_value() {
    let e = errors(parse_quote! {
        #[bucket(size = "10", key = 5, order = "b" "c", items, colour = 1)]
        struct T { a: i64, b: i64 }
    });
    assert_eq!(e.len(), 5, "{e:#?}");
    // Syntax first (the attribute is read whole), then each value.
    assert!(e[0].contains("expected `,`"), "{e:#?}");
    assert!(
        e[1].contains("integer literal") && e[2].contains("string literal"),
        "{e:#?}"
    );
    assert!(e[3].contains("needs a value"), "{e:#?}");
    assert!(e[4].contains("option `colour`"), "{e:#?}");
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
    let e = errors(parse_quote! { #[bucket(size = 10)] #[bucket(key = "a")] struct T { a: i64 } });
    assert_eq!(e.len(), 1, "{e:#?}");
    assert!(e[0].contains("duplicate `#[bucket]`"), "{e:#?}");
}
