//! The reads of a [`Keyset`] query, as driver-style actions.
//!
//! [`FetchPage`] and [`CountDocuments`] run when awaited, each in one
//! allocation (its boxed future). [`ItemStream`] and [`PageStream`] are
//! `Stream`s that are configured the same way before they are first
//! polled; settings made after that are ignored.
//!
//! All four only read, so inside a caller's transaction nothing needs a
//! retry: each `find` (or `aggregate`) runs in the transaction, sees its
//! uncommitted writes, and takes the transaction's read concern (one set
//! on the action is not sent there, as the driver requires).

use std::pin::Pin;
use std::task::{Context, Poll};

use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use mongodb::options::{Collation, Hint};
use mongodb::ClientSession;
use serde::de::DeserializeOwned;

use super::{Keyset, Page, Position};
use crate::action::{action, Call, Given, Options};
use crate::error::Result;

impl<T: Send + Sync> crate::action::Repository for Keyset<T> {
    const PATTERN: &'static str = "keyset";

    fn defaults(&self) -> &crate::action::Options {
        &self.defaults
    }

    fn collection_name(&self) -> &str {
        self.coll.name()
    }
}

/// `hint` and `collation`, on every keyset read.
macro_rules! keyset_setters {
    () => {
        /// The index the server should use (`hint`), over the query's own.
        /// It changes the plan, never the items.
        pub fn hint(mut self, hint: impl Into<Hint>) -> Self {
            self.hint = Some(hint.into());
            self
        }

        /// How strings compare (`collation`), over the query's own. It
        /// changes the order, so tokens of a page read with it are
        /// `Foreign` to reads without it: prefer [`Keyset::collation`].
        pub fn collation(mut self, collation: Collation) -> Self {
            self.collation = Some(collation);
            self
        }
    };
}

action! {
    /// One page of a [`Keyset`] query: [`Keyset::page`].
    ///
    /// Sends one `find` (filter and boundary, sort `{keys..., _id}`, `limit`
    /// and `batchSize` of the page size + 1), with the options set here or on
    /// the query ([`Keyset::with_options`]). In a session it reads in that
    /// session, and inside its transaction sees the transaction's own writes.
    FetchPage<'a, T: DeserializeOwned> on Keyset, "page", read;
    { hint: Option<Hint>, collation: Option<Collation> } -> Page<T>;
    |this, cx| {
        this.repo
            .fetch(&cx.opts, this.hint.as_ref(), this.collation.as_ref(), cx.session)
            .await
    }
}

impl<T: DeserializeOwned + Send + Sync> FetchPage<'_, T> {
    keyset_setters!();
}

action! {
    /// How many documents match a [`Keyset`] query's filter:
    /// [`Keyset::count`].
    ///
    /// Sends one `aggregate` (the driver's `countDocuments`: `$match` on the
    /// filter, then `$group`), with the options set here or on the query. The
    /// query's position is ignored: it counts the whole filter.
    CountDocuments<'a, T: DeserializeOwned> on Keyset, "count", read;
    { hint: Option<Hint>, collation: Option<Collation> } -> u64;
    |this, cx| {
        this.repo
            .count_with(&cx.opts, this.hint.as_ref(), this.collation.as_ref(), cx.session)
            .await
    }
}

impl<T: DeserializeOwned + Send + Sync> CountDocuments<'_, T> {
    keyset_setters!();
}

/// What a stream holds until it is first polled.
struct Pending<'a, T: Send + Sync> {
    query: Option<Keyset<T>>,
    running: Option<BoxStream<'a, Result<Page<T>>>>,
    /// The stream's span, from its first poll: every page's `find` runs
    /// in it.
    span: tracing::Span,
}

/// Between pages of a running stream.
struct Cursorless<'a, T: Send + Sync> {
    query: Keyset<T>,
    options: Options,
    session: Option<&'a mut ClientSession>,
    effective: bool,
}

/// Starts paging `query` (one box for the whole stream, none a page).
fn start<'a, T>(
    mut query: Keyset<T>,
    options: Options,
    session: Option<&'a mut ClientSession>,
    hint: Option<Hint>,
    collation: Option<Collation>,
) -> BoxStream<'a, Result<Page<T>>>
where
    T: DeserializeOwned + Send + Sync + 'a,
{
    if hint.is_some() {
        query.hint = hint;
    }
    if collation.is_some() {
        query.collation = collation;
    }
    let state = Cursorless {
        query,
        options,
        session,
        effective: false,
    };
    futures::stream::try_unfold(Some(state), |state| async move {
        let Some(mut st) = state else {
            return Ok(None);
        };
        // Once per stream: the caller cannot touch the session meanwhile.
        if !st.effective {
            let given = Given::from(std::mem::take(&mut st.options));
            let session = st.session.as_deref_mut();
            let call = Call::new(&st.query.defaults, given, session, true).await;
            st.options = call.opts.clone();
            st.effective = true;
        }
        let page = st
            .query
            .fetch(&st.options, None, None, st.session.as_deref_mut())
            .await?;
        let rest = match &page.next {
            Some(t) => {
                st.query.position = Position::After(t.clone());
                Some(st)
            }
            None => None,
        };
        Ok(Some((page, rest)))
    })
    .boxed()
}

