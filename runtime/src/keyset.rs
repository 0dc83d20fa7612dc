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

mod read;
mod token;

use mongodb::bson;
use std::sync::Arc;

use mongodb::bson::oid::ObjectId;
use mongodb::bson::raw::RawBsonRef;
use mongodb::bson::{doc, Bson, DateTime, Document, RawDocument};
use mongodb::options::{Collation, CountOptions, FindOptions, Hint};
use mongodb::{ClientSession, Collection, Database};
use serde::de::DeserializeOwned;

pub use read::{CountDocuments, FetchPage, ItemStream, PageStream};
use token::SigningKey;
pub use token::{PageToken, MAX_KEY_BYTES, MAX_TOKEN_DEPTH, MAX_TOKEN_LEN};

use crate::action::Options;
use crate::error::{Error, Result};

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

macro_rules! sort_keys {
    ($($t:ty),*) => { $(impl SortKey for $t {})* };
}
sort_keys!(
    i8,
    i16,
    i32,
    i64,
    u8,
    u16,
    u32,
    u64,
    f32,
    f64,
    bool,
    String,
    ObjectId,
    DateTime,
    bson::Decimal128,
    bson::Timestamp,
    bson::Uuid
);
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
        check_untrusted(&filter)?;
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

    /// The action's options over this query's defaults; inside the
    /// caller's transaction, without the read concern (the transaction's
    /// applies). Probes the session only when a read concern is set.
    async fn effective(
        &self,
        options: &Options,
        session: &mut Option<&mut ClientSession>,
    ) -> Options {
        let o = options.or(&self.defaults);
        match session.as_deref_mut() {
            Some(s) if o.read_concern.is_some() => {
                if crate::action::in_transaction(s).await {
                    o.in_transaction()
                } else {
                    o
                }
            }
            _ => o,
        }
    }

    /// One `countDocuments` with effective `options`.
    async fn count_with(
        &self,
        options: &Options,
        hint: Option<&Hint>,
        collation: Option<&Collation>,
        session: Option<&mut ClientSession>,
    ) -> Result<u64> {
        let mut o: CountOptions = options.driver().unwrap_or_default();
        o.hint = hint.or(self.hint.as_ref()).cloned();
        o.collation = collation.or(self.collation.as_ref()).cloned();
        let count = self
            .coll
            .count_documents(self.filter.clone())
            .with_options(o);
        Ok(crate::action::run!(count, session)?)
    }

    /// One page with effective `options`; `hint` and `collation` override
    /// the query's.
    async fn fetch(
        &self,
        options: &Options,
        hint: Option<&Hint>,
        collation: Option<&Collation>,
        session: Option<&mut ClientSession>,
    ) -> Result<Page<T>> {
        let collation = collation.or(self.collation.as_ref());
        let plan = self.plan(collation)?;
        // One options struct, as the driver's own setters build.
        let mut o: FindOptions = options.driver().unwrap_or_default();
        o.sort = Some(plan.sort);
        o.limit = Some(plan.limit);
        o.batch_size = Some(plan.limit as u32);
        o.hint = hint.or(self.hint.as_ref()).cloned();
        o.collation = collation.cloned();
        let find = self.coll.find(plan.filter).with_options(o);
        let mut acc = Collect {
            query: self,
            fingerprint: plan.fingerprint,
            signing: plan.signing,
            size: self.page_size as usize,
            items: Vec::with_capacity(self.page_size as usize),
            head: None,
            tail: None,
            more: false,
        };
        // Typed straight from the reply's batch, as the driver does for a
        // `Collection<T>`; only the page's two edge documents are read raw,
        // for their tokens.
        match session {
            None => {
                let mut cursor = find.await?;
                while cursor.advance().await? {
                    if !acc.take(cursor.current(), || cursor.deserialize_current())? {
                        break;
                    }
                }
            }
            Some(s) => {
                let mut cursor = find.session(&mut *s).await?;
                while cursor.advance(&mut *s).await? {
                    if !acc.take(cursor.current(), || cursor.deserialize_current())? {
                        break;
                    }
                }
            }
        }
        let Collect {
            mut items,
            head,
            tail,
            more,
            ..
        } = acc;
        // `head` is the first fetched and `tail` the last of a full page; a
        // page that ends early has no further page in its direction.
        let (prev, next) = match self.position {
            Position::Start => (None, tail.filter(|_| more)),
            Position::After(_) => (head, tail.filter(|_| more)),
            Position::Before(_) => {
                items.reverse();
                (tail.filter(|_| more), head)
            }
        };
        Ok(Page { items, next, prev })
    }

    /// Database, collection, sort keys, declared direction and collation:
    /// what makes a token this query's.
    fn fingerprint(&self, collation: Option<&Collation>) -> Result<u64> {
        let ns = self.coll.namespace();
        let mut bytes = Vec::with_capacity(64);
        let parts = [ns.db.as_str(), ns.coll.as_str()];
        for part in parts.into_iter().chain(self.sort.iter().copied()) {
            bytes.extend_from_slice(&(part.len() as u64).to_le_bytes());
            bytes.extend_from_slice(part.as_bytes());
        }
        bytes.push(u8::from(self.descending));
        // Without a collation the bytes (and old tokens) are as before.
        if let Some(c) = collation {
            bytes.extend_from_slice(&crate::compat::to_vec(c)?);
        }
        Ok(token::fnv1a64(&bytes))
    }

    fn plan(&self, collation: Option<&Collation>) -> Result<Plan> {
        if !(1..=MAX_PAGE_SIZE).contains(&self.page_size) {
            return Err(Error::invalid(
                "page_size",
                format!("{} is not in 1..={MAX_PAGE_SIZE}", self.page_size),
            ));
        }
        let signing = match &self.key {
            Some(key) if key.0.len() < MIN_SIGNING_KEY_LEN => {
                return Err(Error::invalid(
                    "signing_key",
                    format!(
                        "{} bytes; a signing key needs at least {MIN_SIGNING_KEY_LEN}",
                        key.0.len()
                    ),
                ))
            }
            Some(_) => Some(crate::compat::to_vec(&self.filter)?),
            None => None,
        };
        let fingerprint = self.fingerprint(collation)?;
        let (boundary, scan_descending) = match &self.position {
            Position::Start => (None, self.descending),
            Position::After(t) => (Some(t), self.descending),
            Position::Before(t) => (Some(t), !self.descending),
        };
        let mut filter = self.filter.clone();
        if let Some(t) = boundary {
            let key = self.key.as_ref().zip(signing.as_deref());
            let values = t.values_for(fingerprint, self.sort.len() + 1, key)?;
            let after = boundary_filter(self.keys(), values, scan_descending);
            filter = if filter.is_empty() {
                after
            } else {
                doc! {"$and": [filter, after]}
            };
        }
        let dir = if scan_descending { -1 } else { 1 };
        let sort = self
            .keys()
            .map(|k| (k.to_owned(), Bson::Int32(dir)))
            .collect();
        Ok(Plan {
            filter,
            sort,
            limit: i64::from(self.page_size) + 1,
            fingerprint,
            signing,
        })
    }

    fn keys(&self) -> impl Iterator<Item = &'static str> + Clone {
        self.sort.iter().copied().chain(std::iter::once("_id"))
    }

    /// Refuses a document whose sort values have no position: an array,
    /// code, a regex, MinKey/MaxKey, a document too deep, or values too
    /// large for a token. Reads the raw bytes only.
    fn check_sort_values(&self, raw: &RawDocument) -> Result<()> {
        let mut bytes = 0;
        for key in self.keys() {
            let value = match raw.get(key) {
                Ok(Some(v)) => v,
                Ok(None) => continue,
                Err(_) => return Err(self.unsupported(raw, key, "an unreadable value".into())),
            };
            if let Err(e) = token::check_raw(value) {
                let found = match e {
                    crate::error::CursorError::TooDeep => {
                        format!("a document nested deeper than {MAX_TOKEN_DEPTH}")
                    }
                    _ => format!("{:?}", value.element_type()),
                };
                return Err(self.unsupported(raw, key, found));
            }
            bytes += raw_size(value);
            if bytes > MAX_KEY_BYTES {
                return Err(self.unsupported(
                    raw,
                    key,
                    format!("sort values of {bytes} bytes or more (at most {MAX_KEY_BYTES} fit in a page token)"),
                ));
            }
        }
        Ok(())
    }

    fn unsupported(&self, raw: &RawDocument, key: &str, found: String) -> Error {
        Error::UnsupportedValue {
            collection: self.coll.name().to_owned(),
            id: Box::new(id_of(raw)),
            field: key.to_owned(),
            found,
            why: "a keyset sort key (arrays, code, regexes, MinKey/MaxKey and oversized values have no usable position)",
            dropped: None,
        }
    }

    /// The token of `raw`, whose sort values `check_sort_values` passed.
    fn token_of(
        &self,
        raw: &RawDocument,
        fingerprint: u64,
        signing: Option<&[u8]>,
    ) -> Result<PageToken> {
        let values = self
            .keys()
            .map(|key| match raw.get(key) {
                Ok(Some(v)) => Bson::try_from(crate::compat::to_raw_bson(v))
                    .map_err(|_| self.unsupported(raw, key, "an unreadable value".into())),
                _ => Ok(Bson::Null),
            })
            .collect::<Result<Vec<_>>>()?;
        let token = PageToken::new(fingerprint, values);
        match (&self.key, signing) {
            (Some(key), Some(filter)) => token.signed(key, filter),
            _ => Ok(token),
        }
    }

    fn unexpected(&self, raw: &RawDocument, e: mongodb::error::Error) -> Error {
        match crate::compat::deserialization(e) {
            Ok(source) => Error::UnexpectedDocument {
                collection: self.coll.name().to_owned(),
                id: Box::new(id_of(raw)),
                source,
            },
            Err(e) => Error::from(e),
        }
    }
}

