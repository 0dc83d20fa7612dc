//! Keyset pagination: page by the last key seen, never by `skip`.
//!
//! A page is `find({$and: [filter, boundary]}).sort(keys, _id).limit(n + 1)`:
//! the server seeks straight to the boundary through the index, so page
//! 10,000 costs what page 1 costs. `_id` breaks ties, and the boundary is a
//! strict `$or` over the keys, so duplicate sort values are neither repeated
//! nor skipped. The extra document tells whether a next page exists, without
//! a `count`.
//!
//! Values of every type are paged in MongoDB's own order (BSON comparison
//! order: MinKey, null and missing, numbers with NaN lowest, strings,
//! documents, binary, ObjectId, bool, date, timestamp, regex, MaxKey).
//! `$gt`/`$lt` only match inside one type bracket, and never match NaN, so
//! each boundary is the complement of what sorts at or before the boundary
//! value (`$not`, `$nin`), which the server plans as one index range. A
//! value that cannot be a position (an array, code, MinKey...) is a typed
//! error wherever it appears, never a silent skip.
//!
//! The reads ([`Keyset::page`], [`Keyset::count`], [`Keyset::stream`],
//! [`Keyset::pages`]) are actions: a session, read concern, read
//! preference, comment, time bound, hint and collation, each per read or
//! as the query's defaults. [`Keyset::command`] and [`Keyset::declared`]
//! send nothing, so they stay plain.
//!
//! # Queries and reads
//!
//! `M::keyset(&db)` ([`Documents::keyset`](crate::Documents::keyset)) returns a builder: `.filter(doc)` (or
//! `.untrusted_filter(doc)?`), `.page_size(n)` (1 to 10,000), `.ascending()` /
//! `.descending()`, `.by_id()`, `.signing_key(key)`, `.after(&token)`,
//! `.before(&token)`, `.hint(..)`, `.collation(..)`, `.with_options(..)`,
//! `.with_collection(name)`. Its reads are driver-style actions, run by
//! `.await`: `.page()` ([`FetchPage`], one `find`) for one
//! `Page { items, next, prev }`, and `.count()` ([`CountDocuments`], one
//! `aggregate`), a separate `countDocuments` that paging never runs.
//! `.stream()` ([`ItemStream`]) gives every item to the end and `.pages()`
//! ([`PageStream`]) the pages with their checkpoint tokens: both are
//! `futures::Stream`s, one `find` a page, one page in memory at a time and no
//! cursor held open between pages. All four take a session and the read
//! options, `.hint(..)` and `.collation(..)` included (which, what they do
//! in a session, and the defaults: the [guide](crate::guide#keyset)).
//!
//! ```no_run
//! # use mongo_patterns::prelude::*;
//! # use mongo_patterns::mongodb::options::Hint;
//! # use std::time::Duration;
//! #[derive(Debug, Serialize, Deserialize, Model)]
//! #[serde(rename_all = "camelCase")]
//! #[model(collection = "visits")]
//! #[keyset(sort = "visitedAt", order = "desc")]
//! struct Visit {
//!     #[serde(rename = "_id")]
//!     id: ObjectId,
//!     uuid: String,
//!     visited_at: DateTime,
//! }
//!
//! # async fn f(db: Database, token: PageToken, mut session: mongodb::ClientSession) -> mongo_patterns::Result<()> {
//! let page = Visit::keyset(&db)
//!     .filter(doc! {"uuid": "u-1"})
//!     .after(&token)
//!     .page()
//!     .comment("visits page")
//!     .max_time(Duration::from_secs(2))
//!     .await?;
//! let n = Visit::keyset(&db).count().hint(Hint::Name("mp_keyset_visitedAt".into())).await?;
//! let query = Visit::keyset(&db);
//! let mut all = query.stream().session(&mut session); // borrows `session`
//! while let Some(visit) = all.try_next().await? { /* ... */ }
//! # Ok(()) }
//! ```
//!
//! # Order, boundaries, tokens
//!
//! - **Order.** Sort keys from `#[keyset(sort = "a")]` or
//!   `sort = ["a", "b"]`, then `_id` as the tie-break, all in one direction.
//! - **Boundaries.** A page after key `(v, id)` is
//!   `{$and: [{a: from(v)}, {$or: [{a: after(v)}, {a: {$eq: v}, _id: after(id)}]}]}`:
//!   strict, so duplicate sort values are neither repeated nor skipped.
//!   `from(v)` (at or after `v`) allows nothing the `$or` does not; it is
//!   there for the plan: one range on the index's first key, read in order
//!   (`LIMIT ← FETCH ← IXSCAN`: 54 keys for a page of 50 at depth 1,500 of
//!   2,000 on the test server), where the `$or` alone was planned as one index
//!   scan per branch, merged and sorted in memory (503 keys and 500 documents:
//!   every document after the boundary; `deep_page_uses_the_declared_index`).
//!   By `_id` alone the boundary is `{_id: after(id)}`. `limit(n + 1)`
//!   tells whether a next page exists, so the last page has `next: None` and no
//!   count is ever needed. The batch size equals the limit: one round trip per
//!   page.
//! - **Type brackets.** Pages follow MongoDB's own sort order across types
//!   (MinKey, null and missing, numbers with NaN lowest, strings, documents,
//!   binary, ObjectId, bool, date, timestamp, regex, MaxKey). `$gt`/`$lt` only
//!   match inside one type, and never match NaN, so `after(v)` is the
//!   complement of what sorts at or before `v`:
//!   `{$not: {$lte: v}, $nin: [null, NaN]}`, plus `{$not: {$gte: <smallest
//!   value of the type>}}` for each type that sorts before `v`'s (mirrored
//!   descending). Measured on the test server: `$gt: NaN` and `$lt: NaN` match
//!   nothing, `$eq`/`$gte`/`$lte: NaN` match every NaN (double or decimal),
//!   `$lt: 1` and `$gte: -Infinity` never match NaN, `$eq: null` matches null
//!   and missing. These conditions plan as one index range there, as `$gt`
//!   did: a deep page by `_id` examines 52 keys for 50 items (51 with `$gt`),
//!   where an `$or` of `$gt` and `$type` branches scanned the whole index (see
//!   `deep_pages_cost_what_bracket_local_boundaries_did`). So a float key with
//!   NaNs, or mixed types in one key, pages in `find().sort()` order, each
//!   document once, at every page size and both ways; strings in an `f64`
//!   field fail with the same `UnexpectedDocument` (naming the `_id`) on every
//!   page size. `SortKey` is implemented for integers, floats, `String`,
//!   `bool`, `ObjectId`, `DateTime`, `Decimal128`, `Uuid` and `Option`s of
//!   them; implement it for a newtype that serializes to one.
//! - **Values without a position.** An array (it sorts by an element), code, a
//!   regex, MinKey/MaxKey, a document nested deeper than 8, or sort values over
//!   2 KB together (`MAX_KEY_BYTES`: their token would pass the length limit)
//!   are `UnsupportedValue` naming the document. Every returned document's
//!   sort values are checked, on the raw bytes, not only a page's edges, so
//!   the error comes on every page size alike.
//! - **Tokens.** `PageToken` is versioned, URL-safe base64 of the boundary
//!   values, a fingerprint of the database, collection, sort keys, **direction**
//!   and collation (if any), and a checksum. A token is refused (`InvalidCursor`) before
//!   anything is sent when tampered, truncated (`Corrupted`, `Truncated`) or
//!   issued by another query (`Foreign`: another database, collection, sort
//!   order, or an ascending token given to `.descending()` or to a model with
//!   `order = "desc"`). `before(&prev)` pages back in the query's own
//!   direction, so `prev` tokens keep working. Version 2 (this layout) refuses
//!   tokens of version 1 as `UnsupportedVersion(1)`: a client holding one
//!   starts again from the first page. The values are BSON scalars only
//!   (documents without `$` keys, for compound `_id`s), always operands of
//!   comparison operators, never operators.
//! - **Token modes.** *Unsigned* (the default): the checksum (FNV-1a 64) guards
//!   against accidents (a cut or mangled token), not against a forger, who can
//!   write a well-formed token and so choose where a page starts, within the
//!   caller's filter and nothing more. *Signed* (`.signing_key(key)`, at least
//!   16 bytes, HMAC-SHA-256): the MAC covers the token and the BSON of the
//!   query's filter, so a forged or edited token, one replayed against another
//!   filter (another tenant's) or made with another key is
//!   `InvalidCursor(BadSignature)`; an unsigned token given to a signed query
//!   is refused the same way, and a signed token given to a query without a
//!   key is `Foreign`. The filter is compared as BSON bytes, so build it the
//!   same way (same field order) on each request. Rotate a key by accepting
//!   that old tokens fail: there is no key list. Signing adds one HMAC per
//!   token written or read; the unsigned path is unchanged.
//! - **Limits.** A token string longer than `MAX_TOKEN_LEN` (4,096 bytes) is
//!   `InvalidCursor(TooLong)`, checked before base64 decoding: a 10 MB token
//!   costs one comparison. A value nested deeper than `MAX_TOKEN_DEPTH` (8) is
//!   `InvalidCursor(TooDeep)`, checked by walking the raw bytes with an
//!   explicit stack before anything is decoded recursively (a 150-deep
//!   document once overflowed the stack inside the BSON decoder and aborted the
//!   process). `tests/token_fuzz.rs` feeds the decoder 10⁶ generated inputs on
//!   a 512 KiB stack.
//! - **Trusted filters.** `.filter(doc)` is trusted code: it is sent as given,
//!   and `$where`, `$function` and `$accumulator` run JavaScript on the server.
//!   For a filter built from user input, `.untrusted_filter(doc)` walks it
//!   (iteratively, at most `MAX_FILTER_DEPTH` = 32 levels) and refuses
//!   `$where`, `$function`, `$accumulator` and JavaScript code values with
//!   `InvalidArgument` before anything is sent. It does not judge other
//!   operators (`$regex`, `$expr`): choose which fields a user may name.
//! - **Time ranges.** An ObjectId carries its creation second:
//!   `keyset::created_between(from, to)` and `created_since(from)` give `_id`
//!   range filters. Seconds are whole, so bounds round outwards and nothing in
//!   range is missed.
//! - **The index.** Every figure in `benches/keyset-results.md` assumes the index `{sort keys…, _id}`
//!   in the query's direction (named `mp_keyset_<keys>`, with the query's
//!   collation if it has one); `Model::ensure` creates it, and
//!   `M::keyset(&db).declared()` lists it. Without it each page sorts the
//!   whole filtered collection. By `_id` alone the `_id` index serves.
//!
//! # On a sharded collection
//!
//! Pages stay exactly-once: a page is one `find` with the range filter,
//! the sort and `limit`, and `mongos` sends it to the shards whose chunks
//! the filter can match, each returning at most `limit` documents in the
//! index order, and merges the sorted streams before it returns the first
//! `limit`. The token names a position in the sort order, not a shard or a
//! cursor, so chunk migrations between pages change nothing. What a page
//! costs:
//! - with equality on the shard key in `.filter()` (a customer's orders,
//!   sharded by customer): one shard, as on a replica set;
//! - without it: every shard that holds chunks of the collection reads up
//!   to `limit` index entries and documents, and `mongos` merges `shards ×
//!   limit` to return `limit` (16 shards, pages of 50: up to 800 read per
//!   page). A sort on the shard key itself (ranged) keeps a page to the
//!   shards whose ranges it crosses, usually one or two.
//!
//! The index `ensure` creates, `{sort keys…, _id}`, is created on every
//! shard; the keyset pattern never shards the collection itself (it is
//! yours: `#[shard_key]` on the same model declares its key).
//!
//! # Errors
//!
//! Errors are typed ([`Error`](crate::Error)): `InvalidCursor`,
//! `InvalidArgument` (page size, signing key, untrusted filter),
//! `UnexpectedDocument` (a stored document that does not fit the model, with
//! its `_id`), `UnsupportedValue`, `Unavailable` (connection lost or no server;
//! `is_unavailable()`), `Database`.
//!
//! # Failure behaviour
//!
//! Figures from `tests/keyset_faults.rs` and `tests/token_fuzz.rs`, on the
//! test server.
//!
//! - **Cancelled calls.** Paging only reads: a dropped `page()` or `stream()`
//!   leaves nothing behind (no cursor is kept between pages; a dropped
//!   in-flight `find` is closed by the driver). Resume from the last token the
//!   caller kept.
//! - **Server crash or lost connection.** `Unavailable` (or `Database` for a
//!   server-side error); nothing was written. Retry the same call with the same
//!   token: a token names a position, not a cursor, so it survives restarts,
//!   failovers and days of delay. Items inserted or deleted meanwhile are seen
//!   or not according to their key; an item whose sort key is changed between
//!   pages can be seen twice or not at all (pages are positions, not a
//!   snapshot).
//! - **Retry or not.** Retry `Unavailable`. Do not retry `InvalidCursor`,
//!   `InvalidArgument`, `UnexpectedDocument` or `UnsupportedValue`: the same
//!   input gives the same answer.
//! - **Damaged data.** A document that another client wrote with a sort value
//!   of an unexpected type is paged in MongoDB's order and then fails to
//!   decode (`UnexpectedDocument` with its `_id`) or has no position
//!   (`UnsupportedValue` with its `_id` and field), on every page size, in both
//!   directions; items before it in the order were returned, in whole pages,
//!   and none after. Never a silent skip.
//! - **Hostile tokens.** Refused as `InvalidCursor` before anything is sent,
//!   cheaply (length first, depth without recursion); with a signing key, also
//!   forgeries and replays against another filter.

