//! The server's error codes the crate reacts to, by their server names, and
//! the questions call sites ask of an error, so that no call site compares
//! numbers.

use super::Error;

/// `DuplicateKey`: a unique index refused a write.
pub const DUPLICATE_KEY: i32 = 11000;
/// `WriteConflict`: a concurrent transaction wrote the same document.
pub const WRITE_CONFLICT: i32 = 112;
/// `IllegalOperation`: as a standalone server answers a transaction.
pub const ILLEGAL_OPERATION: i32 = 20;
/// `CommandNotFound`: as a replica set answers the sharding commands.
pub const COMMAND_NOT_FOUND: i32 = 59;
/// `TypeMismatch`: an operator met a value of the wrong type.
pub const TYPE_MISMATCH: i32 = 14;
/// `ConversionFailure`: what a pipeline raises on purpose (a failed
/// `$convert`) to refuse a write whose target is damaged.
pub const REFUSED: i32 = 241;
/// `NamespaceNotFound`: no such collection.
pub const NAMESPACE_NOT_FOUND: i32 = 26;
/// `NamespaceExists`: the collection exists already.
pub const NAMESPACE_EXISTS: i32 = 48;
/// `AlreadyInitialized`: sharding is enabled already.
pub const ALREADY_INITIALIZED: i32 = 23;
/// `Unauthorized`: the user lacks the privilege the command needs (an
/// application's user reading `config.collections` on a `mongos`).
pub const UNAUTHORIZED: i32 = 13;
/// `IndexOptionsConflict`: an index on these keys has other options.
pub const INDEX_OPTIONS_CONFLICT: i32 = 85;
/// `IndexKeySpecsConflict`: an index of this name has other keys.
pub const INDEX_KEY_SPECS_CONFLICT: i32 = 86;
/// `CommandNotSupported`: as the documentdb engine (Cosmos DB vCore,
/// FerretDB 2) answers a command it lacks.
pub const COMMAND_NOT_SUPPORTED: i32 = 115;
/// `NotImplemented`.
pub const NOT_IMPLEMENTED: i32 = 238;
/// What Amazon DocumentDB answers a command or feature it lacks.
pub const DOCUMENTDB_UNSUPPORTED: i32 = 303;
/// `Location40415`: a field the server does not know. MongoDB 7.0 has a
/// `bulkWrite` of its own (not the 8.0 command) and answers 8.0's with
/// "BSON field 'bulkWrite.errorsOnly' is an unknown field".
pub const UNKNOWN_FIELD: i32 = 40415;
/// `InvalidPipelineOperator`: "Unrecognized expression '$sortArray'", as
/// a server before the operator's release answers.
pub const INVALID_PIPELINE_OPERATOR: i32 = 168;
/// `Location40324`: "Unrecognized pipeline stage name: '$setWindowFields'".
pub const UNKNOWN_STAGE: i32 = 40324;
/// `Location15952`: "unknown group operator '$x'", an accumulator the
/// server does not know.
pub const UNKNOWN_ACCUMULATOR: i32 = 15952;
/// The codes with which a server refuses an operator or stage it does not
/// recognise, whatever the operator.
pub const UNKNOWN_OPERATOR: [i32; 3] = [
    INVALID_PIPELINE_OPERATOR,
    UNKNOWN_STAGE,
    UNKNOWN_ACCUMULATOR,
];
/// Every code a server answers a command it cannot run with: nothing was
/// executed.
pub const NOT_SUPPORTED: [i32; 4] = [
    COMMAND_NOT_FOUND,
    COMMAND_NOT_SUPPORTED,
    NOT_IMPLEMENTED,
    DOCUMENTDB_UNSUPPORTED,
];
/// The codes of an election, a step-down or a shutdown (the driver's
/// retryable-write codes that a server returns; network errors are the
/// rest): `NotWritablePrimary`, `NotPrimaryNoSecondaryOk`,
/// `NotPrimaryOrSecondary`, `InterruptedDueToReplStateChange`,
/// `PrimarySteppedDown`, `ShutdownInProgress`, `InterruptedAtShutdown`.
/// As a command's or a statement's error they mean the write was refused
/// or interrupted before it was stored; as a write concern error, that it
/// was stored on a primary that then stepped down, and may be rolled back.
pub const FAILOVER: [i32; 7] = [10107, 13435, 13436, 11602, 189, 91, 11600];
/// Codes for a document over 16 MiB (BSONObjectTooLarge, and the
/// update-result variants).
pub const TOO_LARGE: [i32; 3] = [10334, 17419, 17420];

