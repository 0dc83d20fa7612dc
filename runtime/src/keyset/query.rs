//! What a read sends (the `find` of a page, a `countDocuments`) and what
//! it makes of the reply: the items, typed straight from the batch, and
//! the tokens of the page's edges.

use mongodb::bson::raw::RawBsonRef;
use mongodb::bson::{doc, Bson, Document, RawDocument};
use mongodb::options::{Collation, CountOptions, FindOptions, Hint};
use mongodb::ClientSession;
use serde::de::DeserializeOwned;

use super::boundary::boundary_filter;
use super::token;
use super::{Keyset, Page, PageToken, Position, MAX_KEY_BYTES, MAX_PAGE_SIZE, MIN_SIGNING_KEY_LEN};
use crate::action::Options;
use crate::error::{Error, Found, Result};
use crate::util::id_of;

impl<T> Keyset<T>
where
    T: DeserializeOwned + Send + Sync,
{
    /// One `countDocuments` with effective `options`.
    pub(super) async fn count_with(
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
    pub(super) async fn fetch(
        &self,
        options: &Options,
        hint: Option<&Hint>,
        collation: Option<&Collation>,
        session: Option<&mut ClientSession>,
    ) -> Result<Page<T>> {
        let collation = collation.or(self.collation.as_ref());
        let plan = self.plan(collation)?;
        let hint = hint.or(self.hint.as_ref());
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
        // for their tokens. The cursor is boxed and the read in a session
        // too: held across an `.await`, either would make every page's
        // future too large for a small allocation.
        match session {
            None => {
                let find =
                    self.find_cursor(plan.filter, plan.sort, plan.limit, options, hint, collation);
                let mut cursor = Box::new(find.await?);
                while cursor.advance().await? {
                    if !acc.take(cursor.current(), || cursor.deserialize_current())? {
                        break;
                    }
                }
            }
            Some(s) => {
                let o = find_options(plan.sort, plan.limit, options, hint, collation);
                Box::pin(self.fetch_in(plan.filter, o, &mut acc, s)).await?
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

    /// The cursor of a page's `find`: the action is built and consumed
    /// here, in a function that is not `async`, so that the page's future
    /// holds only the driver's boxed future, not the action and its
    /// options.
    fn find_cursor(
        &self,
        filter: Document,
        sort: Document,
        limit: i64,
        options: &Options,
        hint: Option<&Hint>,
        collation: Option<&Collation>,
    ) -> impl std::future::Future<Output = mongodb::error::Result<mongodb::Cursor<T>>> + '_ {
        use std::future::IntoFuture;
        let o = find_options(sort, limit, options, hint, collation);
        self.coll.find(filter).with_options(o).into_future()
    }

    /// A page's `find` in `session`, into `acc`.
    async fn fetch_in(
        &self,
        filter: Document,
        o: FindOptions,
        acc: &mut Collect<'_, T>,
        s: &mut ClientSession,
    ) -> Result<()> {
        let mut cursor = self
            .coll
            .find(filter)
            .with_options(o)
            .session(&mut *s)
            .await?;
        while cursor.advance(&mut *s).await? {
            if !acc.take(cursor.current(), || cursor.deserialize_current())? {
                break;
            }
        }
        Ok(())
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

    pub(super) fn plan(&self, collation: Option<&Collation>) -> Result<Plan> {
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
                Err(_) => return Err(self.unsupported(raw, key, Found::Unreadable)),
            };
            if let Err(e) = token::check_raw(value) {
                let found = match e {
                    crate::error::CursorError::TooDeep { limit } => Found::TooDeep { limit },
                    _ => Found::Type(value.element_type()),
                };
                return Err(self.unsupported(raw, key, found));
            }
            bytes += raw_size(value);
            if bytes > MAX_KEY_BYTES {
                return Err(self.unsupported(
                    raw,
                    key,
                    Found::TooLarge {
                        bytes,
                        limit: MAX_KEY_BYTES,
                    },
                ));
            }
        }
        Ok(())
    }

    fn unsupported(&self, raw: &RawDocument, key: &str, found: Found) -> Error {
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
                    .map_err(|_| self.unsupported(raw, key, Found::Unreadable)),
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
        Error::unexpected_document(self.coll.name(), raw, e)
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

/// A page's `find`, and what its reply is checked and signed with.
pub(super) struct Plan {
    pub(super) filter: Document,
    pub(super) sort: Document,
    pub(super) limit: i64,
    fingerprint: u64,
    /// The filter's BSON, when the query signs its tokens.
    signing: Option<Vec<u8>>,
}

/// A page's `find` options: one struct, as the driver's own setters build.
fn find_options(
    sort: Document,
    limit: i64,
    options: &Options,
    hint: Option<&Hint>,
    collation: Option<&Collation>,
) -> FindOptions {
    let mut o: FindOptions = options.driver().unwrap_or_default();
    o.sort = Some(sort);
    o.limit = Some(limit);
    o.batch_size = Some(limit as u32);
    o.hint = hint.cloned();
    o.collation = collation.cloned();
    o
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
