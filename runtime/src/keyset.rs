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

/// Largest page [`Keyset::page_size`] accepts. Bigger reads belong to
/// [`Keyset::stream`], which pages under the hood.
pub const MAX_PAGE_SIZE: u32 = 100_000;
/// Page size when neither the model nor the call names one.
pub const DEFAULT_PAGE_SIZE: u32 = 100;
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

/// One page of items, with tokens to move either way.
#[derive(Debug, Clone)]
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
    pub fn count(&self) -> CountDocuments<'_, T> {
        CountDocuments::new(self)
    }

    /// The `find` this query sends: filter, sort and limit.
    pub fn command(&self) -> Result<(Document, Document, i64)> {
        let plan = self.plan(self.collation.as_ref())?;
        Ok((plan.filter, plan.sort, plan.limit))
    }

    /// Fetches one page: one `find`, one round trip (while the page fits in
    /// one 16 MB batch). See [`FetchPage`].
    pub fn page(&self) -> FetchPage<'_, T> {
        FetchPage::new(self)
    }

    /// Every item from the query's position to the end, fetched a page at a
    /// time: no cursor is held open between pages, so a long job neither
    /// times out a cursor nor holds more than one page in memory. See
    /// [`ItemStream`] (it takes a session, which it then borrows).
    pub fn stream<'a>(self) -> ItemStream<'a, T>
    where
        T: 'a,
    {
        ItemStream::new(self)
    }

    /// Every page from the query's position to the end, each with the token
    /// to resume after it (for checkpointing a long job). See [`PageStream`].
    pub fn pages<'a>(self) -> PageStream<'a, T>
    where
        T: 'a,
    {
        PageStream::new(self)
    }
}
