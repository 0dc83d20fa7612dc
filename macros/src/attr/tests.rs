use super::*;
use proc_macro2::{Delimiter, Group};
use quote::quote;

/// `tokens` as a `macro_rules!` macro passes on a `$x:literal`: inside
/// a group without delimiters.
fn invisible(tokens: TokenStream) -> TokenStream {
    Group::new(Delimiter::None, tokens).into_token_stream()
}

/// The options of `#[x(<tokens>)]`, with the errors reading reported.
fn read_all(tokens: TokenStream) -> (Vec<RawOpt>, Vec<String>) {
    let attr: Attribute = syn::parse_quote!(#[x(#tokens)]);
    crate::ctxt::collect(|cx| read(cx, &attr))
}

fn one<T>(value: TokenStream, f: impl Fn(&Ctxt, &RawOpt) -> Option<T>) -> (Option<T>, Vec<String>) {
    let attr: Attribute = syn::parse_quote!(#[x(key = #value)]);
    crate::ctxt::collect(|cx| {
        let opts = read(cx, &attr);
        f(cx, &opts[0])
    })
}

#[test]
fn literals_from_macro_rules() {
    let s = one(invisible(quote!("month")), |cx, o| {
        o.lit_str(cx, "x", "key = \"a\"")
    });
    assert_eq!(s.0.unwrap().value(), "month");
    let i = one(invisible(quote!(100)), |cx, o| {
        o.lit_int(cx, "x", "key = 1")
    });
    assert_eq!(i.0.unwrap().base10_digits(), "100");
    // Nested groups (a macro calling a macro) unwrap too.
    let twice = invisible(invisible(quote!("a")));
    assert_eq!(
        one(twice, |cx, o| o.lit_str(cx, "x", "key = \"a\""))
            .0
            .unwrap()
            .value(),
        "a"
    );
    // The error still points at a value that is not a literal.
    let (_, e) = one(invisible(quote!(a + b)), |cx, o| {
        o.lit_str(cx, "x", "key = \"a\"")
    });
    assert!(e[0].contains("takes a string literal"), "{e:?}");
    let (_, e) = one(invisible(quote!("s")), |cx, o| {
        o.lit_int(cx, "x", "key = 1")
    });
    assert!(e[0].contains("takes an integer literal"), "{e:?}");
}

#[test]
fn reading_goes_on_after_any_mistake() {
    // A broken value, a stray literal, a literal where a key goes, two
    // commas, a forgotten comma: each reported once, and every good
    // option still read.
    let (opts, e) = read_all(quote!(a = 1 +, b = "x" "y", "lit", c = 2,, d(e = 3, f), g h = 1));
    let names: Vec<&str> = opts.iter().map(|o| o.name.as_str()).collect();
    assert_eq!(names, ["a", "b", "c", "d", "g", "h"], "{e:#?}");
    assert_eq!(e.len(), 5, "{e:#?}");
    assert!(e[4].contains("expected `,`"), "{e:#?}");
    assert!(e[1].contains("expected `,`"), "{e:#?}");
    assert!(e[2].contains("expected an option name"), "{e:#?}");
    assert!(matches!(opts[0].value, RawValue::Broken));
    assert!(matches!(opts[4].value, RawValue::Flag));
    let RawValue::List(_, inner) = &opts[3].value else {
        panic!("a list")
    };
    assert_eq!(inner.len(), 2);
    // Keywords are keys too.
    let (opts, e) = read_all(quote!(crate = "x", r#type = 1));
    assert!(e.is_empty(), "{e:?}");
    assert_eq!(opts[0].name, "crate");
    assert_eq!(opts[1].name, "type");
}

#[test]
fn wrong_kinds_point_at_the_value() {
    let (_, e) = one(quote!(1), |cx, o| o.lit_bool(cx, "x", "key = true"));
    assert!(
        e[0].contains("takes `true` or `false`, as in `key = true`"),
        "{e:?}"
    );
    let attr: Attribute = syn::parse_quote!(#[x(key, key(a))]);
    let (_, e) = crate::ctxt::collect(|cx| {
        let opts = read(cx, &attr);
        opts.iter().for_each(|o| {
            o.lit_str(cx, "x", "key = \"a\"");
        });
    });
    assert!(e[0].contains("needs a value, as in `key = \"a\"`"), "{e:?}");
    assert!(e[1].contains("not a list"), "{e:?}");
}

#[test]
fn suggestions() {
    let c = ["customerId", "date", "ticker"];
    assert_eq!(did_you_mean("customerID", c), Some("customerId"));
    assert_eq!(did_you_mean("custmerId", c), Some("customerId"));
    assert_eq!(did_you_mean("dat", c), Some("date"));
    assert_eq!(did_you_mean("quantity", c), None);
    assert_eq!(
        did_you_mean("sotr", ["sort", "order", "page_size"]),
        Some("sort")
    );
    assert_eq!(did_you_mean("up", ["asc", "desc"]), None);
    assert_eq!(edit_distance("kitten", "sitting"), 3);
    assert_eq!(edit_distance("sotr", "sort"), 1);
}
