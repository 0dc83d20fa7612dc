//! The two actions: `plan` reads the deployment and compares it with the
//! declarations; `ensure` does the same, then creates what is missing.

use std::collections::HashMap;
use std::future::IntoFuture;

use futures::future::BoxFuture;
use futures::TryStreamExt;
use mongodb::bson::{doc, Bson, Document};
use mongodb::{ClientSession, Database};

use super::compare::{
    compare_index, merge, ours, same_keys, shard_key_index, stored_parts, undeclared_indexes,
    validator, with_own, Parts, Wanted,
};
use super::{
    Check, Conflict, Declared, Ensured, Index, Invalid, Note, Plan, ServerFacts, Unsupported,
    Validator,
};
use crate::action::Options;
use crate::error::Result;

/// Prepares the deployment for a set of declarations: what
/// [`Model::ensure`](crate::Model::ensure) returns. Build one yourself for
/// repositories on collections named at run time, or to prepare several
/// models in one call: `EnsureAction::new(&db, a.declared()).and(b.declared())`.
///
/// Sends `listCollections` (one per 100 collections), one `listIndexes` per
/// existing collection, one `createIndexes` per missing index (the first
/// on a missing collection creates it), `create` per missing collection
/// that needs no index or has a validator (it is created with it), and a
/// `collMod` per existing collection whose validator is missing or differs
/// (see [`Validation`](super::Validation)); before each validator it sets,
/// a `findAndModify` of [`VALIDATOR_REGISTRY`], and after it a `find`
/// there (and a `listCollections` and a `collMod` again if a concurrent
/// `ensure` of another model registered meanwhile); where a shard key or a [`Need`](super::Need) is
/// declared, `hello`; where a need is declared, `buildInfo`; and on a
/// sharded cluster a read of `config.collections`, a `createIndexes` of
/// the shard key's index where no index starts with the key (`mongod`
/// builds it only when sharding an empty collection, and refuses a
/// collection with documents without it), `enableSharding` and
/// `shardCollection`. The write concern applies to each write (by default
/// the `Database`'s, which `run_command` would not send by itself).
///
/// Refuses with [`Error::Unsupported`](crate::Error::Unsupported), before
/// it writes anything, when the server lacks a feature a declaration
/// needs (the first of [`Plan::unsupported`](super::Plan::unsupported)).
///
/// A `createIndexes` reply is read as `mongod` and every `mongos` shape it:
/// counts at the top, or (a `mongos` before 7.1, or a sharded collection)
/// each shard's under `raw`; the index counts as created by this call when
/// any shard built it.
#[must_use = "does nothing unless awaited"]
pub struct EnsureAction<'a> {
    db: &'a Database,
    declared: Vec<Declared>,
    options: Options,
    session: Option<&'a mut ClientSession>,
}

impl<'a> EnsureAction<'a> {
    /// Prepares `db` for `declared`.
    pub fn new(db: &'a Database, declared: Vec<Declared>) -> Self {
        EnsureAction {
            db,
            declared,
            options: Options::default(),
            session: None,
        }
    }

    /// Prepares for `more` as well.
    pub fn and(mut self, more: impl IntoIterator<Item = Declared>) -> Self {
        self.declared.extend(more);
        self
    }

    /// The options, replacing any set before. A read concern is not sent:
    /// the listings take none.
    pub fn with_options(mut self, options: Options) -> Self {
        self.options = Options {
            read_concern: None,
            ..options
        };
        self
    }

    crate::action::setters!(@session 'a);
    crate::action::setters!(@common);
    crate::action::setters!(@write);
}

impl<'a> IntoFuture for EnsureAction<'a> {
    type Output = Result<Ensured>;
    type IntoFuture = BoxFuture<'a, Result<Ensured>>;

    fn into_future(self) -> Self::IntoFuture {
        let span = span("ensure", &self.declared);
        crate::action::boxed_in(
            async move {
                let mut cx = Cx {
                    db: self.db,
                    options: self.options,
                    session: self.session,
                };
                let wanted = merge(self.declared)?;
                let plan = survey(&mut cx, &wanted, false).await?;
                // Before anything is created: a server that cannot run the
                // patterns gets nothing half-prepared.
                if let Some(u) = plan.unsupported.first() {
                    return Err(u.clone().into_error());
                }
                apply(&mut cx, plan).await
            },
            span,
        )
    }
}

/// Compares the deployment with a set of declarations, writing nothing:
/// what [`Model::plan`](crate::Model::plan) returns.
///
/// Sends only reads: `listCollections`, `listIndexes`, where a shard key
/// or a need is declared `hello`, where a need is declared `buildInfo`,
/// (on a sharded cluster) a `find` on `config.collections`, and for each
/// [`Check`] of a collection that exists one `aggregate` (most scan the
/// collection: run `plan` before a deploy, not at every start). A feature
/// the server lacks is reported in
/// [`Plan::unsupported`](super::Plan::unsupported), not as an error.
#[must_use = "does nothing unless awaited"]
pub struct PlanAction<'a> {
    db: &'a Database,
    declared: Vec<Declared>,
    options: Options,
    session: Option<&'a mut ClientSession>,
}

impl<'a> PlanAction<'a> {
    /// Compares `db` with `declared`.
    pub fn new(db: &'a Database, declared: Vec<Declared>) -> Self {
        PlanAction {
            db,
            declared,
            options: Options::default(),
            session: None,
        }
    }

    /// Compares with `more` as well.
    pub fn and(mut self, more: impl IntoIterator<Item = Declared>) -> Self {
        self.declared.extend(more);
        self
    }

    /// Where the reads go (read preference).
    pub fn selection_criteria(
        mut self,
        sc: impl Into<mongodb::options::SelectionCriteria>,
    ) -> Self {
        self.options.selection_criteria = Some(sc.into());
        self
    }

