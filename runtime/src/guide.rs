//! Using the patterns in an application: the derive's rules, actions,
//! sessions and transactions, options, collection names, errors,
//! failovers, tracing, and what every pattern does under failure.
//!
//! This module holds no code. Every pattern's repository follows the rules
//! below; each pattern's module docs say what its own calls send and how
//! they behave under failure, and this page says, once for all of them,
//! how those calls meet your sessions, options and collections.
//!
//! # `#[derive(Model)]`
//!
//! - `#[model(collection = "...")]` names the collection; without it the
//!   name is the struct's in snake_case (`PageView` is `page_view`, no
//!   plural).
//! - Field names in every attribute resolve through serde: the Rust name or
//!   the stored (BSON) name both work, with `rename` and `rename_all`
//!   applied. A `#[serde(skip)]` or `flatten` field cannot be named: it is
//!   not stored under its name.
//! - Enums, tuple and unit structs, and structs that borrow (lifetime
//!   parameters) are compile errors; type parameters are fine.
//! - Every mistake is reported at once, at the user's own tokens (a typo in
//!   `sort = "visitedAT"` says ``help: did you mean `visitedAt`?``; a sort
//!   key of a type with no single BSON order is an error at the field's
//!   type), and the derive still emits a stub impl so that one bad
//!   attribute does not bury the rest of the crate in follow-on errors.
//! - [`Model::ensure`](crate::Model::ensure) creates the collections,
//!   indexes and sharding the attributes declare; see [`crate::ensure`].
//! - What it costs a build: in a crate of 50 models (ten of each pattern),
//!   the derive's expanded code is 1.34× what serde's derive alone expands
//!   to, and `cargo check` of the crate takes 1.39× and an incremental debug
//!   build 1.59× the time of the same crate with serde's derive alone
//!   (`benches/derive-cost-results.md`).
//!
//! # Actions
//!
//! Every repository speaks the driver's language, so a pattern's call sits
//! next to your own `coll.update_one(...)` without ceremony. Each call
//! returns an action: chained setters configure it and `.await` runs it
//! (`#[must_use]`: an action that is not awaited does nothing, and the
//! compiler says so), as in `coll.find(f).session(&mut s).await`. One
//! allocation per call (the boxed future, as the driver's own actions);
//! nothing else is added on the hot path. Pure computations
//! (`page_pipeline`, `shard_spec`, `stats`, `declared`, `collection`) stay
//! plain methods: no option could apply to them. The [`action`](crate::action)
//! module holds the machinery ([`Options`](crate::action::Options)).
//!
//! # One verb, one meaning
//!
//! The same verb does the same thing in every repository, and means what
//! the driver's verb of that name means. Every call in the table is an
//! action (setters, `.await`) except the streams, which are `Stream`s;
//! every one that reads or writes your data takes `.session()` (the
//! counter's `flush` and `shutdown`, and the deployment calls, take none:
//! see below).
//!
//! | verb | means | keyset | bucket | rank histogram | approximate counter | shard key |
//! | --- | --- | --- | --- | --- | --- | --- |
//! | `insert` | store new documents | — | `push`, `push_many`: the pattern's insert, appending items to each one's key | `insert` (the player and its count) | — | `insert`, `insert_many` |
//! | `upsert` | replace, or insert when absent | — | — | — | — | `upsert` |
//! | `replace` | replace one whole document or item | — | `replace(key, filter, item)` | — | — | `replace` |
//! | `update` | change fields of what matches | — | — | `update_score(filter, score)` | `incr`, `incr_by` | `update(at, search, filter, update)` (operators) |
//! | `delete` | delete what matches | — | `delete(key, filter)` (items) | `delete(filter)` (a player, uncounted) | — | `delete(at, search, filter)` |
//! | `record`, `change`, `unrecord` | counts on the histogram alone, no player document | — | — | `record`, `change`, `unrecord` | — | — |
//! | reads | one answer | `page`, `count` | `page`, `count` | `rank`, `percentile`, `top`, `histogram` | `estimate` | `find`, `find_by_hashed`, `scatter` (streams), `audit`, `analyze` |
//! | `stream` | every item, as a `Stream` | `stream`, `pages` | `stream(key)` | — | — | (`find` gives one) |
//! | repair | recompute what is derived | — | `reindex(key)` | `rebuild(board)` | `flush`, `shutdown` (write what is pending) | — |
//! | `ensure`, `plan`, `declared` | what the deployment needs | every model: `M::ensure(&db)`, `M::plan(&db)`, `M::declared(&db)`, and each repository's `ensure()` and `declared()` | | | | `ensure_sharded` (strict: fails off a sharded cluster) |
//!
//! Before this table (the CHANGELOG has the migration notes): bucket
//! `update` replaced an item (now `replace`) and `remove` deleted items
//! (now `delete`); rank `remove` uncounted a score (now `unrecord`, the
//! opposite of `record`); `Sharded` had no `delete`; bucket `stream` took
//! no session; `push_many(key, items)` asked for the key its items hold
//! (now `push_many(items)`, which may mix keys); `PageRequest::new(3, 25)`
//! took two bare numbers (now `PageRequest::page(3).page_size(25)`);
//! `ensure_indexes` was a second name for `ensure` on two repositories; and
//! a `#[bucket]` model had `M::keyset` and `M::collection`, which read its
//! bucket documents as items and failed on the first (they are now on
//! [`Documents`](crate::Documents), which bucket models do not get).
//!
//! # Sessions and transactions
//!
//! `.session(&mut s)` runs the call in your session, and inside your
//! transaction when one is open. Inside your transaction a pattern never
//! retries on its own: a race it would retry outside (two pushes opening
//! the same bucket, two first increments of a key) is returned with the
//! driver's `TransientTransactionError` label
//! ([`Error::is_transient`](crate::Error::is_transient)), because the
//! server has aborted your transaction; the driver's `and_run2` then runs
//! the whole transaction again. Write and read concerns then come from the
//! transaction, as the driver requires; the ones set on the action are not
//! sent. Calls that need two documents changed together (rank `insert`,
//! `update_score`, `delete`) join your transaction, or without one run
//! their own.
//!
//! ```no_run
//! # use mongo_patterns::prelude::*;
//! # #[derive(Debug, Clone, Serialize, Deserialize, Model)]
//! # #[serde(rename_all = "camelCase")]
//! # #[bucket(size = 1000, key = "customerId")]
//! # struct Trade { customer_id: i64, ticker: String, qty: i32 }
//! # #[derive(Debug, Clone, Serialize, Deserialize, Model)]
//! # #[serde(rename_all = "camelCase")]
//! # #[rank_histogram]
//! # struct Trader { #[serde(rename = "_id")] id: String, desk: String, profit: i64 }
//! # #[derive(Debug, Clone, Serialize, Deserialize, Model)]
//! # struct Ticker { #[serde(rename = "_id")] id: String, #[approx_counter(every = 100)] volume: i64 }
//! # async fn f(client: Client, db: Database, trade: Trade) -> mongodb::error::Result<()> {
//! # let (id, cost, board, old, new) = (1, 10, "desk-1", 5, 6);
//! let accounts = db.collection::<Document>("accounts");
//! let trades = Trade::buckets(&db);
//! let ranks = Trader::ranks(&db);
//! let volume = Ticker::volume_counter(&db);
//!
//! let mut s = client.start_session().await?;
//! s.start_transaction().and_run2(async |s| {
//!     accounts.update_one(doc! {"_id": id}, doc! {"$inc": {"cash": -cost}}).session(&mut *s).await?;
//!     trades.push(&trade).session(&mut *s).await?;            // a bucket
//!     ranks.change(board, old, new).session(&mut *s).await?;  // a rank histogram
//!     volume.incr(&trade.ticker).session(&mut *s).await?;     // a counter, written through
//!     Ok(())
//! }).await?;
//! # Ok(()) }
//! ```
//!
//! `?` works inside the closure because
//! `mongodb::error::Error: From<mongo_patterns::Error>` (see *Errors*
//! below): the labels survive, so a transient error reruns the closure.
//!
//! ## Inside `tokio::spawn`
//!
//! The `and_run2` form above does not compile in a spawned task, which is
//! where web frameworks run handlers: rustc cannot prove the closure's
//! future `Send` for every borrow ("implementation of `Send` is not
//! general enough", rust-lang/rust#96865). There use the driver's
//! `and_run`, with the same retries and 120 s bound: what the closure
//! borrows goes in a context tuple, and the body is a boxed `async move`
//! block.
//!
//! ```no_run
//! # use mongo_patterns::prelude::*;
//! # #[derive(Debug, Clone, Serialize, Deserialize, Model)]
//! # #[serde(rename_all = "camelCase")]
//! # #[bucket(size = 1000, key = "customerId")]
//! # struct Trade { customer_id: i64, ticker: String, qty: i32 }
//! # async fn f(client: Client, db: Database, trade: Trade) {
//! let accounts = db.collection::<Document>("accounts");
//! let trades = Trade::buckets(&db);
//! let task = tokio::spawn(async move {
//!     let mut s = client.start_session().await?;
//!     s.start_transaction()
//!         .and_run((&accounts, &trades, &trade), |s, (accounts, trades, trade)| {
//!             Box::pin(async move {
//!                 let id = trade.customer_id;
//!                 accounts.update_one(doc! {"_id": id}, doc! {"$inc": {"cash": -1}}).session(&mut *s).await?;
//!                 trades.push(*trade).session(&mut *s).await?;
//!                 Ok(())
//!             })
//!         })
//!         .await
//! });
//! let done: mongodb::error::Result<()> = task.await.expect("the task panicked");
//! # }
//! ```
//!
//! What joins your transaction, per pattern:
//!
//! | pattern | in your transaction | refused there, or not taking a session |
//! | --- | --- | --- |
//! | keyset | `page`, `count`, every page of `stream` and `pages` | — |
//! | bucket | every call | — |
//! | rank histogram | every call | — |
//! | approximate counter | `incr`, `incr_by`, `estimate` (a buffered counter writes through, exact) | `flush`, `shutdown` take no session |
//! | shard key | every call | `ensure_sharded` takes no session |
//! | [`ensure`](crate::ensure) | — | a transaction refuses `listCollections` and `listIndexes`: run `ensure` and `plan` outside one |
//!
//! ## Keyset
//!
//! Inside your transaction, `page`, `count` and every page of a `stream`
//! see the transaction's own uncommitted writes, and take its read concern
//! (one set on the action or the query is not sent there). Paging only
//! reads, so there is never a retry to hand back. A `stream` or `pages`
//! given a session borrows it until the stream is dropped; configure a
//! stream before its first poll.
//!
//! ## Bucket
//!
//! Inside your transaction a push sends what it sends outside (an `update`
//! by `_id`; at a rollover a `find` and an `insert`; for a key this
//! repository has not seen, a `find` of the newest bucket first, because a
//! failed insert would abort your transaction), all in the transaction,
//! with its write and read concern. A race the push would retry (its
//! insert of the next bucket losing to another writer, or its bucket
//! changing under it) is returned instead, labelled
//! `TransientTransactionError` (on the test server usually `WriteConflict`
//! 112, already labelled; a duplicate key is labelled by the repository),
//! so `and_run2` runs your closure again: 16 tasks, each pushing to one key
//! of `size = 3` in its own transactions, all committed through `and_run2`
//! with `?` (123 attempts for 32 transactions), every item once, `count`
//! and `start` exact (`tests/bucket_app.rs`). What the repository remembers
//! of a key's open bucket is a hint that every write's filter checks: after
//! an aborted transaction it costs one `find`, never a wrong write.
//!
//! A late push (with `order`), `delete` and `reindex` move the positions of
//! later buckets; each is one transaction of its own outside yours, and
//! inside yours its reads and writes join it, whatever they move, so your
//! commit stores them with the rest and your abort drops them. A write
//! conflict they meet there (another writer of the key, in another
//! instance or task) aborts your transaction with
//! `TransientTransactionError`, which `and_run2` runs again. Until you
//! commit, the buckets they wrote are yours on the server: pushes of
//! other callers to the same key wait for your commit (their own
//! transactions conflict and rerun), so keep such transactions short.
//!
//! ## Rank histogram
//!
//! `record`, `change`, `unrecord`, `rank`, `top`, `histogram` and `rebuild`
//! run inside your transaction when one is open; `insert`, `update_score`
//! and `delete` join your transaction (two round trips, you commit), or
//! otherwise run a transaction of their own (in your session when given
//! one without a transaction, else in a session of their own), always
//! through the driver's `and_run` (jittered backoff, 120 s; not `and_run2`,
//! whose async closure does not compile there, rust-lang/rust#96865, as in
//! a spawned task above). Inside your transaction a call never retries: a
//! write conflict or a lost upsert race comes back with
//! `TransientTransactionError`, so `?` in your `and_run2` closure reruns
//! the whole transaction (`tests/rank_app.rs` provokes one). In a
//! transaction of the call's own, the write concern goes with
//! `commitTransaction` and `max_time` bounds the commit. Inside your
//! transaction the documents layout's `change` and `unrecord` send
//! `update` and `delete` (2 round trips) rather than `bulkWrite`, which the test
//! server refuses as a transaction's first command (`IDLUnknownField`: the
//! driver adds `readConcern` there).
//!
//! ## Approximate counter
//!
//! A **sampled** increment draws as ever and, if it writes, writes in the
//! session, inside its transaction when one is open; a **geometric** one
//! too (a value read back inside a transaction is not remembered for the
//! next write size, as it may be rolled back); a **buffered** counter
//! cannot flush from its background task in your session, so an increment
//! in a session is written through at once in it (`$inc: n`, exact),
//! bypassing the buffer. Aborted, nothing of it is stored. `estimate` reads
//! in the session. Two first increments of a new key (`upsert = true`) can
//! race: outside a transaction the loser is retried once as an update;
//! inside yours it is returned with `TransientTransactionError`
//! (`is_transient()`), so
//! `session.start_transaction().and_run2(async |s| { views.incr(k).session(s).await?; Ok(()) })`
//! runs the transaction again. `flush` and `shutdown` take no session
//! (their writes carry every caller's increments).
//!
//! ## Shard key
//!
//! Pass the session to every call (`logs.upsert(&log).session(s).await?`
//! inside `and_run2`): the `?` converts to the driver's error with its
//! labels, so a lost race runs the transaction again. In your transaction
//! the lookup and the write of a move see one snapshot. `ensure_sharded`
//! takes no session (neither admin command may run in a transaction).
//!
//! ## A write cut inside your transaction
//!
//! A write of any pattern whose future is dropped inside your transaction
//! before its last reply arrived (a request timeout, a `select!`) has the
//! server kill the session's server side (`killSessions`, sent once, at
//! once, from a spawned task). Without it, a write that was the
//! transaction's first command would start the transaction on the server
//! after the driver had given up on it: the driver's `abort_transaction()`
//! then sends nothing, and the transaction would keep what it wrote locked
//! for the server's transaction lifetime (60 s by default), failing or
//! stalling every other writer of the same documents. The driver's own
//! `update_one` cut the same way leaves exactly that. Which command was
//! the first the driver does not say, so any write cut in a transaction
//! kills it: the transaction is lost either way, and a write cut half way
//! must not be committed.
//!
//! Your session afterwards:
//! - its transaction is gone on the server and cannot commit: never commit
//!   a transaction one of whose writes was cut. When the cut write was its
//!   first command the driver believes nothing was sent, and its
//!   `commit_transaction()` then returns `Ok` without sending anything
//!   (nothing is stored); otherwise the commit, like any further command in
//!   the transaction, fails with `NoSuchTransaction` (labelled
//!   `TransientTransactionError`);
//! - `abort_transaction()` returns at once (the driver sends nothing, or an
//!   abort the server answers at once), and dropping the session is fine;
//! - a new transaction in it (`start_transaction()`, or `and_run2`'s next
//!   attempt) runs normally, and fences the cut one: its higher
//!   transaction number makes the server abort the older transaction, if
//!   anything left it open, and refuse its late commands;
//! - commands outside a transaction run normally.
//!
//! What the kill cannot reach: a command of the cut write held in the
//! network until after the kill, which then starts the transaction anew,
//! and a deployment that refuses `killSessions` (Atlas shared tiers and
//! Flex clusters: the refusal is said at DEBUG on `mongo_patterns::cut`).
//! Either leaves the cut transaction open, holding what it wrote, until
//! your session's next transaction fences it or the server's transaction
//! lifetime (60 s by default) ends it. So after a cut inside a
//! transaction, run the next one in the same session (`and_run2` does), or
//! give calls inside transactions no deadline shorter than their bound.
//! The kill is never repeated: a late repeat could interrupt the next user
//! of the pooled server session. Outside a transaction nothing of this
//! runs and nothing is sent.
//!
//! # Options
//!
//! Writes take `.write_concern()`, reads `.read_concern()` and
//! `.selection_criteria()` (`$readPreference`), every call `.comment()` and
//! `.max_time()` (`maxTimeMS`); keyset reads also `.hint()` and
//! `.collation()`. `with_options(Options::new()...)` on a repository sets
//! its defaults; an action's setters override them field by field, and
//! what neither sets comes from the `Database` (or the `Client`), as in the
//! driver. Inside a transaction the transaction's concerns apply.
//!
//! Paths that send `run_command` (the documents-layout histogram's
//! `bulkWrite`, `ensure_sharded`, a counter write with `max_time` or
//! `w: 0`, the one-command bucket push) inherit nothing from the
//! collection: they write the effective write concern (the action's, the
//! repository's, else the collection's) and `maxTimeMS` into the command
//! themselves, and read `writeConcernError` as well as `writeErrors` (an
//! error with the server's code and labels). The driver (3.9) refuses
//! `w: 0` on every operation it builds, before sending anything
//! ("Unacknowledged write concerns are not supported"): such a call returns
//! that driver error and writes nothing; only the `run_command` paths send
//! it. The driver refuses `w: 0` for a transaction too.
//!
//! Per pattern:
//!
//! - **Keyset.** `read_concern`, `selection_criteria`, `comment` and
//!   `max_time` on each action (`page`, `count`, `stream`, `pages`), or as
//!   the query's defaults with `.with_options(..)`. `hint` and `collation`
//!   are keyset-only: on the builder they apply to every page (set a
//!   collation there: it changes the order, so the token fingerprint covers
//!   it and a token read under another collation is `Foreign`), on an
//!   action to that read alone. `command()` and `declared()` send nothing,
//!   so they take no options.
//! - **Bucket.** `write_concern` reaches every write command (`update`,
//!   `insert`, `findAndModify`) and, for the writes that move positions
//!   (a removal, a reindex, a late push: one transaction each), the
//!   commit; `read_concern`, `selection_criteria`, `comment` and
//!   `max_time` reach `page`, `count` and `stream`; `comment` reaches the
//!   writes of pushes and `update`, and `maxTimeMS` the `findAndModify`
//!   (the driver has none for `update` and `insert`). Reads inside a
//!   transaction of the call's own go to the primary, with the
//!   transaction's read concern.
//! - **Rank histogram.** `session`, `comment`, `max_time` on every call;
//!   `write_concern` on the writes, `read_concern` and
//!   `selection_criteria` on `rank`, `top` and `histogram`; all of them on
//!   `rebuild`. The documents layout sends its writes with `run_command`
//!   (`bulkWrite`, or `update` + `delete`), with the effective write
//!   concern and `maxTimeMS` in each command. `w: 0` reaches those
//!   commands; the driver refuses an unacknowledged write concern on every
//!   command it sends itself (the array layout's `update`, the players'
//!   writes: `InvalidArgument`) and on transactions (`insert`,
//!   `update_score`, `delete`), and sends nothing. `max_time` reaches every
//!   read, `findAndModify`, the `run_command` writes and a commit; the
//!   driver has no such option for the `update`, `insert` and `delete`
//!   commands it sends.
//! - **Approximate counter.** `write_concern`, `comment` and `max_time`
//!   reach every write (`update`, geometric `findAndModify`);
//!   `read_concern`, `selection_criteria`, `comment` and `max_time` reach
//!   `estimate`'s `find`. A write concern on one buffered `incr` writes it
//!   through at once with that concern (a later flush could not honour
//!   it). `flush` and `shutdown` take `write_concern`, `comment` and
//!   `max_time`. A handle's defaults (`with_options`) are carried by its
//!   background flushes too. The driver sends neither `maxTimeMS` on an
//!   update nor `w: 0` at all, so a write with either goes as the same
//!   command through `run_command`, with the effective write concern
//!   written into it (the driver does not retry that one on a lost
//!   connection; a buffered flush is still applied once, by its flush id).
//!   A `w: 0` write counts in `stats().writes` only if the reply still
//!   reports it applied.
//! - **Shard key.** `.write_concern(..)` on writes (`insert`,
//!   `insert_many`, `replace`, `upsert`, `update`, `delete`,
//!   `ensure_sharded`), `.read_concern(..)` and `.selection_criteria(..)`
//!   on reads (`find`, `find_by_hashed`, `scatter`, `audit`, `analyze`),
//!   `comment` and `max_time` on every call. The lookup by `_id` inside
//!   `replace`, `upsert`, `update` and `delete` always reads the primary,
//!   whatever reads are set to: it decides the write (or the error).
//!   `ensure_sharded` writes the effective write concern into each admin
//!   command.
//! - **[`ensure`](crate::ensure).** `ensure` takes `.write_concern()` (sent
//!   on every `create`, `createIndexes`, `enableSharding` and
//!   `shardCollection`; by default the `Database`'s), `.comment()`,
//!   `.max_time()`, `.session()`; `plan` takes `.selection_criteria()`,
//!   `.comment()`, `.max_time()`, `.session()`.
//!
//! # Collection names
//!
//! The compile-time name (`#[model(collection = ...)]`) is the default;
//! `with_collection(name)` points a repository at another collection of
//! the same database, for one collection per tenant. `collection()` gives
//! the driver's collection, for your own commands, and `declared()` names
//! what the repository uses, for [`ensure`](crate::ensure)
//! (`repo.ensure()` creates it, under the run-time names).
//!
//! - **Keyset.** `M::keyset(&db)` ([`Documents::keyset`](crate::Documents::keyset)) pages the model's collection;
//!   `.with_collection("visits_tenant_a")` pages another. Tokens name their
//!   database and collection: tenant A's token is `InvalidCursor(Foreign)`
//!   on tenant B's collection, before anything is sent.
//! - **Bucket.** `.with_collection("history_tenant_a")`; it forgets the
//!   open buckets it remembered. `.declared()` names the collection and its `{key, start}`
//!   index.
//! - **Rank histogram.**
//!   `Exam::ranks(&db).with_collection("t1_scores").with_histogram_collection("t1_ranks")`;
//!   `collection()` and `histogram_collection()` give the driver
//!   collections. Board keys are borrowed (`"exam_001"` for a `String`
//!   board).
//! - **Approximate counter.** `Counter::with_collection("tenant_a")` gives
//!   a handle over another collection (its own buffer and statistics; call
//!   it, and `with_options`, on a fresh handle and clone the result).
//! - **Shard key.** `.with_collection("logs_acme")` puts a tenant in its
//!   own (`declared()`, `shard_commands()` and `ensure_sharded()` follow
//!   it). `collection()` is the typed `Collection<T>`, for reads of your
//!   own; a write of your own must store the derived field
//!   (`to_document(&item)` through
//!   `collection().clone_with_type::<Document>()`), or targeted queries
//!   will not see it.
//!
//! # Errors
//!
//! One type, [`Error`](crate::Error), for every pattern.
//! [`Error::mongo`](crate::Error::mongo) is the driver's error underneath,
//! with `code()`, `contains_label()`, `is_duplicate_key()`,
//! `is_transient()` and `is_unavailable()`.
//! `mongodb::error::Error: From<mongo_patterns::Error>` gives back the
//! driver's own error (codes and labels kept) or a custom one holding ours
//! (`get_custom::<mongo_patterns::Error>()`), so `?` works inside an
//! `and_run2` callback and transient errors are retried. The driver prints
//! a custom error as `Custom user error` and leaves out what it holds, so
//! turn the error `and_run2` returns back into ours before printing it:
//! `mongo_patterns::Error::from(e)` (or `?` in a function returning
//! `mongo_patterns::Result`) gives back our error as it was, with its
//! text, and the driver's own errors as ours classifies them. Each error
//! prints its own message; the cause is its `source()`, not repeated.
//!
//! ```no_run
//! # use mongo_patterns::prelude::*;
//! # #[derive(Debug, Clone, Serialize, Deserialize, Model)]
//! # #[bucket(size = 100, key = "sym")]
//! # struct Tick { sym: String, n: u32 }
//! # async fn f(client: Client, db: Database) {
//! let ticks = Tick::buckets(&db);
//! let mut s = client.start_session().await.unwrap();
//! let done = s.start_transaction().and_run2(async |s| {
//!     ticks.delete("MDB", doc! {"n": 1}).session(s).await?; // refused here
//!     Ok(())
//! }).await;
//! if let Err(e) = done {
//!     // `delete` cannot run inside a transaction: ...; call it without
//!     // the transaction's session (...)
//!     eprintln!("{}", mongo_patterns::Error::from(e));
//! }
//! # }
//! ```
//!
//! What to retry, as code: [`Error::is_retryable`](crate::Error::is_retryable).
//! `Unavailable` and `Contended` may succeed later, as may an election's
//! refusal or a write conflict; `OutcomeUnknown` is not to be sent again
//! as it is (read first); `InvalidArgument`, `InvalidCursor`,
//! `Damaged`, `UnexpectedDocument`, `UnsupportedValue`, `NoTransactions`
//! and `ShardKeyMismatch` give the same answer again. Inside your
//! transaction, an error with `is_transient()` means: run the whole
//! transaction again.
//!
//! # Failovers
//!
//! An election, a step-down or a lost connection can strike a write after
//! the server ran it: the reply is replaced by an error, or lost. Every
//! write the patterns send outside your transaction is one of the driver's
//! retryable writes (its CRUD helpers, `Client::bulk_write`), so the
//! driver sends it once more and the server answers the second attempt
//! from its record of the first: one failover ends in `Ok` with the write
//! stored once, as the driver's own `update_one` does. What reaches you is
//! what is left after that retry (two faults in a row, or a client with
//! `retryWrites=false`):
//!
//! - an error with `is_retryable()`: the write was not stored; send it
//!   again as it is;
//! - [`Error::OutcomeUnknown`](crate::Error::OutcomeUnknown): it may be
//!   stored. Read before writing again (a board's histogram, a counter's
//!   value, a bucket's items), or accept that a resend may count it twice.
//!   A bucket push reads for its own write id before it says so, and
//!   says so only when that read fails too; a buffered counter keeps the
//!   increments pending and its flush id makes the next flush apply them
//!   once.
//!
//! Inside your transaction the driver's labels decide, as for any
//! transaction: `TransientTransactionError` runs it again,
//! `UnknownTransactionCommitResult` commits again. `tests/campaign.rs`
//! runs every pattern's writes through random failover faults from two
//! clients and checks what is stored (its table:
//! `benches/campaign-results.md`).
//!
//! # Tracing
//!
//! Every operation runs in a [`tracing`](https://docs.rs/tracing) span, as
//! the driver's own calls emit events: turn on a subscriber and filter on
//! the targets below (`RUST_LOG=mongo_patterns=debug` with
//! `tracing-subscriber`'s `EnvFilter`; a target matches its sub-targets).
//!
//! - **The span**: target and name `mongo_patterns`, level DEBUG, with
//!   fields `pattern` (`bucket`, `keyset`, `rank_histogram`,
//!   `approx_counter`, `shard_key`, `ensure`), `operation` (the method as
//!   you call it: `push`, `push_many`, `page`, `update_score`, `incr`,
//!   `ensure`, ...; `incr_by` is `incr`; `find_by_hashed` is `find`) and
//!   `collection` (the collection the call is about: a rank histogram's is
//!   its histogram collection, which every call of it reads or writes;
//!   `ensure` and `plan` name every declared collection). Recorded when the
//!   call pauses: `retries` (the retries of a lost race so far). The span
//!   covers the whole call, the tasks it spawns (a bucket `delete`,
//!   `reindex` or late push, each a transaction of its own; a batch of
//!   queued pushes: there, in the span of the push that started the
//!   batch) and, for the streams (bucket
//!   `stream`, keyset `stream` and `pages`), every poll from the first; a
//!   shard key `find` covers the `find`, not the `getMore`s of the stream
//!   it returns. A counter `incr` that sends nothing (a sampled increment
//!   that did not hit, one buffered) has no span: its hot path stays a load
//!   and a draw.
//! - **Events inside it**: DEBUG on `mongo_patterns::retry` for each pause
//!   after a lost race (fields `operation`, the retry loop's name;
//!   `attempt`; `backoff_ms`); INFO on `mongo_patterns::fallback`, once per repository and its
//!   clones, when it learns the deployment lacks something (field
//!   `fallback`: `no_bulk_write`, `no_bulk_in_transaction`,
//!   `no_transactions`; `collection`; the message says what it sends
//!   instead). An INFO filter shows the fallbacks without the spans. The
//!   counter's timed flush warns (WARN, `mongo_patterns::approx_counter`)
//!   when a write fails; it runs outside any call's span.
//! - **Cost**: without a subscriber that takes the span, a call checks a
//!   static and an atomic, allocates nothing more and holds no span: its
//!   future is the size it was (`tests/tracing_spans.rs` counts the
//!   allocations). With one, each call's future holds the span (40 bytes
//!   more) and the subscriber does what it does.
//!
//! **Round trips.** The span does not count commands: the runtime sees no
//! command the driver sends. The driver does, two ways, and both land
//! inside the operation's span, because the driver emits them in the task
//! that awaits the call:
//!
//! - its command events: a [`command_event_handler`](mongodb::options::ClientOptions::command_event_handler)
//!   made with `EventHandler::callback` runs inline, where
//!   `tracing::Span::current()` is the operation's span, so it can count
//!   `CommandEvent::Started` per span (`tests/tracing_spans.rs` checks that
//!   every command of a push, an `update_score` and an `incr` starts in its
//!   span);
//! - its own `tracing` events, behind the driver's `tracing-unstable`
//!   feature (unstable: it may change in a minor release of the driver):
//!   `mongodb = { version = "3", features = ["tracing-unstable"] }` emits
//!   `Command started`, `Command succeeded` and `Command failed` at DEBUG
//!   on target `mongodb::command` (the command and the reply as JSON, cut
//!   at `tracing_max_document_length_bytes`, 1000 by default), and events
//!   on `mongodb::connection`, `mongodb::server_selection` and
//!   `mongodb::topology`. With
//!   `RUST_LOG=mongo_patterns=debug,mongodb::command=debug`,
//!   `tracing-subscriber`'s `fmt` prints each command under the call that
//!   sent it:
//!   `mongo_patterns{pattern="bucket" operation="push" collection="trades"}: mongodb::command: Command started ...`.
//!
//! # bson 2 and bson 3
//!
//! The crate uses the driver's `bson` (`mongo_patterns::bson`). An
//! application on the driver's bson 3 turns on the same feature here:
//! `mongo-patterns = { version = "0.1", features = ["bson-3"] }` beside
//! `mongodb = { version = "3", features = ["bson-3"] }`.
//!
//! # On live data
//!
//! ## Adopting a players collection
//!
//! A players collection that exists already (written by another service,
//! or before the model had `#[rank_histogram]`) gets its histograms with
//! one call, bounded in memory whatever the number of boards:
//!
//! ```no_run
//! # use mongo_patterns::prelude::*;
//! #[derive(Debug, Clone, Serialize, Deserialize, Model)]
//! #[rank_histogram(board = "desk", score = "profit")]
//! struct Trader { #[serde(rename = "_id")] id: String, desk: String, profit: i64 }
//!
//! # async fn f(db: Database) -> mongo_patterns::Result<()> {
//! let players = Trader::ranks(&db)
//!     .rebuild_all()
//!     .on_progress(|p| eprintln!("{} of {} boards ({:.0}/s)", p.done, p.of, p.rate()))
//!     .await?;
//! # Ok(()) }
//! ```
//!
//! Run it before the application's own writes start (a write in flight
//! while a board is rebuilt can be lost from that board's histogram), or
//! run it again once they have.
//!
//! ## Filling a shard key's coarse field
//!
//! Documents stored without the derived coarse field (by another service,
//! or before the model had `#[shard_key]`) are invisible to
//! `Sharded::find` and refused by its writes; so are documents whose field
//! holds another granularity's period after `granularity` (or `coarse`'s
//! default) changed. `Sharded::audit` lists them; `Sharded::fill_coarse`
//! writes the field on them, 1,000 documents a batch, with `$dateTrunc`
//! of the timestamp as stored when the write runs (one statement a
//! document, guarded by the timestamp as read, before MongoDB 5.0), so
//! that a concurrent writer's change never gets a stale value. A cut run
//! resumes by running
//! again; on a consistent collection it writes nothing. Documents whose
//! timestamp is missing or not one the model reads are counted and named,
//! never written.
//!
//! ```no_run
//! # use mongo_patterns::prelude::*;
//! #[derive(Debug, Clone, Serialize, Deserialize, Model)]
//! #[shard_key(coarse = "month", from = "ts", search = "type")]
//! struct Log {
//!     #[serde(rename = "_id")] id: ObjectId,
//!     #[serde(rename = "type")] kind: String,
//!     ts: i64,
//! }
//!
//! # async fn f(db: Database) -> mongo_patterns::Result<()> {
//! let logs = Log::sharded(&db);
//! let fill = logs
//!     .fill_coarse()
//!     .on_progress(|p| eprintln!("{} of {} documents ({:.0}/s)", p.done, p.of, p.rate()))
//!     .await?;
//! eprintln!("{} filled, {} from another granularity, {} unfillable", fill.filled, fill.migrated, fill.unfillable);
//! # Ok(()) }
//! ```
//!
//! Fill before `ensure_sharded` if you can: it is the cheaper time. On a
//! collection already sharded, setting or changing a shard key field is a
//! change of the document's shard key value, which MongoDB accepts only
//! through `mongos`, as a retryable write or in a transaction, one
//! document per statement, with the full shard key in the filter: on a
//! `mongos` (or with `.sharded(true)`) `fill_coarse` writes so, one
//! statement a document, a batch in a transaction.
//!
//! ## Adopting a flat collection into buckets
//!
//! An application that stores one document per item (a trades collection,
//! one trade a document) moves to `#[bucket]` with
//! `Buckets::adopt_from(source)`: on the server, a batch of keys at a
//! time, it writes the buckets `push_many` would have written, in `order`
//! (equal values by `_id`, arrival order for ObjectIds), and only reads
//! the source. It is idempotent (a key's buckets are rewritten the same,
//! so each item is stored once) and a call cut short is finished by
//! calling it again. An index on the source's `{<key>: 1, <order>: 1}`
//! keeps each round's read of the keys off a collection scan.
//!
//! The copy takes time while the application goes on writing to the flat
//! collection, and what it writes during the copy must not be lost. The
//! way over, without dual writes:
//!
//! 1. Note `t0`, now, and run the first pass while the application writes
//!    to the flat collection as before.
//! 2. Catch up: adopt again the keys written since `t0`, whole. With
//!    ObjectId `_id`s, their time is the inserting client's clock, so
//!    take a margin for clock skew (a minute): `only_keys_of(doc! {"_id":
//!    {"$gte": since}})`, with `since` the ObjectId of the second `t0`
//!    less the margin. Each catch-up starts a new `t0` first; repeat until
//!    a pass is short.
//! 3. Freeze the application's writes to the flat collection (queue or
//!    refuse them for the moment), run one last catch-up from the last
//!    `t0`, then send writes to `push` and lift the freeze. Reads can move
//!    to the buckets then too.
//!
//! Why it loses nothing: an item is either written before the first pass
//! read its key (and copied then), or its key was written since `t0` and
//! is copied whole again by a catch-up; the last catch-up runs while the
//! source cannot change, and after it every write goes to the buckets.
//! The freeze lasts as long as the last catch-up, which copies only the
//! keys written during the one before. If the application also updates or
//! removes flat items, catch up on the field those writes set (an
//! `updatedAt`), or run the last pass on every key.
//!
//! Dual writes (to the flat collection and to `push` during the copy) do
//! not work with it, and it refuses them: adopting a key rewrites its
//! buckets from the source, which would overwrite what pushes stored, so
//! a key whose buckets the repository has written to is refused with
//! `Error::AlreadyBucketed`, naming it, before its batch writes (the
//! batches before it are adopted). Seen after the switch, it means a pass
//! ran after the key was pushed to: its buckets are kept as they are;
//! leave the switched keys out of any later pass (`only_keys_of`).
//!
//! ```no_run
//! # use mongo_patterns::prelude::*;
//! #[derive(Debug, Clone, Serialize, Deserialize, Model)]
//! #[bucket(size = 1000, key = "customer", order = "at")]
//! struct Trade { customer: i64, at: DateTime, ticker: String, qty: i32 }
//!
//! # async fn f(db: Database) -> mongo_patterns::Result<()> {
//! let trades = Trade::buckets(&db);
//! // A minute of margin for the clocks of the clients that make `_id`s.
//! let t0 = DateTime::now().timestamp_millis() / 1000 - 60;
//! trades
//!     .adopt_from("trades")
//!     .on_progress(|p| eprintln!("{} of {} trades ({:.0}/s)", p.done, p.of, p.rate()))
//!     .await?;
//! // ... the application's writes to "trades" frozen ...
//! let since = ObjectId::from_parts(t0 as u32, [0; 5], [0; 3]);
//! trades
//!     .adopt_from("trades")
//!     .only_keys_of(doc! {"_id": {"$gte": since}})
//!     .await?;
//! // ... the application now pushes to `trades`; the freeze is lifted.
//! # Ok(()) }
//! ```
//!
//! ## Retention
//!
//! Buckets with `order` on a date drop their old history with
//! `Buckets::delete_before(&key, cutoff)` for one key and
//! `Buckets::delete_all_before(cutoff)` for every key (a scheduled job):
//! whole buckets go, the boundary one is trimmed, `count` and pages stay
//! exact, pushes beside it are unharmed. A TTL index cannot do it: it
//! removes whole documents by one date, so it would drop buckets holding
//! newer items and leave every later bucket's position wrong.
//!
//! ```no_run
//! # use mongo_patterns::prelude::*;
//! #[derive(Debug, Clone, Serialize, Deserialize, Model)]
//! #[bucket(size = 1000, key = "customer", order = "at")]
//! struct Trade { customer: i64, at: DateTime, ticker: String, qty: i32 }
//!
//! # async fn f(db: Database) -> mongo_patterns::Result<()> {
//! let ninety_days_ago = DateTime::from_millis(DateTime::now().timestamp_millis() - 90 * 86_400_000);
//! let removed = Trade::buckets(&db).delete_all_before(ninety_days_ago).await?;
//! # Ok(()) }
//! ```
//!
//! Approximate counters and rank histograms need no retention: a counter
//! is one field of a document you already keep, and a histogram holds one
//! count per score, whose size follows the distinct scores, not the
//! players or the time; remove a player with `Ranks::delete` and the
//! histogram follows. Keyset pages and shard keys add nothing to expire.
//!
//! ## Invariants the server enforces
//!
//! `Model::ensure` sets a `$jsonSchema` validator on each collection a
//! pattern writes: the struct's fields' types as serde stores them (a
//! keyset sort key of one type, so that pages keep their order), and each
//! pattern's invariants: a bucket's `_id`, `start`, `count` and items
//! array; a histogram's counts; a derived shard key field. Another
//! service, or a person in the shell, then cannot store a bucket with a
//! string `_id`, a negative count or a date as a string: the server
//! refuses it (code 121), where before the repository found it later as
//! `Error::Damaged` or `UnexpectedDocument`. `#[model(validate = "...")]`
//! picks the level (moderate by default: a document stored before that
//! breaks it can still be mended). Under `strict`, a repository's own
//! write to such a document is refused too: it is
//! `Error::FailedValidation`, which names the document by its `_id` and
//! the rules it breaks by field, and stores nothing. On a collection that
//! holds data, count what already breaks it first:
//!
//! ```no_run
//! # use mongo_patterns::prelude::*;
//! #[derive(Debug, Clone, Serialize, Deserialize, Model)]
//! #[model(validate = "strict")]
//! #[bucket(size = 1000, key = "customer", order = "at")]
//! struct Trade { customer: i64, at: DateTime, ticker: String, qty: i32 }
//!
//! # async fn f(db: Database) -> mongo_patterns::Result<()> {
//! for bad in Trade::validate_existing(&db).await? {
//!     eprintln!("{}: {} break it, first {:?}", bad.collection, bad.count, bad.ids);
//! }
//! let done = Trade::ensure(&db).await?; // sets the validator
//! assert!(done.conflicts.is_empty(), "{done}");
//! # Ok(()) }
//! ```
//!
//! No field is required (a counter's upsert stores some only). A nested
//! struct or an enum is checked where it derives `Schema`
//! (`#[derive(Schema)]`: its fields' types; an enum's names and each
//! variant's shape under its serde tagging); a field whose Rust type does not decide its BSON type
//! otherwise (a helper's, a type without `Schema`) is left open, and
//! still found on read (`UnexpectedDocument`). The attribute reference
//! lists what is typed.
//!
//! Two models on one collection (an ordered and an arrival-order view of
//! one history) each have their own part of the validator, and a
//! document passes if it meets one of them: either model's `ensure`, in
//! any order, keeps the other's part (`Plan`'s validator lists it as
//! kept), two services' at the same moment too (each part is registered
//! in the database's `mp_validators` collection first). A model you stop
//! using keeps its part until you `collMod` it away and delete it there.
//!
//! ## Changing an attribute over stored data
//!
//! `Model::plan` reads the stored documents as well as the indexes, and
//! reports what a changed declaration would read wrongly or refuse as a
//! `Conflict::Stored`: how many, the first `_id`s, what the repository
//! does with them and the migration. One `aggregate` per check, most of
//! them a collection scan, so run it before a deploy (`ensure` does not
//! look).
//!
//! | change over stored data | what `plan` finds | what the repository does | migration |
//! | --- | --- | --- | --- |
//! | bucket `size` raised | nothing | works: old buckets read and take late items as before | none needed |
//! | bucket `size` lowered below what buckets hold (twice `size` with `order`) | the buckets over it | `Error::Damaged` naming the bucket, on every read and push that reaches it | restore the old `size`, or `rebucket_all()` under the new declaration |
//! | bucket `order` declared over buckets filled in arrival order | the buckets whose items are not in `order` | pages read items as stored: out of order | `rebucket_all()` under the new declaration |
//! | bucket `items` renamed | every bucket (no array under the new name) | `Error::Damaged` naming the bucket, on every read and push (nothing written) | restore the old name, or `rebucket_all().items_from("<old name>")` under the new declaration |
//! | rank `layout` changed | the other layout's documents | never reads them: ranks count only what the new layout wrote | `rebuild_all()` under the new declaration, then delete them |
//! | rank `precision` changed | histogram entries off the new step | ranks off, writes that reach them refused | `rebuild_all()` under the new declaration |
//! | keyset `sort` or `order` changed | the old `mp_keyset_` index, no longer declared (a note), and the new one to create | pages follow the new order exactly; a token from the old one is `InvalidCursor(Foreign)` | `ensure` creates the new index; drop the old one yourself |
//! | shard key `coarse` granularity changed (or documents stored without the field) | documents whose coarse field is missing or not their timestamp's period | `find` misses them, writes to them are refused, `audit` names them | `fill_coarse()` (cheaper before the collection is sharded) |
//! | shard key fields changed on a collection already sharded | `Conflict::ShardKey`: sharded on another key | `find` by the new key reads every shard, writes `mongos` cannot target are refused | `fill_coarse()` if the new key derives a field, then `reshardCollection` (MongoDB 5.0+) or `refineCollectionShardKey` (4.4+, a key that only adds fields at its end), by an administrator |
//!
//! `Buckets::rebucket_all` finds the keys that have such a bucket and
//! writes each key's buckets again under the new declaration, one
//! transaction a key, while pushes go on (a push to a key being moved
//! waits for it, or conflicts and is retried); `Buckets::rebucket(&key)`
//! moves one key. Several instances may run it at once: a key another
//! one has moved meanwhile is read in its transaction and left as it is,
//! so each key is written once. A key's items are held in memory and
//! written in one transaction, so a key of more than 100,000 items
//! (`max_items`) is moved bucket by bucket instead: each bucket over the
//! limit (or under the old `items` name) split in a transaction of its
//! own between its neighbours, memory holding one bucket. Only a key that
//! must be sorted across buckets (`order` declared over buckets filled in
//! arrival order) cannot be moved so: it is refused before anything is
//! written (`Error::KeyTooLarge`; `rebucket_all` moves the others and
//! names it in its report). Copy such a key to a flat collection (stream
//! it with the old model, `insert_many` it with its key) and
//! `Buckets::adopt_from` it into a new bucket collection (see *Adopting a
//! flat collection into buckets*).
//!
//! ```no_run
//! # use mongo_patterns::prelude::*;
//! // `size` was 1000; buckets of up to 2000 (with `order`) are stored.
//! #[derive(Debug, Clone, Serialize, Deserialize, Model)]
//! #[bucket(size = 200, key = "customer", order = "at")]
//! struct Trade { customer: i64, at: DateTime, qty: i32 }
//!
//! # async fn f(db: Database) -> mongo_patterns::Result<()> {
//! let moved = Trade::buckets(&db)
//!     .rebucket_all()
//!     .on_progress(|p| eprintln!("{} of {} customers moved", p.done, p.of))
//!     .await?;
//! for e in &moved.too_large {
//!     eprintln!("left as it was: {e}"); // Error::KeyTooLarge
//! }
//! # Ok(()) }
//! ```
//!
//! ```no_run
//! # use mongo_patterns::prelude::*;
//! # #[derive(Debug, Clone, Serialize, Deserialize, Model)]
//! # #[rank_histogram(board = "desk", score = "profit", layout = "documents")]
//! # struct Trader { #[serde(rename = "_id")] id: String, desk: String, profit: i64 }
//! use mongo_patterns::ensure::Conflict;
//!
//! # async fn f(db: Database) -> mongo_patterns::Result<()> {
//! let plan = Trader::plan(&db).await?;
//! for c in &plan.conflicts {
//!     if let Conflict::Stored { collection, count, ids, .. } = c {
//!         eprintln!("{collection}: {count} documents to migrate, first {ids:?}");
//!     }
//! }
//! println!("{plan}"); // each conflict says what the repository does, and the migration
//! # Ok(()) }
//! ```
//!
//! # Failure behaviour common to every pattern
//!
//! Each pattern's module docs end with its own *Failure behaviour*,
//! measured by its fault suite (`tests/<pattern>_faults.rs`, plus
//! `tests/token_fuzz.rs`). What holds for all of them:
//!
//! - **Cancellation.** Any call may be dropped at any `.await` (a timeout,
//!   `select!`, a client that went away). Nothing taken out of shared state
//!   is lost: a buffered counter keeps a cut write pending and re-sends it
//!   with the same flush id; a cut rank transaction is killed on the server
//!   at once, so its locks do not outlive the call; a cut bucket `delete`
//!   finishes on its own task. Single-command writes are applied whole or
//!   not at all.
//! - **Unknown outcomes.** A write whose reply was lost (`Unavailable`, a
//!   server killed mid-write) may or may not have been applied. Bucket
//!   writes and buffered counter flushes carry an id that the document
//!   remembers, so a re-send is refused as a repeat (within the bound each
//!   pattern gives); rank transactions are rerun by the driver's
//!   transaction API. Elsewhere the pattern's docs say what a retry can
//!   cost.
//! - **Contention.** Sixteen tasks on one document (one bucket key, one
//!   board, one counter key) finish exactly, without `Contended`; retries
//!   back off with jitter within a 120 s bound.
//! - **Damaged documents.** A document another client wrote that breaks a
//!   pattern's invariant is `Error::Damaged`, one that does not fit the
//!   model `UnexpectedDocument`, a value the pattern cannot use
//!   `UnsupportedValue`: each names the document by its `_id` as BSON, and
//!   nothing is written on top of it. Never a silently wrong answer.
//! - **Hostile input.** Page tokens are bounded before decoding (length,
//!   then nesting depth without recursion) and can be signed; filters from
//!   users can be checked for server-side JavaScript
//!   (`Keyset::untrusted_filter`); amounts, precisions and page sizes out
//!   of range are `InvalidArgument` before anything is sent. No input
//!   reaches a panic.
//! - **Cut inside your transaction.** See *A write cut inside your
//!   transaction* above: the transaction and its locks do not outlive the
//!   call; the transaction is lost: abort it or let `and_run2` retry, never
//!   commit it.
//! - **Elections, lost replies and secondary reads.** See *Failovers*
//!   above: every acknowledged write outside your transaction is one of
//!   the driver's retryable writes, an outcome that stays unknown is
//!   `Error::OutcomeUnknown`, never a silent double. Every read that
//!   decides a write goes to the primary whatever the client's
//!   `readPreference`; your own reads follow it. `tests/deployments.rs`
//!   gives each case with the test server's `failCommand`, as `mongod`
//!   answers it.

#[doc = include_str!("bucket_guide.md")]
pub mod bucket {}
