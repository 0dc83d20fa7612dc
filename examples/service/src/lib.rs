//! A small trading service on [axum] that uses every mongo-patterns pattern
//! the way an application would. Copy it, rename the models, keep the
//! plumbing: one [`App`] per process (its repositories and counter handles
//! are shared by every request), a deadline on every request, one mapping of
//! [`mongo_patterns::Error`] to HTTP, and a graceful shutdown that flushes
//! the counters.
//!
//! | endpoint | pattern |
//! | --- | --- |
//! | `POST /traders` `{id, board}` | rank histogram: a trader joins a board at volume 0 |
//! | `GET /traders/{id}` | rank histogram: my volume and rank on my board |
//! | `GET /boards/{board}/top?n=` | rank histogram: the top `n` places |
//! | `POST /orders` `{customer, ticker, qty, order_id?}` | one transaction: a trade (bucket), the trader's volume (rank histogram), a view of the ticker (counter), an activity (feed) |
//! | `GET /customers/{id}/trades?page=&page_size=` | bucket: a customer's trades, newest first |
//! | `GET /feed?after=&before=&limit=` | keyset: the activity feed, signed page tokens in the query string |
//! | `GET /products/{id}` | approximate counter: counts a view, shows views and likes |
//! | `POST /products/{id}/like` | approximate counter: counts a like |
//! | `POST /events` `{kind, detail}`, `GET /events/{kind}?days=&limit=` | shard key: an event log under `{month, kind}` |
//! | `GET /healthz` | nothing: the process is up |
//!
//! `src/main.rs` runs it against `MONGODB_URI`: see its docs.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, Query, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use mongo_patterns::mongodb::Collection;
use mongo_patterns::prelude::*;

// ---------------------------------------------------------------------------
// The models: one per pattern, as plain serde structs.

/// A customer's trade. Buckets of 200 trades per customer, kept in `at`
/// order, so a page of history is one or two documents whatever its depth.
#[derive(Debug, Clone, Serialize, Deserialize, Model)]
#[serde(rename_all = "camelCase")]
#[model(collection = "trades")]
#[bucket(size = 200, key = "customerId", order = "at")]
pub struct Trade {
    /// The bucket key.
    pub customer_id: String,
    /// The order that made it (unique: checked by the load run).
    pub order_id: String,
    /// What was traded.
    pub ticker: String,
    /// How many.
    pub qty: i32,
    /// When: the bucket's order.
    pub at: DateTime,
}

/// One line of the activity feed, paged newest first by keyset tokens (an
/// index seek per page at any depth, never `skip`).
#[derive(Debug, Clone, Serialize, Deserialize, Model)]
#[model(collection = "activities")]
#[keyset(sort = "at", order = "desc", page_size = 20)]
pub struct Activity {
    /// Breaks ties between activities of the same millisecond.
    #[serde(rename = "_id")]
    pub id: ObjectId,
    /// Who.
    pub customer: String,
    /// What, for people.
    pub text: String,
    /// When: the sort key.
    pub at: DateTime,
}

/// A trader on a leaderboard, ranked by traded volume: ranks come from a
/// histogram of volumes per board, not from counting traders.
///
/// `layout = "documents"`: one histogram document per (board, volume)
/// rather than one per board. Every order moves its trader's volume inside
/// the order's transaction, and a transaction holds what it wrote until it
/// commits: with one document per board, the orders of a board run one at a
/// time (the load run cut 88 of 1,120 orders at its 5 s deadline, 8
/// boards). Volumes are mostly distinct, so here two orders of a board
/// rarely touch the same document.
#[derive(Debug, Clone, Serialize, Deserialize, Model)]
#[model(collection = "traders")]
#[rank_histogram(board = "board", score = "volume", layout = "documents")]
pub struct Trader {
    /// The trader's (and customer's) id.
    #[serde(rename = "_id")]
    pub id: String,
    /// The leaderboard.
    pub board: String,
    /// Shares traded: the score.
    pub volume: i64,
}