    crate::action::setters!(@session 'a);
    crate::action::setters!(@common);
}

impl<'a> IntoFuture for PlanAction<'a> {
    type Output = Result<Plan>;
    type IntoFuture = BoxFuture<'a, Result<Plan>>;

    fn into_future(self) -> Self::IntoFuture {
        let span = span("plan", &self.declared);
        crate::action::boxed_in(
            async move {
                let mut cx = Cx {
                    db: self.db,
                    options: self.options,
                    session: self.session,
                };
                let wanted = merge(self.declared)?;
                survey(&mut cx, &wanted, true).await
            },
            span,
        )
    }
}

/// Counts, per collection, the stored documents that break the declared
/// schema (the patterns' invariants, see
/// [`Validation`](super::Validation)), and names the first few by `_id`:
/// what [`Model::validate_existing`](crate::Model::validate_existing)
/// returns, a collection with none left out.
///
/// A `listCollections` (one per 100 collections), then one `aggregate`
/// per collection with a schema (`$match` of `$nor` the schema, a
/// collection scan); the validator need not be set. Where it is, the parts
/// other models set on it count too: a document that meets one of them
/// passes, as the server would pass it (see [`Declared::model`](super::Declared::model)).
/// Run it before `ensure` sets a validator, or before raising its
/// level to strict: a document listed here cannot be updated under a
/// strict validator until it is mended.
#[must_use = "does nothing unless awaited"]
pub struct ValidateExisting<'a> {
    db: &'a Database,
    declared: Vec<Declared>,
    options: Options,
    session: Option<&'a mut ClientSession>,
}

impl<'a> ValidateExisting<'a> {
    /// Checks the documents of `db` against `declared`'s schemas.
    pub fn new(db: &'a Database, declared: Vec<Declared>) -> Self {
        ValidateExisting {
            db,
            declared,
            options: Options::default(),
            session: None,
        }
    }

    /// Where the reads go (read preference).
    pub fn selection_criteria(
        mut self,
        sc: impl Into<mongodb::options::SelectionCriteria>,
    ) -> Self {
        self.options.selection_criteria = Some(sc.into());
        self
    }

    crate::action::setters!(@session 'a);
    crate::action::setters!(@common);
}

impl<'a> IntoFuture for ValidateExisting<'a> {
    type Output = Result<Vec<Invalid>>;
    type IntoFuture = BoxFuture<'a, Result<Vec<Invalid>>>;

    fn into_future(self) -> Self::IntoFuture {
        let span = span("validate_existing", &self.declared);
        crate::action::boxed_in(
            async move {
                let mut cx = Cx {
                    db: self.db,
                    options: self.options,
                    session: self.session,
                };
                // The schema as declared, whatever the level: `Off`
                // declares none, and checks nothing.
                let mut found = Vec::new();
                let wanted = merge(self.declared)?;
                let kinds = collection_kinds(&mut cx, &wanted).await?;
                for w in wanted {
                    if w.validator().is_none() {
                        continue;
                    }
                    // Other models' parts of the stored validator count:
                    // their documents pass as the server would pass them.
                    let stored = kinds
                        .get(&w.collection)
                        .and_then(|(_, o)| o.get_document("validator").ok())
                        .filter(|v| ours(v));
                    let Some(validator) = validator(&with_own(stored, &w.parts)) else {
                        continue;
                    };
                    let filter = doc! {"$nor": [validator]};
                    let (count, ids) = matching(&mut cx, &w.collection, &filter).await?;
                    if count > 0 {
                        found.push(Invalid {
                            collection: w.collection,
                            count,
                            ids,
                        });
                    }
                }
                Ok(found)
            },
            span,
        )
    }
}

/// The span of `ensure` or `plan`: its `collection` names the declared
/// collections, comma-separated (joined only for a subscriber that takes
/// the span).
fn span(operation: &'static str, declared: &[Declared]) -> tracing::Span {
    // The fields of `crate::action::span`, `collection` recorded after.
    let span = tracing::debug_span!(
        target: "mongo_patterns",
        "mongo_patterns",
        pattern = "ensure",
        operation,
        collection = tracing::field::Empty,
        retries = tracing::field::Empty,
    );
    if !span.is_disabled() {
        let mut names: Vec<&str> = declared.iter().map(|d| d.collection.as_str()).collect();
        names.dedup();
        span.record("collection", names.join(", "));
    }
    span
}

/// The database, the effective options and the caller's session, for the
/// commands one call sends.
struct Cx<'a> {
    db: &'a Database,
    options: Options,
    session: Option<&'a mut ClientSession>,
}