/// The server's error codes in `e`: a command's, or each write's.
pub(crate) fn server_codes(e: &mongodb::error::Error) -> Vec<i32> {
    use mongodb::error::{ErrorKind, WriteFailure};
    match &*e.kind {
        ErrorKind::Command(c) => vec![c.code],
        ErrorKind::Write(WriteFailure::WriteError(w)) => vec![w.code],
        ErrorKind::InsertMany(m) => m.write_errors.iter().flatten().map(|w| w.code).collect(),
        _ => Vec::new(),
    }
}

/// Whether `e` says that the server cannot run `command` at all, so that
/// nothing was executed: an unknown command (59, or the message of a
/// server that sends no code), one the server does not support (115,
/// 238, DocumentDB's 303), or a field of it the server does not know
/// (40415, as 7.0 answers 8.0's `bulkWrite`) other than `readConcern`
/// (which some servers refuse only on a transaction's first command: see
/// [`refuses_read_concern`]). The one place that tells "this server cannot
/// do that" from a failed command.
pub(crate) fn lacks_command(e: &mongodb::error::Error, command: &str) -> bool {
    let mongodb::error::ErrorKind::Command(c) = &*e.kind else {
        return false;
    };
    let m = c.message.to_ascii_lowercase();
    NOT_SUPPORTED.contains(&c.code)
        || c.code == UNKNOWN_FIELD && !refuses_read_concern(e, command)
        || m.contains("no such command")
        || m.contains("no such cmd")
        || m.contains("unrecognized command")
}

/// The operator or stage (`$sortArray`) that `e` says the server does not
/// recognise or support, so that the command was not run: a code of
/// [`UNKNOWN_OPERATOR`] (MongoDB, and the servers that copy its codes), or
/// any refusal ([`NOT_SUPPORTED`], or no code) whose message says so
/// ("Unrecognized expression", "Unrecognized pipeline stage", "unknown
/// group operator", "not supported") and names a `$` operator. The
/// command's own error or a write's (an update pipeline is parsed per
/// statement). The one place that tells "this server cannot do that
/// operator" from a failed command.
pub(crate) fn unknown_operator(e: &mongodb::error::Error) -> Option<String> {
    use mongodb::error::{ErrorKind, WriteFailure};
    let (code, message) = match &*e.kind {
        ErrorKind::Command(c) => (c.code, c.message.as_str()),
        ErrorKind::Write(WriteFailure::WriteError(w)) => (w.code, w.message.as_str()),
        ErrorKind::InsertMany(m) => {
            let w = m.write_errors.as_ref()?.first()?;
            (w.code, w.message.as_str())
        }
        _ => return None,
    };
    let lower = message.to_ascii_lowercase();
    let unknown = [
        "unrecognized expression",
        "unrecognized pipeline stage",
        "unknown group operator",
    ]
    .iter()
    .any(|m| lower.contains(m));
    let unsupported = lower.contains("not supported") || lower.contains("unsupported");
    let refused = UNKNOWN_OPERATOR.contains(&code)
        || unknown
        || (unsupported && (code == 0 || NOT_SUPPORTED.contains(&code)));
    if !refused {
        return None;
    }
    match operator_in(message) {
        Some(op) => Some(op),
        // A refusal by code alone (a proxy's, a fail point's message).
        None if UNKNOWN_OPERATOR.contains(&code) => {
            Some("an unrecognised aggregation operator or stage".to_owned())
        }
        None => None,
    }
}

/// The `$name` a server's message names: the first quoted one ("Invalid
/// $project :: caused by :: Unrecognized expression '$sortArray'" names
/// `$sortArray`), else the first.
fn operator_in(message: &str) -> Option<String> {
    let at = match message.find("'$") {
        Some(quoted) => quoted + 1,
        None => message.find('$')?,
    };
    let name: String = message[at + 1..]
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect();
    (!name.is_empty()).then(|| format!("${name}"))
}

/// Whether `e` refuses `readConcern` on `command` as an unknown field (a
/// server that runs the command, but not as a transaction's first).
pub(crate) fn refuses_read_concern(e: &mongodb::error::Error, command: &str) -> bool {
    let mongodb::error::ErrorKind::Command(c) = &*e.kind else {
        return false;
    };
    c.code == UNKNOWN_FIELD
        && c.message
            .to_ascii_lowercase()
            .contains(&format!("'{}.readconcern'", command.to_ascii_lowercase()))
}

