//! What a score and a board can be, and a score as the histogram stores
//! it.

use mongodb::bson;
use mongodb::bson::Bson;
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::rounding::round;
use super::{RankHistogram, Ranks};
use crate::error::{Error, Result};
use crate::util::impls;

/// Types a board field can have: BSON scalars that compare by value.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be a rank board",
    label = "not a board key",
    note = "a board must be a String, an integer, an ObjectId or a Uuid; implement `mongo_patterns::rank_histogram::BoardKey` for a newtype that serializes to one"
)]
pub trait BoardKey {}

/// Numeric types a score field can have.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be a rank score",
    label = "not a number",
    note = "a score must be an integer (i8 to i64, u8 to u64) or a float (f32, f64)"
)]
pub trait RankScore: Copy + Serialize + DeserializeOwned + Send + Sync + 'static {
    /// Whether the type is an integer (stored as BSON int64) or a float
    /// (stored as a double).
    const INTEGER: bool;
    /// The score as the number MongoDB compares.
    fn to_number(self) -> Number;
}

/// A score as a number: integers stay integers, so that they compare and
/// store exactly.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Number {
    /// An integer score (an unsigned one past `i64::MAX` is refused).
    Int(i128),
    /// A floating-point score.
    Float(f64),
}

macro_rules! int_scores {
    ($($t:ty),*) => {$(
        impl RankScore for $t {
            const INTEGER: bool = true;
            fn to_number(self) -> Number {
                Number::Int(self as i128)
            }
        }
    )*};
}
int_scores!(i8, i16, i32, i64, u8, u16, u32, u64);

impl RankScore for f64 {
    const INTEGER: bool = false;
    fn to_number(self) -> Number {
        Number::Float(self)
    }
}

impl RankScore for f32 {
    const INTEGER: bool = false;
    fn to_number(self) -> Number {
        Number::Float(f64::from(self))
    }
}

impls!(BoardKey: i8, i16, i32, i64, u8, u16, u32, u64, String, bson::oid::ObjectId, bson::Uuid);

/// A score whose type its holder does not name, so that an action can
/// carry one without a bound on its model.
pub(super) trait AnyScore: Send + Sync {
    fn number(&self) -> Number;
    /// The score as the players' documents store it: not rounded.
    fn stored(&self) -> Result<Bson>;
}

impl<S: RankScore> AnyScore for S {
    fn number(&self) -> Number {
        self.to_number()
    }

    fn stored(&self) -> Result<Bson> {
        Ok(crate::compat::to_bson(self)?)
    }
}

impl<T: RankHistogram> Ranks<T> {
    /// The score as stored on the histogram: checked, rounded to the
    /// precision, and of one BSON type per model.
    pub(super) fn score_bson(&self, score: T::Score) -> Result<Bson> {
        self.number_bson(score.to_number())
    }

    /// [`score_bson`](Self::score_bson) of a score as a number.
    pub(super) fn number_bson(&self, score: Number) -> Result<Bson> {
        match score {
            Number::Int(i) => i64::try_from(i).map(Bson::Int64).map_err(|_| {
                Error::invalid(
                    "score",
                    format!("{i} is past i64::MAX, which BSON cannot hold"),
                )
            }),
            Number::Float(f) if !f.is_finite() => Err(Error::invalid(
                "score",
                format!("{f} cannot be ranked: scores must be finite numbers"),
            )),
            Number::Float(f) => match round(f, self.spec.precision) {
                r if r.is_finite() => Ok(Bson::Double(r)),
                _ => Err(Error::invalid(
                    "score",
                    format!(
                        "{f} rounded to precision {} passes the largest double",
                        self.spec.precision.unwrap_or_default()
                    ),
                )),
            },
        }
    }

    /// A score from `rebuild`'s grouping, in the BSON type `score_bson` uses.
    pub(super) fn normalize(&self, s: Bson) -> Bson {
        match (s, T::Score::INTEGER) {
            (Bson::Int32(i), true) => Bson::Int64(i.into()),
            (Bson::Int32(i), false) => Bson::Double(f64::from(i)),
            (Bson::Int64(i), false) => Bson::Double(i as f64),
            (Bson::Double(f), false) => Bson::Double(f + 0.0),
            (other, _) => other,
        }
    }
}

/// A stored score as the number it compares as.
pub(super) fn as_number(b: &Bson) -> Option<f64> {
    match b {
        Bson::Int32(i) => Some(f64::from(*i)),
        Bson::Int64(i) => Some(*i as f64),
        Bson::Double(f) => Some(*f),
        _ => None,
    }
}