impl Cx<'_> {
    /// A read that answers with a cursor, all of it.
    async fn read_cursor(&mut self, db: &Database, mut command: Document) -> Result<Vec<Document>> {
        self.options.command_fields(&mut command, None, false)?;
        let mut action = db.run_cursor_command(command);
        if let Some(sc) = &self.options.selection_criteria {
            action = action.selection_criteria(sc.clone());
        }
        if let Some(c) = &self.options.comment {
            action = action.comment(c.clone());
        }
        Ok(match self.session.as_deref_mut() {
            Some(s) => {
                let mut cursor = action.session(&mut *s).await?;
                cursor.stream(s).try_collect().await?
            }
            None => action.await?.try_collect().await?,
        })
    }

    /// A read that answers with a cursor, all of it, on the primary: one
    /// that decides a write.
    async fn read_primary(&mut self, db: &Database, command: Document) -> Result<Vec<Document>> {
        let chosen = self
            .options
            .selection_criteria
            .replace(crate::util::primary());
        let read = self.read_cursor(db, command).await;
        self.options.selection_criteria = chosen;
        read
    }

    /// A read that answers with one document.
    async fn read(&mut self, db: &Database, mut command: Document) -> Result<Document> {
        self.options.command_fields(&mut command, None, false)?;
        let mut action = db.run_command(command);
        if let Some(sc) = &self.options.selection_criteria {
            action = action.selection_criteria(sc.clone());
        }
        Ok(crate::action::run!(action, self.session.as_deref_mut())?)
    }

    /// A write, with the effective write concern; errors in the reply
    /// (`writeConcernError`) are errors.
    async fn write(&mut self, db: &Database, mut command: Document) -> Result<Document> {
        self.options
            .command_fields(&mut command, self.db.write_concern(), true)?;
        let action = db.run_command(command);
        let reply = crate::action::run!(action, self.session.as_deref_mut())?;
        crate::action::command_write_errors(&reply)?;
        Ok(reply)
    }

    async fn list_indexes(&mut self, collection: &str) -> Result<Vec<Document>> {
        let db = self.db;
        match self.read_cursor(db, doc! {"listIndexes": collection}).await {
            Ok(v) => Ok(v),
            // Dropped since it was listed: it holds no index.
            Err(e) if e.is_namespace_not_found() => Ok(Vec::new()),
            Err(e) => Err(e),
        }
    }
}

/// The type (`collection`, `timeseries`, `view`) and the options (its
/// validator among them) of each collection of `wanted` that exists, by
/// its name: `listCollections`, 100 names a time.
async fn collection_kinds(
    cx: &mut Cx<'_>,
    wanted: &[Wanted],
) -> Result<HashMap<String, (String, Document)>> {
    let mut kinds = HashMap::new();
    let names: Vec<&str> = wanted.iter().map(|w| w.collection.as_str()).collect();
    for chunk in names.chunks(100) {
        let listed = cx
            .read_cursor(
                cx.db,
                doc! {"listCollections": 1, "filter": {"name": {"$in": chunk}}},
            )
            .await?;
        for c in listed {
            if let Ok(name) = c.get_str("name") {
                let kind = c.get_str("type").unwrap_or("collection").to_owned();
                let options = c.get_document("options").cloned().unwrap_or_default();
                kinds.insert(name.to_owned(), (kind, options));
            }
        }
    }
    Ok(kinds)
}

/// Reads the deployment and compares it with `wanted`.
async fn survey(cx: &mut Cx<'_>, wanted: &[Wanted], stored: bool) -> Result<Plan> {
    let db = cx.db;
    let kinds = collection_kinds(cx, wanted).await?;
    let asks = wanted.iter().any(|w| !w.needs.is_empty());
    let hello = if asks || wanted.iter().any(|w| w.shard.is_some()) {
        Some(cx.read(db, doc! {"hello": 1}).await?)
    } else {
        None
    };
    let sharded_cluster = hello.as_ref().is_some_and(crate::util::is_mongos);

    let mut plan = Plan::default();
    if let (true, Some(hello)) = (asks, &hello) {
        // A server that refuses `buildInfo` is judged by `hello` alone.
        let build_info = cx.read(db, doc! {"buildInfo": 1}).await.ok();
        let facts = ServerFacts::from_replies(hello, build_info.as_ref());
        check_needs(&mut plan, wanted, &facts);
    }
    for w in wanted {
        let validator = w.validator();
        let existing = match kinds.get(&w.collection).map(|(k, _)| k.as_str()) {
            None => {
                plan.create_collections.push(w.collection.clone());
                if let Some(validator) = validator.clone() {
                    let (level, action) = w.validation.level_and_action();
                    plan.validators.push(Validator {
                        collection: w.collection.clone(),
                        validator,
                        level,
                        action,
                        replaces: None,
                        kept: Vec::new(),
                        own: own_parts(w),
                    });
                }
                Vec::new()
            }
            Some("collection" | "timeseries") => cx.list_indexes(&w.collection).await?,
            Some(other) => {
                plan.conflicts.push(Conflict::NotACollection {
                    collection: w.collection.clone(),
                    kind: other.to_owned(),
                });
                continue;
            }
        };
        for declared in &w.indexes {
            compare_index(&mut plan, declared, &existing);
        }
        undeclared_indexes(&mut plan, w, &existing);
        if let (Some(_), Some((_, options))) = (validator, kinds.get(&w.collection)) {
            compare_validator(&mut plan, w, options);
        }
        if stored && kinds.contains_key(&w.collection) {
            for check in &w.checks {
                if let Some(found) = stored_check(cx, &w.collection, check).await? {
                    plan.conflicts.push(found);
                }
            }
        }
        let Some(shard) = &w.shard else { continue };
        if !sharded_cluster {
            plan.notes.push(Note::ShardingNotApplicable {
                collection: w.collection.clone(),
            });
            continue;
        }
        let ns = format!("{}.{}", db.name(), w.collection);
        let config = db.client().database("config");
        let command = doc! {"find": "collections", "filter": {"_id": &ns}, "limit": 1};
        match sharding(cx.read_cursor(&config, command).await)? {
            Sharding::Unsharded => {
                // Before `shardCollection`, on a collection that may hold
                // documents (see `shard_key_index`).
                if let Some(ix) = shard_key_index(shard, &existing, &plan.create_indexes) {
                    plan.create_indexes.push(ix);
                }
                plan.shard.push(shard.clone());
            }
            Sharding::On(k) if same_keys(&k, &shard.key) => {}
            Sharding::On(found) => plan.conflicts.push(Conflict::ShardKey {
                declared: shard.clone(),
                found,
            }),
            Sharding::Unknown => plan.notes.push(Note::ShardingUnknown {
                collection: w.collection.clone(),
            }),
        }
    }
    Ok(plan)
}