mod boundary;
mod filter;
mod query;
mod read;
mod token;

use mongodb::bson;
use std::sync::Arc;

use mongodb::bson::oid::ObjectId;
use mongodb::bson::{DateTime, Document};
use mongodb::options::{Collation, Hint};
use mongodb::{Collection, Database};
use serde::de::DeserializeOwned;

pub use filter::{created_between, created_since};
pub use read::{CountDocuments, FetchPage, ItemStream, PageStream};
use token::SigningKey;
pub use token::{PageToken, MAX_KEY_BYTES, MAX_TOKEN_DEPTH, MAX_TOKEN_LEN};

use crate::action::Options;
use crate::error::Result;
use crate::util::impls;

pub use crate::paging::{DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE};
/// Deepest nesting [`Keyset::untrusted_filter`] walks; deeper filters are
/// refused.
pub const MAX_FILTER_DEPTH: usize = 32;
/// Shortest key [`Keyset::signing_key`] accepts, in bytes.
pub const MIN_SIGNING_KEY_LEN: usize = 16;

/// A model's default paging: the sort keys before `_id`, the direction and
/// the page size. `#[keyset(...)]` sets it; without it, `_id` ascending.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeysetSpec {
    /// BSON field names, most significant first; `_id` is always appended.
    pub sort: &'static [&'static str],
    /// Newest (largest) first.
    pub descending: bool,
    /// Items per page.
    pub page_size: u32,
}

