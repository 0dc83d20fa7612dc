//! Error collection, after serde_derive's `Ctxt`: every check reports into
//! one place, and the derive fails once, with all of them.

use std::cell::RefCell;
use std::fmt::Display;

use proc_macro2::TokenStream;
use quote::ToTokens;

#[derive(Default)]
pub struct Ctxt {
    errors: RefCell<Option<Vec<syn::Error>>>,
}

impl Ctxt {
    pub fn new() -> Self {
        Ctxt {
            errors: RefCell::new(Some(Vec::new())),
        }
    }

    /// An error pointing at `tokens`.
    pub fn error_spanned_by<T: ToTokens, M: Display>(&self, tokens: T, msg: M) {
        self.syn_error(syn::Error::new_spanned(tokens.into_token_stream(), msg));
    }

    pub fn syn_error(&self, err: syn::Error) {
        self.errors
            .borrow_mut()
            .as_mut()
            .expect("Ctxt used after check()")
            .push(err);
    }

    /// `Some(value)`, or `None` with the error reported: how a parser
    /// carries on past a `syn::Result`.
    pub fn ok<T>(&self, result: syn::Result<T>) -> Option<T> {
        match result {
            Ok(v) => Some(v),
            Err(e) => {
                self.syn_error(e);
                None
            }
        }
    }

    /// How many errors were reported so far: a check that only makes sense
    /// when nothing else failed compares counts.
    pub fn error_count(&self) -> usize {
        self.errors.borrow().as_ref().map_or(0, Vec::len)
    }

    /// All errors combined into one, or `Ok` when there were none.
    pub fn check(self) -> Result<(), syn::Error> {
        let errors = self.errors.borrow_mut().take().expect("check() twice");
        let mut iter = errors.into_iter();
        match iter.next() {
            None => Ok(()),
            Some(mut first) => {
                for e in iter {
                    first.combine(e);
                }
                Err(first)
            }
        }
    }

    /// The errors as `compile_error!` invocations.
    pub fn into_compile_errors(self) -> Option<TokenStream> {
        self.check().err().map(|e| e.to_compile_error())
    }
}

/// Runs `f` with a fresh context and returns its result with the messages
/// it reported, in order: how the unit tests look at errors.
#[cfg(test)]
pub fn collect<T>(f: impl FnOnce(&Ctxt) -> T) -> (T, Vec<String>) {
    let cx = Ctxt::new();
    let out = f(&cx);
    let errors = cx
        .check()
        .err()
        .map_or(vec![], |e| e.into_iter().map(|e| e.to_string()).collect());
    (out, errors)
}

impl Drop for Ctxt {
    fn drop(&mut self) {
        if !std::thread::panicking() && self.errors.borrow().is_some() {
            panic!("forgot to check for errors");
        }
    }
}