/// A page being read: the items, and the tokens of its edges.
struct Collect<'q, T: Send + Sync> {
    query: &'q Keyset<T>,
    fingerprint: u64,
    signing: Option<Vec<u8>>,
    size: usize,
    items: Vec<T>,
    head: Option<PageToken>,
    tail: Option<PageToken>,
    more: bool,
}

impl<T: DeserializeOwned + Send + Sync> Collect<'_, T> {
    /// Takes the document `raw` (typed by `item`); false when the page was
    /// already full, so `raw` is the look-ahead.
    fn take(
        &mut self,
        raw: &RawDocument,
        item: impl FnOnce() -> mongodb::error::Result<T>,
    ) -> Result<bool> {
        if self.items.len() == self.size {
            self.more = true;
            return Ok(false);
        }
        let q = self.query;
        // Every document, not only the edges: a value without a sort
        // position fails on every page size alike.
        q.check_sort_values(raw)?;
        if self.items.is_empty() {
            self.head = Some(q.token_of(raw, self.fingerprint, self.signing.as_deref())?);
        }
        if self.items.len() + 1 == self.size {
            self.tail = Some(q.token_of(raw, self.fingerprint, self.signing.as_deref())?);
        }
        self.items.push(item().map_err(|e| q.unexpected(raw, e))?);
        Ok(true)
    }
}

