//! The board and the score a bare `#[rank_histogram]` leaves out: the one
//! stored field of each kind.

use syn::{Attribute, Type};

use super::{BOARD, SCORE};
use crate::ast::{Field, Input};
use crate::ctxt::Ctxt;

pub const INTEGERS: &[&str] = &["i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64"];
pub const FLOATS: &[&str] = &["f32", "f64"];
const KEYS: &[&str] = &["String", "ObjectId", "Uuid"];

/// What fields an option left out may be inferred from.
pub struct Kind {
    option: &'static str,
    what: &'static str,
    example: &'static str,
    fits: fn(&Type) -> bool,
}

pub const SCORE_KIND: Kind = Kind {
    option: SCORE,
    what: "numeric",
    example: "score = \"score\"",
    fits: |ty| is_one_of(ty, INTEGERS) || is_one_of(ty, FLOATS),
};

pub const BOARD_KIND: Kind = Kind {
    option: BOARD,
    what: "String, integer, ObjectId or Uuid",
    example: "board = \"examId\"",
    fits: |ty| is_one_of(ty, INTEGERS) || is_one_of(ty, KEYS),
};

/// The other option's field, as far as it is known when one is inferred.
#[derive(Clone, Copy)]
pub enum Other<'f, 'a> {
    /// Not chosen yet (the score is inferred before the board).
    Open,
    /// This field, which is then no candidate.
    Is(&'f Field<'a>),
    /// Not resolved, and already reported: it may have meant any field of
    /// its kind.
    Failed,
}

/// The one stored field of `kind`, or an error at the attribute that lists
/// the candidates. While `other` is unresolved, only what stands whatever it
/// meant is reported, so that one mistake gives one error.
pub fn infer<'f, 'a>(
    cx: &Ctxt,
    attr: &Attribute,
    model: &'f Input<'a>,
    kind: &Kind,
    other_kind: &Kind,
    other: Other<'f, 'a>,
) -> Option<&'f Field<'a>> {
    let candidates: Vec<&Field> = model
        .fields
        .iter()
        .filter(|f| f.not_stored.is_none() && f.bson_name != "_id" && (kind.fits)(f.ty))
        .filter(|f| !matches!(other, Other::Is(o) if o.bson_name == f.bson_name))
        .collect();
    let (option, example) = (kind.option, kind.example);
    if candidates.is_empty() {
        let besides = match other {
            Other::Is(o) if (kind.fits)(o.ty) => {
                format!(" besides the {} `{}`", other_kind.option, o.bson_name)
            }
            _ => String::new(),
        };
        cx.error_spanned_by(
            attr,
            format!("`#[rank_histogram]` cannot infer the {option}: `{}` has no {} field{besides} that could be it; name one, as in `#[rank_histogram({example})]`", model.ident, kind.what),
        );
        return None;
    }
    let failed = matches!(other, Other::Failed);
    let listed: Vec<&Field> = if failed {
        candidates
            .into_iter()
            .filter(|f| !(other_kind.fits)(f.ty))
            .collect()
    } else {
        candidates
    };
    match listed.as_slice() {
        [one] if !failed => Some(*one),
        [first, _, ..] => {
            let names: Vec<String> = listed
                .iter()
                .map(|f| format!("`{}`", f.bson_name))
                .collect();
            cx.error_spanned_by(
                attr,
                format!("`#[rank_histogram]` cannot infer the {option}: {} could each be it; name one, as in `#[rank_histogram({option} = \"{}\")]`", names.join(", "), first.bson_name),
            );
            None
        }
        _ => None,
    }
}

/// Whether `ty` is a path ending in one of `names` (a syntactic guess for
/// inference only; the explicit form is checked by trait bounds).
pub fn is_one_of(ty: &Type, names: &[&str]) -> bool {
    match ty {
        Type::Path(p) if p.qself.is_none() => p
            .path
            .segments
            .last()
            .is_some_and(|s| s.arguments.is_none() && names.iter().any(|n| s.ident == n)),
        _ => false,
    }
}
