//! The server features the patterns use, and the MongoDB release that
//! brought each: what [`ensure`](crate::ensure) compares a server with up
//! front, and what the error classifier names when a server refuses an
//! operator at run time. A leaf module: both read it, it reads neither.

use std::fmt;

/// A server feature a pattern uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Feature {
    /// Updates with an aggregation pipeline (MongoDB 4.2).
    PipelineUpdate,
    /// The `$isNumber` and `$bsonSize` expressions (MongoDB 4.4).
    IsNumber,
    /// `$merge` into the collection being aggregated (MongoDB 4.4).
    MergeIntoSelf,
    /// The `$setWindowFields` stage (MongoDB 5.0).
    SetWindowFields,
    /// The `$sortArray` expression (MongoDB 5.2).
    SortArray,
    /// The `bulkWrite` command (MongoDB 8.0).
    BulkWrite,
    /// Multi-document transactions: a replica set (4.0) or a sharded
    /// cluster (4.2), not a standalone.
    Transactions,
}

impl Feature {
    /// Its name as the server spells it: an operator, a stage, a command.
    pub fn name(self) -> &'static str {
        match self {
            Feature::PipelineUpdate => "pipeline updates",
            Feature::IsNumber => "$isNumber",
            Feature::MergeIntoSelf => "$merge into the same collection",
            Feature::SetWindowFields => "$setWindowFields",
            Feature::SortArray => "$sortArray",
            Feature::BulkWrite => "bulkWrite",
            Feature::Transactions => "transactions",
        }
    }

    /// The first MongoDB release that has it, as text: `"MongoDB 5.2"`.
    pub fn since(self) -> &'static str {
        match self {
            Feature::PipelineUpdate => "MongoDB 4.2",
            Feature::IsNumber | Feature::MergeIntoSelf => "MongoDB 4.4",
            Feature::SetWindowFields => "MongoDB 5.0",
            Feature::SortArray => "MongoDB 5.2",
            Feature::BulkWrite => "MongoDB 8.0",
            Feature::Transactions => "a MongoDB 4.0 replica set or a 4.2 sharded cluster",
        }
    }

    /// The `hello.maxWireVersion` of that release (4.0 = 7, 4.2 = 8,
    /// 4.4 = 9, 5.0 = 13, 5.2 = 15, 8.0 = 25).
    pub(crate) fn wire(self) -> i32 {
        match self {
            Feature::Transactions => 7,
            Feature::PipelineUpdate => 8,
            Feature::IsNumber | Feature::MergeIntoSelf => 9,
            Feature::SetWindowFields => 13,
            Feature::SortArray => 15,
            Feature::BulkWrite => 25,
        }
    }

    /// The aggregation stage it is, where it is one.
    pub(crate) fn stage(self) -> Option<&'static str> {
        match self {
            Feature::SetWindowFields => Some("$setWindowFields"),
            Feature::MergeIntoSelf => Some("$merge"),
            _ => None,
        }
    }

    /// The feature an operator or stage the server did not recognise
    /// belongs to, where the patterns use it.
    pub(crate) fn of_operator(op: &str) -> Option<Feature> {
        match op {
            "$isNumber" | "$bsonSize" => Some(Feature::IsNumber),
            "$setWindowFields" => Some(Feature::SetWindowFields),
            "$merge" => Some(Feature::MergeIntoSelf),
            "$sortArray" => Some(Feature::SortArray),
            _ => None,
        }
    }
}

impl fmt::Display for Feature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "`{}` ({})", self.name(), self.since())
    }
}
