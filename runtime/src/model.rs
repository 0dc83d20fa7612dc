//! The trait every `#[derive(Model)]` implements: where the documents live,
//! and how they page by default.

use mongodb::{Collection, Database};
use serde::de::DeserializeOwned;

use crate::ensure::{Declared, EnsureAction, PlanAction};
use crate::keyset::{Keyset, KeysetSpec};

/// A struct stored one document per value in a collection.
///
/// Derive it; the derive checks the attributes against the struct's fields
/// (as serde names them) at compile time.
pub trait Model: Sized {
    /// The collection's name: `#[model(collection = "...")]`, or by default
    /// the struct's name in snake_case (`PageView` is `page_view`).
    const COLLECTION: &'static str;

    /// How [`Model::keyset`] pages: `#[keyset(...)]`, or `_id` ascending.
    const KEYSET: KeysetSpec = KeysetSpec::BY_ID;

    /// The typed collection.
    fn collection(db: &Database) -> Collection<Self>
    where
        Self: Send + Sync,
    {
        db.collection(Self::COLLECTION)
    }

    /// A keyset query over the collection, in the model's declared order.
    fn keyset(db: &Database) -> Keyset<Self>
    where
        Self: DeserializeOwned + Send + Sync,
    {
        Keyset::new(db, Self::COLLECTION, Self::KEYSET)
    }

    /// What the model's attributes need in the deployment: its collection,
    /// the keyset index `{sort keys..., _id}` when `#[keyset(sort = ...)]`
    /// names keys, and what each pattern's repository declares (bucket,
    /// rank histogram and its histogram collection, shard key, counters).
    /// The derive writes it; [`Model::ensure`] and [`Model::plan`] use it.
    fn declared(db: &Database) -> Vec<Declared> {
        Self::KEYSET.declared(db, Self::COLLECTION)
    }

    /// Creates what [`Model::declared`] lists and the deployment lacks:
    /// collections, indexes, and sharding on a sharded cluster. Idempotent;
    /// drops and changes nothing: what conflicts is reported and left
    /// alone. See [`EnsureAction`] for the commands it sends.
    fn ensure(db: &Database) -> EnsureAction<'_> {
        EnsureAction::new(db, Self::declared(db))
    }

    /// A dry run of [`Model::ensure`]: what it would create, and what in
    /// the deployment differs from the declarations. Sends only reads.
    fn plan(db: &Database) -> PlanAction<'_> {
        PlanAction::new(db, Self::declared(db))
    }
}
