//! What a model needs in the deployment (collections, indexes, sharding),
//! declared by each pattern, so that one call prepares it and a dry run
//! says what differs.
//!
//! ```no_run
//! # use mongo_patterns::prelude::*;
//! # #[derive(Serialize, Deserialize, Model)]
//! # #[keyset(sort = "at")]
//! # struct Visit { at: DateTime }
//! # async fn f(db: Database) -> mongo_patterns::Result<()> {
//! let plan = Visit::plan(&db).await?; // reads only
//! println!("{plan}");
//! let done = Visit::ensure(&db).await?; // creates what is missing
//! assert!(done.conflicts.is_empty(), "{done}");
//! # Ok(()) }
//! ```
//!
//! [`Model::ensure`](crate::Model::ensure) creates what is missing and
//! never drops or changes what exists: an index that has the declared name
//! but other keys or options is reported as a [`Conflict`] and left in
//! place (drop it yourself if it should go). An index with the declared
//! keys under another name serves as well, and is reported as a [`Note`].
//! Sharding applies only on a sharded cluster (`hello` answers
//! `msg: "isdbgrid"`); elsewhere it is a [`Note`], and the shard key's
//! index is still created, since it serves the same queries there.
//!
//! Both actions take `.session()`: the commands then run in that session.
//! A transaction refuses `listCollections` and `listIndexes`, so run them
//! outside one.

use std::collections::HashMap;
use std::fmt;
use std::future::IntoFuture;

use futures::future::BoxFuture;
use futures::TryStreamExt;
use mongodb::bson::{doc, Bson, Document};
use mongodb::{ClientSession, Database, IndexModel};

use crate::action::Options;
use crate::error::code::{
    ALREADY_INITIALIZED, INDEX_KEY_SPECS_CONFLICT, INDEX_OPTIONS_CONFLICT, NAMESPACE_EXISTS,
    NAMESPACE_NOT_FOUND,
};
use crate::error::{code, Result};
use crate::keyset::{Keyset, KeysetSpec};

/// What one pattern needs in one collection.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Declared {
    /// The collection's name.
    pub collection: String,
    /// Indexes it needs, each with its name set.
    pub indexes: Vec<IndexModel>,
    /// `shardCollection`'s `key` and whether it is unique, where the
    /// pattern shards the collection.
    pub shard_key: Option<(Document, bool)>,
}

impl Declared {
    /// `collection`, with nothing in it yet.
    pub fn new(collection: impl Into<String>) -> Self {
        Declared {
            collection: collection.into(),
            indexes: Vec::new(),
            shard_key: None,
        }
    }

    /// Adds an index on `keys` named `name`.
    pub fn index(mut self, keys: Document, name: impl Into<String>) -> Self {
        let options = mongodb::options::IndexOptions::builder()
            .name(name.into())
            .build();
        self.indexes
            .push(IndexModel::builder().keys(keys).options(options).build());
        self
    }

    /// Shards the collection on `key`.
    pub fn sharded(mut self, key: Document, unique: bool) -> Self {
        self.shard_key = Some((key, unique));
        self
    }
}

/// What a model's keyset paging needs: its collection, and the index
/// `{sort keys..., _id}` when it sorts by more than `_id`.
pub fn keyset_declared(db: &Database, collection: &str, spec: KeysetSpec) -> Vec<Declared> {
    Keyset::<Document>::new(db, collection, spec).declared()
}

/// An index, by collection, name and keys.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Index {
    /// The collection it is on.
    pub collection: String,
    /// Its name.
    pub name: String,
    /// Its keys, as `createIndexes` takes them.
    pub keys: Document,
}

/// A collection to shard.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Shard {
    /// The collection.
    pub collection: String,
    /// `shardCollection`'s `key`.
    pub key: Document,
    /// Whether the key is unique.
    pub unique: bool,
}

/// Something in the deployment that stands where a declaration wants
/// something else. Left alone: neither `plan` nor `ensure` changes it.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Conflict {
    /// An index has the declared name, but other keys, or options that
    /// keep it from serving every query on its keys (`partialFilterExpression`,
    /// `sparse`, `hidden`, a collation). Drop it to let `ensure` create the
    /// declared one.
    Index {
        /// What was declared.
        declared: Index,
        /// The index as `listIndexes` shows it.
        found: Document,
    },
    /// The name belongs to something that is not a collection (a view):
    /// nothing is created in it.
    NotACollection {
        /// The name.
        collection: String,
        /// What `listCollections` says it is.
        kind: String,
    },
    /// The collection is sharded on another key.
    ShardKey {
        /// What was declared.
        declared: Shard,
        /// The key it is sharded on.
        found: Document,
    },
}

