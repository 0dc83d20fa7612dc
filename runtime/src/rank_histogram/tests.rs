use mongodb::bson::{doc, Bson};
use mongodb::error::TRANSIENT_TRANSACTION_ERROR;

use super::array::array_problem;
use super::documents::{document_problem, statements};
use super::rounding::round;
use super::send::{first_failed, refused_bulk_write};
use super::write::{Delta, Statement};
use super::Rank;
use crate::action::first_write_error;
use crate::error::server_codes;

#[test]
fn rounding_matches_decimal_steps() {
    assert_eq!(round(87.35, Some(0.01)), 87.35);
    assert_eq!(round(87.3449, Some(0.01)), 87.34);
    assert_eq!(round(87.3, Some(0.5)), 87.5);
    assert_eq!(round(87.2, Some(0.5)), 87.0);
    assert_eq!(round(7.4, Some(2.5)), 7.5);
    assert_eq!(round(-0.0, None), 0.0);
    assert!(round(-0.0, None).is_sign_positive());
    assert_eq!(round(0.1 + 0.2, Some(0.1)), 0.3);
}

#[test]
fn rounding_past_the_largest_double_is_infinite_and_refused_upstream() {
    // `score_bson` refuses what this returns for such scores.
    assert!(!round(f64::MAX, Some(0.5)).is_finite());
    assert!(!round(f64::MIN, Some(0.5)).is_finite());
    assert_eq!(round(1e300, Some(0.5)), 1e300);
}

#[test]
fn array_boards_are_checked_entry_by_entry() {
    let ok = doc! {"_id": "b", "scores": [{"score": 2.0, "count": 1_i64}, {"score": 1.0, "count": 3_i32}]};
    assert_eq!(array_problem(&ok, true), None);
    assert_eq!(array_problem(&doc! {"_id": "b"}, true), None);
    let dup = doc! {"_id": "b", "scores": [{"score": 2.0, "count": 1_i64}, {"score": 2.0, "count": 1_i64}]};
    let (field, problem) = array_problem(&dup, true).unwrap();
    assert_eq!(field, "scores");
    assert!(problem.contains("twice"), "{problem}");
    let neg = doc! {"_id": "b", "scores": [{"score": 2.0, "count": -1_i64}]};
    assert_eq!(array_problem(&neg, true).unwrap().0, "scores.0.count");
    let frac = doc! {"_id": "b", "scores": [{"score": 2.0, "count": 1.5}]};
    assert_eq!(array_problem(&frac, true).unwrap().0, "scores.0.count");
    let text = doc! {"_id": "b", "scores": [{"score": "x", "count": 1_i64}]};
    assert_eq!(array_problem(&text, true).unwrap().0, "scores.0.score");
    assert_eq!(
        array_problem(&doc! {"scores": 3}, true).unwrap().0,
        "scores"
    );
    let unsorted = doc! {"_id": "b", "scores": [{"score": 1.0, "count": 1_i64}, {"score": 2.0, "count": 1_i64}]};
    assert!(array_problem(&unsorted, true)
        .unwrap()
        .1
        .contains("out of order"));
    assert_eq!(array_problem(&unsorted, false), None);
    let apart = doc! {"_id": "b", "scores": [{"score": 3.0, "count": 1_i64}, {"score": 2.0, "count": 1_i64}, {"score": 3.0, "count": 1_i64}]};
    assert!(array_problem(&apart, true).unwrap().1.contains("twice"));
}

#[test]
fn score_documents_are_checked() {
    let id = |s: Bson| doc! {"b": "b", "s": s};
    assert_eq!(
        document_problem(&doc! {"_id": id(2.0.into()), "count": 0_i64}),
        None
    );
    assert_eq!(
        document_problem(&doc! {"_id": id(Bson::MinKey), "count": 0_i64}),
        None
    );
    let bad = [
        doc! {"_id": id(2.0.into()), "count": -1_i64},
        doc! {"_id": id(2.0.into()), "count": 2.5},
        doc! {"_id": id(2.0.into()), "count": "2"},
        doc! {"_id": id(2.0.into())},
        doc! {"_id": id("two".into()), "count": 1_i64},
        doc! {"_id": id(Bson::MinKey), "count": 4_i64},
    ];
    for d in bad {
        assert!(document_problem(&d).is_some(), "{d}");
    }
}

#[test]
fn bulk_write_refusals_are_recognised() {
    let refusal = |code: i32, name: &str, msg: &str| -> mongodb::error::Error {
        let c: mongodb::error::CommandError =
            crate::compat::from_document(doc! {"code": code, "codeName": name, "errmsg": msg})
                .unwrap();
        mongodb::error::ErrorKind::Command(c).into()
    };
    // As mongod 7.0, and the test server for a command it lacks, reply.
    assert!(refused_bulk_write(&refusal(
        59,
        "CommandNotFound",
        "no such command: 'bulkWrite'"
    )));
    assert!(refused_bulk_write(&refusal(
        0,
        "",
        "unrecognized command: bulkWrite"
    )));
    assert!(!refused_bulk_write(&refusal(
        16,
        "InvalidLength",
        "Write batch sizes must be between 1 and 100000"
    )));
    assert!(!refused_bulk_write(&mongodb::error::Error::custom(
        "no such command"
    )));
}

