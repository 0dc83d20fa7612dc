//! The `tracing` span every operation runs in, and the events inside it,
//! recorded by a small subscriber of this file's own (no
//! `tracing-subscriber`): target and name `mongo_patterns`, the pattern,
//! the operation and the collection; `retries` when a
//! call pauses; a learnt fallback said once, at INFO. And what costs
//! nothing: without a subscriber, an operation's future is its one box.
//!
//! Each test installs the recorder on its own thread (`set_default`) and
//! runs on a current-thread runtime, so the tasks a call spawns run there
//! too, and tests of one process do not see each other's spans.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::collections::BTreeMap;
use std::future::IntoFuture;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mongo_patterns::bucket::PageRequest;
use mongo_patterns::mongodb::event::command::CommandEvent;
use mongo_patterns::mongodb::event::EventHandler;
use mongo_patterns::mongodb::options::ClientOptions;
use mongo_patterns::mongodb::Client;
use mongo_patterns::prelude::*;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};

// ---------------------------------------------------------------------------
// The recorder.

/// A span as the recorder saw it: its fields as recorded last.
#[derive(Debug, Clone)]
struct SpanSeen {
    id: u64,
    target: String,
    name: String,
    level: Level,
    fields: BTreeMap<String, String>,
}

/// An event: its target, level, fields (`message` among them) and the span
/// it was emitted in.
#[derive(Debug, Clone)]
struct EventSeen {
    target: String,
    level: Level,
    fields: BTreeMap<String, String>,
    span: Option<u64>,
}

#[derive(Default)]
struct Log {
    spans: Vec<(SpanSeen, &'static Metadata<'static>)>,
    events: Vec<EventSeen>,
    /// The spans entered on this (the only) thread, innermost last.
    stack: Vec<u64>,
}

/// Records every span and event whose target starts with
/// `mongo_patterns`, at every level.
#[derive(Clone, Default)]
struct Recorder {
    log: Arc<Mutex<Log>>,
    next: Arc<AtomicU64>,
}

impl Recorder {
    fn spans(&self) -> Vec<SpanSeen> {
        let log = self.log.lock().unwrap();
        log.spans.iter().map(|(s, _)| s.clone()).collect()
    }

    fn events(&self) -> Vec<EventSeen> {
        self.log.lock().unwrap().events.clone()
    }

    /// The spans of `pattern`'s `operation`.
    fn of(&self, pattern: &str, operation: &str) -> Vec<SpanSeen> {
        self.spans()
            .into_iter()
            .filter(|s| field(&s.fields, "pattern") == pattern)
            .filter(|s| field(&s.fields, "operation") == operation)
            .collect()
    }

    /// The current span's id: what `tracing::Span::current()` would give.
    fn current(&self) -> Option<u64> {
        self.log.lock().unwrap().stack.last().copied()
    }
}

fn field<'a>(fields: &'a BTreeMap<String, String>, name: &str) -> &'a str {
    fields.get(name).map_or("", String::as_str)
}

/// Writes each field as its `Debug` (strings) or `Display` (numbers).
struct Fields<'a>(&'a mut BTreeMap<String, String>);

impl Visit for Fields<'_> {
    fn record_str(&mut self, f: &Field, value: &str) {
        self.0.insert(f.name().to_owned(), value.to_owned());
    }

    fn record_debug(&mut self, f: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(f.name().to_owned(), format!("{value:?}"));
    }
}