struct Plan {
    filter: Document,
    sort: Document,
    limit: i64,
    fingerprint: u64,
    /// The filter's BSON, when the query signs its tokens.
    signing: Option<Vec<u8>>,
}

/// Bytes a raw value takes in a token, near enough to bound its size.
fn raw_size(v: RawBsonRef<'_>) -> usize {
    match v {
        RawBsonRef::String(s) => s.len() + 5,
        RawBsonRef::Document(d) => d.as_bytes().len(),
        RawBsonRef::Binary(b) => b.bytes.len() + 5,
        _ => 16,
    }
}

/// The `_id` of a stored document, to name it in an error.
pub(crate) fn id_of(raw: &RawDocument) -> Bson {
    raw.get("_id")
        .ok()
        .flatten()
        .and_then(|v| Bson::try_from(crate::compat::to_raw_bson(v)).ok())
        .unwrap_or(Bson::Null)
}

const NULL: usize = 2;
const NUMBER: usize = 3;
const TIMESTAMP: usize = 10;

/// A value's type bracket, in MongoDB's comparison order: MinKey,
/// undefined, null (and missing), numbers, strings, documents, binary,
/// ObjectId, bool, date, timestamp, then the types no token holds.
fn bracket(v: &Bson) -> usize {
    match v {
        Bson::MinKey => 0,
        Bson::Undefined => 1,
        Bson::Null => NULL,
        Bson::Double(_) | Bson::Int32(_) | Bson::Int64(_) | Bson::Decimal128(_) => NUMBER,
        Bson::String(_) | Bson::Symbol(_) => 4,
        Bson::Document(_) | Bson::Array(_) => 5,
        Bson::Binary(_) => 6,
        Bson::ObjectId(_) => 7,
        Bson::Boolean(_) => 8,
        Bson::DateTime(_) => 9,
        Bson::Timestamp(_) => TIMESTAMP,
        Bson::RegularExpression(_) => 11,
        Bson::DbPointer(_) => 12,
        Bson::JavaScriptCode(_) => 13,
        Bson::JavaScriptCodeWithScope(_) => 14,
        Bson::MaxKey => 15,
    }
}