impl KeysetSpec {
    /// `_id` ascending, 100 a page.
    pub const BY_ID: KeysetSpec = KeysetSpec {
        sort: &[],
        descending: false,
        page_size: DEFAULT_PAGE_SIZE,
    };

    /// What paging `collection` this way needs in the deployment: the
    /// collection, and the index `{sort keys..., _id}` when it sorts by
    /// more than `_id` ([`Keyset::declared`]). [`Model::declared`](crate::Model::declared)
    /// starts from it.
    pub fn declared(self, db: &Database, collection: &str) -> Vec<crate::ensure::Declared> {
        Keyset::<Document>::new(db, collection, self).declared()
    }
}

/// Types whose BSON values have one sort order, so they can be keyset sort
/// keys. Implement it for a newtype that serializes to one of these.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be a keyset sort key",
    label = "not a BSON scalar with a total order",
    note = "sort keys must serialize to one BSON scalar type: integers, floats, strings, bool, ObjectId, DateTime, Decimal128, Uuid, or an Option of one; implement `mongo_patterns::keyset::SortKey` for a newtype that does"
)]
pub trait SortKey {}

impls!(SortKey: i8, i16, i32, i64, u8, u16, u32, u64, f32, f64, bool, String);
impls!(SortKey: ObjectId, DateTime, bson::Decimal128, bson::Timestamp, bson::Uuid);
impl<T: SortKey> SortKey for Option<T> {}
impl<T: SortKey + ?Sized> SortKey for Box<T> {}

