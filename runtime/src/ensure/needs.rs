//! What each pattern needs from the server, and what a server says it is.
//!
//! A pattern's declaration lists the server features its repository uses
//! ([`Need`]): an aggregation operator or stage, a command, transactions.
//! [`Model::plan`](crate::Model::plan) and [`Model::ensure`](crate::Model::ensure)
//! ask the server what it is (`hello`, `buildInfo`) once per call, before
//! anything is written, and compare:
//!
//! - a feature the server lacks and the repository cannot do without is
//!   listed in [`Plan::unsupported`](super::Plan::unsupported), and
//!   `ensure` refuses with [`Error::Unsupported`](crate::Error::Unsupported)
//!   before it creates anything;
//! - a feature the repository works around (the `bulkWrite` command before
//!   8.0, transactions on a deployment without them) is a
//!   [`Note::WithoutFeature`](super::Note::WithoutFeature) naming what
//!   changes.
//!
//! How a server is judged, and why:
//! - MongoDB by `hello.maxWireVersion`, which every server sends in its
//!   handshake (6.0 = 17, 7.0 = 21, 8.0 = 25): the version that decides
//!   which operators the server parses. `buildInfo.version` only names it
//!   in messages. A feature-compatibility version below the binary's is not
//!   seen here; the server's refusal is then classified at run time.
//! - FerretDB by the `ferretdbVersion` field of `buildInfo` (its `version`
//!   field names the MongoDB release it imitates, which says nothing of what
//!   it implements): aggregation stages by the `ferretdbFeatures.
//!   aggregationStages` list where it sends one; FerretDB 1.x runs no
//!   transactions (it answers `commitTransaction` with CommandNotFound after
//!   applying the statements one by one), so it is treated as a standalone.
//!   Operators it may lack are not known up front.
//! - Any other server that speaks the protocol (Amazon DocumentDB, Azure
//!   Cosmos DB) is judged by what it reports, which is the MongoDB API
//!   version it imitates: such a server can lack an operator its version
//!   would have (DocumentDB 5.0 has no `$setWindowFields`). What it refuses
//!   at run time is then [`Error::Unsupported`](crate::Error::Unsupported)
//!   (see the classifier in `error/code.rs`), not an opaque error; a
//!   removal refused half-way is repaired by the next read on a server that
//!   can, and reported the same way on one that cannot.
//!
//! Checking up front rather than probing each operator with a harmless
//! aggregation: a probe is one round trip per feature, `$merge` cannot be
//! probed without a write (which `plan` must not send), and a version
//! floor gives a message a user can act on ("needs MongoDB 5.2").

use std::fmt;

use mongodb::bson::{Bson, Document};

use crate::feature::Feature;

/// A feature one pattern's repository uses, and which of its operations
/// use it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Need {
    /// The feature.
    pub feature: Feature,
    /// What uses it: `"bucket update (with order)"`.
    pub by: &'static str,
    /// What the repository does without it, where it works around it
    /// (then a server without it gets a note, not a refusal).
    pub without: Option<&'static str>,
}

impl Need {
    /// `by` cannot work without `feature`.
    pub const fn needs(feature: Feature, by: &'static str) -> Self {
        Need {
            feature,
            by,
            without: None,
        }
    }

    /// `by` uses `feature` where the server has it, and otherwise does
    /// what `without` says.
    pub const fn prefers(feature: Feature, by: &'static str, without: &'static str) -> Self {
        Need {
            feature,
            by,
            without: Some(without),
        }
    }
}

/// A feature a declaration needs and the server lacks: in
/// [`Plan::unsupported`](super::Plan::unsupported), and what
/// [`Model::ensure`](crate::Model::ensure) refuses with.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Unsupported {
    /// The collection whose declaration needs it.
    pub collection: String,
    /// The feature.
    pub feature: Feature,
    /// What needs it.
    pub by: &'static str,
    /// What the server said it is: `"MongoDB 5.0.14 (wire version 13)"`.
    pub server: String,
}

impl fmt::Display for Unsupported {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} on `{}` needs {}, which {} lacks",
            self.by, self.collection, self.feature, self.server
        )
    }
}

impl Unsupported {
    pub(crate) fn into_error(self) -> crate::Error {
        crate::Error::Unsupported {
            feature: self.feature.name().to_owned(),
            needs: Some(self.feature.since()),
            by: Some(format!("{} on `{}`", self.by, self.collection)),
            server: Some(self.server),
            source: None,
        }
    }
}

