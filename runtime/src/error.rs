//! One error type for every pattern, so callers match on what went wrong
//! rather than on which module said it.

use mongodb::bson;
use std::fmt;

use mongodb::bson::Bson;

/// The result of every fallible call in this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What can go wrong at run time. Every input a caller or a server can hand
/// us ends here, never in a panic.
///
/// # Inside a caller's transaction
///
/// MongoDB aborts a transaction as soon as one of its statements fails;
/// its later statements and its commit get `NoSuchTransaction` (251,
/// labelled `TransientTransactionError`). So an error that comes from a
/// statement the server refused ([`ScoreNotFound`](Error::ScoreNotFound),
/// [`UnsupportedValue`](Error::UnsupportedValue),
/// [`Damaged`](Error::Damaged), [`FailedValidation`](Error::FailedValidation),
/// [`Database`](Error::Database)) ends the
/// caller's transaction: return it from `and_run2`'s closure (`?`), which
/// aborts and hands it back. Going on would send the next statement into
/// the aborted transaction, whose transient label makes `and_run2` run
/// the whole transaction again, and meet the same refusal each time until
/// its 120 s bound. Races ([`is_transient`](Error::is_transient)) carry
/// the label themselves, so that `and_run2` reruns. A refusal of the
/// call's own ([`InvalidArgument`](Error::InvalidArgument)) fails no
/// statement and leaves the transaction going; returned from
/// `and_run2`'s closure it carries no label, so `and_run2` aborts and
/// hands it back without running the closure again.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A page token could not be used: see [`CursorError`] for why.
    #[error("invalid page token: {0}")]
    InvalidCursor(CursorError),

    /// A caller's argument is outside what the call accepts. The call's
    /// own check, not a failed statement: a caller's transaction goes on.
    #[error("invalid argument `{name}`: {reason}")]
    #[non_exhaustive]
    InvalidArgument {
        /// The argument's name, as the method spells it.
        name: &'static str,
        /// What was wrong with it.
        reason: String,
    },

    /// A stored document does not deserialize into the model. Nothing was
    /// written.
    #[error("document {id} in `{collection}` does not match the model")]
    #[non_exhaustive]
    UnexpectedDocument {
        /// The collection it was read from.
        collection: String,
        /// Its `_id` as stored.
        id: Box<Bson>,
        /// What serde said.
        #[source]
        source: crate::compat::DeError,
    },

    /// A stored document holds a value that the pattern cannot use, such
    /// as an array in a sort key or a string in a counter. Nothing was
    /// written, except as `dropped` says. Where the server refused the
    /// write, a caller's transaction is aborted (see [`Error`]).
    #[error(
        "document {id} in `{collection}`: field `{field}` holds {found}, which cannot be {why}{}",
        .dropped.map(|n| format!("; {n} pending increments of it were dropped")).unwrap_or_default()
    )]
    #[non_exhaustive]
    UnsupportedValue {
        /// The collection it was read from.
        collection: String,
        /// Its `_id` as stored.
        id: Box<Bson>,
        /// The BSON field name.
        field: String,
        /// What the field holds.
        found: Found,
        /// What the value was needed for.
        why: &'static str,
        /// Counters only: the pending increments of this document that were
        /// given up because the server refused them (other keys keep theirs).
        dropped: Option<u64>,
    },

    /// A stored document breaks an invariant of its pattern (another client
    /// wrote it, or it was edited by hand): a bucket whose `count` is not its
    /// array's length, a histogram entry with a negative count, a score
    /// listed twice. The call wrote nothing on top of it. Where the server
    /// refused the write, a caller's transaction is aborted (see [`Error`]).
    #[error("document {id} in `{collection}` is damaged: `{field}` {problem}")]
    #[non_exhaustive]
    Damaged {
        /// The collection it was read from.
        collection: String,
        /// Its `_id` as stored.
        id: Box<Bson>,
        /// The BSON field (or dotted path) at fault.
        field: String,
        /// What is wrong with it.
        problem: String,
    },

    /// The collection's validator refused a write: the document it would
    /// store breaks the `$jsonSchema` that
    /// [`Model::ensure`](crate::Model::ensure) set (or a rule someone else
    /// set), most often because the document was stored before the
    /// validator, at `validate = "strict"`. Nothing of the write was
    /// stored, and a caller's transaction is aborted (see [`Error`]); it
    /// fails the same way again until the document is mended, which
    /// [`Model::validate_existing`](crate::Model::validate_existing)
    /// helps find.
    #[error(
        "the collection's validator refused the write{}{}{}",
        .id.as_deref().map(|id| format!(" to document {id}")).unwrap_or_default(),
        rules(.details.as_deref()),
        driver_said(.source)
    )]
    #[non_exhaustive]
    FailedValidation {
        /// The refused document's `_id`, as the server named it
        /// (`errInfo.failingDocumentId`, MongoDB 5.0 and later).
        id: Option<Box<Bson>>,
        /// The server's `errInfo` (MongoDB 5.0 and later): its `details`
        /// say which rules the document broke; the message names the
        /// first few by field.
        details: Option<Box<bson::Document>>,
        /// The driver's error, with its code (121) and labels.
        #[source]
        source: Box<mongodb::error::Error>,
    },

    /// A document would pass MongoDB's 16 MiB limit: an item too large for
    /// any bucket (`bytes` is its size, nothing was sent), or a write the
    /// server refused for its size (`bytes` is `None`; `source` is the
    /// driver's error, with its code and labels).
    #[error(
        "document too large for MongoDB's 16 MiB limit{}{}",
        .bytes.map(|b| format!(" ({b} bytes)")).unwrap_or_default(),
        .source.as_deref().map(driver_said).unwrap_or_default()
    )]
    #[non_exhaustive]
    DocumentTooLarge {
        /// The size, where known before sending.
        bytes: Option<usize>,
        /// The server's refusal, where it refused.
        #[source]
        source: Option<Box<mongodb::error::Error>>,
    },

    /// Concurrent writers kept winning the race for the same document;
    /// retrying later may succeed.
    #[error("`{operation}` lost {attempts} races in a row to concurrent writers")]
    #[non_exhaustive]
    Contended {
        /// The repository method.
        operation: &'static str,
        /// How many times it tried.
        attempts: usize,
    },

    /// A rank board that was never written.
    #[error("no rank board {board} in `{collection}`")]
    #[non_exhaustive]
    UnknownBoard {
        /// The histogram collection.
        collection: String,
        /// The board, as stored.
        board: Box<Bson>,
    },

    /// A score to take off a rank board that nobody on it holds; nothing
    /// was written. The server refused the decrement, so a caller's
    /// transaction is aborted (see [`Error`]): not worth running again.
    #[error("nobody on rank board {board} holds score {score}")]
    #[non_exhaustive]
    ScoreNotFound {
        /// The board, as stored.
        board: Box<Bson>,
        /// The score, as the histogram would store it.
        score: Box<Bson>,
    },

    /// The deployment does not shard: `command` answered CommandNotFound
    /// (a replica set or a standalone).
    #[error("the deployment is not sharded: `{command}` is not available")]
    #[non_exhaustive]
    NotSharded {
        /// The command that was refused.
        command: &'static str,
    },

    /// A concurrent writer created the same document first. Retried inside
    /// the crate; seen only when retries ran out.
    #[error("lost a race to a concurrent writer{}", driver_said(.0))]
    Raced(#[source] mongodb::error::Error),

    /// A value could not be turned into BSON.
    #[error("cannot convert to BSON")]
    Serialize(#[from] crate::compat::SerError),

    /// The deployment could not be reached, or the connection was lost.
    /// Retrying later may succeed.
    #[error("MongoDB is unreachable{}", driver_said(.0))]
    Unavailable(#[source] mongodb::error::Error),

    /// The server answered with an error.
    #[error("the server returned an error{}", driver_said(.0))]
    Database(#[source] mongodb::error::Error),

    /// A write may or may not be stored: its connection failed after it
    /// was sent, or it was stored on a primary that then stepped down (a
    /// write concern error of an election), and it is one the server
    /// cannot de-duplicate, so it was not sent again; or the tokio runtime
    /// shut down while a task of the call's own ran its writes (the source
    /// then says so). The error underneath keeps the driver's codes and
    /// labels. Read before
    /// writing again, or accept that a retry may count it twice; the
    /// operation's docs say which of its writes can end here.
    #[error("the outcome of `{operation}` is unknown: it may or may not be stored{}", driver_said(.source))]
    #[non_exhaustive]
    OutcomeUnknown {
        /// The repository method.
        operation: &'static str,
        /// What the driver said.
        #[source]
        source: mongodb::error::Error,
    },

    /// A shard key repository's `update` named a document by its `_id`
    /// and a shard key value, and the document is stored under another
    /// value (`stored`). Nothing was written.
    #[error("document {id} in `{collection}` is stored under shard key {stored}, not the one the call named")]
    #[non_exhaustive]
    ShardKeyMismatch {
        /// The collection.
        collection: String,
        /// Its `_id` as stored.
        id: Box<Bson>,
        /// Its shard key fields as stored (boxed: the variant stays no
        /// larger than the others).
        stored: Box<bson::Document>,
    },

    /// The server lacks a feature the operation needs: an operator or
    /// stage it does not recognise (`$sortArray` before MongoDB 5.2,
    /// `$setWindowFields` before 5.0), or one a declaration needs
    /// ([`Model::ensure`](crate::Model::ensure) refuses before creating
    /// anything; [`Model::plan`](crate::Model::plan) lists them all in
    /// [`Plan::unsupported`](crate::ensure::Plan::unsupported)). At run
    /// time it is the server's refusal of a command, classified: the
    /// command was not run, but an operation of several commands (a
    /// bucket removal) may have sent some before it; see each operation's
    /// docs, and [`crate::ensure::Feature`] for what each pattern needs.
    #[error(
        "{}{} is not available on {}{}",
        quoted(.feature),
        .needs.map(|n| format!(" ({n})")).unwrap_or_default(),
        .server.as_deref().unwrap_or("this server"),
        .by.as_ref().map(|b| format!("; {b} needs it")).unwrap_or_default()
    )]
    #[non_exhaustive]
    Unsupported {
        /// The operator, stage or capability: `$sortArray`; where the
        /// server's refusal names none, what its code says ("an
        /// unrecognised aggregation operator or stage").
        feature: String,
        /// The first MongoDB release that has it, where known:
        /// `"MongoDB 5.2"`.
        needs: Option<&'static str>,
        /// What needs it, where known: the pattern's operation and
        /// collection.
        by: Option<String>,
        /// What the server said it is, where asked:
        /// `"MongoDB 5.0.30 (wire version 13)"`.
        server: Option<String>,
        /// The server's refusal, where it refused at run time.
        #[source]
        source: Option<Box<mongodb::error::Error>>,
    },

    /// [`Buckets::adopt_from`](crate::bucket::Buckets::adopt_from) met a
    /// key whose buckets the repository has written to since (pushes, or
    /// any other write): adopting it again would replace them with the
    /// source's items and lose what was written. Nothing of the key was
    /// written; the keys of earlier batches are adopted. Leave the key
    /// out (`only_keys_of`), or delete its buckets first if the source
    /// holds every item.
    #[error("key {key} of `{collection}` has buckets written since it was adopted (or before): adopting it would overwrite them")]
    #[non_exhaustive]
    AlreadyBucketed {
        /// The bucket collection.
        collection: String,
        /// The key, as stored.
        key: Box<Bson>,
    },

    /// A key `rebucket` would move holds more items than one move takes,
    /// and its buckets must be sorted across (`order` declared over
    /// buckets filled in arrival order), so it cannot be moved bucket by
    /// bucket: a move holds the key's items in memory and writes them in
    /// one transaction, so it refuses such a key before reading its
    /// items. Nothing of the key was written. Raise the limit
    /// (`max_items`), or copy the key's items to a flat collection and
    /// `adopt_from` it into a new bucket collection.
    #[error("key {key} of `{collection}` holds {items} items, more than the {limit} one move of `rebucket` takes, and must be sorted across its buckets: nothing written; raise `max_items`, or copy the key to a flat collection and `adopt_from` it")]
    #[non_exhaustive]
    KeyTooLarge {
        /// The bucket collection.
        collection: String,
        /// The key, as stored.
        key: Box<Bson>,
        /// The items its buckets hold (their `count`s).
        items: u64,
        /// The limit it is over.
        limit: u64,
    },

    /// A write that must change several documents together met a
    /// deployment without transactions (a standalone server; or one told
    /// not to use them). Nothing was written. A replica set runs them, a
    /// single-node one included (`mongod --replSet rs0`, then
    /// `rs.initiate()`); a rank histogram can also be allowed to write
    /// its documents one after the other (`allow_non_atomic`).
    #[error("`{operation}` needs a transaction, which this deployment does not run (a standalone server): run a replica set, a single-node one will do")]
    #[non_exhaustive]
    NoTransactions {
        /// The repository method.
        operation: &'static str,
    },
}

pub(crate) mod code;
pub(crate) mod failover;
pub(crate) mod validation;
pub(crate) use code::server_codes;

impl Error {
    /// A document read from `collection` that does not deserialize into the
    /// model, named by its `_id`; any other read error as it is.
    pub(crate) fn unexpected_document(
        collection: &str,
        raw: &bson::RawDocument,
        e: mongodb::error::Error,
    ) -> Error {
        match crate::compat::deserialization(e) {
            Ok(source) => Error::UnexpectedDocument {
                collection: collection.to_owned(),
                id: Box::new(crate::util::id_of(raw)),
                source,
            },
            Err(e) => Error::from(e),
        }
    }
}

impl From<mongodb::error::Error> for Error {
    fn from(e: mongodb::error::Error) -> Self {
        use mongodb::error::ErrorKind;
        if let Some(info) = validation::refusal(&e) {
            return Error::FailedValidation {
                id: info.as_ref().and_then(validation::failing_id).map(Box::new),
                details: info.map(Box::new),
                source: Box::new(e),
            };
        }
        match *e.kind {
            ErrorKind::Io(_)
            | ErrorKind::ServerSelection { .. }
            | ErrorKind::ConnectionPoolCleared { .. } => Error::Unavailable(e),
            _ if server_codes(&e).iter().any(|c| code::TOO_LARGE.contains(c)) => {
                Error::DocumentTooLarge {
                    bytes: None,
                    source: Some(Box::new(e)),
                }
            }
            // Ours, carried through the driver's error (`?` in an
            // `and_run2` closure): given back as it was.
            ErrorKind::Custom(_) if e.get_custom::<Error>().is_some() => e
                .get_custom::<Error>()
                .cloned()
                .unwrap_or(Error::Database(e)),
            _ => match code::unknown_operator(&e) {
                Some(op) => Error::Unsupported {
                    needs: crate::feature::Feature::of_operator(&op).map(|f| f.since()),
                    feature: op,
                    by: None,
                    server: None,
                    source: Some(Box::new(e)),
                },
                None => Error::Database(e),
            },
        }
    }
}

impl From<CursorError> for Error {
    fn from(e: CursorError) -> Self {
        Error::InvalidCursor(e)
    }
}

/// A value or document with no raw BSON form, as a refused argument.
impl From<crate::compat::NotRaw> for Error {
    fn from(e: crate::compat::NotRaw) -> Self {
        Error::invalid(e.what, e.source.to_string())
    }
}

/// `: ` and the rules a validator's refusal names, where its details say.
fn rules(info: Option<&bson::Document>) -> String {
    match info.map(validation::broken_rules) {
        Some(rules) if !rules.is_empty() => format!(": {}", rules.join("; ")),
        _ => String::new(),
    }
}

/// An operator or command's name in backticks; a description as it is.
fn quoted(feature: &str) -> String {
    if feature.contains(' ') {
        feature.to_owned()
    } else {
        format!("`{feature}`")
    }
}

/// What the driver said, after the crate's own words: `: code N
/// CodeName: the server's message` for a server error, the driver's description
/// otherwise (as the driver's own `Display` and sqlx's do), so that a log
/// line of `%e` names the cause; `source()` still gives the driver's error
/// itself, labels included.
fn driver_said(e: &mongodb::error::Error) -> String {
    use mongodb::error::{ErrorKind, WriteFailure};
    match &*e.kind {
        ErrorKind::Command(c) => format!(": code {} {}: {}", c.code, c.code_name, c.message),
        ErrorKind::Write(WriteFailure::WriteError(w)) => {
            format!(": code {}: {}", w.code, w.message)
        }
        ErrorKind::Write(WriteFailure::WriteConcernError(w)) => {
            format!(
                ": write concern error {} ({}): {}",
                w.code_name, w.code, w.message
            )
        }
        kind => match server_codes(e).first() {
            Some(c) => format!(" (code {c}): {kind}"),
            None => format!(": {kind}"),
        },
    }
}

/// `e` with the driver's `TransientTransactionError` label, so that a
/// caller's `and_run2` (or our own transaction runner) runs the whole
/// transaction again. The driver lets only its own errors carry labels;
/// a write-concern error is the one kind whose labels can be set from
/// outside (they are read from the server's reply), so the race is
/// reported as one, with the original error's text.
pub(crate) fn with_transient_label(e: mongodb::error::Error) -> mongodb::error::Error {
    use mongodb::error::TRANSIENT_TRANSACTION_ERROR;
    if e.contains_label(TRANSIENT_TRANSACTION_ERROR) {
        return e;
    }
    let code = server_codes(&e)
        .first()
        .copied()
        .unwrap_or(code::WRITE_CONFLICT);
    let wc = mongodb::bson::doc! {
        "code": code, "codeName": "TransientRace", "errmsg": e.to_string(),
        "errorLabels": [TRANSIENT_TRANSACTION_ERROR],
    };
    match crate::compat::from_document::<mongodb::error::WriteConcernError>(wc) {
        Ok(wc) => {
            mongodb::error::ErrorKind::Write(mongodb::error::WriteFailure::WriteConcernError(wc))
                .into()
        }
        Err(_) => e,
    }
}

impl From<Error> for mongodb::error::Error {
    /// The driver's own error where there is one (codes and labels kept,
    /// so `?` in an `and_run2` callback lets the driver retry a transient
    /// failure, and a server's refusal converts back to the same variant);
    /// otherwise [`mongodb::error::Error::custom`] holding this error,
    /// without a code or labels (so `and_run2` returns it rather than
    /// running the transaction again). `get_custom::<mongo_patterns::Error>()`
    /// gives it back, and so does `mongo_patterns::Error::from`, whose
    /// text is ours: the driver prints a custom error as `Custom user
    /// error` and leaves out what it holds (it prints only a `String`).
    fn from(e: Error) -> Self {
        match e {
            Error::Raced(e) | Error::Unavailable(e) | Error::Database(e) => e,
            Error::OutcomeUnknown { source, .. } => source,
            Error::DocumentTooLarge {
                source: Some(source),
                ..
            }
            | Error::FailedValidation { source, .. } => *source,
            other => mongodb::error::Error::custom(other),
        }
    }
}

impl Error {
    /// True when the failure was reaching the server, not the request itself.
    pub fn is_unavailable(&self) -> bool {
        matches!(self, Error::Unavailable(_))
    }

    /// The driver's error underneath, if the server or the connection
    /// failed.
    pub fn mongo(&self) -> Option<&mongodb::error::Error> {
        match self {
            Error::Raced(e) | Error::Unavailable(e) | Error::Database(e) => Some(e),
            Error::OutcomeUnknown { source, .. } => Some(source),
            Error::Unsupported {
                source: Some(source),
                ..
            }
            | Error::DocumentTooLarge {
                source: Some(source),
                ..
            }
            | Error::FailedValidation { source, .. } => Some(source),
            _ => None,
        }
    }

    /// True when the driver's error underneath carries `label`, such as
    /// `TransientTransactionError` or `UnknownTransactionCommitResult`.
    pub fn contains_label(&self, label: impl AsRef<str>) -> bool {
        self.mongo().is_some_and(|e| e.contains_label(label))
    }

    /// True when running the whole transaction again may succeed: the
    /// error carries `TransientTransactionError`, as a pattern's write that
    /// lost a race inside a caller's transaction does.
    pub fn is_transient(&self) -> bool {
        self.contains_label(mongodb::error::TRANSIENT_TRANSACTION_ERROR)
    }

    /// True when sending the same call again, as it is, may succeed and
    /// cannot store anything twice. Per variant:
    /// - `Unavailable`: yes. No server could be selected, or a read lost
    ///   its connection; a write whose connection failed after it was sent
    ///   is `OutcomeUnknown` instead.
    /// - `Raced`, `Contended`: yes. A concurrent writer won a race the call
    ///   retried for its bound; nothing of the call was stored.
    /// - `Database`: when it carries `TransientTransactionError` (run the
    ///   whole transaction again: the server aborted it), when the server
    ///   refused the command before running it (10107 and its like, as an
    ///   election answers, unless labelled `RetryableWriteError`: that may
    ///   answer the driver's second attempt of a write whose first was
    ///   stored), when the driver says no attempt wrote
    ///   (`NoWritesPerformed`), or on a `WriteConflict`. Not for an error
    ///   that may leave the write stored: outside a transaction those are
    ///   `OutcomeUnknown`.
    /// - `OutcomeUnknown`: no. The write may be stored (the driver had sent
    ///   it once more already, as a retryable write); read before writing
    ///   again, or accept that a retry may count it twice.
    /// - Everything the call refused (`InvalidArgument`, `InvalidCursor`,
    ///   `Damaged`, `FailedValidation`, `UnexpectedDocument`,
    ///   `UnsupportedValue`, `Unsupported`, `KeyTooLarge`,
    ///   `NoTransactions`, `ShardKeyMismatch`, `DocumentTooLarge`, ...): no,
    ///   it fails the same way again.
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Unavailable(_) | Error::Raced(_) | Error::Contended { .. } => true,
            Error::Database(e) => crate::failover::safe_to_resend(e),
            _ => false,
        }
    }

    /// A [`Error::Damaged`] for document `id` of `collection`.
    pub(crate) fn damaged(
        collection: &str,
        id: Bson,
        field: impl Into<String>,
        problem: impl Into<String>,
    ) -> Self {
        Error::Damaged {
            collection: collection.to_owned(),
            id: Box::new(id),
            field: field.into(),
            problem: problem.into(),
        }
    }

    pub(crate) fn invalid(name: &'static str, reason: impl Into<String>) -> Self {
        Error::InvalidArgument {
            name,
            reason: reason.into(),
        }
    }
}

