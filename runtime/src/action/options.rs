//! The options every operation takes ([`Options`]), an action's own
//! ([`Given`]) and what a call runs with ([`Effective`]), and how they fill
//! in the driver's options structs.

use std::time::Duration;

use mongodb::bson::{Bson, Document};
use mongodb::options::{ReadConcern, SelectionCriteria, WriteConcern};

use crate::error::Result;

/// Options any operation may take. Set per operation with the action's
/// setters, or on a repository as its defaults.
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct Options {
    /// Write concern of every write the operation sends.
    pub write_concern: Option<WriteConcern>,
    /// Read concern of every read the operation sends.
    pub read_concern: Option<ReadConcern>,
    /// Where reads go (read preference).
    pub selection_criteria: Option<SelectionCriteria>,
    /// A comment attached to every command, for the profiler and logs.
    pub comment: Option<Bson>,
    /// The server-side time bound of each command (`maxTimeMS`).
    pub max_time: Option<Duration>,
}

/// An action's own [`Options`], boxed by its first setter: an action
/// given none (the hot path of a counter) carries one null pointer, and
/// building and dropping it costs nothing.
#[derive(Default)]
pub(crate) struct Given(Option<Box<Options>>);

/// What [`Given`] reads when no setter ran.
static NONE: Options = Options {
    write_concern: None,
    read_concern: None,
    selection_criteria: None,
    comment: None,
    max_time: None,
};

impl std::ops::Deref for Given {
    type Target = Options;

    #[inline]
    fn deref(&self) -> &Options {
        self.0.as_deref().unwrap_or(&NONE)
    }
}

impl std::ops::DerefMut for Given {
    fn deref_mut(&mut self) -> &mut Options {
        self.0.get_or_insert_with(Box::default)
    }
}

impl From<Options> for Given {
    fn from(o: Options) -> Given {
        Given((!o.is_empty()).then(|| Box::new(o)))
    }
}

impl Given {
    /// These options over a repository's `defaults`: the defaults
    /// themselves, borrowed, when no setter ran.
    pub(crate) fn over(self, defaults: &Options) -> Effective<'_> {
        match self.0 {
            None => Effective::Defaults(defaults),
            Some(own) => Effective::Merged(Box::new(own.or(defaults))),
        }
    }
}

/// The options an operation runs with, one word wide: the repository's
/// defaults, borrowed, when the call set none (the hot path copies
/// nothing), and otherwise the call's own over them, boxed.
///
/// An operation's future holds its options across every `.await`, and
/// each future is one allocation: a future that stays under a kilobyte is
/// served from the allocator's small-chunk lists, while a larger one
/// first makes glibc's malloc consolidate the small chunks the previous
/// operation freed, which then cost the next allocations more (about a
/// sixth of a rank `change`, measured in instructions).
pub(crate) enum Effective<'a> {
    Defaults(&'a Options),
    Merged(Box<Options>),
}

impl std::ops::Deref for Effective<'_> {
    type Target = Options;

    #[inline]
    fn deref(&self) -> &Options {
        match self {
            Effective::Defaults(o) => o,
            Effective::Merged(o) => o,
        }
    }
}

impl<'a> Effective<'a> {
    /// The same options for a call inside a transaction: write and read
    /// concern belong to the transaction there.
    pub(crate) fn in_transaction(self) -> Effective<'a> {
        let o = match self {
            Effective::Defaults(o) => o.clone(),
            Effective::Merged(o) => *o,
        };
        Effective::Merged(Box::new(o.in_transaction()))
    }
}

impl Options {
    /// No options: everything comes from the repository or the database.
    pub fn new() -> Self {
        Self::default()
    }