/// What a server is, as far as its `hello` and `buildInfo` replies say.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ServerFacts {
    /// `hello.maxWireVersion`.
    wire: Option<i32>,
    /// `buildInfo.version`.
    version: Option<String>,
    /// `buildInfo.ferretdbVersion`: a FerretDB.
    ferretdb: Option<String>,
    /// `buildInfo.ferretdbFeatures.aggregationStages`, where sent.
    stages: Option<Vec<String>>,
    /// `hello.setName` or `hello.msg == "isdbgrid"`.
    replicated: bool,
    sharded: bool,
}

impl ServerFacts {
    /// From the replies; `build_info` is `None` where the server refused
    /// `buildInfo`.
    pub(crate) fn from_replies(hello: &Document, build_info: Option<&Document>) -> Self {
        let int = |v: Option<&Bson>| match v {
            Some(Bson::Int32(n)) => Some(*n),
            Some(Bson::Int64(n)) => i32::try_from(*n).ok(),
            Some(Bson::Double(n)) if n.fract() == 0.0 => Some(*n as i32),
            _ => None,
        };
        let string = |d: Option<&Document>, k: &str| d?.get_str(k).ok().map(str::to_owned);
        let stages = build_info
            .and_then(|b| b.get_document("ferretdbFeatures").ok())
            .and_then(|f| f.get_array("aggregationStages").ok())
            .map(|a| {
                a.iter()
                    .filter_map(|s| s.as_str().map(str::to_owned))
                    .collect()
            });
        ServerFacts {
            wire: int(hello.get("maxWireVersion")),
            version: string(build_info, "version"),
            ferretdb: string(build_info, "ferretdbVersion"),
            stages,
            replicated: hello.get_str("setName").is_ok(),
            sharded: crate::util::is_mongos(hello),
        }
    }

    /// Whether the server is known to lack `feature`. Unknown counts as
    /// present: the run-time classifier reports what the server refuses.
    pub(crate) fn lacks(&self, feature: Feature) -> bool {
        if let Some(v) = &self.ferretdb {
            return match feature {
                Feature::Transactions => major(v).is_none_or(|m| m < 2),
                _ => match (feature.stage(), &self.stages) {
                    (Some(stage), Some(listed)) => !listed.iter().any(|s| s == stage),
                    _ => false,
                },
            };
        }
        if feature == Feature::Transactions {
            let floor = if self.sharded { 8 } else { 7 };
            return !(self.replicated || self.sharded) || self.wire.is_some_and(|w| w < floor);
        }
        self.wire.is_some_and(|w| w < feature.wire())
    }

    /// What the server is, for messages.
    pub(crate) fn describe(&self) -> String {
        let kind = match (self.sharded, self.replicated) {
            (true, _) => " (mongos)",
            (false, true) => "",
            (false, false) => " (standalone)",
        };
        match (&self.ferretdb, &self.version, self.wire) {
            (Some(f), _, _) => format!("FerretDB {f}{kind}"),
            (None, Some(v), Some(w)) => format!("MongoDB {v}{kind} (wire version {w})"),
            (None, Some(v), None) => format!("MongoDB {v}{kind}"),
            (None, None, Some(w)) => format!("a server of wire version {w}{kind}"),
            (None, None, None) => format!("this server{kind}"),
        }
    }
}