/// Something worth knowing that needs no action.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Note {
    /// An index on the declared keys exists under another name: it serves,
    /// so none is created.
    IndexUnderOtherName {
        /// What was declared.
        declared: Index,
        /// The name of the index that serves instead.
        found: String,
    },
    /// The collection is declared sharded, but the deployment does not shard
    /// (a replica set or a standalone): sharding does not apply.
    ShardingNotApplicable {
        /// The collection.
        collection: String,
    },
}

/// What [`Model::plan`](crate::Model::plan) found: what `ensure` would
/// create, and what differs from the declarations.
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct Plan {
    /// Collections that do not exist.
    pub create_collections: Vec<String>,
    /// Indexes that do not exist, under their name or any other.
    pub create_indexes: Vec<Index>,
    /// Collections a sharded cluster has not sharded yet.
    pub shard: Vec<Shard>,
    /// What stands in the way; `ensure` leaves it alone.
    pub conflicts: Vec<Conflict>,
    /// What needs no action.
    pub notes: Vec<Note>,
}

impl Plan {
    /// Nothing to create, nothing to shard, no conflict: the deployment
    /// holds what the declarations need.
    pub fn is_up_to_date(&self) -> bool {
        self.create_collections.is_empty()
            && self.create_indexes.is_empty()
            && self.shard.is_empty()
            && self.conflicts.is_empty()
    }
}

/// What [`Model::ensure`](crate::Model::ensure) did. Lists only what this
/// call created: what existed, or what a concurrent call created first, is
/// not in it, as far as the server's replies tell: for two calls racing on
/// the same deployment, the server may let both claim an index built at
/// the same moment, or a collection that needs no index (`create` succeeds
/// on an existing collection). The deployment ends up right either way.
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct Ensured {
    /// Collections it created.
    pub collections_created: Vec<String>,
    /// Indexes it created.
    pub indexes_created: Vec<Index>,
    /// Collections it sharded.
    pub sharded: Vec<String>,
    /// What it left alone because it stands where a declaration wants
    /// something else.
    pub conflicts: Vec<Conflict>,
    /// What needed no action.
    pub notes: Vec<Note>,
}

impl Ensured {
    /// It created and sharded nothing (the deployment was prepared already,
    /// or conflicts stood in the way: see [`Ensured::conflicts`]).
    pub fn created_nothing(&self) -> bool {
        self.collections_created.is_empty()
            && self.indexes_created.is_empty()
            && self.sharded.is_empty()
    }
}

/// Prepares the deployment for a set of declarations: what
/// [`Model::ensure`](crate::Model::ensure) returns. Build one yourself for
/// repositories on collections named at run time, or to prepare several
/// models in one call: `EnsureAction::new(&db, a.declared()).and(b.declared())`.
///
/// Sends `listCollections` (one per 100 collections), one `listIndexes` per
/// existing collection, one `createIndexes` per missing index (the first
/// on a missing collection creates it), `create` per missing collection
/// that needs no index; where a shard key is declared, `hello`, and on a
/// sharded cluster a read of `config.collections`, `enableSharding` and
/// `shardCollection`. The write concern applies to each write (by default
/// the `Database`'s, which `run_command` would not send by itself).
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
        Box::pin(async move {
            let mut cx = Cx {
                db: self.db,
                options: self.options,
                session: self.session,
            };
            let wanted = merge(self.declared);
            let plan = survey(&mut cx, &wanted).await?;
            apply(&mut cx, plan).await
        })
    }
}

/// Compares the deployment with a set of declarations, writing nothing:
/// what [`Model::plan`](crate::Model::plan) returns.
///
/// Sends only reads: `listCollections`, `listIndexes`, and where a shard
/// key is declared `hello` and (on a sharded cluster) a `find` on
/// `config.collections`.
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
        Box::pin(async move {
            let mut cx = Cx {
                db: self.db,
                options: self.options,
                session: self.session,
            };
            let wanted = merge(self.declared);
            survey(&mut cx, &wanted).await
        })
    }
}

/// One collection's declarations, merged.
struct Wanted {
    collection: String,
    indexes: Vec<Index>,
    shard: Option<Shard>,
}