/// What a stored field held that its pattern could not use
/// ([`Error::UnsupportedValue`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Found {
    /// Nothing: the field is missing.
    Missing,
    /// A value of this BSON type.
    Type(bson::spec::ElementType),
    /// Bytes that do not parse as BSON.
    Unreadable,
    /// A document or array nested deeper than `limit` levels.
    #[non_exhaustive]
    TooDeep {
        /// The deepest nesting accepted.
        limit: usize,
    },
    /// Values of `bytes` bytes or more, where at most `limit` fit.
    #[non_exhaustive]
    TooLarge {
        /// How large they are, at least.
        bytes: usize,
        /// The most that fits.
        limit: usize,
    },
}

impl Found {
    /// What `value` is: its type, or missing.
    pub fn of(value: Option<&Bson>) -> Found {
        value.map_or(Found::Missing, |b| Found::Type(b.element_type()))
    }
}

impl fmt::Display for Found {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Found::Missing => f.write_str("nothing"),
            Found::Type(t) => write!(f, "{t:?}"),
            Found::Unreadable => f.write_str("an unreadable value"),
            Found::TooDeep { limit } => write!(f, "a document nested deeper than {limit}"),
            Found::TooLarge { bytes, limit } => write!(
                f,
                "sort values of {bytes} bytes or more (at most {limit} fit in a page token)"
            ),
        }
    }
}