/// A product page's view and like counters. Buffered: each handle counts in
/// memory and writes `$inc` once per 100 of a key (or after 1 s), exact once
/// flushed; `App::shutdown` flushes what is pending.
#[derive(Debug, Clone, Serialize, Deserialize, Model)]
#[model(collection = "products")]
pub struct Product {
    /// The ticker.
    #[serde(rename = "_id")]
    pub id: String,
    /// Page views.
    #[approx_counter(every = 100, mode = "buffered", upsert = true)]
    #[serde(default)]
    pub views: i64,
    /// Likes.
    #[approx_counter(every = 100, mode = "buffered", upsert = true)]
    #[serde(default)]
    pub likes: i64,
}

/// The event log, sharded on `{month, kind}` (`month` derived from `at` on
/// every write): a query for one kind over a time range goes to the shards
/// of those months only, and inserts spread over kinds, not on one hot shard.
#[derive(Debug, Clone, Serialize, Deserialize, Model)]
#[model(collection = "events")]
#[shard_key(coarse = "month", from = "at", search = "kind")]
pub struct Event {
    /// Its id.
    #[serde(rename = "_id")]
    pub id: ObjectId,
    /// The search part of the shard key.
    pub kind: String,
    /// When: `month` comes from it.
    pub at: DateTime,
    /// Free text.
    pub detail: String,
}

// ---------------------------------------------------------------------------
// The application state.

/// How long [`App::shutdown`] keeps trying to flush the counters: past the
/// server's default transaction lifetime (60 s), which bounds how long a
/// transaction can hold a counter's document.
pub const SHUTDOWN_BUDGET: Duration = Duration::from_secs(90);

/// What a deployment sets.
#[derive(Debug, Clone)]
pub struct Config {
    /// Every request is cut after this long (see [`deadline`]).
    pub deadline: Duration,
    /// Signs the feed's page tokens: every instance of the service needs the
    /// same key, or a token from one is refused by the next.
    pub token_key: Arc<[u8]>,
}

impl Config {
    /// `SERVICE_DEADLINE_MS` (default 5000) and `FEED_TOKEN_KEY` (at least
    /// 16 bytes; a fixed development key when unset, which lets anyone
    /// forge tokens: set it in production).
    pub fn from_env() -> Config {
        let ms = std::env::var("SERVICE_DEADLINE_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(5_000);
        let key = std::env::var("FEED_TOKEN_KEY")
            .unwrap_or_else(|_| "development key, not a secret".to_owned());
        Config {
            deadline: Duration::from_millis(ms),
            token_key: key.into_bytes().into(),
        }
    }
}

/// One per process, cloned into every request: the repositories and the
/// counter handles inside are shared by their clones, so the buffered
/// counters count every request of the process in one buffer.
#[derive(Clone)]
pub struct App {
    client: Client,
    db: Database,
    config: Config,
    trades: Buckets<Trade>,
    ranks: Ranks<Trader>,
    events: Sharded<Event>,
    views: Counter<Product>,
    likes: Counter<Product>,
}

impl App {
    /// The service over `db` (of `client`): creates the collections and
    /// indexes the models declare (what is missing; it drops nothing).
    pub async fn new(client: Client, db: Database, config: Config) -> mongo_patterns::Result<App> {
        for report in [
            Trade::ensure(&db).await?,
            Activity::ensure(&db).await?,
            Trader::ensure(&db).await?,
            Product::ensure(&db).await?,
            Event::ensure(&db).await?,
        ] {
            tracing::info!(%report, "ensure");
        }
        Ok(App {
            trades: Trade::buckets(&db),
            ranks: Trader::ranks(&db),
            events: Event::sharded(&db),
            views: Product::views_counter(&db),
            likes: Product::likes_counter(&db),
            client,
            db,
            config,
        })
    }

    /// This app with another request deadline, sharing everything else (the
    /// same counter handles): for a route group with a tighter budget, or a
    /// test that needs a request cut.
    pub fn with_deadline(mut self, deadline: Duration) -> App {
        self.config.deadline = deadline;
        self
    }

