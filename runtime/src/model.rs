//! The traits `#[derive(Model)]` implements: [`Model`] for every model
//! (where its documents live, what it needs in the deployment), and
//! [`Documents`] for models stored one document per value (every model but
//! a `#[bucket]` one, whose documents are buckets).

use mongodb::{Collection, Database};
use serde::de::DeserializeOwned;

use crate::ensure::{Declared, EnsureAction, FieldType, PlanAction, ValidateExisting, Validation};
use crate::keyset::{Keyset, KeysetSpec};

/// A struct the patterns store in a collection.
///
/// Derive it; the derive checks the attributes against the struct's fields
/// (as serde names them) at compile time.
pub trait Model: Sized {
    /// The collection's name: `#[model(collection = "...")]`, or by default
    /// the struct's name in snake_case (`PageView` is `page_view`).
    const COLLECTION: &'static str;

    /// How [`Documents::keyset`] pages: `#[keyset(...)]`, or `_id`
    /// ascending.
    const KEYSET: KeysetSpec = KeysetSpec::BY_ID;

    /// How the server enforces the patterns' invariants on the model's
    /// collections: `#[model(validate = "moderate" | "strict" | "warn" |
    /// "off")]`, moderate by default. See [`Validation`].
    const VALIDATION: Validation = Validation::Moderate;

    /// The stored fields whose Rust type decides their BSON types, as
    /// serde stores them: the part of the collection's schema the struct
    /// gives (see [`Validation`]). The derive writes it.
    const FIELDS: &'static [FieldType] = &[];

    /// The stored fields whose type (inside `Option`s and sequences)
    /// implements [`Schema`](crate::Schema), with the schema each gives:
    /// a nested struct's fields, an enum's names. The derive writes it.
    fn nested() -> Vec<crate::ensure::Nested> {
        Vec::new()
    }

    /// What the model's attributes need in the deployment: its collection,
    /// the keyset index `{sort keys..., _id}` when `#[keyset(sort = ...)]`
    /// names keys, and what each pattern's repository declares (bucket,
    /// rank histogram and its histogram collection, shard key, counters).
    /// The derive writes it; [`Model::ensure`] and [`Model::plan`] use it.
    fn declared(db: &Database) -> Vec<Declared> {
        let all = Self::KEYSET.declared(db, Self::COLLECTION);
        let all = crate::ensure::with_fields(all, Self::COLLECTION, Self::FIELDS, &Self::nested());
        crate::ensure::for_model::<Self>(all, Self::VALIDATION)
    }

    /// Creates what [`Model::declared`] lists and the deployment lacks:
    /// collections, indexes, and sharding on a sharded cluster. Idempotent;
    /// drops and changes nothing: what conflicts is reported and left
    /// alone. See [`EnsureAction`] for the commands it sends.
    ///
    /// ```no_run
    /// # use mongo_patterns::prelude::*;
    /// # #[derive(Debug, Clone, Serialize, Deserialize, Model)]
    /// # #[bucket(size = 1000, key = "customer")]
    /// # struct Trade { customer: i64, qty: i32 }
    /// # async fn f(db: Database) -> mongo_patterns::Result<()> {
    /// let done = Trade::ensure(&db).await?; // at start-up; idempotent
    /// println!("{done:?}");
    /// # Ok(()) }
    /// ```
    fn ensure(db: &Database) -> EnsureAction<'_> {
        EnsureAction::new(db, Self::declared(db))
    }

    /// A dry run of [`Model::ensure`]: what it would create, and what in
    /// the deployment differs from the declarations. Sends only reads.
    ///
    /// ```no_run
    /// # use mongo_patterns::prelude::*;
    /// # #[derive(Debug, Clone, Serialize, Deserialize, Model)]
    /// # #[bucket(size = 1000, key = "customer")]
    /// # struct Trade { customer: i64, qty: i32 }
    /// # async fn f(db: Database) -> mongo_patterns::Result<()> {
    /// let plan = Trade::plan(&db).await?; // what ensure would do
    /// println!("{plan:?}");
    /// # Ok(()) }
    /// ```
    fn plan(db: &Database) -> PlanAction<'_> {
        PlanAction::new(db, Self::declared(db))
    }

    /// Counts the documents already stored that break the schema
    /// [`Model::ensure`] has the server enforce, and names the first few
    /// by `_id`, per collection: a `listCollections`, and one `aggregate`
    /// (a collection scan) per collection with a schema. Run it before
    /// `ensure` sets a validator on data that exists. See
    /// [`ValidateExisting`].
    ///
    /// ```no_run
    /// # use mongo_patterns::prelude::*;
    /// # #[derive(Debug, Clone, Serialize, Deserialize, Model)]
    /// # #[bucket(size = 1000, key = "customer")]
    /// # struct Trade { customer: i64, qty: i32 }
    /// # async fn f(db: Database) -> mongo_patterns::Result<()> {
    /// for bad in Trade::validate_existing(&db).await? {
    ///     eprintln!("{}: {} documents, first {:?}", bad.collection, bad.count, bad.ids);
    /// }
    /// # Ok(()) }
    /// ```
    fn validate_existing(db: &Database) -> ValidateExisting<'_> {
        ValidateExisting::new(db, Self::declared(db))
    }
}

/// A model stored one document per value: the derive implements it for
/// every model but a `#[bucket]` one. A bucket model's documents are
/// buckets of items, which neither its typed collection nor an `_id`
/// keyset could read; its items are read with
/// [`Buckets::page`](crate::bucket::Buckets::page) and
/// [`Buckets::stream`](crate::bucket::Buckets::stream).
pub trait Documents: Model {
    /// The typed collection.
    fn collection(db: &Database) -> Collection<Self>
    where
        Self: Send + Sync,
    {
        db.collection(Self::COLLECTION)
    }

    /// A keyset query over the collection, in the model's declared order
    /// (see [`crate::keyset`]).
    ///
    /// ```no_run
    /// # use mongo_patterns::prelude::*;
    /// # #[derive(Debug, Clone, Serialize, Deserialize, Model)]
    /// # #[keyset(sort = "at", order = "desc", page_size = 50)]
    /// # struct Visit { at: DateTime, page: String }
    /// # async fn f(db: Database) -> mongo_patterns::Result<()> {
    /// let first = Visit::keyset(&db).page().await?;
    /// if let Some(next) = first.next {
    ///     let _second = Visit::keyset(&db).after(&next).page().await?;
    /// }
    /// # Ok(()) }
    /// ```
    fn keyset(db: &Database) -> Keyset<Self>
    where
        Self: DeserializeOwned + Send + Sync,
    {
        Keyset::new(db, Self::COLLECTION, Self::KEYSET)
    }
}