/// Why a page token was refused. Tokens come from clients, so each way a
/// token can be wrong has its own name.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CursorError {
    /// Not URL-safe base64.
    NotBase64,
    /// Shorter than any token this crate writes.
    Truncated,
    /// Written by a version of this crate that this one cannot read.
    UnsupportedVersion(u8),
    /// The checksum does not match: the token was altered or cut.
    Corrupted,
    /// The bytes are not a token's layout.
    Malformed(String),
    /// The token belongs to another database, collection, sort order or
    /// direction, or it is signed and the query has no signing key.
    Foreign,
    /// Longer than [`MAX_TOKEN_LEN`](crate::keyset::MAX_TOKEN_LEN): refused
    /// before it is decoded.
    #[non_exhaustive]
    TooLong {
        /// The token's length, in characters.
        len: usize,
        /// The most a token may have ([`MAX_TOKEN_LEN`](crate::keyset::MAX_TOKEN_LEN)).
        limit: usize,
    },
    /// A value nested deeper than [`MAX_TOKEN_DEPTH`](crate::keyset::MAX_TOKEN_DEPTH):
    /// refused before it is decoded.
    #[non_exhaustive]
    TooDeep {
        /// The deepest nesting accepted ([`MAX_TOKEN_DEPTH`](crate::keyset::MAX_TOKEN_DEPTH)).
        limit: usize,
    },
    /// The query signs its tokens and this one's signature does not match:
    /// forged, unsigned, or issued for another filter or key.
    BadSignature,
}