    /// The counter handles, for a caller that reads their statistics.
    pub fn counters(&self) -> [&Counter<Product>; 2] {
        [&self.views, &self.likes]
    }

    /// Flushes what the counters hold: call it once the server has stopped
    /// taking requests, or the last second of counts is lost. Later
    /// increments (of a request still finishing) are written through.
    ///
    /// A flush that fails keeps its increments pending, so it is tried
    /// again while it fails with something that may pass (`Contended`: a
    /// write of the same key that did not land within 30 s, such as one
    /// waiting behind a transaction; `Unavailable`), for up to
    /// [`SHUTDOWN_BUDGET`].
    pub async fn shutdown(&self) -> mongo_patterns::Result<()> {
        let give_up = tokio::time::Instant::now() + SHUTDOWN_BUDGET;
        for counter in [&self.views, &self.likes] {
            loop {
                match counter.shutdown().await {
                    Ok(()) => break,
                    Err(e) if e.is_retryable() && tokio::time::Instant::now() < give_up => {
                        tracing::warn!(error = %e, "counter flush at shutdown: trying again");
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(())
    }

    /// The routes, every one under the deadline.
    pub fn router(&self) -> Router {
        Router::new()
            .route("/healthz", get(|| async { "ok" }))
            .route("/traders", post(join_board))
            .route("/traders/{id}", get(my_rank))
            .route("/boards/{board}/top", get(top))
            .route("/orders", post(place_order))
            .route("/customers/{id}/trades", get(history))
            .route("/feed", get(feed))
            .route("/products/{id}", get(view_product))
            .route("/products/{id}/like", post(like_product))
            .route("/events", post(log_event))
            .route("/events/{kind}", get(events_of))
            .layer(middleware::from_fn_with_state(self.clone(), deadline))
            .with_state(self.clone())
    }
}

/// Serves `app` on `listener` until `stop` completes, lets the requests in
/// flight finish (axum's graceful shutdown), then flushes the counters.
pub async fn serve(
    listener: tokio::net::TcpListener,
    app: App,
    stop: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, app.router())
        .with_graceful_shutdown(stop)
        .await?;
    app.shutdown().await.map_err(std::io::Error::other)
}

// ---------------------------------------------------------------------------
// Errors and the deadline.

/// What a handler fails with: the library's error, or the service's own.
#[derive(Debug, Clone)]
pub enum ApiError {
    /// From a pattern or the driver.
    Db(mongo_patterns::Error),
    /// Nothing by that id.
    NotFound(String),
    /// A request the service refuses before asking the database.
    BadRequest(String),
}

impl From<mongo_patterns::Error> for ApiError {
    fn from(e: mongo_patterns::Error) -> Self {
        ApiError::Db(e)
    }
}

/// The driver's errors (our own calls, a transaction's outcome): ours when
/// one of our handlers put it there (`mongodb::error::Error::custom`), else
/// classified as the library classifies them.
impl From<mongo_patterns::mongodb::error::Error> for ApiError {
    fn from(e: mongo_patterns::mongodb::error::Error) -> Self {
        match e.get_custom::<ApiError>() {
            Some(ours) => ours.clone(),
            None => ApiError::Db(mongo_patterns::Error::from(e)),
        }
    }
}

/// Retry-After on every 503: the failures that may pass.
const RETRY_AFTER_SECS: &str = "1";

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        use mongo_patterns::Error as E;
        let retry_later = |msg: String| {
            (
                StatusCode::SERVICE_UNAVAILABLE,
                [(header::RETRY_AFTER, RETRY_AFTER_SECS)],
                msg,
            )
                .into_response()
        };
        match self {
            ApiError::NotFound(what) => (StatusCode::NOT_FOUND, what).into_response(),
            ApiError::BadRequest(why) => (StatusCode::BAD_REQUEST, why).into_response(),
            // A page token that is not one of ours (bad base64, cut,
            // altered, signed by another key, for another query): the
            // client's fault, refused before anything was sent.
            ApiError::Db(e @ (E::InvalidCursor(_) | E::InvalidArgument { .. })) => {
                (StatusCode::BAD_REQUEST, e.to_string()).into_response()
            }
            ApiError::Db(e @ E::UnknownBoard { .. }) => {
                (StatusCode::NOT_FOUND, e.to_string()).into_response()
            }
            ApiError::Db(e) if e.is_duplicate_key() => {
                (StatusCode::CONFLICT, e.to_string()).into_response()
            }
            // The write may be stored: the client must read before sending
            // it again, so say so rather than "try again".
            ApiError::Db(e @ E::OutcomeUnknown { .. }) => (
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("the outcome is unknown: the write may or may not be stored; read before retrying ({e})"),
            )
                .into_response(),
            // Unreachable, contended, an election, a write conflict: the
            // same request later may succeed.
            ApiError::Db(e @ (E::Contended { .. } | E::Unavailable(_))) => retry_later(e.to_string()),
            ApiError::Db(e) if e.is_retryable() => retry_later(e.to_string()),
            ApiError::Db(e) => {
                tracing::error!(error = %e, "request failed");
                (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response()
            }
        }
    }
}

/// Cuts every request at the app's deadline: the handler's future is
/// dropped, and with it whatever call it was awaiting.
///
/// What a cut call leaves behind is what the library documents for
/// cancellation (the guide's *Failure behaviour*): a read leaves nothing; a
/// buffered counter keeps a cut flush pending and re-sends it with the same
/// flush id (counted once); a single-command write (an event, a bucket push
/// into an open bucket) is applied whole or not at all; a rank write's own
/// transaction (a trader joining) is killed on the server at once.
///
/// A cut inside the order's transaction ends it: a pattern call cut there
/// has the library kill the transaction on the server at once (the guide's
/// *A write cut inside your transaction*), and the dropped session has the
/// driver abort it, so it holds no locks and the next order of the same
/// customer runs at once (`tests/service.rs` checks it). Only a cut during
/// the commit leaves the order's outcome unknown: the load run saw one such
/// order stored. So the 504 says "may or may not": the client reads the
/// customer's trades (`order_id`) before placing it again.
pub async fn deadline(State(app): State<App>, req: Request, next: Next) -> Response {
    let budget = app.config.deadline;
    match tokio::time::timeout(budget, next.run(req)).await {
        Ok(response) => response,
        Err(_) => (
            StatusCode::GATEWAY_TIMEOUT,
            format!(
                "cut by the {} ms deadline: a write may or may not be stored; read before retrying",
                budget.as_millis()
            ),
        )
            .into_response(),
    }
}

type ApiResult<T> = Result<T, ApiError>;

fn rfc3339(at: DateTime) -> String {
    at.try_to_rfc3339_string().unwrap_or_default()
}

// ---------------------------------------------------------------------------
// Leaderboard: rank histogram.

/// A trader joining a board.
#[derive(Debug, Serialize, Deserialize)]
pub struct JoinBoard {
    /// The trader's id.
    pub id: String,
    /// The board.
    pub board: String,
}

/// A trader and where they stand.
#[derive(Debug, Serialize, Deserialize)]
pub struct Standing {
    /// The trader.
    pub id: String,
    /// Their board.
    pub board: String,
    /// Their volume.
    pub volume: i64,
    /// Competition rank: 1 + traders with more volume.
    pub rank: u64,
    /// Traders on the board.
    pub total: u64,
    /// Share of the board below, ties counted half.
    pub percentile: f64,
}

/// Inserts the trader at volume 0 and counts them on the board's histogram,
/// in one transaction of the call's own. An existing id is 409.
async fn join_board(
    State(app): State<App>,
    Json(j): Json<JoinBoard>,
) -> ApiResult<impl IntoResponse> {
    let trader = Trader {
        id: j.id,
        board: j.board,
        volume: 0,
    };
    app.ranks.insert(&trader).await?;
    Ok((StatusCode::CREATED, Json(standing(&app, trader).await?)))
}

/// One `find` for the trader, one `aggregate` for the rank.
async fn my_rank(State(app): State<App>, Path(id): Path<String>) -> ApiResult<Json<Standing>> {
    let trader = app
        .ranks
        .collection()
        .find_one(doc! {"_id": &id})
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("no trader {id}")))?;
    Ok(Json(standing(&app, trader).await?))
}

async fn standing(app: &App, t: Trader) -> ApiResult<Standing> {
    let r = app.ranks.rank(t.board.as_str(), t.volume).await?;
    Ok(Standing {
        percentile: r.percentile().unwrap_or_default(),
        rank: r.rank,
        total: r.total,
        id: t.id,
        board: t.board,
        volume: t.volume,
    })
}

#[derive(Debug, Deserialize)]
struct TopQuery {
    n: Option<u32>,
}

/// One place of a board's top.
#[derive(Debug, Serialize, Deserialize)]
pub struct Place {
    /// Competition rank.
    pub rank: u64,
    /// The volume.
    pub volume: i64,
    /// Traders at that volume.
    pub traders: u64,
}

/// The top `n` places (10 by default, at most 100): one round trip reading
/// at most `n` histogram entries. A board nobody joined is 404.
async fn top(
    State(app): State<App>,
    Path(board): Path<String>,
    Query(q): Query<TopQuery>,
) -> ApiResult<Json<Vec<Place>>> {
    let n = q.n.unwrap_or(10);
    if !(1..=100).contains(&n) {
        return Err(ApiError::BadRequest("n: from 1 to 100".into()));
    }
    let places = app.ranks.top(board.as_str(), n).await?;
    Ok(Json(
        places
            .into_iter()
            .map(|p| Place {
                rank: p.rank,
                volume: p.score,
                traders: p.count,
            })
            .collect(),
    ))
}

// ---------------------------------------------------------------------------
// Orders: one caller transaction over three patterns and a plain insert.

/// An order to place.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NewOrder {
    /// The client's id for it, to find it again after an unknown outcome;
    /// made up when absent.
    #[serde(default)]
    pub order_id: Option<String>,
    /// A registered trader.
    pub customer: String,
    /// The product.
    pub ticker: String,
    /// Shares, 1 to 1,000,000.
    pub qty: i32,
}

