use super::*;
use syn::parse_quote;

fn parsed(input: DeriveInput) -> Result<Option<Spec>, Vec<String>> {
    let (r, e) = crate::ctxt::collect(|cx| {
        Input::from_syn(cx, &input).and_then(|m| parse(cx, &input, &m)?.spec)
    });
    if e.is_empty() {
        Ok(r)
    } else {
        Err(e)
    }
}

#[test]
fn field_and_struct_forms() {
    let c = parsed(parse_quote! {
        #[serde(rename_all = "camelCase")]
        #[approx_counter(field = "likes", every = 10, mode = "buffered", max_delay_ms = 250, max_keys = 5, upsert = true)]
        struct Product {
            #[serde(rename = "_id")] id: String,
            #[approx_counter(every = 100)] web_page_views: i64,
            likes: u32,
        }
    })
    .unwrap()
    .unwrap();
    let got: Vec<(&str, u64, Mode, u64, u64, bool)> = c
        .counters
        .iter()
        .map(|c| {
            (
                c.bson_name.as_str(),
                c.every,
                c.mode,
                c.max_delay_ms,
                c.max_keys,
                c.upsert,
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            ("likes", 10, Mode::Buffered, 250, 5, true),
            ("webPageViews", 100, Mode::Sampled, 1000, 10_000, false)
        ]
    );
}

#[test]
fn mistakes() {
    let e = parsed(parse_quote! {
        struct P {
            #[serde(rename = "_id")] id: String,
            #[approx_counter(every = 1)] a: i64,
            #[approx_counter(every = 0, mode = "sampld")] b: i64,
            #[approx_counter(every = 5, max_delay_ms = 10)] c: i64,
            #[approx_counter(mode = "buffered")] d: i64,
        }
    })
    .err()
    .unwrap();
    assert_eq!(e.len(), 5, "{e:#?}");
    assert!(e[0].contains("exact counter"));
    assert!(e[1].contains("did you mean `sampled`"));
    assert!(e[2].contains("at least 2"));
    assert!(e[3].contains("applies to `mode = \"buffered\"`"));
    assert!(e[4].contains("needs `every`"));

    // A misspelt mode or `field` is reported alone, not what it implies.
    let e = parsed(parse_quote! {
        #[approx_counter(feild = "b", every = 10)]
        struct P {
            #[serde(rename = "_id")] id: String,
            #[approx_counter(every = 5, mode = "bufered", max_delay_ms = 10)] a: i64,
            b: i64,
        }
    })
    .err()
    .unwrap();
    assert_eq!(e.len(), 2, "{e:#?}");
    assert!(e[0].contains("option `feild`"));
    assert!(e[1].contains("did you mean `buffered`"));
    assert_eq!(underscored(MAX_EVERY), "1_000_000");
    assert_eq!(underscored(100), "100");
    assert_eq!(underscored(1000), "1_000");

    // Every wrongly typed value is reported, and reading goes on.
    let e = parsed(parse_quote! {
        struct P {
            #[serde(rename = "_id")] id: String,
            #[approx_counter(every = "10", mode = 2, upsert = 1, max_keys = x, evry = 3)] a: i64,
        }
    })
    .err()
    .unwrap();
    assert_eq!(e.len(), 5, "{e:#?}");
    assert!(
        e[0].contains("integer literal") && e[1].contains("string literal"),
        "{e:#?}"
    );
    assert!(
        e[2].contains("`true` or `false`") && e[3].contains("integer literal"),
        "{e:#?}"
    );
    assert!(e[4].contains("did you mean `every`"), "{e:#?}");

    let e = parsed(parse_quote! {
        #[approx_counter(field = "views", every = 100)]
        struct NoId { views: i64 }
    })
    .err()
    .unwrap();
    assert!(e[0].contains("no field stored as `_id`"), "{e:?}");
}