/// Lists the declared validator of an existing collection whose
/// `options` differ from it, or the conflict of a validator of its own.
/// The parts of a validator of ours that other models set (see
/// [`Declared::model`](super::Declared::model)) are kept.
fn compare_validator(plan: &mut Plan, w: &Wanted, options: &Document) {
    let (level, action) = w.validation.level_and_action();
    let found = options.get_document("validator").ok();
    if let Some(found) = found.filter(|f| !ours(f)) {
        plan.conflicts.push(Conflict::Validator {
            collection: w.collection.clone(),
            found: found.clone(),
        });
        return;
    }
    let own = own_parts(w);
    let kept: Vec<String> = found
        .map(stored_parts)
        .unwrap_or_default()
        .into_keys()
        .filter(|k| !own.contains(k))
        .collect();
    let Some(validator) = validator(&with_own(found, &w.parts)) else {
        return;
    };
    // The server's defaults where it shows none.
    let same = found == Some(&validator)
        && options.get_str("validationLevel").unwrap_or("strict") == level
        && options.get_str("validationAction").unwrap_or("error") == action;
    if !same {
        plan.validators.push(Validator {
            collection: w.collection.clone(),
            validator,
            level,
            action,
            replaces: found.cloned(),
            kept,
            own,
        });
    }
}

/// Where `ensure` keeps each model's part of the validators it sets, in
/// the model's database: one document per collection,
/// `{_id: <collection>, parts: {<model>: [<fragments>]}, v: <changes>}`.
///
/// The server has no compare-and-set for a validator: two `ensure`s of
/// two models on one collection, each sending a `collMod` built from what
/// it read, can write over each other's part. So each registers its part
/// here first (one `findAndModify`, which counts the change in `v`),
/// builds the validator from every registered part, sets it, and reads
/// the document again: if another registered since, it sets the
/// validator again from what is registered now. The last `collMod` to
/// land is then checked by its sender, against a registry that holds
/// every part: none is lost. A part stays registered after its model is
/// gone, as it stays in the validator: remove it from both.
pub const VALIDATOR_REGISTRY: &str = "mp_validators";

/// The parts registered for a collection, and the change that left them.
#[derive(Debug)]
struct Registered {
    parts: Parts,
    v: i64,
}

impl Registered {
    fn from_document(d: &Document) -> Registered {
        let mut parts = Parts::new();
        for (name, fragments) in d.get_document("parts").into_iter().flatten() {
            if let Some(all) = fragments.as_array() {
                let all = all.iter().filter_map(|f| f.as_document().cloned());
                parts.insert(name.clone(), all.collect());
            }
        }
        Registered {
            v: d.get_i64("v")
                .or(d.get_i32("v").map(i64::from))
                .unwrap_or(0),
            parts,
        }
    }
}

/// Registers `v`'s parts ([`VALIDATOR_REGISTRY`]); `None` where the user
/// may not write there (then the validator is read back instead, as
/// [`converge_validator`] does).
async fn register(cx: &mut Cx<'_>, v: &Validator) -> Result<Option<Registered>> {
    let mut set = Document::new();
    for (name, fragments) in stored_parts(&v.validator) {
        if v.own.contains(&name) {
            set.insert(format!("parts.{name}"), fragments);
        }
    }
    let command = doc! {
        "findAndModify": VALIDATOR_REGISTRY,
        "query": {"_id": &v.collection},
        "update": {"$set": set, "$inc": {"v": 1_i64}},
        "upsert": true,
        "new": true,
    };
    // Two first registrations of a collection race to insert it: the one
    // that lost updates it.
    for last in [false, true] {
        match cx.write(cx.db, command.clone()).await {
            Ok(reply) => {
                let d = reply.get_document("value").cloned().unwrap_or_default();
                return Ok(Some(Registered::from_document(&d)));
            }
            Err(e) if e.is_unauthorized() => return Ok(None),
            Err(e) if e.is_duplicate_key() && !last => {}
            Err(e) => return Err(e),
        }
    }
    Ok(None)
}

/// Sets the validator `registered` makes, merged with `found`, the one
/// stored (parts set before the registry, or by an `ensure` without the
/// privilege to write it); one of the collection's own is left alone.
async fn set_registered(
    cx: &mut Cx<'_>,
    v: &Validator,
    registered: &Registered,
    found: Option<&Document>,
) -> Result<()> {
    if found.is_some_and(|f| !ours(f)) {
        return Ok(());
    }
    match validator(&with_own(found, &registered.parts)) {
        Some(merged) => coll_mod(cx, v, &merged).await,
        None => Ok(()),
    }
}

/// Sets `validator` on `v`'s collection, at `v`'s level and action.
async fn coll_mod(cx: &mut Cx<'_>, v: &Validator, validator: &Document) -> Result<()> {
    let command = doc! {
        "collMod": &v.collection,
        "validator": validator,
        "validationLevel": v.level,
        "validationAction": v.action,
    };
    cx.write(cx.db, command).await?;
    Ok(())
}

/// After this call's validator landed: reads the registry on the
/// primary, and while another `ensure` registered since, sets the
/// validator again from what is registered (see [`VALIDATOR_REGISTRY`]).
/// Leaves it after [`VALIDATOR_ROUNDS`]: the next `plan` shows it.
async fn settle(cx: &mut Cx<'_>, v: &Validator, mut registered: Registered) -> Result<()> {
    for _ in 0..VALIDATOR_ROUNDS {
        let command =
            doc! {"find": VALIDATOR_REGISTRY, "filter": {"_id": &v.collection}, "limit": 1};
        let now = cx.read_primary(cx.db, command).await?;
        let Some(now) = now.first() else {
            return Ok(());
        };
        let now = Registered::from_document(now);
        if now.v == registered.v {
            return Ok(());
        }
        let found = stored_validator(cx, &v.collection).await?;
        set_registered(cx, v, &now, found.as_ref()).await?;
        registered = now;
    }
    Ok(())
}