fn major(version: &str) -> Option<u32> {
    version
        .trim_start_matches('v')
        .split('.')
        .next()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use mongodb::bson::doc;

    fn replica_set(wire: i32, version: &str) -> ServerFacts {
        ServerFacts::from_replies(
            &doc! {"isWritablePrimary": true, "setName": "rs0", "maxWireVersion": wire, "ok": 1},
            Some(&doc! {"version": version, "ok": 1}),
        )
    }

    const ALWAYS: [Feature; 3] = [
        Feature::PipelineUpdate,
        Feature::IsNumber,
        Feature::MergeIntoSelf,
    ];

    /// Each release has what its floor says, and nothing newer.
    #[test]
    fn mongodb_releases() {
        let v82 = replica_set(27, "8.2.0");
        let v80 = replica_set(25, "8.0.4");
        let v70 = replica_set(21, "7.0.12");
        let v60 = replica_set(17, "6.0.19");
        let v50 = replica_set(13, "5.0.30");
        let v44 = replica_set(9, "4.4.29");
        for s in [&v82, &v80, &v70, &v60, &v50, &v44] {
            for f in ALWAYS {
                assert!(!s.lacks(f), "{f} {s:?}");
            }
            assert!(!s.lacks(Feature::Transactions));
        }
        for s in [&v82, &v80] {
            assert!(!s.lacks(Feature::BulkWrite));
        }
        for s in [&v82, &v80, &v70, &v60] {
            assert!(!s.lacks(Feature::SortArray));
            assert!(!s.lacks(Feature::SetWindowFields));
        }
        for s in [&v70, &v60, &v50, &v44] {
            assert!(s.lacks(Feature::BulkWrite), "{s:?}");
        }
        assert!(v50.lacks(Feature::SortArray));
        assert!(!v50.lacks(Feature::SetWindowFields));
        assert!(v44.lacks(Feature::SetWindowFields));
        assert_eq!(
            v50.describe(),
            "MongoDB 5.0.30 (wire version 13)",
            "{v50:?}"
        );
    }

    /// Transactions need a replica set or a `mongos`.
    #[test]
    fn topologies() {
        let standalone = ServerFacts::from_replies(
            &doc! {"isWritablePrimary": true, "maxWireVersion": 25, "ok": 1},
            Some(&doc! {"version": "8.0.4"}),
        );
        assert!(standalone.lacks(Feature::Transactions));
        assert!(!standalone.lacks(Feature::SortArray));
        assert_eq!(
            standalone.describe(),
            "MongoDB 8.0.4 (standalone) (wire version 25)"
        );
        let mongos = ServerFacts::from_replies(
            &doc! {"isWritablePrimary": true, "msg": "isdbgrid", "maxWireVersion": 25, "ok": 1},
            None,
        );
        assert!(!mongos.lacks(Feature::Transactions));
        assert_eq!(mongos.describe(), "a server of wire version 25 (mongos)");
        // 4.0's mongos ran no transactions.
        let old_mongos = ServerFacts::from_replies(
            &doc! {"msg": "isdbgrid", "maxWireVersion": 7_i64, "ok": 1},
            None,
        );
        assert!(old_mongos.lacks(Feature::Transactions));
    }

    /// FerretDB names the MongoDB release it imitates; its own version and
    /// its list of stages decide.
    #[test]
    fn ferretdb() {
        let f1 = ServerFacts::from_replies(
            &doc! {"isWritablePrimary": true, "maxWireVersion": 21, "ok": 1.0},
            Some(&doc! {
                "version": "7.0.42", "ferretdbVersion": "v1.24.0",
                "ferretdbFeatures": {"aggregationStages": ["$count", "$group", "$match", "$sort"]},
                "ok": 1.0,
            }),
        );
        assert!(f1.lacks(Feature::Transactions));
        assert!(f1.lacks(Feature::SetWindowFields));
        assert!(f1.lacks(Feature::MergeIntoSelf));
        // Expressions are not listed: unknown, left to the run time.
        assert!(!f1.lacks(Feature::SortArray));
        assert_eq!(f1.describe(), "FerretDB v1.24.0 (standalone)");
        // With a replica set name set, still no transactions in 1.x.
        let named = ServerFacts::from_replies(
            &doc! {"setName": "rs0", "maxWireVersion": 21},
            Some(&doc! {"version": "7.0.42", "ferretdbVersion": "v1.24.0"}),
        );
        assert!(named.lacks(Feature::Transactions));
        let f2 = ServerFacts::from_replies(
            &doc! {"setName": "rs0", "maxWireVersion": 21},
            Some(&doc! {"version": "7.0.77", "ferretdbVersion": "v2.1.0"}),
        );
        assert!(!f2.lacks(Feature::Transactions));
        assert!(!f2.lacks(Feature::SetWindowFields));
    }

    /// A server that imitates an API version (DocumentDB 5.0 says 5.0.0
    /// and wire version 13) is judged by what it says.
    #[test]
    fn documentdb_like() {
        let docdb = replica_set(13, "5.0.0");
        assert!(docdb.lacks(Feature::SortArray));
        assert!(!docdb.lacks(Feature::SetWindowFields));
        assert!(docdb.lacks(Feature::BulkWrite));
        // An unreadable reply lacks nothing it cannot tell.
        let blank = ServerFacts::from_replies(&doc! {}, None);
        assert!(!blank.lacks(Feature::SortArray));
        assert!(blank.lacks(Feature::Transactions));
        assert_eq!(blank.describe(), "this server (standalone)");
    }

    #[test]
    fn messages_name_the_feature_the_user_and_the_release() {
        let u = Unsupported {
            collection: "history".into(),
            feature: Feature::SortArray,
            by: "bucket update (with order)",
            server: replica_set(13, "5.0.30").describe(),
        };
        assert_eq!(
            u.to_string(),
            "bucket update (with order) on `history` needs `$sortArray` (MongoDB 5.2), which MongoDB 5.0.30 (wire version 13) lacks"
        );
        let e = u.into_error();
        let text = e.to_string();
        for part in ["$sortArray", "MongoDB 5.2", "bucket update", "5.0.30"] {
            assert!(text.contains(part), "{text}");
        }
    }
}