impl Subscriber for Recorder {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        metadata.target().starts_with("mongo_patterns")
    }

    fn new_span(&self, attrs: &Attributes<'_>) -> Id {
        let id = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        let mut fields = BTreeMap::new();
        attrs.record(&mut Fields(&mut fields));
        let meta = attrs.metadata();
        let seen = SpanSeen {
            id,
            target: meta.target().to_owned(),
            name: meta.name().to_owned(),
            level: *meta.level(),
            fields,
        };
        self.log.lock().unwrap().spans.push((seen, meta));
        Id::from_u64(id)
    }

    fn record(&self, span: &Id, values: &Record<'_>) {
        let mut log = self.log.lock().unwrap();
        if let Some((s, _)) = log.spans.iter_mut().find(|(s, _)| s.id == span.into_u64()) {
            values.record(&mut Fields(&mut s.fields));
        }
    }

    fn record_follows_from(&self, _: &Id, _: &Id) {}

    fn event(&self, event: &Event<'_>) {
        let mut fields = BTreeMap::new();
        event.record(&mut Fields(&mut fields));
        let span = match event.parent() {
            Some(p) => Some(p.into_u64()),
            None if event.is_contextual() => self.current(),
            None => None,
        };
        let meta = event.metadata();
        self.log.lock().unwrap().events.push(EventSeen {
            target: meta.target().to_owned(),
            level: *meta.level(),
            fields,
            span,
        });
    }

    fn enter(&self, span: &Id) {
        self.log.lock().unwrap().stack.push(span.into_u64());
    }

    fn exit(&self, span: &Id) {
        let mut log = self.log.lock().unwrap();
        if let Some(at) = log.stack.iter().rposition(|s| *s == span.into_u64()) {
            log.stack.remove(at);
        }
    }

    fn current_span(&self) -> tracing_core::span::Current {
        let log = self.log.lock().unwrap();
        match log.stack.last() {
            Some(id) => {
                let meta = log
                    .spans
                    .iter()
                    .find(|(s, _)| s.id == *id)
                    .map(|(_, m)| *m)
                    .unwrap();
                tracing_core::span::Current::new(Id::from_u64(*id), meta)
            }
            None => tracing_core::span::Current::none(),
        }
    }
}

/// A recorder, the default on this thread until the guard drops.
fn record() -> (Recorder, tracing::subscriber::DefaultGuard) {
    let r = Recorder::default();
    let guard = tracing::subscriber::set_default(r.clone());
    (r, guard)
}

// ---------------------------------------------------------------------------
// Allocations on this thread, for the cost without a subscriber.

struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn allocations() -> u64 {
    ALLOCATIONS.with(Cell::get)
}