/// The validator of `collection` as stored now, read on the primary.
async fn stored_validator(cx: &mut Cx<'_>, collection: &str) -> Result<Option<Document>> {
    let listed = cx
        .read_primary(
            cx.db,
            doc! {"listCollections": 1, "filter": {"name": collection}},
        )
        .await?;
    Ok(listed
        .first()
        .and_then(|c| c.get_document("options").ok())
        .and_then(|o| o.get_document("validator").ok())
        .cloned())
}

/// How many times [`converge_validator`] sets a validator again.
const VALIDATOR_ROUNDS: usize = 5;

/// Reads back the validator `v` set and sets it again, merged with what is
/// stored, while this call's parts are missing or differ: a concurrent
/// `ensure` of another model on the collection that read it before this
/// call wrote replaces it whole (the server has no compare-and-set for a
/// validator; a `create` that lost the race set nothing). One
/// `listCollections` when nobody raced, and a `collMod` more per round.
/// Leaves it after [`VALIDATOR_ROUNDS`]: the next `plan` shows it.
async fn converge_validator(cx: &mut Cx<'_>, v: &Validator) -> Result<()> {
    let own: Parts = stored_parts(&v.validator)
        .into_iter()
        .filter(|(n, _)| v.own.contains(n))
        .collect();
    for _ in 0..VALIDATOR_ROUNDS {
        let listed = cx
            .read_primary(
                cx.db,
                doc! {"listCollections": 1, "filter": {"name": &v.collection}},
            )
            .await?;
        let options = listed
            .first()
            .and_then(|c| c.get_document("options").ok().cloned())
            .unwrap_or_default();
        let found = options.get_document("validator").ok();
        // Another validator of the collection's own now: left alone, as
        // `plan` leaves one.
        if found.is_some_and(|f| !ours(f)) {
            return Ok(());
        }
        let parts = found.map(stored_parts).unwrap_or_default();
        let holds = own.iter().all(|(n, f)| parts.get(n) == Some(f))
            && options.get_str("validationLevel").unwrap_or("strict") == v.level
            && options.get_str("validationAction").unwrap_or("error") == v.action;
        if holds {
            return Ok(());
        }
        let Some(merged) = validator(&with_own(found, &own)) else {
            return Ok(());
        };
        coll_mod(cx, v, &merged).await?;
    }
    Ok(())
}

/// The names of the parts `w` declares (a model with `validate = "off"`
/// declares none).
fn own_parts(w: &Wanted) -> Vec<String> {
    w.parts
        .iter()
        .filter(|(_, fragments)| !fragments.is_empty())
        .map(|(name, _)| name.clone())
        .collect()
}

/// How many `_id`s a [`Conflict::Stored`] names.
const STORED_IDS: i64 = 5;

/// The documents of `collection` that `check` matches: how many, and the
/// first few `_id`s, in one aggregation.
async fn stored_check(
    cx: &mut Cx<'_>,
    collection: &str,
    check: &Check,
) -> Result<Option<Conflict>> {
    let (count, ids) = matching(cx, collection, &check.filter).await?;
    if count == 0 {
        return Ok(None);
    }
    Ok(Some(Conflict::Stored {
        collection: collection.to_owned(),
        found: check.found.clone(),
        count,
        ids,
        then: check.then.clone(),
    }))
}

/// How many documents of `collection` match `filter`, and the first
/// [`STORED_IDS`] `_id`s: one aggregation.
async fn matching(
    cx: &mut Cx<'_>,
    collection: &str,
    filter: &Document,
) -> Result<(u64, Vec<Bson>)> {
    let db = cx.db;
    let command = doc! {
        "aggregate": collection,
        "pipeline": [
            {"$match": filter},
            {"$facet": {
                "n": [{"$count": "n"}],
                "ids": [{"$limit": STORED_IDS}, {"$project": {"_id": 1}}],
            }},
        ],
        "cursor": {},
    };
    let reply = match cx.read_cursor(db, command).await {
        Ok(reply) => reply,
        Err(e) if e.is_namespace_not_found() => return Ok((0, Vec::new())),
        Err(e) => return Err(e),
    };
    let Some(facets) = reply.first() else {
        return Ok((0, Vec::new()));
    };
    let count = facets
        .get_array("n")
        .ok()
        .and_then(|n| n.first())
        .and_then(Bson::as_document)
        .and_then(|n| match n.get("n") {
            Some(Bson::Int32(v)) => u64::try_from(*v).ok(),
            Some(Bson::Int64(v)) => u64::try_from(*v).ok(),
            Some(Bson::Double(v)) if *v >= 0.0 => Some(*v as u64),
            _ => None,
        })
        .unwrap_or(0);
    let ids = facets
        .get_array("ids")
        .map(|ids| {
            ids.iter()
                .filter_map(|d| d.as_document()?.get("_id").cloned())
                .collect()
        })
        .unwrap_or_default();
    Ok((count, ids))
}

/// Lists in `plan` what `wanted` needs and the server lacks: as
/// unsupported, or as a note where the repository does without.
fn check_needs(plan: &mut Plan, wanted: &[Wanted], facts: &ServerFacts) {
    for w in wanted {
        for need in w.needs.iter().filter(|n| facts.lacks(n.feature)) {
            match need.without {
                Some(without) => plan.notes.push(Note::WithoutFeature {
                    collection: w.collection.clone(),
                    feature: need.feature,
                    by: need.by,
                    without,
                }),
                None => plan.unsupported.push(Unsupported {
                    collection: w.collection.clone(),
                    feature: need.feature,
                    by: need.by,
                    server: facts.describe(),
                }),
            }
        }
    }
}