    /// No options, borrowed for as long as needed.
    pub(crate) fn none() -> &'static Options {
        &NONE
    }

    /// Sets [`Options::write_concern`].
    pub fn write_concern(mut self, wc: WriteConcern) -> Self {
        self.write_concern = Some(wc);
        self
    }

    /// Sets [`Options::read_concern`].
    pub fn read_concern(mut self, rc: ReadConcern) -> Self {
        self.read_concern = Some(rc);
        self
    }

    /// Sets [`Options::selection_criteria`].
    pub fn selection_criteria(mut self, sc: impl Into<SelectionCriteria>) -> Self {
        self.selection_criteria = Some(sc.into());
        self
    }

    /// Sets [`Options::comment`].
    pub fn comment(mut self, comment: impl Into<Bson>) -> Self {
        self.comment = Some(comment.into());
        self
    }

    /// Sets [`Options::max_time`].
    pub fn max_time(mut self, max_time: Duration) -> Self {
        self.max_time = Some(max_time);
        self
    }

    /// `self`, with what it leaves unset taken from `defaults`.
    pub fn or(&self, defaults: &Options) -> Options {
        Options {
            write_concern: self
                .write_concern
                .clone()
                .or_else(|| defaults.write_concern.clone()),
            read_concern: self
                .read_concern
                .clone()
                .or_else(|| defaults.read_concern.clone()),
            selection_criteria: self
                .selection_criteria
                .clone()
                .or_else(|| defaults.selection_criteria.clone()),
            comment: self.comment.clone().or_else(|| defaults.comment.clone()),
            max_time: self.max_time.or(defaults.max_time),
        }
    }

    /// True when nothing is set (the hot path: no driver options built).
    pub fn is_empty(&self) -> bool {
        self == &Options::default()
    }

    /// The options for a call inside a transaction: write and read
    /// concern belong to the transaction there.
    pub(crate) fn in_transaction(mut self) -> Options {
        self.write_concern = None;
        self.read_concern = None;
        self
    }

    /// Whether writes go unacknowledged (`w: 0` without `j: true`), by
    /// these options or else `coll`'s write concern: such a write returns
    /// nothing to read an outcome from, and the driver's own write helpers
    /// refuse to send it.
    pub(crate) fn unacknowledged(&self, coll: Option<&WriteConcern>) -> bool {
        self.write_concern.as_ref().or(coll).is_some_and(|wc| {
            wc.w == Some(mongodb::options::Acknowledgment::Nodes(0)) && wc.journal != Some(true)
        })
    }

    /// The driver's options struct `O` with these set, or `None` when
    /// nothing applies (so the hot path builds nothing).
    pub(crate) fn driver<O: DriverOptions>(&self) -> Option<O> {
        if self.is_empty() {
            return None;
        }
        let mut o = O::default();
        o.apply(self);
        Some(o)
    }

    /// The driver's options struct `O` for a read that decides a write:
    /// these options, but on the primary whatever they or the client say
    /// (a secondary's copy can lag behind the write being decided, and a
    /// transaction reads nothing else).
    pub(crate) fn deciding<O: DriverOptions>(&self) -> O {
        let mut o = O::default();
        o.apply(self);
        o.primary();
        o
    }

    /// Adds these options to a command sent with `run_command`, which
    /// inherits nothing from the collection: `writeConcern` (the given
    /// effective one, for a write), `readConcern`, `comment`, `maxTimeMS`.
    pub(crate) fn command_fields(
        &self,
        command: &mut Document,
        write_concern: Option<&WriteConcern>,
        write: bool,
    ) -> Result<()> {
        if write {
            if let Some(wc) = self.write_concern.as_ref().or(write_concern) {
                command.insert("writeConcern", crate::compat::to_bson(wc)?);
            }
        } else if let Some(rc) = &self.read_concern {
            command.insert("readConcern", crate::compat::to_bson(rc)?);
        }
        if let Some(c) = &self.comment {
            command.insert("comment", c.clone());
        }
        if let Some(t) = self.max_time {
            command.insert(
                "maxTimeMS",
                i64::try_from(t.as_millis()).unwrap_or(i64::MAX),
            );
        }
        Ok(())
    }
}

/// Driver option structs that [`Options`] fills in.
pub(crate) trait DriverOptions: Default {
    fn apply(&mut self, o: &Options);
    /// Reads from the primary (a read's options; nothing for a write's).
    fn primary(&mut self) {}
}

macro_rules! driver_options {
    ($($t:ident: $($field:ident),*;)*) => {$(
        impl DriverOptions for mongodb::options::$t {
            fn apply(&mut self, o: &Options) {
                $(if o.$field.is_some() { self.$field = o.$field.clone(); })*
            }
        }
    )*};
}

/// The read options: [`driver_options!`], and [`DriverOptions::primary`].
macro_rules! read_options {
    ($($t:ident: $($field:ident),*;)*) => {$(
        impl DriverOptions for mongodb::options::$t {
            fn apply(&mut self, o: &Options) {
                $(if o.$field.is_some() { self.$field = o.$field.clone(); })*
                if o.selection_criteria.is_some() {
                    self.selection_criteria = o.selection_criteria.clone();
                }
            }

            fn primary(&mut self) {
                self.selection_criteria = Some(crate::util::primary());
            }
        }
    )*};
}

read_options! {
    FindOptions: comment, max_time, read_concern;
    FindOneOptions: comment, max_time, read_concern;
    AggregateOptions: comment, max_time, read_concern, write_concern;
    CountOptions: comment, max_time, read_concern;
    DistinctOptions: comment, max_time, read_concern;
    EstimatedDocumentCountOptions: comment, max_time, read_concern;
}

driver_options! {
    UpdateOptions: comment, write_concern;
    ReplaceOptions: comment, write_concern;
    DeleteOptions: comment, write_concern;
    InsertOneOptions: comment, write_concern;
    InsertManyOptions: comment, write_concern;
    FindOneAndUpdateOptions: comment, max_time, write_concern;
    FindOneAndReplaceOptions: comment, max_time, write_concern;
    FindOneAndDeleteOptions: comment, max_time, write_concern;
    CreateIndexOptions: comment, max_time, write_concern;
}