/// A placed order.
#[derive(Debug, Serialize, Deserialize)]
pub struct Placed {
    /// Its id.
    pub order_id: String,
    /// The trader's volume after it.
    pub volume: i64,
}

/// Places an order in ONE transaction: the trade goes into the customer's
/// history (bucket push), the feed gets a line (a driver insert), the
/// trader's volume moves on the leaderboard (rank `update_score`) and the
/// ticker's page counts a view (a buffered counter written through, exact,
/// inside a transaction). All or nothing: a conflict with another order
/// of the same customer or board reruns the whole closure (the driver's
/// `and_run`; `and_run2`'s closure is not `Send`, so not in a handler).
async fn place_order(
    State(app): State<App>,
    Json(o): Json<NewOrder>,
) -> ApiResult<impl IntoResponse> {
    if !(1..=1_000_000).contains(&o.qty) {
        return Err(ApiError::BadRequest("qty: from 1 to 1,000,000".into()));
    }
    let order_id = o
        .order_id
        .clone()
        .unwrap_or_else(|| ObjectId::new().to_hex());
    let trade = Trade {
        customer_id: o.customer.clone(),
        order_id: order_id.clone(),
        ticker: o.ticker.clone(),
        qty: o.qty,
        at: DateTime::now(),
    };
    let feed: Collection<Activity> = Activity::collection(&app.db);
    let mut s = app.client.start_session().await?;
    let volume = s
        .start_transaction()
        .and_run((&app, &trade, &feed), |s, (app, trade, feed)| {
            Box::pin(async move {
                let trader =
                    app.ranks
                        .collection()
                        .find_one(doc! {"_id": &trade.customer_id})
                        .session(&mut *s)
                        .await?
                        .ok_or_else(|| {
                            // Carried through the driver's error, no labels: not rerun.
                            mongo_patterns::mongodb::error::Error::custom(ApiError::NotFound(
                                format!("no trader {}", trade.customer_id),
                            ))
                        })?;
                let volume = trader.volume + i64::from(trade.qty);
                // Least contended first: a transaction holds what it wrote
                // until it commits, so the document every order of a ticker
                // writes (the product's counter) goes last.
                app.trades.push(*trade).session(&mut *s).await?;
                let line = Activity {
                    id: ObjectId::new(),
                    customer: trade.customer_id.clone(),
                    text: format!(
                        "{} bought {} {}",
                        trade.customer_id, trade.qty, trade.ticker
                    ),
                    at: trade.at,
                };
                feed.insert_one(&line).session(&mut *s).await?;
                app.ranks
                    .update_score(doc! {"_id": &trade.customer_id}, volume)
                    .session(&mut *s)
                    .await?;
                app.views.incr(&trade.ticker).session(&mut *s).await?;
                Ok(volume)
            })
        })
        .await?;
    Ok((StatusCode::CREATED, Json(Placed { order_id, volume })))
}