/// The smallest value of a bracket from numbers to timestamps (NaN aside):
/// `$gte` it matches the whole bracket.
fn bracket_min(b: usize) -> Bson {
    match b {
        NUMBER => Bson::Double(f64::NEG_INFINITY),
        4 => Bson::String(String::new()),
        5 => Bson::Document(Document::new()),
        6 => Bson::Binary(bson::Binary {
            subtype: bson::spec::BinarySubtype::Generic,
            bytes: Vec::new(),
        }),
        7 => Bson::ObjectId(ObjectId::from_bytes([0; 12])),
        8 => Bson::Boolean(false),
        9 => Bson::DateTime(DateTime::MIN),
        _ => Bson::Timestamp(bson::Timestamp {
            time: 0,
            increment: 0,
        }),
    }
}

/// NaN, as a double or a decimal (whose combination field is all ones).
fn is_nan(v: &Bson) -> bool {
    match v {
        Bson::Double(f) => f.is_nan(),
        Bson::Decimal128(d) => d.bytes()[15] & 0x7c == 0x7c,
        _ => false,
    }
}

/// Documents strictly after `values` in the order `keys` ascending (or
/// descending): `$or` of "equal on the first i keys, beyond on key i".
///
/// With more than one key, the `$or` is `$and`ed with "at or beyond the
/// first value" on the first key. It matches nothing the `$or` does not
/// already allow, but it is one range on the index's first field, so the
/// server seeks there and reads the index in order; the `$or` alone was
/// planned as one index scan per branch, merged and then sorted in memory,
/// reading every document after the boundary (measured on the test
/// server: 503 keys and 500 documents for a page of 50 at depth 1,500 of
/// 2,000).
fn boundary_filter(
    keys: impl Iterator<Item = &'static str> + Clone,
    values: &[Bson],
    descending: bool,
) -> Document {
    let mut branches = Vec::new();
    let mut equal = Document::new();
    let mut prefix = None;
    for (key, value) in keys.zip(values) {
        let mut branch = equal.clone();
        branch.extend(beyond(key, value, descending, false));
        branches.push(Bson::Document(branch));
        if prefix.is_none() {
            prefix = Some(beyond(key, value, descending, true));
        }
        // `$eq: null` matches null and missing, `$eq: NaN` every NaN (as
        // measured on the server), as the sort puts each set together.
        equal.insert(key, doc! {"$eq": value.clone()});
    }
    match <[Bson; 1]>::try_from(branches) {
        Ok([Bson::Document(only)]) => only,
        Ok([other]) => doc! {"$or": [other]},
        Err(branches) => match prefix {
            Some(prefix) => doc! {"$and": [prefix, {"$or": branches}]},
            None => doc! {"$or": branches},
        },
    }
}