/// One page of items, with tokens to move either way. Serializes (for a
/// handler's JSON) as `{items, next, prev}`, each token as its string.
#[derive(Debug, Clone, serde::Serialize)]
#[non_exhaustive]
pub struct Page<T> {
    /// The items, in the query's order.
    pub items: Vec<T>,
    /// Fetch the following page with [`Keyset::after`]; `None` on the last.
    pub next: Option<PageToken>,
    /// Fetch the preceding page with [`Keyset::before`]; `None` on the first.
    pub prev: Option<PageToken>,
}

#[derive(Debug, Clone)]
enum Position {
    Start,
    After(PageToken),
    Before(PageToken),
}

/// A keyset query over one collection: build it, then fetch a [`Page`] or a
/// [`Stream`](futures::Stream) of items.
///
/// ```no_run
/// # use mongo_patterns::prelude::*;
/// # #[derive(Serialize, Deserialize, Model)] struct Visit { uuid: String }
/// # async fn f(db: mongodb::Database, token: Option<PageToken>) -> mongo_patterns::Result<()> {
/// let mut q = Visit::keyset(&db).filter(doc! {"uuid": "u-1"}).page_size(50);
/// if let Some(t) = &token {
///     q = q.after(t);
/// }
/// let page = q.page().await?; // page.items, page.next
/// # Ok(()) }
/// ```
///
/// The builder's methods only describe the query; the reads
/// ([`page`](Self::page), [`count`](Self::count), [`stream`](Self::stream),
/// [`pages`](Self::pages)) return actions that take a session and options.
/// [`command`](Self::command) and [`declared`](Self::declared) send
/// nothing, so they take no options.
#[derive(Debug)]
pub struct Keyset<T: Send + Sync> {
    db: Database,
    coll: Collection<T>,
    sort: &'static [&'static str],
    descending: bool,
    filter: Document,
    page_size: u32,
    position: Position,
    key: Option<SigningKey>,
    defaults: Options,
    hint: Option<Hint>,
    collation: Option<Collation>,
}