impl fmt::Display for CursorError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CursorError::NotBase64 => f.write_str("not URL-safe base64"),
            CursorError::Truncated => f.write_str("too short to be a token"),
            CursorError::UnsupportedVersion(v) => write!(f, "unsupported token version {v}"),
            CursorError::Corrupted => f.write_str("checksum mismatch (altered or truncated)"),
            CursorError::Malformed(why) => write!(f, "malformed: {why}"),
            CursorError::Foreign => f.write_str(
                "issued for another database, collection, sort order or direction (or signed, for a query without a key)",
            ),
            CursorError::TooLong { len, limit } => write!(
                f,
                "{len} characters, more than the {limit} a token may have"
            ),
            CursorError::TooDeep { limit } => {
                write!(f, "a value nested deeper than {limit} levels")
            }
            CursorError::BadSignature => {
                f.write_str("signature mismatch (forged, or issued for another filter or key)")
            }
        }
    }
}

impl std::error::Error for CursorError {}

#[cfg(test)]
mod tests {
    /// `is_retryable` is the retry advice of the docs: races, elections
    /// and transient labels yes; an unknown outcome and the call's own
    /// refusals no.
    #[test]
    fn retryable_is_what_a_retry_cannot_double() {
        use super::Error;
        use mongodb::error::{ErrorKind, WriteFailure};
        let write = |code: i32| -> mongodb::error::Error {
            ErrorKind::Write(WriteFailure::WriteError(
                crate::compat::from_document(mongodb::bson::doc! {"code": code, "errmsg": "x"})
                    .unwrap(),
            ))
            .into()
        };
        assert!(Error::Database(write(112)).is_retryable());
        // Refused before it ran: nothing stored.
        assert!(Error::Database(write(10107)).is_retryable());
        // Interrupted while it ran: perhaps stored.
        assert!(!Error::Database(write(11602)).is_retryable());
        assert!(Error::Contended {
            operation: "push",
            attempts: 3
        }
        .is_retryable());
        assert!(Error::Raced(super::with_transient_label(write(11000))).is_retryable());
        assert!(!Error::Database(write(11000)).is_retryable());
        assert!(!Error::OutcomeUnknown {
            operation: "push",
            source: write(11602)
        }
        .is_retryable());
        assert!(!Error::invalid("key", "wrong").is_retryable());
        let labelled = super::with_transient_label(write(11000));
        assert!(Error::Database(labelled).is_retryable());
    }