/// Values of `key` strictly after `v` in MongoDB's sort order (before it,
/// descending), across type brackets, as conditions the server turns into
/// one index range.
///
/// `$gt`/`$lt` only match inside `v`'s bracket, so the condition is the
/// complement of what sorts at or before `v`: `$not: {$lte: v}` (everything
/// but `v`'s bracket up to `v`), then `$not: {$gte: <bracket's minimum>}`
/// for each earlier bracket, and `$nin: [null, NaN]` for null, missing and
/// NaN (NaN sorts below every number, but `$lte`/`$gte` with a number never
/// match it). On the test server this plans as a seek, as `$gt` alone did;
/// an `$or` of `$gt` and `$type` branches scanned the whole index. Arrays
/// sort by an element; these conditions match an array exactly where it
/// sorts, so a page reaches it and refuses it, rather than skip it. Types no
/// token holds (MinKey, regex, code...) are not excluded: wherever one sorts,
/// a page reaches it and refuses it.
///
/// `inclusive`, the values at or after `v`: `$lt`/`$gt` in place of
/// `$lte`/`$gte`, and NaN kept when `v` is NaN.
fn beyond(key: &str, v: &Bson, descending: bool, inclusive: bool) -> Document {
    let b = bracket(v);
    let nan = is_nan(v);
    let mut first = Document::new();
    let mut excluded: Vec<usize>;
    let mut nin: Vec<Bson> = Vec::new();
    if !descending {
        let op = if inclusive { "$lt" } else { "$lte" };
        first.insert("$not", doc! {op: v.clone()});
        excluded = (NUMBER..b.min(TIMESTAMP + 1)).collect();
        if b != NULL {
            nin.push(Bson::Null);
            if !(inclusive && nan) {
                nin.push(Bson::Double(f64::NAN));
            }
        }
    } else {
        let op = if inclusive { "$gt" } else { "$gte" };
        first.insert("$not", doc! {op: v.clone()});
        excluded = (b + 1..=TIMESTAMP).filter(|&x| x >= NUMBER).collect();
        // Every other number sorts above NaN.
        if nan {
            excluded.insert(0, NUMBER);
        }
        if b == NULL {
            nin.push(Bson::Double(f64::NAN));
        }
    }
    if !nin.is_empty() {
        first.insert("$nin", nin);
    }
    let mut conditions = vec![doc! {key: first}];
    conditions.extend(
        excluded
            .into_iter()
            .map(|x| doc! {key: {"$not": {"$gte": bracket_min(x)}}}),
    );
    match <[Document; 1]>::try_from(conditions) {
        Ok([only]) => only,
        Err(all) => doc! {"$and": all},
    }
}

/// Refuses server-side JavaScript and excessive nesting in a filter, walking
/// it with an explicit stack.
fn check_untrusted(filter: &Document) -> Result<()> {
    const JS: [&str; 3] = ["$where", "$function", "$accumulator"];
    let refuse = |why: String| Err(Error::invalid("filter", why));
    let mut stack: Vec<(&Bson, usize)> = Vec::new();
    let mut docs: Vec<(&Document, usize)> = vec![(filter, 1)];
    loop {
        if let Some((d, depth)) = docs.pop() {
            for (k, v) in d {
                if JS.contains(&k.as_str()) {
                    return refuse(format!(
                        "`{k}` runs JavaScript on the server, refused in an untrusted filter"
                    ));
                }
                stack.push((v, depth));
            }
            continue;
        }
        let Some((v, depth)) = stack.pop() else {
            return Ok(());
        };
        match v {
            Bson::JavaScriptCode(_) | Bson::JavaScriptCodeWithScope(_) => {
                return refuse("a JavaScript code value, refused in an untrusted filter".into())
            }
            Bson::Document(_) | Bson::Array(_) if depth >= MAX_FILTER_DEPTH => {
                return refuse(format!("nested deeper than {MAX_FILTER_DEPTH} levels"))
            }
            Bson::Document(d) => docs.push((d, depth + 1)),
            Bson::Array(a) => stack.extend(a.iter().map(|v| (v, depth + 1))),
            _ => {}
        }
    }
}