/// Creates what `plan` lists. A concurrent creator may win any step: what
/// it created first is not reported as ours where the reply says so, and
/// an index it created with other keys under the declared name becomes a
/// conflict.
async fn apply(cx: &mut Cx<'_>, plan: Plan) -> Result<Ensured> {
    let db = cx.db;
    let mut done = Ensured {
        conflicts: plan.conflicts,
        notes: plan.notes,
        ..Ensured::default()
    };
    // A collection with an index to create is created by its first
    // `createIndexes`, whose reply says whether it created the collection
    // (`create` succeeds on an existing collection, so it cannot say).
    let mut indexes = plan.create_indexes;
    let mut validators = plan.validators;
    for name in plan.create_collections {
        // Created with its validator, by `create`; a concurrent creator
        // that won set it, or the next `plan` says it did not.
        if let Some(at) = validators.iter().position(|v| v.collection == name) {
            let v = validators.remove(at);
            let registered = register(cx, &v).await?;
            // Every registered part: no validator is stored yet.
            let all = registered.as_ref().and_then(|r| validator(&r.parts));
            let command = doc! {
                "create": &name,
                "validator": all.as_ref().unwrap_or(&v.validator),
                "validationLevel": v.level,
                "validationAction": v.action,
            };
            match cx.write(db, command).await {
                Ok(_) => done.collections_created.push(name),
                // A concurrent creator won, with its own validator or
                // none: ours is merged into it.
                Err(e) if e.is_namespace_exists() => match &registered {
                    Some(r) => {
                        let found = stored_validator(cx, &v.collection).await?;
                        set_registered(cx, &v, r, found.as_ref()).await?
                    }
                    None => converge_validator(cx, &v).await?,
                },
                Err(e) => return Err(e),
            }
            if let Some(r) = registered {
                settle(cx, &v, r).await?;
            }
            done.validators_set.push(v.collection);
            continue;
        }
        match indexes.iter().position(|i| i.collection == name) {
            Some(at) => {
                let index = indexes.remove(at);
                if let Some(reply) = create_index(cx, index, &mut done).await? {
                    if created_collection(&reply) {
                        done.collections_created.push(name);
                    }
                }
            }
            None => match cx.write(db, doc! {"create": &name}).await {
                Ok(_) => done.collections_created.push(name),
                Err(e) if e.is_namespace_exists() => {}
                Err(e) => return Err(e),
            },
        }
    }
    for index in indexes {
        create_index(cx, index, &mut done).await?;
    }
    // Existing collections: the patterns' validator set or replaced, never
    // one of the collection's own (that is a conflict, left alone).
    for v in validators {
        match register(cx, &v).await? {
            Some(registered) => {
                // The validator `plan` read a moment ago: the registry
                // holds every part set since by an `ensure` that reads it.
                set_registered(cx, &v, &registered, v.replaces.as_ref()).await?;
                settle(cx, &v, registered).await?;
            }
            None => {
                coll_mod(cx, &v, &v.validator).await?;
                converge_validator(cx, &v).await?;
            }
        }
        done.validators_set.push(v.collection);
    }
    if !plan.shard.is_empty() {
        let admin = db.client().database("admin");
        match cx.write(&admin, doc! {"enableSharding": db.name()}).await {
            Ok(_) => {}
            Err(e) if e.is_already_initialized() => {}
            Err(e) => return Err(e),
        }
        for shard in plan.shard {
            let ns = format!("{}.{}", db.name(), shard.collection);
            let command = doc! {"shardCollection": ns, "key": &shard.key, "unique": shard.unique};
            match cx.write(&admin, command).await {
                Ok(_) => done.sharded.push(shard.collection),
                Err(e) if e.is_command_not_found() => {
                    done.notes.push(Note::ShardingNotApplicable {
                        collection: shard.collection,
                    });
                }
                Err(e) => return Err(e),
            }
        }
    }
    Ok(done)
}

/// Creates `index`, reporting it in `done` when this call built it, or as a
/// conflict when the server refuses it for an index that stands in its
/// way (created since the survey). The reply, unless it was refused.
async fn create_index(
    cx: &mut Cx<'_>,
    index: Index,
    done: &mut Ensured,
) -> Result<Option<Document>> {
    let db = cx.db;
    let mut spec = doc! {"key": &index.keys, "name": &index.name};
    spec.extend(index.options.clone());
    let command = doc! {"createIndexes": &index.collection, "indexes": [spec]};
    match cx.write(db, command).await {
        Ok(reply) => {
            if created_one(&reply) {
                done.indexes_created.push(index);
            }
            Ok(Some(reply))
        }
        Err(e) if e.is_index_conflict() => {
            let existing = cx.list_indexes(&index.collection).await?;
            let found = existing
                .iter()
                .find(|ix| ix.get_str("name").ok() == Some(index.name.as_str()))
                .or_else(|| {
                    existing.iter().find(|ix| {
                        ix.get_document("key")
                            .is_ok_and(|k| same_keys(k, &index.keys))
                    })
                });
            match found {
                Some(ix) => {
                    done.conflicts.push(Conflict::Index {
                        declared: index,
                        found: ix.clone(),
                    });
                    Ok(None)
                }
                None => Err(e),
            }
        }
        Err(e) => Err(e),
    }
}

/// What `config.collections` says of one collection.
#[derive(Debug, PartialEq)]
enum Sharding {
    /// Not sharded.
    Unsharded,
    /// Sharded on this key.
    On(Document),
    /// The user may not read it.
    Unknown,
}

