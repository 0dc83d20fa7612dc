//! One counter per process for each (database, collection, declaration):
//! what `M::<field>_counter(&db)` and [`Counter::new`] hand out.
//!
//! A buffered counter's exactness and its write rate rest on one buffer
//! per process: a handle made per request would hold its own increments
//! (lost if it is dropped outside a runtime), write a key once per N of
//! *its* increments, and crowd the document's list of recent flushes
//! (each handle's flush id is remembered there, 16 at most). So the call
//! an application makes everywhere gives the same handle each time, as
//! long as one lives: clones of one shared state. Handles made with
//! [`Counter::with_options`], [`Counter::with_collection`] or
//! [`Counter::seeded`] are their own, as those say.
//!
//! The driver gives no way to tell two clients apart, so a counter is
//! named by the database's name and the settings it writes and reads with
//! (the client's and the database's concerns and read preference), the
//! collection and the declaration: two clients in one process whose
//! databases have the same name and settings share the counter, which
//! writes through the database it was first made with. A process that
//! talks to two deployments with databases of the same name gives one of
//! them handles of their own ([`Counter::with_options`]).
//!
//! [`Counter::new`]: super::Counter::new
//! [`Counter::with_options`]: super::Counter::with_options
//! [`Counter::with_collection`]: super::Counter::with_collection
//! [`Counter::seeded`]: super::Counter::seeded

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, PoisonError, Weak};

use mongodb::Database;

use super::{CounterSpec, Inner};

/// The live counters of this process, by [`key`].
fn registry() -> &'static Mutex<HashMap<String, Weak<Inner>>> {
    static REGISTRY: OnceLock<Mutex<HashMap<String, Weak<Inner>>>> = OnceLock::new();
    REGISTRY.get_or_init(Default::default)
}

/// What names one counter: the database and the settings it writes and
/// reads with, the collection and the declaration.
fn key(db: &Database, collection: &str, spec: &CounterSpec) -> String {
    let c = db.client();
    format!(
        "{}|{:?}|{:?}|{:?}|{:?}|{:?}|{:?}|{collection}|{spec:?}",
        db.name(),
        c.write_concern(),
        c.read_concern(),
        c.selection_criteria(),
        db.write_concern(),
        db.read_concern(),
        db.selection_criteria(),
    )
}

/// The live counter for `(db, collection, spec)`, or the one `make`
/// builds, kept (weakly: it ends with its last handle) for the next call.
pub(super) fn shared(
    db: &Database,
    collection: &str,
    spec: &CounterSpec,
    make: impl FnOnce() -> Inner,
) -> (Arc<Inner>, bool) {
    let key = key(db, collection, spec);
    let mut map = registry().lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(live) = map.get(&key).and_then(Weak::upgrade) {
        return (live, false);
    }
    map.retain(|_, w| w.strong_count() > 0);
    let inner = Arc::new(make());
    map.insert(key, Arc::downgrade(&inner));
    (inner, true)
}
