//! Keyset pagination (seed 004): page by the last key seen, never by `skip`.
//!
//! A page is `find({$and: [filter, boundary]}).sort(keys, _id).limit(n + 1)`:
//! the server seeks straight to the boundary through the index, so page
//! 10,000 costs what page 1 costs. `_id` breaks ties, and the boundary is a
//! strict `$or` over the keys, so duplicate sort values are neither repeated
//! nor skipped. The extra document tells whether a next page exists, without
//! a `count`.
//!
//! Null and missing sort values are paged in MongoDB's own order: they sort
//! together, before every other value ascending and after it descending.

mod token;

use std::marker::PhantomData;

use bson::oid::ObjectId;
use bson::{doc, Bson, DateTime, Document, RawDocument, RawDocumentBuf};
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use mongodb::{Collection, Database};
use serde::de::DeserializeOwned;

pub use token::PageToken;

use crate::error::{Error, Result};

/// Largest page [`Keyset::page_size`] accepts. Bigger reads belong to
/// [`Keyset::stream`], which pages under the hood.
pub const MAX_PAGE_SIZE: u32 = 100_000;
/// Page size when neither the model nor the call names one.
pub const DEFAULT_PAGE_SIZE: u32 = 100;

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
#[derive(Debug)]
pub struct Keyset<T> {
    coll: Collection<RawDocumentBuf>,
    sort: &'static [&'static str],
    descending: bool,
    filter: Document,
    page_size: u32,
    position: Position,
    _items: PhantomData<fn() -> T>,
}

impl<T> Clone for Keyset<T> {
    fn clone(&self) -> Self {
        Keyset {
            coll: self.coll.clone(),
            sort: self.sort,
            descending: self.descending,
            filter: self.filter.clone(),
            page_size: self.page_size,
            position: self.position.clone(),
            _items: PhantomData,
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
            coll: db.collection(collection),
            sort: spec.sort,
            descending: spec.descending,
            filter: Document::new(),
            page_size: spec.page_size,
            position: Position::Start,
            _items: PhantomData,
        }
    }

    /// Only documents matching `filter` (replaces any earlier filter). The
    /// filter is the caller's; tokens never widen it.
    pub fn filter(mut self, filter: Document) -> Self {
        self.filter = filter;
        self
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

    /// The page that follows the item `token` marks (a page's `next`).
    pub fn after(mut self, token: &PageToken) -> Self {
        self.position = Position::After(token.clone());
        self
    }

    /// The page that precedes the item `token` marks (a page's `prev`).
    pub fn before(mut self, token: &PageToken) -> Self {
        self.position = Position::Before(token.clone());
        self
    }

    /// How many documents match the filter: a separate `countDocuments`,
    /// never run as part of paging.
    pub async fn count(&self) -> Result<u64> {
        Ok(self.coll.count_documents(self.filter.clone()).await?)
    }

    /// The `find` this query sends: filter, sort and limit.
    pub fn command(&self) -> Result<(Document, Document, i64)> {
        let plan = self.plan()?;
        Ok((plan.filter, plan.sort, plan.limit))
    }

    /// Fetches one page: one `find`, one round trip (while the page fits in
    /// one 16 MB batch).
    pub async fn page(&self) -> Result<Page<T>> {
        let plan = self.plan()?;
        // Typed straight from the reply's batch, as the driver does for a
        // `Collection<T>`; only the page's two edge documents are read raw,
        // for their tokens.
        let mut cursor = self
            .coll
            .clone_with_type::<T>()
            .find(plan.filter)
            .sort(plan.sort)
            .limit(plan.limit)
            .batch_size(plan.limit as u32)
            .await?;
        let size = self.page_size as usize;
        let mut items: Vec<T> = Vec::with_capacity(size);
        let (mut head, mut tail, mut more) = (None, None, false);
        while cursor.advance().await? {
            if items.len() == size {
                more = true;
                break;
            }
            let raw = cursor.current();
            if items.is_empty() {
                head = Some(self.token_of(raw)?);
            }
            if items.len() + 1 == size {
                tail = Some(self.token_of(raw)?);
            }
            items.push(
                cursor
                    .deserialize_current()
                    .map_err(|e| self.unexpected(raw, e))?,
            );
        }
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

    /// Every item from the query's position to the end, fetched a page at a
    /// time: no cursor is held open between pages, so a long job neither
    /// times out a cursor nor holds more than one page in memory.
    pub fn stream(self) -> BoxStream<'static, Result<T>>
    where
        T: 'static,
    {
        self.pages()
            .map_ok(|page| futures::stream::iter(page.items.into_iter().map(Ok)))
            .try_flatten()
            .boxed()
    }

    /// Every page from the query's position to the end, each with the token
    /// to resume after it (for checkpointing a long job).
    pub fn pages(self) -> BoxStream<'static, Result<Page<T>>>
    where
        T: 'static,
    {
        futures::stream::try_unfold(Some(self), |query| async move {
            let Some(query) = query else {
                return Ok(None);
            };
            let page = query.page().await?;
            let rest = page.next.as_ref().map(|t| query.clone().after(t));
            Ok(Some((page, rest)))
        })
        .boxed()
    }

    fn fingerprint(&self) -> u32 {
        let mut bytes = self.coll.name().as_bytes().to_vec();
        for key in self.sort {
            bytes.push(0);
            bytes.extend_from_slice(key.as_bytes());
        }
        token::fnv1a64(&bytes) as u32
    }

    fn plan(&self) -> Result<Plan> {
        if !(1..=MAX_PAGE_SIZE).contains(&self.page_size) {
            return Err(Error::invalid(
                "page_size",
                format!("{} is not in 1..={MAX_PAGE_SIZE}", self.page_size),
            ));
        }
        let (boundary, scan_descending) = match &self.position {
            Position::Start => (None, self.descending),
            Position::After(t) => (Some(t), self.descending),
            Position::Before(t) => (Some(t), !self.descending),
        };
        let mut filter = self.filter.clone();
        if let Some(t) = boundary {
            let values = t.values_for(self.fingerprint(), self.sort.len() + 1)?;
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
        })
    }

    fn keys(&self) -> impl Iterator<Item = &'static str> + Clone {
        self.sort.iter().copied().chain(std::iter::once("_id"))
    }