impl<'a, T> Pending<'a, T>
where
    T: DeserializeOwned + Send + Sync + 'a,
{
    fn poll_page(
        &mut self,
        operation: &'static str,
        cx: &mut Context<'_>,
        options: &mut Options,
        session: &mut Option<&'a mut ClientSession>,
        hint: &mut Option<Hint>,
        collation: &mut Option<Collation>,
    ) -> Poll<Option<Result<Page<T>>>> {
        if let Some(query) = self.query.take() {
            self.span = crate::action::span("keyset", operation, query.coll.name());
            self.running = Some(start(
                query,
                std::mem::take(options),
                session.take(),
                hint.take(),
                collation.take(),
            ));
        }
        let _in = self.span.enter();
        match &mut self.running {
            Some(pages) => pages.poll_next_unpin(cx),
            None => Poll::Ready(None),
        }
    }
}

/// Every page of a [`Keyset`] query from its position to the end:
/// [`Keyset::pages`], a `Stream` of [`Page`]s.
///
/// Sends one `find` a page (as [`FetchPage`]), with the options set here
/// or on the query; no cursor stays open between pages. Given a session,
/// the stream borrows it until dropped, and every page reads in it (inside
/// its transaction, seeing the transaction's writes). Configure it before
/// the first poll.
#[must_use = "streams do nothing unless polled"]
pub struct PageStream<'a, T: Send + Sync> {
    pending: Pending<'a, T>,
    options: Options,
    session: Option<&'a mut ClientSession>,
    hint: Option<Hint>,
    collation: Option<Collation>,
}

impl<'a, T: Send + Sync> PageStream<'a, T> {
    pub(super) fn new(query: Keyset<T>) -> Self {
        PageStream {
            pending: Pending {
                query: Some(query),
                running: None,
                span: tracing::Span::none(),
            },
            options: Options::new(),
            session: None,
            hint: None,
            collation: None,
        }
    }

    crate::action::setters!('a; read);
    keyset_setters!();
}

impl<'a, T> Stream for PageStream<'a, T>
where
    T: DeserializeOwned + Send + Sync + 'a,
{
    type Item = Result<Page<T>>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        this.pending.poll_page(
            "pages",
            cx,
            &mut this.options,
            &mut this.session,
            &mut this.hint,
            &mut this.collation,
        )
    }
}

/// Every item of a [`Keyset`] query from its position to the end:
/// [`Keyset::stream`], a `Stream` of items, one page in memory at a time.
///
/// Sends what [`PageStream`] sends, and borrows a session the same way.
/// Configure it before the first poll.
#[must_use = "streams do nothing unless polled"]
pub struct ItemStream<'a, T: Send + Sync> {
    pending: Pending<'a, T>,
    items: std::vec::IntoIter<T>,
    options: Options,
    session: Option<&'a mut ClientSession>,
    hint: Option<Hint>,
    collation: Option<Collation>,
}

impl<'a, T: Send + Sync> ItemStream<'a, T> {
    pub(super) fn new(query: Keyset<T>) -> Self {
        ItemStream {
            pending: Pending {
                query: Some(query),
                running: None,
                span: tracing::Span::none(),
            },
            items: Vec::new().into_iter(),
            options: Options::new(),
            session: None,
            hint: None,
            collation: None,
        }
    }

    crate::action::setters!('a; read);
    keyset_setters!();
}

// Nothing is pinned in place: the items are moved out, never polled.
impl<T: Send + Sync> Unpin for ItemStream<'_, T> {}

impl<'a, T> Stream for ItemStream<'a, T>
where
    T: DeserializeOwned + Send + Sync + 'a,
{
    type Item = Result<T>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        loop {
            if let Some(item) = this.items.next() {
                return Poll::Ready(Some(Ok(item)));
            }
            match this.pending.poll_page(
                "stream",
                cx,
                &mut this.options,
                &mut this.session,
                &mut this.hint,
                &mut this.collation,
            ) {
                Poll::Ready(Some(Ok(page))) => this.items = page.items.into_iter(),
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e))),
                Poll::Ready(None) => return Poll::Ready(None),
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}