// ---------------------------------------------------------------------------
// Models.

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[serde(rename_all = "camelCase")]
#[model(collection = "trades")]
#[bucket(size = 5, key = "customerId", items = "trades")]
struct Trade {
    customer_id: i64,
    seq: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[serde(rename_all = "camelCase")]
#[model(collection = "exam_scores")]
#[rank_histogram(precision = 0.5)]
struct ExamScore {
    #[serde(rename = "_id")]
    student: String,
    exam_id: String,
    score: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[serde(rename_all = "camelCase")]
#[model(collection = "exam_scores_docs")]
#[rank_histogram(board = "examId", score = "score", layout = "documents")]
struct ExamScoreDocs {
    #[serde(rename = "_id")]
    student: String,
    exam_id: String,
    score: f64,
}

/// Lap times on integer tracks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[model(collection = "laps")]
#[rank_histogram(board = "track", score = "millis", order = "asc")]
struct Lap {
    #[serde(rename = "_id")]
    id: i64,
    track: i32,
    millis: i64,
}

#[derive(Debug, Clone, Serialize, Deserialize, Model)]
#[model(collection = "views")]
struct Viewed {
    #[serde(rename = "_id")]
    id: i64,
    #[approx_counter(every = 2, upsert = true)]
    views: i64,
}

/// Each command started: its name, and the span current then.
type Started = Arc<Mutex<Vec<(String, Option<u64>)>>>;

/// A client of this test's own on the test server, which notes, for every
/// command it starts, the span current when the driver started it.
async fn noting_client() -> (Client, Started) {
    let mut opts = ClientOptions::parse(mongo_patterns_testkit::server_uri())
        .await
        .unwrap();
    opts.server_selection_timeout = Some(Duration::from_secs(10));
    let seen: Started = Arc::default();
    let log = seen.clone();
    opts.command_event_handler = Some(EventHandler::callback(move |ev: CommandEvent| {
        if let CommandEvent::Started(ev) = ev {
            let span = tracing::Span::current().id().map(|id| id.into_u64());
            log.lock().unwrap().push((ev.command_name, span));
        }
    }));
    (Client::with_options(opts).unwrap(), seen)
}

/// The one span of `pattern`'s `operation` on `collection`, checked for
/// the target, name and level every operation's span has.
fn one_span(r: &Recorder, pattern: &str, operation: &str, collection: &str) -> SpanSeen {
    let spans = r.of(pattern, operation);
    assert_eq!(spans.len(), 1, "{pattern} {operation}: {:?}", r.spans());
    let s = spans.into_iter().next().unwrap();
    assert_eq!(s.target, "mongo_patterns", "{s:?}");
    assert_eq!(s.name, "mongo_patterns", "{s:?}");
    assert_eq!(s.level, Level::DEBUG, "{s:?}");
    assert_eq!(field(&s.fields, "collection"), collection, "{s:?}");
    s
}

// ---------------------------------------------------------------------------
// Tests.

/// A bucket push, a rank `update_score` and a counter `incr` each run in
/// a span of their own, and every command they send starts inside it (the
/// driver calls a command event handler in the operation's task: a
/// handler can count an operation's round trips by its span).
#[tokio::test]
async fn each_operation_runs_in_its_span() {
    let (fresh, _) = mongo_patterns_testkit::fresh_db("tracing_ops").await;
    let (client, commands) = noting_client().await;
    let db = client.database(fresh.name());
    let buckets = Trade::buckets(&db);
    let ranks = ExamScore::ranks(&db);
    let views = Viewed::views_counter(&db);
    ranks
        .insert(&ExamScore {
            student: "s1".into(),
            exam_id: "e1".into(),
            score: 50.0,
        })
        .await
        .unwrap();
    commands.lock().unwrap().clear();

    let (r, _guard) = record();
    buckets
        .push(&Trade {
            customer_id: 1,
            seq: 0,
        })
        .await
        .unwrap();
    let push = one_span(&r, "bucket", "push", "trades");
    assert!(
        !push.fields.contains_key("retries"),
        "a push that lost no race records no retries: {push:?}"
    );
    let sent = std::mem::take(&mut *commands.lock().unwrap());
    assert!(!sent.is_empty());
    assert!(
        sent.iter().all(|(_, span)| *span == Some(push.id)),
        "every command of the push in its span: {sent:?}"
    );

    assert!(ranks.update_score(doc! {"_id": "s1"}, 60.0).await.unwrap());
    let hist = ranks.histogram_collection().name().to_owned();
    let update = one_span(&r, "rank_histogram", "update_score", &hist);
    let sent = std::mem::take(&mut *commands.lock().unwrap());
    assert!(sent.len() >= 2, "{sent:?}");
    assert!(
        sent.iter().all(|(_, span)| *span == Some(update.id)),
        "every command of update_score in its span: {sent:?}"
    );

    // `incr_by` of `every` or more always writes (`incr` one time in 2).
    views.incr_by(&7_i64, 2).await.unwrap();
    let incr = one_span(&r, "approx_counter", "incr", "views");
    let sent = std::mem::take(&mut *commands.lock().unwrap());
    assert_eq!(
        sent,
        [("update".to_owned(), Some(incr.id))],
        "one update, in the span"
    );

    // Reads too: a page, and a count of a keyset query.
    buckets
        .page(&1, PageRequest::page(1).page_size(5))
        .await
        .unwrap();
    one_span(&r, "bucket", "page", "trades");
    assert_eq!(ranks.rank("e1", 60.0).await.unwrap().rank, 1);
    one_span(&r, "rank_histogram", "rank", &hist);
    assert_eq!(
        r.spans().len(),
        5,
        "one span an operation, none else: {:?}",
        r.spans()
    );
    fresh.drop().await.unwrap();
}

/// Pushes that lose a race retry, and their span says how often
/// (`retries`), with a DEBUG event each (target `mongo_patterns::retry`).
/// Provoked: 16 repositories (not clones, which queue per key) push the
/// first items of one new key at once; a round in which no push lost is
/// tried again with a new key, up to 20 rounds.
#[tokio::test]
async fn a_lost_race_records_retries() {
    let (db, _) = mongo_patterns_testkit::fresh_db("tracing_race").await;
    let repos: Vec<_> = (0..16).map(|_| Trade::buckets(&db)).collect();
    let (r, _guard) = record();
    let mut retried = None;
    for key in 1..=20_i64 {
        let items: Vec<Trade> = (0..16)
            .map(|seq| Trade {
                customer_id: key,
                seq,
            })
            .collect();
        let pushes = repos.iter().zip(&items).map(|(repo, t)| repo.push(t));
        for done in futures::future::join_all(pushes.map(IntoFuture::into_future)).await {
            done.unwrap();
        }
        retried = r
            .of("bucket", "push")
            .into_iter()
            .find(|s| s.fields.contains_key("retries"));
        if retried.is_some() {
            break;
        }
    }
    let span = retried.expect("no push lost a race in 20 rounds of 16");
    let retries: u32 = field(&span.fields, "retries").parse().unwrap();
    assert!(retries >= 1, "{span:?}");
    let events: Vec<_> = r
        .events()
        .into_iter()
        .filter(|e| e.span == Some(span.id) && e.target == "mongo_patterns::retry")
        .collect();
    assert!(!events.is_empty());
    assert!(events.iter().all(|e| e.level == Level::DEBUG
        && field(&e.fields, "operation") == "push"
        && e.fields.contains_key("backoff_ms")
        && e.fields.contains_key("attempt")));
    db.drop().await.unwrap();
}

/// A repository that learns a fallback (here: the server refuses
/// `bulkWrite`, under a name it does not know) says so once, at INFO
/// (target `mongo_patterns::fallback`), inside the call that learnt it;
/// the calls after it, and its clones, say nothing more.
#[tokio::test]
async fn a_learnt_fallback_is_said_once() {
    let (db, _) = mongo_patterns_testkit::fresh_db("tracing_fallback").await;
    let ranks = ExamScoreDocs::ranks(&db).__bulk_write_command("bulkWriteUnknown");
    let (r, _guard) = record();
    ranks.record("e1", 50.0).await.unwrap();
    ranks.record("e1", 60.0).await.unwrap();
    ranks.clone().change("e1", 50.0, 70.0).await.unwrap();
    let said: Vec<_> = r
        .events()
        .into_iter()
        .filter(|e| e.target == "mongo_patterns::fallback")
        .collect();
    assert_eq!(said.len(), 1, "{said:?}");
    let hist = ranks.histogram_collection().name().to_owned();
    let first = &r.of("rank_histogram", "record")[0];
    assert_eq!(said[0].level, Level::INFO);
    assert_eq!(field(&said[0].fields, "fallback"), "no_bulk_write");
    assert_eq!(field(&said[0].fields, "collection"), hist);
    assert_eq!(said[0].span, Some(first.id));
    assert_eq!(r.of("rank_histogram", "record").len(), 2);
    assert_eq!(
        ranks.rank("e1", 70.0).await.unwrap().total,
        2,
        "written through the fallback"
    );
    db.drop().await.unwrap();
}

/// Without a subscriber an operation's future costs what it did: its one
/// box, no span allocated or held (the spans' fields are borrowed).
#[tokio::test]
async fn without_a_subscriber_a_future_is_one_allocation() {
    let client = Client::with_uri_str("mongodb://127.0.0.1:9/?serverSelectionTimeoutMS=1")
        .await
        .unwrap();
    let db = client.database("sizes");
    let (buckets, ranks) = (Trade::buckets(&db), Lap::ranks(&db));
    let t = Trade {
        customer_id: 1,
        seq: 0,
    };
    let req = PageRequest::page(1).page_size(5);
    let key = 1_i64;
    let count = |f: &dyn Fn()| {
        let before = allocations();
        f();
        allocations() - before
    };
    assert_eq!(count(&|| drop(buckets.push(&t).into_future())), 1);
    assert_eq!(count(&|| drop(buckets.page(&key, req).into_future())), 1);
    assert_eq!(count(&|| drop(buckets.count(&key).into_future())), 1);
    // Board 7: an integer board serializes without allocating.
    assert_eq!(count(&|| drop(ranks.top(&7, 3).into_future())), 1);
    // With a subscriber that takes the span, the span is more.
    let (r, _guard) = record();
    assert!(count(&|| drop(buckets.push(&t).into_future())) > 1);
    assert_eq!(r.spans().len(), 1);
}