    fn token_of(&self, raw: &RawDocument) -> Result<PageToken> {
        let values = self
            .keys()
            .map(|key| {
                let value = match raw.get(key) {
                    Ok(Some(v)) => Bson::try_from(v.to_raw_bson()).ok(),
                    Ok(None) => Some(Bson::Null),
                    Err(_) => None,
                };
                match value {
                    Some(v) if token::check_value(&v, 0).is_ok() => Ok(v),
                    other => Err(Error::UnsupportedValue {
                        collection: self.coll.name().to_owned(),
                        id: id_of(raw),
                        field: key.to_owned(),
                        found: other.map_or("an unreadable value".into(), |v| {
                            format!("{:?}", v.element_type())
                        }),
                        why: "a keyset sort key (arrays and code cannot be ordered)",
                        dropped: None,
                    }),
                }
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(PageToken::new(self.fingerprint(), values))
    }

    fn unexpected(&self, raw: &RawDocument, e: mongodb::error::Error) -> Error {
        match *e.kind {
            mongodb::error::ErrorKind::BsonDeserialization(source) => Error::UnexpectedDocument {
                collection: self.coll.name().to_owned(),
                id: id_of(raw),
                source,
            },
            _ => Error::from(e),
        }
    }
}

struct Plan {
    filter: Document,
    sort: Document,
    limit: i64,
}

/// The `_id` of a stored document, to name it in an error.
pub(crate) fn id_of(raw: &RawDocument) -> Bson {
    raw.get("_id")
        .ok()
        .flatten()
        .and_then(|v| Bson::try_from(v.to_raw_bson()).ok())
        .unwrap_or(Bson::Null)
}

/// Documents strictly after `values` in the order `keys` ascending (or
/// descending): `$or` of "equal on the first i keys, beyond on key i".
fn boundary_filter(
    keys: impl Iterator<Item = &'static str> + Clone,
    values: &[Bson],
    descending: bool,
) -> Document {
    let mut branches = Vec::new();
    let mut equal = Document::new();
    for (key, value) in keys.zip(values) {
        let mut branch = equal.clone();
        match (value, descending) {
            // Ascending, nothing is below null; everything non-null is above.
            (Bson::Null, false) => {
                branch.insert(key, doc! {"$ne": Bson::Null});
            }
            // Descending, nothing follows null.
            (Bson::Null, true) => {
                equal.insert(key, doc! {"$eq": Bson::Null});
                continue;
            }
            (v, false) => {
                branch.insert(key, doc! {"$gt": v.clone()});
            }
            // `_id` is never null.
            (v, true) if key == "_id" => {
                branch.insert(key, doc! {"$lt": v.clone()});
            }
            // Descending, null and missing come after every value.
            (v, true) => {
                branch.insert(
                    "$or",
                    vec![
                        Bson::Document(doc! {key: {"$lt": v.clone()}}),
                        Bson::Document(doc! {key: {"$eq": Bson::Null}}),
                    ],
                );
            }
        }
        branches.push(Bson::Document(branch));
        equal.insert(key, doc! {"$eq": value.clone()});
    }
    // Paging by `_id` alone: the plain `{_id: {$gt: last}}`.
    match <[Bson; 1]>::try_from(branches) {
        Ok([Bson::Document(only)]) => only,
        Ok([other]) => doc! {"$or": [other]},
        Err(branches) => doc! {"$or": branches},
    }
}

/// A filter on `_id` for documents whose ObjectId was made in `[from, to)`.
///
/// ObjectIds hold their creation time in whole seconds (seed 004), so the
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

    #[test]
    fn boundary_is_a_strict_or() {
        let f = boundary_filter(keys(&["t"]), &[Bson::Int32(5), Bson::Int32(9)], false);
        assert_eq!(
            f,
            doc! {"$or": [
                {"t": {"$gt": 5}},
                {"t": {"$eq": 5}, "_id": {"$gt": 9}},
            ]}
        );
    }

    #[test]
    fn descending_boundary_keeps_nulls_last() {
        let f = boundary_filter(keys(&["t"]), &[Bson::Int32(5), Bson::Int32(9)], true);
        assert_eq!(
            f,
            doc! {"$or": [
                {"$or": [{"t": {"$lt": 5}}, {"t": {"$eq": null}}]},
                {"t": {"$eq": 5}, "_id": {"$lt": 9}},
            ]}
        );
    }

    #[test]
    fn null_boundaries() {
        let up = boundary_filter(keys(&["t"]), &[Bson::Null, Bson::Int32(9)], false);
        assert_eq!(
            up,
            doc! {"$or": [
                {"t": {"$ne": null}},
                {"t": {"$eq": null}, "_id": {"$gt": 9}},
            ]}
        );
        let down = boundary_filter(keys(&["t"]), &[Bson::Null, Bson::Int32(9)], true);
        assert_eq!(down, doc! {"t": {"$eq": null}, "_id": {"$lt": 9}});
    }

    #[test]
    fn id_only_boundary() {
        let f = boundary_filter(keys(&[]), &[Bson::Int32(9)], false);
        assert_eq!(f, doc! {"_id": {"$gt": 9}});
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