/// Reads the answer to a `find` by `_id` on `config.collections`: a
/// collection not listed, listed `dropped: true` (before 5.0) or
/// `unsplittable: true` (8.0 lists unsharded collections that way, with
/// key `{_id: 1}`) is unsharded; Unauthorized (an application's user
/// without cluster read rights) leaves it unknown.
fn sharding(read: Result<Vec<Document>>) -> Result<Sharding> {
    let entries = match read {
        Ok(entries) => entries,
        Err(e) if e.is_unauthorized() => return Ok(Sharding::Unknown),
        Err(e) => return Err(e),
    };
    let key = entries
        .into_iter()
        .filter(|c| {
            !c.get_bool("dropped").unwrap_or(false) && !c.get_bool("unsplittable").unwrap_or(false)
        })
        .find_map(|mut c| match c.remove("key") {
            Some(Bson::Document(k)) => Some(k),
            _ => None,
        });
    Ok(key.map_or(Sharding::Unsharded, Sharding::On))
}

/// The replies a `createIndexes` reply holds: its own top-level counts on
/// `mongod` (and `mongos` from 7.1 for an unsharded collection), else each
/// shard's that succeeded under `raw` (a `mongos` before 7.1, or any
/// `mongos` for a sharded collection: `{raw: {"<shard>/<hosts>":
/// {numIndexesBefore, numIndexesAfter, createdCollectionAutomatically, ok},
/// ...}, ok}`); a shard that does not own the collection may answer there
/// with an error, which says nothing about the index.
fn create_replies(reply: &Document) -> Vec<&Document> {
    let counted = reply.contains_key("numIndexesBefore") || reply.contains_key("numIndexesAfter");
    match reply.get_document("raw") {
        Ok(raw) if !counted => raw
            .values()
            .filter_map(|v| v.as_document())
            .filter(|r| number(r.get("ok")).is_some_and(|ok| ok == 1))
            .collect(),
        _ => vec![reply],
    }
}

/// A count in a reply, whatever its integer type.
fn number(v: Option<&Bson>) -> Option<i64> {
    match v? {
        Bson::Int32(n) => Some(i64::from(*n)),
        Bson::Int64(n) => Some(*n),
        Bson::Double(n) => Some(*n as i64),
        _ => None,
    }
}

/// Whether a `createIndexes` reply says it built the index (rather than
/// finding it built: `note: "all indexes already exist"`), on any shard.
fn created_one(reply: &Document) -> bool {
    let built = |r: &Document| match (
        number(r.get("numIndexesBefore")),
        number(r.get("numIndexesAfter")),
    ) {
        (Some(before), Some(after)) => after > before,
        _ => !r.contains_key("note"),
    };
    let replies = create_replies(reply);
    if replies.is_empty() {
        return !reply.contains_key("note");
    }
    replies.into_iter().any(built)
}