/// A `bulkWrite`'s error is its first failed statement, by index, with
/// the server's code; a write concern error is the call's, as the driver
/// reports one of a single write.
#[test]
fn bulk_write_errors_name_the_statement_that_failed() {
    use mongodb::error::{BulkWriteError, ErrorKind, WriteConcernError, WriteError, WriteFailure};
    let write_error = |code: i32| -> WriteError {
        crate::compat::from_document(doc! {"code": code, "errmsg": "refused"}).unwrap()
    };
    let mut b = BulkWriteError::default();
    b.write_errors.insert(4, write_error(11000));
    b.write_errors.insert(2, write_error(241));
    let (idx, e) = first_failed(ErrorKind::BulkWrite(b).into()).unwrap();
    assert_eq!((idx, server_codes(&e)), (2, vec![241]));

    let wce: WriteConcernError =
        crate::compat::from_document(doc! {"code": 100, "codeName": "X", "errmsg": "w: 5"})
            .unwrap();
    let mut b = BulkWriteError::default();
    b.write_concern_errors.push(wce);
    let e = first_failed(ErrorKind::BulkWrite(b).into()).unwrap_err();
    assert!(
        matches!(&*e.kind, ErrorKind::Write(WriteFailure::WriteConcernError(w)) if w.code == 100),
        "{e:?}"
    );
    let io = mongodb::error::Error::from(std::io::Error::from(std::io::ErrorKind::UnexpectedEof));
    assert!(first_failed(io).is_err());
}

/// The documents layout's statements: check the `+1`'s target, `-1`, the
/// removal of an emptied score, `+1` (the marker only for a `-1` alone);
/// after a read that found the `-1`'s count, no check, and no removal
/// unless the count is 1.
#[test]
fn documents_statements_follow_what_a_read_found() {
    let (board, old, new) = (Bson::from("b"), Bson::from(1_i64), Bson::from(2_i64));
    let kinds = |dec: Option<&Bson>, inc: Option<&Bson>, known: Option<i64>| {
        let of = |filter: &mongodb::bson::Document| {
            filter
                .get_document("_id")
                .unwrap()
                .get("s")
                .unwrap()
                .clone()
        };
        let shape = statements(&board, Delta { dec, inc }, known);
        shape
            .into_iter()
            .map(|st| match st {
                Statement::Update { filter, .. } => ("update", of(&filter)),
                Statement::Delete { filter } => ("delete", of(&filter)),
            })
            .collect::<Vec<_>>()
    };
    let (u, d, o, n, m) = ("update", "delete", old.clone(), new.clone(), Bson::MinKey);
    let change = [
        (u, n.clone()),
        (u, o.clone()),
        (d, o.clone()),
        (u, n.clone()),
    ];
    assert_eq!(kinds(Some(&old), Some(&new), None), change);
    assert_eq!(kinds(Some(&old), Some(&new), Some(1)), change[1..]);
    assert_eq!(
        kinds(Some(&old), Some(&new), Some(3)),
        [(u, o.clone()), (u, n.clone())]
    );
    assert_eq!(kinds(None, Some(&new), None), [(u, n)]);
    let unrecord = [(u, o.clone()), (u, m), (d, o)];
    assert_eq!(kinds(Some(&old), None, None), unrecord);
    assert_eq!(kinds(Some(&old), None, Some(2)), unrecord[..2]);
}

#[test]
fn write_errors_of_update_replies_are_read() {
    assert!(first_write_error(&doc! {"n": 2, "ok": 1.0}).is_none());
    let reply = doc! {"n": 1, "writeErrors": [{"index": 1, "code": 11000, "errmsg": "dup"}]};
    let (idx, e) = first_write_error(&reply).unwrap();
    assert_eq!((idx, server_codes(&e)), (1, vec![11000]));
    assert!(e.to_string().contains("dup"), "{e}");
}

#[test]
fn lost_races_are_labelled_transient() {
    let e = crate::error::with_transient_label(mongodb::error::Error::custom("lost"));
    assert!(e.contains_label(TRANSIENT_TRANSACTION_ERROR));
}

#[test]
fn percentile_counts_ties_half() {
    let r = Rank {
        rank: 3,
        dense: 3,
        above: 2,
        ties: 2,
        total: 10,
    };
    assert_eq!(r.percentile(), Some(70.0));
    let empty = Rank {
        rank: 1,
        dense: 1,
        above: 0,
        ties: 0,
        total: 0,
    };
    assert_eq!(empty.percentile(), None);
}