// ---------------------------------------------------------------------------
// Trade history: bucket.

#[derive(Debug, Deserialize)]
struct HistoryQuery {
    page: Option<u32>,
    page_size: Option<u32>,
}

/// A trade, as the API shows it.
#[derive(Debug, Serialize, Deserialize)]
pub struct TradeView {
    /// Its order.
    pub order_id: String,
    /// What.
    pub ticker: String,
    /// How many.
    pub qty: i32,
    /// When, RFC 3339.
    pub at: String,
}

/// A page of history.
#[derive(Debug, Serialize, Deserialize)]
pub struct History {
    /// Newest first.
    pub trades: Vec<TradeView>,
    /// Whether an older page exists.
    pub has_more: bool,
}

/// Page `page` (from 1) of `page_size` trades (20 by default), newest first:
/// reads the one or two buckets the page falls in, found by position.
async fn history(
    State(app): State<App>,
    Path(id): Path<String>,
    Query(q): Query<HistoryQuery>,
) -> ApiResult<Json<History>> {
    let req = PageRequest::page(q.page.unwrap_or(1))
        .page_size(q.page_size.unwrap_or(20))
        .newest_first();
    let page = app.trades.page(&id, req).await?;
    Ok(Json(History {
        has_more: page.has_more,
        trades: page
            .items
            .into_iter()
            .map(|t| TradeView {
                order_id: t.order_id,
                ticker: t.ticker,
                qty: t.qty,
                at: rfc3339(t.at),
            })
            .collect(),
    }))
}