/// Whether a `createIndexes` reply says it created the collection, on any
/// shard.
fn created_collection(reply: &Document) -> bool {
    create_replies(reply)
        .iter()
        .any(|r| r.get_bool("createdCollectionAutomatically").ok() == Some(true))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn create_indexes_replies() {
        assert!(created_one(
            &doc! {"numIndexesBefore": 1, "numIndexesAfter": 2, "ok": 1}
        ));
        assert!(!created_one(
            &doc! {"numIndexesBefore": 2, "numIndexesAfter": 2, "note": "all indexes already exist", "ok": 1}
        ));
        assert!(!created_one(
            &doc! {"note": "all indexes already exist", "ok": 1}
        ));
        assert!(created_one(&doc! {"ok": 1}));
        assert!(created_collection(
            &doc! {"createdCollectionAutomatically": true, "numIndexesBefore": 1, "numIndexesAfter": 2, "commitQuorum": "votingMembers", "ok": 1}
        ));
        assert!(!created_collection(
            &doc! {"createdCollectionAutomatically": false, "numIndexesBefore": 1, "numIndexesAfter": 2, "ok": 1}
        ));
    }

    /// `mongos` before 7.1 (and for a sharded collection) answers with each
    /// shard's reply under `raw`, keyed by the shard's connection string,
    /// and no counts of its own.
    #[test]
    fn create_indexes_replies_from_mongos() {
        let one = doc! {
            "raw": {
                "shard01/localhost:27018,localhost:27019,localhost:27020": {
                    "createdCollectionAutomatically": true,
                    "numIndexesBefore": 1, "numIndexesAfter": 2,
                    "commitQuorum": "votingMembers", "ok": 1,
                },
            },
            "ok": 1,
            "$clusterTime": {"clusterTime": mongodb::bson::Timestamp { time: 1, increment: 1 }},
            "operationTime": mongodb::bson::Timestamp { time: 1, increment: 1 },
        };
        assert!(created_one(&one));
        assert!(created_collection(&one));

        let existed = doc! {
            "raw": {
                "shard01/a:27018": {
                    "numIndexesBefore": 2, "numIndexesAfter": 2,
                    "note": "all indexes already exist", "ok": 1,
                },
            },
            "ok": 1,
        };
        assert!(!created_one(&existed));
        assert!(!created_collection(&existed));

        // Two shards, one of which built it; one that does not own the
        // collection answers with an error, which counts for nothing.
        let sharded = doc! {
            "raw": {
                "shard01/a:27018": {
                    "createdCollectionAutomatically": false,
                    "numIndexesBefore": 2, "numIndexesAfter": 2,
                    "note": "all indexes already exist", "ok": 1,
                },
                "shard02/b:27018": {
                    "createdCollectionAutomatically": false,
                    "numIndexesBefore": 1, "numIndexesAfter": 2, "ok": 1_i64,
                },
                "shard03/c:27018": {
                    "ok": 0, "errmsg": "no", "code": 227,
                    "codeName": "CannotImplicitlyCreateCollection",
                },
            },
            "ok": 1.0,
        };
        assert!(created_one(&sharded));
        assert!(!created_collection(&sharded));

        // 7.1 and later put an unsharded collection's counts at the top.
        let promoted = doc! {
            "numIndexesBefore": 2, "numIndexesAfter": 2,
            "note": "all indexes already exist",
            "raw": {"shard01/a:27018": {"numIndexesBefore": 1, "numIndexesAfter": 2, "ok": 1}},
            "ok": 1,
        };
        assert!(!created_one(&promoted));

        // Nothing usable under `raw`: the top-level note decides.
        assert!(!created_one(
            &doc! {"raw": {}, "note": "all indexes already exist", "ok": 1}
        ));
    }

    /// What a bucket with `order` and a documents-layout rank board need,
    /// against replies of MongoDB 8.0, 6.0, 5.0 and 4.4 and a standalone:
    /// what the server lacks is unsupported, what the repository does
    /// without is a note.
    #[test]
    fn needs_against_servers() {
        use crate::ensure::{Feature, Need};
        let declared = || {
            merge(vec![
                Declared::new("ticks").needs([
                    Need::needs(Feature::IsNumber, "bucket push and page"),
                    Need::needs(Feature::SetWindowFields, "bucket remove"),
                    Need::needs(Feature::SortArray, "bucket update (with order)"),
                ]),
                Declared::new("scores").needs([
                    Need::prefers(Feature::BulkWrite, "rank change", "two commands"),
                    Need::prefers(Feature::Transactions, "rank insert", "NoTransactions"),
                ]),
            ])
            .unwrap()
        };
        let check = |hello: Document, version: &str| {
            let mut plan = Plan::default();
            let facts = ServerFacts::from_replies(&hello, Some(&doc! {"version": version}));
            check_needs(&mut plan, &declared(), &facts);
            let lacking: Vec<Feature> = plan.unsupported.iter().map(|u| u.feature).collect();
            let noted: Vec<Feature> = plan
                .notes
                .iter()
                .filter_map(|n| match n {
                    Note::WithoutFeature { feature, .. } => Some(*feature),
                    _ => None,
                })
                .collect();
            (lacking, noted, plan)
        };
        let rs = |wire: i32| doc! {"setName": "rs0", "maxWireVersion": wire};
        let (lacking, noted, _) = check(rs(25), "8.0.4");
        assert!(lacking.is_empty() && noted.is_empty());
        let (lacking, noted, _) = check(rs(17), "6.0.19");
        assert!(lacking.is_empty());
        assert_eq!(noted, [Feature::BulkWrite]);
        let (lacking, _, plan) = check(rs(13), "5.0.30");
        assert_eq!(lacking, [Feature::SortArray]);
        assert!(!plan.is_up_to_date());
        assert!(
            plan.to_string().contains(
                "unsupported: bucket update (with order) on `ticks` needs `$sortArray` (MongoDB 5.2), which MongoDB 5.0.30 (wire version 13) lacks"
            ),
            "{plan}"
        );
        let (lacking, _, _) = check(rs(9), "4.4.29");
        assert_eq!(lacking, [Feature::SetWindowFields, Feature::SortArray]);
        let (lacking, noted, plan) = check(doc! {"maxWireVersion": 25}, "8.0.4");
        assert!(lacking.is_empty());
        assert_eq!(noted, [Feature::Transactions]);
        assert!(plan.is_up_to_date(), "{plan}");
        // `ensure` refuses with the first, named.
        let (_, _, plan) = check(rs(13), "5.0.30");
        let e = plan.unsupported[0].clone().into_error();
        assert!(
            matches!(&e, crate::Error::Unsupported { feature, needs: Some("MongoDB 5.2"), .. } if feature == "$sortArray"),
            "{e:?}"
        );
    }

    /// `config.collections` entries as `mongos` lists them, and the error
    /// an application's user gets instead.
    #[test]
    fn config_collections_entries() {
        let epoch = mongodb::bson::oid::ObjectId::new();
        let sharded = doc! {
            "_id": "db.logs", "lastmodEpoch": epoch,
            "lastmod": mongodb::bson::DateTime::from_millis(0),
            "timestamp": mongodb::bson::Timestamp { time: 1, increment: 1 },
            "uuid": mongodb::bson::Binary { subtype: mongodb::bson::spec::BinarySubtype::Uuid, bytes: vec![0; 16] },
            "key": {"month": 1, "type": 1}, "unique": false, "noBalance": false,
        };
        assert_eq!(
            sharding(Ok(vec![sharded])).unwrap(),
            Sharding::On(doc! {"month": 1, "type": 1})
        );
        assert_eq!(sharding(Ok(vec![])).unwrap(), Sharding::Unsharded);
        // 8.0 tracks unsharded collections too, unsplittable on `_id`.
        let tracked = doc! {
            "_id": "db.logs", "lastmodEpoch": epoch,
            "key": {"_id": 1}, "unique": false, "unsplittable": true,
        };
        assert_eq!(sharding(Ok(vec![tracked])).unwrap(), Sharding::Unsharded);
        // Before 5.0 a dropped collection stays listed.
        let dropped = doc! {"_id": "db.logs", "key": {"a": 1}, "dropped": true};
        assert_eq!(sharding(Ok(vec![dropped])).unwrap(), Sharding::Unsharded);

        use crate::error::code::{command_error, COMMAND_NOT_FOUND, UNAUTHORIZED};
        assert_eq!(
            sharding(Err(command_error(UNAUTHORIZED))).unwrap(),
            Sharding::Unknown
        );
        let other = sharding(Err(command_error(COMMAND_NOT_FOUND))).unwrap_err();
        assert_eq!(other.code(), Some(COMMAND_NOT_FOUND));
    }
}
