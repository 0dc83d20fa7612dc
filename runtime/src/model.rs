//! The trait every `#[derive(Model)]` implements: where the documents live,
//! and how they page by default.

use mongodb::{Collection, Database};
use serde::de::DeserializeOwned;

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
}
