//! The two actions: `plan` reads the deployment and compares it with the
//! declarations; `ensure` does the same, then creates what is missing.

use std::collections::HashMap;
use std::future::IntoFuture;

use futures::future::BoxFuture;
use futures::TryStreamExt;
use mongodb::bson::{doc, Bson, Document};
use mongodb::{ClientSession, Database};

use super::compare::{compare_index, merge, same_keys, Wanted};
use super::{Conflict, Declared, Ensured, Index, Note, Plan};
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
            let wanted = merge(self.declared)?;
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
            let wanted = merge(self.declared)?;
            survey(&mut cx, &wanted).await
        })
    }
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
            Err(e) if e.is_namespace_not_found() => Ok(Vec::new()),
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
                Err(e) if e.is_namespace_exists() => {}
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
    }
}