impl Error {
    /// The server's error code: a command's, the first failed write's, or
    /// a write concern error's.
    pub fn code(&self) -> Option<i32> {
        use mongodb::error::{ErrorKind, WriteFailure};
        let e = self.mongo()?;
        match &*e.kind {
            ErrorKind::Write(WriteFailure::WriteConcernError(w)) => Some(w.code),
            ErrorKind::InsertMany(m) if m.write_errors.is_none() => {
                m.write_concern_error.as_ref().map(|w| w.code)
            }
            _ => server_codes(e).first().copied(),
        }
    }

    /// True when a unique index refused a write (code 11000).
    pub fn is_duplicate_key(&self) -> bool {
        self.mongo()
            .is_some_and(|e| server_codes(e).contains(&DUPLICATE_KEY))
    }

    /// An operator met a value of the wrong type: a counter's `$inc` on a
    /// field that holds no number.
    pub(crate) fn is_type_mismatch(&self) -> bool {
        self.code() == Some(TYPE_MISMATCH)
    }

    /// The collection does not exist (dropped since it was listed).
    pub(crate) fn is_namespace_not_found(&self) -> bool {
        self.code() == Some(NAMESPACE_NOT_FOUND)
    }

    /// `create` met a collection that exists already (a concurrent
    /// creator won).
    pub(crate) fn is_namespace_exists(&self) -> bool {
        self.code() == Some(NAMESPACE_EXISTS)
    }

    /// `enableSharding` met a database sharding is enabled on already.
    pub(crate) fn is_already_initialized(&self) -> bool {
        self.code() == Some(ALREADY_INITIALIZED)
    }

    /// The server does not know the command: a sharding command sent to
    /// a deployment that does not shard.
    pub(crate) fn is_command_not_found(&self) -> bool {
        self.code() == Some(COMMAND_NOT_FOUND)
    }

    /// The user lacks the privilege the command needs.
    pub(crate) fn is_unauthorized(&self) -> bool {
        self.code() == Some(UNAUTHORIZED)
    }

    /// `createIndexes` refused the index for one that stands in its way:
    /// the same name with other keys, or the same keys with other options.
    pub(crate) fn is_index_conflict(&self) -> bool {
        matches!(
            self.code(),
            Some(INDEX_OPTIONS_CONFLICT | INDEX_KEY_SPECS_CONFLICT)
        )
    }
}