/// Declarations by collection, in the order first declared; an index
/// declared twice (by name or by keys) is kept once, the first shard key
/// wins.
fn merge(declared: Vec<Declared>) -> Vec<Wanted> {
    let mut out: Vec<Wanted> = Vec::new();
    for d in declared {
        let at = match out.iter().position(|w| w.collection == d.collection) {
            Some(i) => i,
            None => {
                out.push(Wanted {
                    collection: d.collection.clone(),
                    indexes: Vec::new(),
                    shard: None,
                });
                out.len() - 1
            }
        };
        let w = &mut out[at];
        for model in d.indexes {
            let name = model
                .options
                .as_ref()
                .and_then(|o| o.name.clone())
                .unwrap_or_else(|| default_name(&model.keys));
            let dup = w
                .indexes
                .iter()
                .any(|i| i.name == name || same_keys(&i.keys, &model.keys));
            if !dup {
                let index = Index {
                    collection: d.collection.clone(),
                    name,
                    keys: model.keys,
                };
                w.indexes.push(index);
            }
        }
        if w.shard.is_none() {
            w.shard = d.shard_key.map(|(key, unique)| Shard {
                collection: d.collection.clone(),
                key,
                unique,
            });
        }
    }
    out
}

/// The name the server gives an unnamed index: `a_1_b_-1`.
fn default_name(keys: &Document) -> String {
    let parts: Vec<String> = keys
        .iter()
        .map(|(k, v)| match v {
            Bson::String(s) => format!("{k}_{s}"),
            other => format!("{k}_{}", direction(other).unwrap_or(1)),
        })
        .collect();
    parts.join("_")
}

/// `1` or `-1` for a numeric key, as the server reads it.
fn direction(v: &Bson) -> Option<i32> {
    let n = match v {
        Bson::Int32(n) => f64::from(*n),
        Bson::Int64(n) => *n as f64,
        Bson::Double(n) => *n,
        _ => return None,
    };
    Some(if n < 0.0 { -1 } else { 1 })
}

/// The same keys in the same order and directions (`1`, `1.0` and `1i64`
/// are one direction; `"hashed"` is compared as a string).
fn same_keys(a: &Document, b: &Document) -> bool {
    a.len() == b.len()
        && a.iter().zip(b.iter()).all(|((ka, va), (kb, vb))| {
            ka == kb
                && match (va, vb) {
                    (Bson::String(x), Bson::String(y)) => x == y,
                    (x, y) => direction(x).is_some() && direction(x) == direction(y),
                }
        })
}

/// Whether an existing index (a `listIndexes` entry) serves every query
/// an index on `keys` would: the same keys, and no option that narrows it.
fn serves(found: &Document, keys: &Document) -> bool {
    let Ok(found_keys) = found.get_document("key") else {
        return false;
    };
    let narrowed = found.contains_key("partialFilterExpression")
        || found.get_bool("sparse").unwrap_or(false)
        || found.get_bool("hidden").unwrap_or(false)
        || found
            .get_document("collation")
            .is_ok_and(|c| c.get_str("locale").unwrap_or("simple") != "simple");
    !narrowed && same_keys(found_keys, keys)
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
            Err(e) if e.code() == Some(NAMESPACE_NOT_FOUND) => Ok(Vec::new()),
            Err(e) => Err(e),
        }
    }
}

