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
}