/// A filter on `_id` for documents whose ObjectId was made in `[from, to)`.
///
/// ObjectIds hold their creation time in whole seconds, so the
/// range is widened to whole seconds: `from` rounds down and `to` rounds up.
/// Nothing in range is ever missed. Combine it with other conditions in
/// `$and`.
pub fn created_between(from: DateTime, to: DateTime) -> Result<Document> {
    if from > to {
        return Err(Error::invalid(
            "from",
            format!("{from} is after `to` ({to})"),
        ));
    }
    let lo = object_id_at(from.timestamp_millis().div_euclid(1000), "from")?;
    let hi_secs = (to.timestamp_millis() + 999).div_euclid(1000);
    let mut range = doc! {"$gte": lo};
    // Past the last second an ObjectId can hold, everything is in range.
    if hi_secs <= i64::from(u32::MAX) {
        range.insert("$lt", object_id_at(hi_secs, "to")?);
    }
    Ok(doc! {"_id": range})
}

/// A filter on `_id` for documents whose ObjectId was made at `from` or later.
pub fn created_since(from: DateTime) -> Result<Document> {
    let lo = object_id_at(from.timestamp_millis().div_euclid(1000), "from")?;
    Ok(doc! {"_id": {"$gte": lo}})
}

/// The smallest ObjectId made in second `secs` of the Unix epoch.
fn object_id_at(secs: i64, name: &'static str) -> Result<ObjectId> {
    let secs = u32::try_from(secs).map_err(|_| {
        Error::invalid(
            name,
            format!("second {secs} is outside what an ObjectId can hold (1970 to 2106)"),
        )
    })?;
    let mut bytes = [0u8; 12];
    bytes[..4].copy_from_slice(&secs.to_be_bytes());
    Ok(ObjectId::from_bytes(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(k: &'static [&'static str]) -> impl Iterator<Item = &'static str> + Clone {
        k.iter().copied().chain(std::iter::once("_id"))
    }

    /// Equal as the server reads them (`NaN != NaN` for `PartialEq`).
    macro_rules! same {
        ($a:expr, $b:expr) => {
            assert_eq!(($a).to_string(), ($b).to_string())
        };
    }

    #[test]
    fn boundary_is_a_strict_or_within_one_range() {
        let f = boundary_filter(keys(&["t"]), &[Bson::Int32(5), Bson::Int32(9)], false);
        same!(
            f,
            doc! {"$and": [
                {"t": {"$not": {"$lt": 5}, "$nin": [null, f64::NAN]}},
                {"$or": [
                    {"t": {"$not": {"$lte": 5}, "$nin": [null, f64::NAN]}},
                    {"t": {"$eq": 5}, "_id": {"$not": {"$lte": 9}, "$nin": [null, f64::NAN]}},
                ]},
            ]}
        );
    }

    /// The range is what sorts at or after the value: NaN and null
    /// included when they are the value.
    #[test]
    fn inclusive_ranges_keep_the_value() {
        same!(
            beyond("t", &Bson::Double(f64::NAN), false, true),
            doc! {"t": {"$not": {"$lt": f64::NAN}, "$nin": [null]}}
        );
        same!(
            beyond("t", &Bson::Null, false, true),
            doc! {"t": {"$not": {"$lt": null}}}
        );
        let down = beyond("t", &Bson::Null, true, true);
        same!(
            down.get_array("$and").unwrap()[0],
            Bson::Document(doc! {"t": {"$not": {"$gt": null}, "$nin": [f64::NAN]}})
        );
    }

    #[test]
    fn descending_boundary_keeps_nans_and_nulls_last() {
        let f = boundary_filter(keys(&["t"]), &[Bson::Int32(5), Bson::Int32(9)], true);
        let later: Vec<Document> = (4..=TIMESTAMP)
            .map(|b| doc! {"t": {"$not": {"$gte": bracket_min(b)}}})
            .collect();
        let or = f.get_array("$and").unwrap()[1].as_document().unwrap();
        let Some(Bson::Document(first)) = or.get_array("$or").unwrap().first().cloned() else {
            panic!("{f}")
        };
        let mut want = vec![doc! {"t": {"$not": {"$gte": 5}}}];
        want.extend(later);
        same!(first, doc! {"$and": want});
    }

    #[test]
    fn brackets_before_a_string_are_excluded() {
        let f = beyond("t", &Bson::String("m".into()), false, false);
        same!(
            f,
            doc! {"$and": [
                {"t": {"$not": {"$lte": "m"}, "$nin": [null, f64::NAN]}},
                {"t": {"$not": {"$gte": f64::NEG_INFINITY}}},
            ]}
        );
        // After NaN come the other numbers; before it, only null.
        same!(
            beyond("t", &Bson::Double(f64::NAN), false, false),
            doc! {"t": {"$not": {"$lte": f64::NAN}, "$nin": [null, f64::NAN]}}
        );
        let down = beyond("t", &Bson::Double(f64::NAN), true, false);
        same!(
            down.get_array("$and").unwrap()[1],
            Bson::Document(doc! {"t": {"$not": {"$gte": f64::NEG_INFINITY}}})
        );
    }

    #[test]
    fn null_boundaries() {
        let up = boundary_filter(keys(&["t"]), &[Bson::Null, Bson::Int32(9)], false);
        same!(
            up.get_array("$and").unwrap()[1],
            Bson::Document(doc! {"$or": [
                {"t": {"$not": {"$lte": null}}},
                {"t": {"$eq": null}, "_id": {"$not": {"$lte": 9}, "$nin": [null, f64::NAN]}},
            ]})
        );
        let down = beyond("t", &Bson::Null, true, false);
        let all = down.get_array("$and").unwrap();
        same!(
            all[0],
            Bson::Document(doc! {"t": {"$not": {"$gte": null}, "$nin": [f64::NAN]}})
        );
        same!(all.len(), 1 + (TIMESTAMP - NUMBER + 1));
    }

    #[test]
    fn id_only_boundary() {
        let f = boundary_filter(keys(&[]), &[Bson::Int32(9)], false);
        same!(
            f,
            doc! {"_id": {"$not": {"$lte": 9}, "$nin": [null, f64::NAN]}}
        );
    }

    #[test]
    fn untrusted_filters_refuse_javascript() {
        for f in [
            doc! {"$where": "sleep(100)"},
            doc! {"a": 1, "$or": [{"b": 2}, {"$where": "1"}]},
            doc! {"$expr": {"$function": {"body": "f", "args": [], "lang": "js"}}},
            doc! {"$expr": {"$eq": [{"$accumulator": {}}, 1]}},
            doc! {"a": {"$eq": Bson::JavaScriptCode("x".into())}},
        ] {
            assert!(
                matches!(
                    check_untrusted(&f),
                    Err(Error::InvalidArgument { name: "filter", .. })
                ),
                "{f}"
            );
        }
        let mut deep = doc! {"a": 1};
        for _ in 0..MAX_FILTER_DEPTH {
            deep = doc! {"$and": [deep]};
        }
        assert!(check_untrusted(&deep).is_err());
        assert!(check_untrusted(&doc! {"a": {"$in": [1, 2]}, "b": {"$regex": "^x"}}).is_ok());
    }

    #[test]
    fn time_ranges_round_outwards() {
        let f =
            created_between(DateTime::from_millis(10_500), DateTime::from_millis(20_000)).unwrap();
        assert_eq!(
            f,
            doc! {"_id": {"$gte": object_id_at(10, "").unwrap(), "$lt": object_id_at(20, "").unwrap()}}
        );
        let f = created_between(DateTime::from_millis(0), DateTime::from_millis(20_001)).unwrap();
        assert_eq!(
            f.get_document("_id").unwrap().get("$lt"),
            Some(&Bson::ObjectId(object_id_at(21, "").unwrap()))
        );
        assert!(created_between(DateTime::from_millis(2), DateTime::from_millis(1)).is_err());
        assert!(created_since(DateTime::from_millis(-1000)).is_err());
    }
}