/// Reads the deployment and compares it with `wanted`.
async fn survey(cx: &mut Cx<'_>, wanted: &[Wanted]) -> Result<Plan> {
    let db = cx.db;
    let mut kinds: HashMap<String, String> = HashMap::new();
    let names: Vec<&str> = wanted.iter().map(|w| w.collection.as_str()).collect();
    for chunk in names.chunks(100) {
        let listed = cx
            .read_cursor(
                db,
                doc! {"listCollections": 1, "filter": {"name": {"$in": chunk}}},
            )
            .await?;
        for c in listed {
            if let Ok(name) = c.get_str("name") {
                let kind = c.get_str("type").unwrap_or("collection").to_owned();
                kinds.insert(name.to_owned(), kind);
            }
        }
    }
    let sharded_cluster = if wanted.iter().any(|w| w.shard.is_some()) {
        let hello = cx.read(db, doc! {"hello": 1}).await?;
        hello.get_str("msg").ok() == Some("isdbgrid")
    } else {
        false
    };

    let mut plan = Plan::default();
    for w in wanted {
        let existing = match kinds.get(&w.collection).map(String::as_str) {
            None => {
                plan.create_collections.push(w.collection.clone());
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
        let Some(shard) = &w.shard else { continue };
        if !sharded_cluster {
            plan.notes.push(Note::ShardingNotApplicable {
                collection: w.collection.clone(),
            });
            continue;
        }
        let ns = format!("{}.{}", db.name(), w.collection);
        let config = db.client().database("config");
        let found = cx
            .read_cursor(
                &config,
                doc! {"find": "collections", "filter": {"_id": &ns}, "limit": 1},
            )
            .await?;
        let key = found
            .iter()
            .find(|c| !c.get_bool("dropped").unwrap_or(false))
            .and_then(|c| c.get_document("key").ok());
        match key {
            None => plan.shard.push(shard.clone()),
            Some(k) if same_keys(k, &shard.key) => {}
            Some(k) => plan.conflicts.push(Conflict::ShardKey {
                declared: shard.clone(),
                found: k.clone(),
            }),
        }
    }
    Ok(plan)
}

fn compare_index(plan: &mut Plan, declared: &Index, existing: &[Document]) {
    let by_name = existing
        .iter()
        .find(|ix| ix.get_str("name").ok() == Some(declared.name.as_str()));
    match by_name {
        Some(ix) if serves(ix, &declared.keys) => {}
        Some(ix) => plan.conflicts.push(Conflict::Index {
            declared: declared.clone(),
            found: ix.clone(),
        }),
        None => match existing.iter().find(|ix| serves(ix, &declared.keys)) {
            Some(ix) => plan.notes.push(Note::IndexUnderOtherName {
                declared: declared.clone(),
                found: ix.get_str("name").unwrap_or_default().to_owned(),
            }),
            None => plan.create_indexes.push(declared.clone()),
        },
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
    for name in plan.create_collections {
        match indexes.iter().position(|i| i.collection == name) {
            Some(at) => {
                let index = indexes.remove(at);
                if let Some(reply) = create_index(cx, index, &mut done).await? {
                    if reply.get_bool("createdCollectionAutomatically").ok() == Some(true) {
                        done.collections_created.push(name);
                    }
                }
            }
            None => match cx.write(db, doc! {"create": &name}).await {
                Ok(_) => done.collections_created.push(name),
                Err(e) if e.code() == Some(NAMESPACE_EXISTS) => {}
                Err(e) => return Err(e),
            },
        }
    }
    for index in indexes {
        create_index(cx, index, &mut done).await?;
    }
    if !plan.shard.is_empty() {
        let admin = db.client().database("admin");
        match cx.write(&admin, doc! {"enableSharding": db.name()}).await {
            Ok(_) => {}
            Err(e) if e.code() == Some(ALREADY_INITIALIZED) => {}
            Err(e) => return Err(e),
        }
        for shard in plan.shard {
            let ns = format!("{}.{}", db.name(), shard.collection);
            let command = doc! {"shardCollection": ns, "key": &shard.key, "unique": shard.unique};
            match cx.write(&admin, command).await {
                Ok(_) => done.sharded.push(shard.collection),
                Err(e) if e.code() == Some(code::COMMAND_NOT_FOUND) => {
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
    let spec = doc! {"key": &index.keys, "name": &index.name};
    let command = doc! {"createIndexes": &index.collection, "indexes": [spec]};
    match cx.write(db, command).await {
        Ok(reply) => {
            if created_one(&reply) {
                done.indexes_created.push(index);
            }
            Ok(Some(reply))
        }
        Err(e)
            if matches!(
                e.code(),
                Some(INDEX_OPTIONS_CONFLICT | INDEX_KEY_SPECS_CONFLICT)
            ) =>
        {
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

/// Whether a `createIndexes` reply says it built the index (rather than
/// finding it built: `note: "all indexes already exist"`).
fn created_one(reply: &Document) -> bool {
    let count = |k: &str| match reply.get(k) {
        Some(Bson::Int32(n)) => Some(i64::from(*n)),
        Some(Bson::Int64(n)) => Some(*n),
        _ => None,
    };
    match (count("numIndexesBefore"), count("numIndexesAfter")) {
        (Some(before), Some(after)) => after > before,
        _ => !reply.contains_key("note"),
    }
}

impl fmt::Display for Index {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "index `{}` {} on `{}`",
            self.name, self.keys, self.collection
        )
    }
}

impl fmt::Display for Conflict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Conflict::Index { declared, found } => {
                write!(
                    f,
                    "{declared} is declared, but the index of that name is {found}"
                )
            }
            Conflict::NotACollection { collection, kind } => {
                write!(f, "`{collection}` is a {kind}, not a collection")
            }
            Conflict::ShardKey { declared, found } => write!(
                f,
                "`{}` should be sharded on {}, and is sharded on {found}",
                declared.collection, declared.key
            ),
        }
    }
}

impl fmt::Display for Note {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Note::IndexUnderOtherName { declared, found } => {
                write!(
                    f,
                    "{declared} is served by index `{found}` on the same keys"
                )
            }
            Note::ShardingNotApplicable { collection } => write!(
                f,
                "`{collection}` would be sharded, but the deployment does not shard"
            ),
        }
    }
}

/// One line per item, each under a heading: `create`, `shard`,
/// `conflict`, `note`.
fn lines(f: &mut fmt::Formatter<'_>, head: &str, items: &[impl fmt::Display]) -> fmt::Result {
    for i in items {
        writeln!(f, "{head}: {i}")?;
    }
    Ok(())
}

struct Named<'a>(&'a str, &'a str);

impl fmt::Display for Named<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} `{}`", self.0, self.1)
    }
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_up_to_date() && self.notes.is_empty() {
            return writeln!(f, "up to date");
        }
        let colls: Vec<Named> = self
            .create_collections
            .iter()
            .map(|c| Named("collection", c))
            .collect();
        lines(f, "create", &colls)?;
        lines(f, "create", &self.create_indexes)?;
        let shards: Vec<Named> = self
            .shard
            .iter()
            .map(|s| Named("collection", &s.collection))
            .collect();
        lines(f, "shard", &shards)?;
        lines(f, "conflict", &self.conflicts)?;
        lines(f, "note", &self.notes)
    }
}