    /// A `Result<T, Error>` stays cheap to return: payloads that would make
    /// it large (a document's `_id`) are boxed.
    #[test]
    fn error_stays_small() {
        assert!(std::mem::size_of::<super::Error>() <= 128);
    }

    /// A race labelled for the caller's `and_run2` keeps its label through
    /// both conversions, and `code()` reads it.
    #[test]
    fn labels_and_codes_survive_conversion() {
        use mongodb::error::TRANSIENT_TRANSACTION_ERROR;
        let dup: mongodb::error::Error =
            mongodb::error::ErrorKind::Write(mongodb::error::WriteFailure::WriteError(
                crate::compat::from_document(mongodb::bson::doc! {"code": 11000, "errmsg": "dup"})
                    .unwrap(),
            ))
            .into();
        let ours = super::Error::from(dup.clone());
        assert!(ours.is_duplicate_key());
        assert_eq!(ours.code(), Some(11000));
        assert!(!ours.is_transient());

        let raced = super::Error::Raced(super::with_transient_label(dup));
        assert!(raced.is_transient());
        assert_eq!(raced.code(), Some(11000));
        let back = mongodb::error::Error::from(raced);
        assert!(back.contains_label(TRANSIENT_TRANSACTION_ERROR));

        let own = super::Error::invalid("n", "too big");
        let back = mongodb::error::Error::from(own);
        assert!(matches!(
            back.get_custom::<super::Error>(),
            Some(super::Error::InvalidArgument { name: "n", .. })
        ));
        assert!(!back.contains_label(TRANSIENT_TRANSACTION_ERROR));
        // And back to ours, with its own text (the driver's is only
        // "Custom user error").
        let ours = super::Error::from(back);
        assert!(matches!(
            ours,
            super::Error::InvalidArgument { name: "n", .. }
        ));
        assert_eq!(ours.to_string(), "invalid argument `n`: too big");
    }

    /// A driver's error prints what the driver said (a log line of `%e`
    /// names the cause); `source()` still gives the driver's error.
    #[test]
    fn display_says_what_the_driver_said() {
        use std::error::Error as _;
        let dup: mongodb::error::Error =
            mongodb::error::ErrorKind::Write(mongodb::error::WriteFailure::WriteError(
                crate::compat::from_document(
                    mongodb::bson::doc! {"code": 11000, "errmsg": "E11000 duplicate key error collection: t.c index: _id_"},
                )
                .unwrap(),
            ))
            .into();
        let e = super::Error::Database(dup);
        assert_eq!(
            e.to_string(),
            "the server returned an error: code 11000: E11000 duplicate key error collection: t.c index: _id_"
        );
        assert!(e.source().is_some());
        let reset = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "boom");
        let e = super::Error::Unavailable(mongodb::error::ErrorKind::from(reset).into());
        assert!(e.to_string().starts_with("MongoDB is unreachable: "), "{e}");
        assert!(e.to_string().contains("boom"), "{e}");
    }
}