/// A command's error with `code`, as the driver reports it: for tests.
#[cfg(test)]
pub(crate) fn command_error(code: i32) -> Error {
    let c: mongodb::error::CommandError =
        crate::compat::from_document(mongodb::bson::doc! {"code": code, "errmsg": "no"}).unwrap();
    mongodb::error::Error::from(mongodb::error::ErrorKind::Command(c)).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each predicate answers for its own code and no other.
    #[test]
    fn predicates_name_their_codes() {
        type Predicate = fn(&Error) -> bool;
        let predicates: [(Predicate, &[i32]); 7] = [
            (Error::is_type_mismatch, &[TYPE_MISMATCH]),
            (Error::is_namespace_not_found, &[NAMESPACE_NOT_FOUND]),
            (Error::is_namespace_exists, &[NAMESPACE_EXISTS]),
            (Error::is_already_initialized, &[ALREADY_INITIALIZED]),
            (Error::is_command_not_found, &[COMMAND_NOT_FOUND]),
            (Error::is_unauthorized, &[UNAUTHORIZED]),
            (
                Error::is_index_conflict,
                &[INDEX_OPTIONS_CONFLICT, INDEX_KEY_SPECS_CONFLICT],
            ),
        ];
        let all = [
            DUPLICATE_KEY,
            TYPE_MISMATCH,
            NAMESPACE_NOT_FOUND,
            NAMESPACE_EXISTS,
            ALREADY_INITIALIZED,
            COMMAND_NOT_FOUND,
            UNAUTHORIZED,
            INDEX_OPTIONS_CONFLICT,
            INDEX_KEY_SPECS_CONFLICT,
        ];
        for (is, codes) in predicates {
            for code in all {
                assert_eq!(is(&command_error(code)), codes.contains(&code), "{code}");
            }
            assert!(!is(&Error::invalid("n", "no server code")));
        }
        assert!(command_error(DUPLICATE_KEY).is_duplicate_key());
    }

    fn refusal(code: i32, msg: &str) -> mongodb::error::Error {
        let c: mongodb::error::CommandError =
            crate::compat::from_document(mongodb::bson::doc! {"code": code, "errmsg": msg})
                .unwrap();
        mongodb::error::Error::from(mongodb::error::ErrorKind::Command(c))
    }

    /// Every answer of a server that cannot run a command, as the servers
    /// send them; a refused `readConcern` is not one.
    #[test]
    fn servers_that_lack_a_command_are_recognised() {
        let lacks = |code, msg| lacks_command(&refusal(code, msg), "bulkWrite");
        assert!(lacks(59, "no such command: 'bulkWrite'"));
        assert!(lacks(
            40415,
            "BSON field 'bulkWrite.errorsOnly' is an unknown field."
        ));
        assert!(lacks(115, "bulkWrite is not supported"));
        assert!(lacks(303, "Feature not supported: bulkWrite"));
        assert!(lacks(238, "not implemented"));
        assert!(lacks(0, "unrecognized command: bulkWrite"));
        let rc = refusal(
            40415,
            "BSON field 'bulkWrite.readConcern' is an unknown field.",
        );
        assert!(!lacks_command(&rc, "bulkWrite"));
        assert!(refuses_read_concern(&rc, "bulkWrite"));
        assert!(!refuses_read_concern(
            &refusal(
                40415,
                "BSON field 'bulkWrite.errorsOnly' is an unknown field."
            ),
            "bulkWrite"
        ));
        assert!(!lacks(16, "Write batch sizes must be between 1 and 100000"));
        assert!(!lacks(11000, "duplicate key"));
    }

    /// The refusals of an operator or stage a server does not know, as
    /// MongoDB, DocumentDB and the documentdb engine word them, become the
    /// operator's name; other errors do not.
    #[test]
    fn unknown_operators_are_recognised() {
        let op = |code, msg| unknown_operator(&refusal(code, msg));
        let some = |s: &str| Some(s.to_owned());
        assert_eq!(
            op(
                168,
                "Invalid $project :: caused by :: Unrecognized expression '$sortArray'"
            ),
            some("$sortArray")
        );
        assert_eq!(
            op(
                40324,
                "Unrecognized pipeline stage name: '$setWindowFields'"
            ),
            some("$setWindowFields")
        );
        assert_eq!(op(15952, "unknown group operator '$top'"), some("$top"));
        assert_eq!(
            op(303, "Feature not supported: $setWindowFields"),
            some("$setWindowFields")
        );
        assert_eq!(
            op(115, "$sortArray is not supported yet"),
            some("$sortArray")
        );
        assert_eq!(
            op(0, "Unrecognized expression '$isNumber'"),
            some("$isNumber")
        );
        // As an update's write error (a pipeline update's expression).
        let w: mongodb::error::WriteError = crate::compat::from_document(
            mongodb::bson::doc! {"code": 168, "errmsg": "Unrecognized expression '$bsonSize'"},
        )
        .unwrap();
        let w = mongodb::error::Error::from(mongodb::error::ErrorKind::Write(
            mongodb::error::WriteFailure::WriteError(w),
        ));
        assert_eq!(unknown_operator(&w), some("$bsonSize"));

        assert_eq!(
            op(40324, "Failing command via 'failCommand' failpoint"),
            some("an unrecognised aggregation operator or stage")
        );
        assert_eq!(
            Error::from(refusal(168, "no")).to_string(),
            "an unrecognised aggregation operator or stage is not available on this server"
        );

        // Not refusals of an operator.
        assert_eq!(op(59, "no such command: 'bulkWrite'"), None);
        assert_eq!(op(115, "bulkWrite is not supported"), None);
        assert_eq!(op(2, "unknown operator: $foo"), None);
        assert_eq!(op(14, "$inc on a string: not supported"), None);
        assert_eq!(op(11000, "duplicate key"), None);
        assert_eq!(op(241, "$convert failed"), None);

        // Converted, the error names the operator and its release, and
        // keeps the server's code.
        let e = Error::from(refusal(168, "Unrecognized expression '$sortArray'"));
        assert!(
            matches!(&e, Error::Unsupported { feature, needs: Some("MongoDB 5.2"), .. } if feature == "$sortArray"),
            "{e:?}"
        );
        assert_eq!(e.code(), Some(168));
        assert_eq!(
            e.to_string(),
            "`$sortArray` (MongoDB 5.2) is not available on this server"
        );
        let other = Error::from(refusal(40324, "Unrecognized pipeline stage name: '$foo'"));
        assert_eq!(other.to_string(), "`$foo` is not available on this server");
        assert!(matches!(
            Error::from(refusal(115, "bulkWrite is not supported")),
            Error::Database(_)
        ));
    }
}
