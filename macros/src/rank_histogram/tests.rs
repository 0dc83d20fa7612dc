use super::*;
use syn::parse_quote;

fn parsed(input: DeriveInput) -> Result<Option<Spec>, Vec<String>> {
    let (r, e) = crate::ctxt::collect(|cx| {
        let collection = input.ident.to_string().to_lowercase();
        Input::from_syn(cx, &input).and_then(|m| parse(cx, &input, &m, &collection)?.spec)
    });
    if e.is_empty() {
        Ok(r)
    } else {
        Err(e)
    }
}

#[test]
fn explicit_form_resolves_through_serde() {
    let r = parsed(parse_quote! {
        #[serde(rename_all = "camelCase")]
        #[model(collection = "scores")]
        #[rank_histogram(board = "exam_id", score = "score", order = "asc", precision = 0.5, layout = "documents", histogram = "exam_ranks")]
        struct S { student_id: String, exam_id: String, score: f64 }
    })
    .unwrap()
    .unwrap();
    assert_eq!(r.board.0, "examId");
    assert_eq!(r.score.0, "score");
    assert!(r.order == Order::Asc && r.layout == Layout::Documents);
    assert_eq!(r.precision, Some(0.5));
    assert_eq!(r.histogram, "exam_ranks");
}

#[test]
fn bare_form_infers_when_unambiguous() {
    let r = parsed(parse_quote! {
        #[rank_histogram]
        struct Result {
            #[serde(rename = "_id")] id: ObjectId,
            exam: String,
            points: i32,
            #[serde(skip)] cached: u64,
        }
    })
    .unwrap()
    .unwrap();
    assert_eq!((r.board.0.as_str(), r.score.0.as_str()), ("exam", "points"));
    assert!(r.order == Order::Desc && r.layout == Layout::Array && r.precision.is_none());
    assert_eq!(r.histogram, "result_ranks");
}

#[test]
fn ambiguity_lists_candidates() {
    let e = parsed(parse_quote! {
        #[rank_histogram]
        struct S { student: String, exam: String, score: f64 }
    })
    .err()
    .unwrap();
    assert_eq!(e.len(), 1, "{e:?}");
    assert!(e[0].contains("`student`, `exam`"), "{e:?}");
    // Naming the board settles it.
    assert!(parsed(parse_quote! {
        #[rank_histogram(board = "exam")]
        struct S { student: String, exam: String, score: f64 }
    })
    .is_ok());
}

#[test]
fn an_unresolved_option_adds_no_inference_error() {
    let one = |input: DeriveInput| {
        let e = parsed(input).err().unwrap();
        assert_eq!(e.len(), 1, "{e:?}");
        e[0].clone()
    };
    // The integers could be the board only if they were not the score.
    let e = one(parse_quote! {
        #[rank_histogram]
        struct S { exam: String, points: i32, attempts: i32 }
    });
    assert!(e.contains("infer the score: `points`, `attempts`"), "{e}");
    let e = one(parse_quote! {
        #[rank_histogram(score = "pionts")]
        struct S { exam: String, points: i32 }
    });
    assert!(e.contains("did you mean `points`"), "{e}");
    let e = one(parse_quote! {
        #[rank_histogram(board = "seasn")]
        struct S { season: i32, points: i32 }
    });
    assert!(e.contains("did you mean `season`"), "{e}");
    // An ambiguity that stands whatever the score is still is reported.
    let e = parsed(parse_quote! {
        #[rank_histogram]
        struct S { student: String, exam: String, points: i32, bonus: f64 }
    })
    .err()
    .unwrap();
    assert_eq!(e.len(), 2, "{e:?}");
    assert!(
        e[1].contains("infer the board: `student`, `exam` could"),
        "{e:?}"
    );
    // No candidate at all, with the score's field named.
    let e = one(parse_quote! {
        #[rank_histogram]
        struct S { tags: Vec<String>, points: i32 }
    });
    assert!(
        e.contains("no String, integer, ObjectId or Uuid field besides the score `points`"),
        "{e}"
    );
}

#[test]
fn every_option_is_read_after_a_wrong_value() {
    let e = parsed(parse_quote! {
        #[rank_histogram(board = exam, score = 1, precision = "0.5", layout, ordr = "asc")]
        struct S { exam: String, points: i32 }
    })
    .err()
    .unwrap();
    // No inference error on top: the board and the score were given.
    assert_eq!(e.len(), 5, "{e:#?}");
    assert!(e[0].contains("`board` takes a string literal"), "{e:#?}");
    assert!(e[1].contains("`score` takes a string literal"), "{e:#?}");
    assert!(e[2].contains("number literal"), "{e:#?}");
    assert!(e[3].contains("needs a value"), "{e:#?}");
    assert!(e[4].contains("did you mean `order`"), "{e:#?}");
}

#[test]
fn precision_values() {
    let p = |e: Expr| precision_number(&e).and_then(precision_value);
    assert_eq!(p(parse_quote!(0.5)), Ok(0.5));
    assert_eq!(p(parse_quote!(2)), Ok(2.0));
    assert!(p(parse_quote!(0)).unwrap_err().contains("above 0"));
    assert!(p(parse_quote!(-0.5)).unwrap_err().contains("above 0"));
    assert!(p(parse_quote!("0.5"))
        .unwrap_err()
        .contains("number literal"));
    assert!(p(parse_quote!(1e-20)).unwrap_err().contains("1e-12"));
}