impl fmt::Display for Ensured {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.created_nothing() && self.conflicts.is_empty() && self.notes.is_empty() {
            return writeln!(f, "nothing to do");
        }
        let colls: Vec<Named> = self
            .collections_created
            .iter()
            .map(|c| Named("collection", c))
            .collect();
        lines(f, "created", &colls)?;
        lines(f, "created", &self.indexes_created)?;
        let shards: Vec<Named> = self
            .sharded
            .iter()
            .map(|c| Named("collection", c))
            .collect();
        lines(f, "sharded", &shards)?;
        lines(f, "left alone", &self.conflicts)?;
        lines(f, "note", &self.notes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_compare_by_direction() {
        assert!(same_keys(
            &doc! {"a": 1, "b": -1},
            &doc! {"a": 1.0, "b": -1_i64}
        ));
        assert!(!same_keys(&doc! {"a": 1, "b": -1}, &doc! {"a": 1, "b": 1}));
        assert!(!same_keys(&doc! {"a": 1, "b": 1}, &doc! {"b": 1, "a": 1}));
        assert!(!same_keys(&doc! {"a": 1}, &doc! {"a": 1, "b": 1}));
        assert!(same_keys(&doc! {"a": "hashed"}, &doc! {"a": "hashed"}));
        assert!(!same_keys(&doc! {"a": "hashed"}, &doc! {"a": 1}));
    }

    #[test]
    fn narrowed_indexes_do_not_serve() {
        let keys = doc! {"a": 1};
        assert!(serves(&doc! {"name": "x", "key": {"a": 1}}, &keys));
        assert!(serves(
            &doc! {"name": "x", "key": {"a": 1}, "unique": true, "collation": {"locale": "simple"}},
            &keys
        ));
        for narrowing in [
            doc! {"partialFilterExpression": {"a": {"$gt": 1}}},
            doc! {"sparse": true},
            doc! {"hidden": true},
            doc! {"collation": {"locale": "fr"}},
        ] {
            let mut ix = doc! {"name": "x", "key": {"a": 1}};
            ix.extend(narrowing.clone());
            assert!(!serves(&ix, &keys), "{narrowing}");
        }
    }

    #[test]
    fn declarations_merge_by_collection() {
        let merged = merge(vec![
            Declared::new("a"),
            Declared::new("a").index(doc! {"k": 1, "start": 1}, "mp_k"),
            Declared::new("b"),
            // The same index again, by name and by keys: kept once.
            Declared::new("a").index(doc! {"k": 1, "start": 1}, "mp_k"),
            Declared::new("a").index(doc! {"k": 1.0, "start": 1.0}, "other"),
            Declared::new("a")
                .index(doc! {"s": 1}, "mp_s")
                .sharded(doc! {"s": 1}, false),
        ]);
        let names: Vec<(&str, Vec<&str>, bool)> = merged
            .iter()
            .map(|w| {
                (
                    w.collection.as_str(),
                    w.indexes.iter().map(|i| i.name.as_str()).collect(),
                    w.shard.is_some(),
                )
            })
            .collect();
        assert_eq!(
            names,
            [("a", vec!["mp_k", "mp_s"], true), ("b", vec![], false)]
        );
    }

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
        assert_eq!(
            default_name(&doc! {"a": 1, "b": -1.0, "c": "hashed"}),
            "a_1_b_-1_c_hashed"
        );
    }
}