// ---------------------------------------------------------------------------
// Activity feed: keyset.

#[derive(Debug, Deserialize)]
struct FeedQuery {
    after: Option<String>,
    before: Option<String>,
    limit: Option<u32>,
}

/// One line of the feed.
#[derive(Debug, Serialize, Deserialize)]
pub struct FeedLine {
    /// Who.
    pub customer: String,
    /// What.
    pub text: String,
    /// When, RFC 3339.
    pub at: String,
}

/// A page of the feed with the tokens to move either way.
#[derive(Debug, Serialize, Deserialize)]
pub struct FeedPage {
    /// Newest first.
    pub items: Vec<FeedLine>,
    /// `?after=` this for the older page.
    pub next: Option<String>,
    /// `?before=` this for the newer page.
    pub prev: Option<String>,
}

/// One `find` per page at any depth. Tokens are signed with the config's
/// key: a forged, cut or altered token is 400 before anything is sent.
async fn feed(State(app): State<App>, Query(q): Query<FeedQuery>) -> ApiResult<Json<FeedPage>> {
    let mut query = Activity::keyset(&app.db)
        .signing_key(app.config.token_key.clone())
        .page_size(q.limit.unwrap_or(20));
    match (&q.after, &q.before) {
        (Some(_), Some(_)) => return Err(ApiError::BadRequest("after or before, not both".into())),
        (Some(t), None) => query = query.after(&t.parse::<PageToken>()?),
        (None, Some(t)) => query = query.before(&t.parse::<PageToken>()?),
        (None, None) => {}
    }
    let page = query.page().await?;
    Ok(Json(FeedPage {
        next: page.next.map(|t| t.to_string()),
        prev: page.prev.map(|t| t.to_string()),
        items: page
            .items
            .into_iter()
            .map(|a| FeedLine {
                customer: a.customer,
                text: a.text,
                at: rfc3339(a.at),
            })
            .collect(),
    }))
}