impl<T: Send + Sync> Clone for Keyset<T> {
    fn clone(&self) -> Self {
        Keyset {
            db: self.db.clone(),
            coll: self.coll.clone(),
            sort: self.sort,
            descending: self.descending,
            filter: self.filter.clone(),
            page_size: self.page_size,
            position: self.position.clone(),
            key: self.key.clone(),
            defaults: self.defaults.clone(),
            hint: self.hint.clone(),
            collation: self.collation.clone(),
        }
    }
}

impl<T> Keyset<T>
where
    T: DeserializeOwned + Send + Sync,
{
    /// A query over `collection` in `db`, paged as `spec` says.
    pub fn new(db: &Database, collection: &str, spec: KeysetSpec) -> Self {
        Keyset {
            db: db.clone(),
            coll: db.collection(collection),
            sort: spec.sort,
            descending: spec.descending,
            filter: Document::new(),
            page_size: spec.page_size,
            position: Position::Start,
            key: None,
            defaults: Options::new(),
            hint: None,
            collation: None,
        }
    }

    /// Pages the collection `name` of the same database instead (one
    /// collection per tenant, say). Tokens name their collection: a token
    /// issued on one is `InvalidCursor(Foreign)` on another.
    pub fn with_collection(mut self, name: &str) -> Self {
        self.coll = self.db.collection(name);
        self
    }

    /// Options every read of this query takes unless its action sets them
    /// (what neither sets comes from the `Database`).
    pub fn with_options(mut self, defaults: Options) -> Self {
        self.defaults = defaults;
        self
    }

    /// The collection this query reads, for commands of your own beside it.
    pub fn collection(&self) -> &Collection<T> {
        &self.coll
    }

    /// The index every read of this query should use (`hint`), unless its
    /// action names another. It only changes the plan, never the items, so
    /// tokens do not depend on it.
    pub fn hint(mut self, hint: impl Into<Hint>) -> Self {
        self.hint = Some(hint.into());
        self
    }

    /// Compares strings by `collation` in the filter, the sort and the
    /// boundaries, for every page of this query (set it here rather than on
    /// one page: it changes the order, so a token is `Foreign` to a query
    /// with another collation). The index `{sort keys..., _id}` serves only
    /// with the same collation, which [`declared`](Self::declared) gives it.
    pub fn collation(mut self, collation: Collation) -> Self {
        self.collation = Some(collation);
        self
    }

    /// Only documents matching `filter` (replaces any earlier filter). The
    /// filter is the caller's; tokens never widen it.
    ///
    /// The filter is trusted code: it is sent as given, and operators such
    /// as `$where`, `$function` and `$accumulator` run JavaScript on the
    /// server. For a filter built from user input, use
    /// [`untrusted_filter`](Self::untrusted_filter).
    pub fn filter(mut self, filter: Document) -> Self {
        self.filter = filter;
        self
    }

    /// [`filter`](Self::filter), for a filter built from user input: refused
    /// with `InvalidArgument` (before anything is sent) if it asks the server
    /// to run JavaScript (`$where`, `$function`, `$accumulator`, or a code
    /// value anywhere) or nests deeper than [`MAX_FILTER_DEPTH`]. Other
    /// operators (`$regex`, `$expr`...) stay available: decide which fields
    /// a user may name before building the filter.
    pub fn untrusted_filter(self, filter: Document) -> Result<Self> {
        filter::check_untrusted(&filter)?;
        Ok(self.filter(filter))
    }

    /// Signs this query's page tokens with `key` (HMAC-SHA-256, at least
    /// [`MIN_SIGNING_KEY_LEN`] bytes, checked when a page is fetched). The
    /// signature covers the token and this query's filter, so a token this
    /// key did not issue for this very filter (forged, edited, or replayed
    /// against another filter or tenant) is `InvalidCursor(BadSignature)`.
    /// Without a key, tokens carry a checksum: it catches accidents, not a
    /// forger, who can then choose where a page starts inside the filter.
    pub fn signing_key(mut self, key: impl Into<Arc<[u8]>>) -> Self {
        self.key = Some(SigningKey(key.into()));
        self
    }

    /// What this query needs in the deployment: its collection, and the
    /// index `{sort keys..., _id}` in the query's direction (by `_id` alone,
    /// the `_id` index serves), with the query's collation if it has one. A
    /// page at any depth is then one index seek; without it, every page
    /// sorts the whole filtered collection.
    pub fn declared(&self) -> Vec<crate::ensure::Declared> {
        let decl = crate::ensure::Declared::new(self.coll.name());
        if self.sort.is_empty() {
            return vec![decl];
        }
        let dir = if self.descending { -1 } else { 1 };
        let mut keys = Document::new();
        for k in self.sort {
            keys.insert(*k, dir);
        }
        keys.insert("_id", dir);
        let name = format!("mp_keyset_{}", self.sort.join("_"));
        let mut decl = decl.index(keys, name);
        if let Some(c) = &self.collation {
            for index in &mut decl.indexes {
                if let Some(o) = index.options.as_mut() {
                    o.collation = Some(c.clone());
                }
            }
        }
        vec![decl]
    }

    /// Creates what [`declared`](Self::declared) lists and the deployment
    /// lacks: the collection and its keyset index.
    ///
    /// ```no_run
    /// # use mongo_patterns::prelude::*;
    /// # #[derive(Debug, Clone, Serialize, Deserialize, Model)]
    /// # #[keyset(sort = "at", order = "desc")]
    /// # struct Visit { at: DateTime, page: String }
    /// # async fn f(db: Database) -> mongo_patterns::Result<()> {
    /// Visit::keyset(&db).ensure().await?; // the {at, _id} index
    /// # Ok(()) }
    /// ```
    pub fn ensure(&self) -> crate::ensure::EnsureAction<'_> {
        crate::ensure::EnsureAction::new(&self.db, self.declared())
    }

    /// Items per page, `1..=MAX_PAGE_SIZE` (checked when a page is fetched).
    pub fn page_size(mut self, n: u32) -> Self {
        self.page_size = n;
        self
    }

    /// Smallest key first.
    pub fn ascending(mut self) -> Self {
        self.descending = false;
        self
    }

    /// Largest key first.
    pub fn descending(mut self) -> Self {
        self.descending = true;
        self
    }

    /// Page by `_id` alone, whatever the model declares.
    pub fn by_id(mut self) -> Self {
        self.sort = &[];
        self
    }

    /// The page that follows the item `token` marks (a page's `next`). The
    /// token must come from this query: the same database, collection, sort
    /// keys, direction and collation (and, signed, the same filter and key),
    /// or the page is `InvalidCursor`.
    pub fn after(mut self, token: &PageToken) -> Self {
        self.position = Position::After(token.clone());
        self
    }

    /// The page that precedes the item `token` marks (a page's `prev`),
    /// still in this query's direction.
    pub fn before(mut self, token: &PageToken) -> Self {
        self.position = Position::Before(token.clone());
        self
    }

    /// How many documents match the filter: a separate `countDocuments`
    /// (one `aggregate`), never run as part of paging. See [`CountDocuments`].
    ///
    /// ```no_run
    /// # use mongo_patterns::prelude::*;
    /// # #[derive(Debug, Clone, Serialize, Deserialize, Model)]
    /// # #[keyset(sort = "at", order = "desc", page_size = 50)]
    /// # struct Visit { at: DateTime, page: String }
    /// # async fn f(db: Database) -> mongo_patterns::Result<()> {
    /// let n = Visit::keyset(&db).filter(doc! {"page": "/"}).count().await?;
    /// # Ok(()) }
    /// ```
    pub fn count(&self) -> CountDocuments<'_, T> {
        CountDocuments::new(self, None, None)
    }

    /// The `find` this query sends: filter, sort and limit.
    pub fn command(&self) -> Result<(Document, Document, i64)> {
        let plan = self.plan(self.collation.as_ref())?;
        Ok((plan.filter, plan.sort, plan.limit))
    }

    /// Fetches one page: one `find`, one round trip (while the page fits in
    /// one 16 MB batch). See [`FetchPage`].
    ///
    /// ```no_run
    /// # use mongo_patterns::prelude::*;
    /// # #[derive(Debug, Clone, Serialize, Deserialize, Model)]
    /// # #[keyset(sort = "at", order = "desc", page_size = 50)]
    /// # struct Visit { at: DateTime, page: String }
    /// # async fn f(db: Database) -> mongo_patterns::Result<()> {
    /// let page = Visit::keyset(&db).page().await?; // then `.after(&token)`
    /// # Ok(()) }
    /// ```
    pub fn page(&self) -> FetchPage<'_, T> {
        FetchPage::new(self, None, None)
    }

    /// Every item from the query's position to the end, fetched a page at a
    /// time: no cursor is held open between pages, so a long job neither
    /// times out a cursor nor holds more than one page in memory. See
    /// [`ItemStream`] (it takes a session, which it then borrows).
    ///
    /// ```no_run
    /// # use mongo_patterns::prelude::*;
    /// # #[derive(Debug, Clone, Serialize, Deserialize, Model)]
    /// # #[keyset(sort = "at", order = "desc", page_size = 50)]
    /// # struct Visit { at: DateTime, page: String }
    /// # async fn f(db: Database) -> mongo_patterns::Result<()> {
    /// let all: Vec<Visit> = Visit::keyset(&db).stream().try_collect().await?;
    /// # Ok(()) }
    /// ```
    pub fn stream<'a>(self) -> ItemStream<'a, T>
    where
        T: 'a,
    {
        ItemStream::new(self)
    }

    /// Every page from the query's position to the end, each with the token
    /// to resume after it (for checkpointing a long job). See [`PageStream`].
    ///
    /// ```no_run
    /// # use mongo_patterns::prelude::*;
    /// # #[derive(Debug, Clone, Serialize, Deserialize, Model)]
    /// # #[keyset(sort = "at", order = "desc", page_size = 50)]
    /// # struct Visit { at: DateTime, page: String }
    /// # async fn f(db: Database) -> mongo_patterns::Result<()> {
    /// let mut pages = Visit::keyset(&db).pages();
    /// while let Some(page) = pages.try_next().await? {
    ///     // process `page.items`; checkpoint `page.next` to resume
    /// }
    /// # Ok(()) }
    /// ```
    pub fn pages<'a>(self) -> PageStream<'a, T>
    where
        T: 'a,
    {
        PageStream::new(self)
    }
}