// ---------------------------------------------------------------------------
// Views and likes: approximate counters.

/// A product's counters, as this process knows them.
#[derive(Debug, Serialize, Deserialize)]
pub struct Counts {
    /// The product.
    pub id: String,
    /// Views stored plus what this process holds unwritten.
    pub views: i64,
    /// Likes, the same way.
    pub likes: i64,
}

/// Counts a view (in memory: a write per 100 views of the product), then
/// reads both counters.
async fn view_product(State(app): State<App>, Path(id): Path<String>) -> ApiResult<Json<Counts>> {
    app.views.incr(id.as_str()).await?;
    counts(&app, id).await.map(Json)
}

/// Counts a like.
async fn like_product(State(app): State<App>, Path(id): Path<String>) -> ApiResult<Json<Counts>> {
    app.likes.incr(id.as_str()).await?;
    counts(&app, id).await.map(Json)
}

async fn counts(app: &App, id: String) -> ApiResult<Counts> {
    Ok(Counts {
        views: app.views.estimate(id.as_str()).await?,
        likes: app.likes.estimate(id.as_str()).await?,
        id,
    })
}

// ---------------------------------------------------------------------------
// Event log: shard key.

/// An event to log.
#[derive(Debug, Serialize, Deserialize)]
pub struct NewEvent {
    /// Its kind: the shard key's search field.
    pub kind: String,
    /// Free text.
    pub detail: String,
}

/// A logged event.
#[derive(Debug, Serialize, Deserialize)]
pub struct EventView {
    /// Its id.
    pub id: String,
    /// Kind.
    pub kind: String,
    /// When, RFC 3339.
    pub at: String,
    /// Text.
    pub detail: String,
}

/// Inserts the event with `month` derived from now.
async fn log_event(
    State(app): State<App>,
    Json(e): Json<NewEvent>,
) -> ApiResult<impl IntoResponse> {
    let event = Event {
        id: ObjectId::new(),
        kind: e.kind,
        at: DateTime::now(),
        detail: e.detail,
    };
    app.events.insert(&event).await?;
    Ok((StatusCode::CREATED, Json(event_view(event))))
}

fn event_view(e: Event) -> EventView {
    EventView {
        id: e.id.to_hex(),
        kind: e.kind,
        at: rfc3339(e.at),
        detail: e.detail,
    }
}

#[derive(Debug, Deserialize)]
struct EventsQuery {
    days: Option<u32>,
    limit: Option<usize>,
}

/// The events of one kind of the last `days` days (7 by default), at most
/// `limit` (100): a query naming the shard key's prefix, so on a sharded
/// cluster it goes to the shards holding those months only.
async fn events_of(
    State(app): State<App>,
    Path(kind): Path<String>,
    Query(q): Query<EventsQuery>,
) -> ApiResult<Json<Vec<EventView>>> {
    let (days, limit) = (q.days.unwrap_or(7), q.limit.unwrap_or(100));
    if !(1..=366).contains(&days) || !(1..=1000).contains(&limit) {
        return Err(ApiError::BadRequest(
            "days: 1 to 366; limit: 1 to 1000".into(),
        ));
    }
    let mut cursor = app
        .events
        .find(kind.as_str(), TimeRange::last_days(days), doc! {})
        .await?;
    let mut out = Vec::new();
    while out.len() < limit {
        match cursor.try_next().await? {
            Some(e) => out.push(event_view(e)),
            None => break,
        }
    }
    Ok(Json(out))
}
