//! The one option reader every attribute shares, and the pieces its
//! parsers use: option slots that refuse duplicates, typed values with the
//! user's span, and "did you mean".
//!
//! Each pattern module works in two steps, as thiserror's `attr` and
//! `valid`: its `attr` step reads the attribute with [`read`] and types each
//! value ([`RawOpt::lit_str`], ...), reporting what cannot be read; its
//! `check` step judges what was read (limits, options that need each other,
//! the fields the options name). Reading never stops at a mistake: a value
//! of the wrong kind, an unknown option or even broken syntax is reported
//! and the reader carries on at the next `,`, so that a user sees every
//! mistake of an attribute at once.

use proc_macro2::{Span, TokenStream, TokenTree};
use quote::ToTokens;
use syn::ext::IdentExt;
use syn::meta::ParseNestedMeta;
use syn::parse::discouraged::Speculative;
use syn::parse::{ParseStream, Parser};
use syn::punctuated::Punctuated;
use syn::spanned::Spanned;
use syn::{Attribute, Expr, ExprLit, Ident, Lit, LitBool, LitInt, LitStr, Meta, Path, Token};

use crate::ctxt::Ctxt;

/// One option as written, before anything is judged.
pub struct RawOpt {
    /// The key, where errors about the option itself point.
    pub path: Path,
    /// The key as text (`crate`, `max_keys`).
    pub name: String,
    pub value: RawValue,
}

pub enum RawValue {
    /// `key` alone.
    Flag,
    /// `key = value`, without the invisible groups a `macro_rules!` macro
    /// wraps a `$x:literal` in.
    Value(Expr),
    /// `key(...)`: the group as written, and the options inside it.
    List(TokenStream, Vec<RawOpt>),
    /// `key = ...` whose value does not parse: reported already.
    Broken,
}

/// Reads every option of `#[attr(...)]`: a mistake in one option is
/// reported and reading goes on with the next. `#[attr]` has no options
/// (the caller decides what that means); `#[attr = ...]` is reported.
pub fn read(cx: &Ctxt, attr: &Attribute) -> Vec<RawOpt> {
    let mut out = Vec::new();
    match &attr.meta {
        Meta::List(list) => {
            let parsed = list.parse_args_with(|input: ParseStream| {
                read_list(cx, input, &mut out);
                Ok(())
            });
            cx.ok(parsed);
        }
        Meta::NameValue(nv) => {
            let name = path_name(&nv.path);
            cx.error_spanned_by(
                nv,
                format!("`#[{name}]` takes options in parentheses, as in `#[{name}(...)]`"),
            );
        }
        Meta::Path(_) => {}
    }
    out
}

/// `option, option, ...`, each one read or reported and skipped.
fn read_list(cx: &Ctxt, input: ParseStream, out: &mut Vec<RawOpt>) {
    while !input.is_empty() {
        if let Some(opt) = read_one(cx, input) {
            out.push(opt);
        }
        if input.is_empty() {
            break;
        }
        if !input.peek(Token![,]) {
            cx.syn_error(input.error("expected `,` before the next option"));
            // A name is read as the next option (the comma was forgotten);
            // anything else is skipped, up to the next `,`.
            if !input.peek(Ident::peek_any) {
                skip_to_comma(input);
            }
        }
        let _ = input.parse::<Option<Token![,]>>();
    }
}

/// `key`, `key = value` or `key(...)`; `None` when the key itself is not
/// one (reported, and skipped to the next `,`).
fn read_one(cx: &Ctxt, input: ParseStream) -> Option<RawOpt> {
    let path = match read_key(input) {
        Ok(path) => path,
        Err(e) => {
            cx.syn_error(e);
            skip_to_comma(input);
            return None;
        }
    };
    let name = path_name(&path);
    let value = if input.peek(Token![=]) {
        let _ = input.parse::<Token![=]>();
        let fork = input.fork();
        match fork.parse::<Expr>() {
            Ok(e) => {
                input.advance_to(&fork);
                RawValue::Value(ungroup(e))
            }
            Err(e) => {
                cx.syn_error(e);
                skip_to_comma(input);
                RawValue::Broken
            }
        }
    } else if input.peek(syn::token::Paren) {
        match input.parse::<TokenTree>() {
            Ok(TokenTree::Group(g)) => {
                let mut inner = Vec::new();
                let parsed = (|input: ParseStream| {
                    read_list(cx, input, &mut inner);
                    Ok(())
                })
                .parse2(g.stream());
                cx.ok(parsed);
                RawValue::List(TokenTree::Group(g).into_token_stream(), inner)
            }
            _ => RawValue::Broken,
        }
    } else {
        RawValue::Flag
    };
    Some(RawOpt { path, name, value })
}

/// An option's key: an identifier (keywords too, for `crate`), or a path.
fn read_key(input: ParseStream) -> syn::Result<Path> {
    if !input.peek(Ident::peek_any) {
        return Err(input.error("expected an option name, as in `name = value`"));
    }
    let mut segments = Punctuated::new();
    loop {
        segments.push_value(Ident::parse_any(input)?.into());
        if !input.peek(Token![::]) {
            break;
        }
        segments.push_punct(input.parse()?);
    }
    Ok(Path {
        leading_colon: None,
        segments,
    })
}

/// Skips token trees up to the next `,` at this level (or the end).
fn skip_to_comma(input: ParseStream) {
    let _ = input.step(|cursor| {
        let mut rest = *cursor;
        while let Some((tt, next)) = rest.token_tree() {
            if matches!(&tt, TokenTree::Punct(p) if p.as_char() == ',') {
                break;
            }
            rest = next;
        }
        Ok(((), rest))
    });
}

fn path_name(path: &Path) -> String {
    path.get_ident()
        .map(|i| i.unraw().to_string())
        .unwrap_or_else(|| path.to_token_stream().to_string().replace(' ', ""))
}

impl RawOpt {
    /// The value of `key = value`. `key` alone or `key(...)` is reported
    /// as needing a value like `example` (the whole option, as in
    /// `size = 1000`).
    pub fn value(&self, cx: &Ctxt, attr: &str, example: &str) -> Option<&Expr> {
        let name = &self.name;
        match &self.value {
            RawValue::Value(e) => Some(e),
            RawValue::Broken => None,
            RawValue::Flag => {
                cx.error_spanned_by(
                    &self.path,
                    format!("`{attr}` option `{name}` needs a value, as in `{example}`"),
                );
                None
            }
            RawValue::List(group, _) => {
                cx.error_spanned_by(
                    group,
                    format!("`{attr}` option `{name}` takes `=` and a value, as in `{example}`, not a list"),
                );
                None
            }
        }
    }

    /// `key = "string"`, reported at the value when it is something else.
    pub fn lit_str(&self, cx: &Ctxt, attr: &str, example: &str) -> Option<LitStr> {
        match self.value(cx, attr, example)? {
            Expr::Lit(ExprLit {
                lit: Lit::Str(s), ..
            }) => Some(s.clone()),
            other => {
                self.wrong_kind(cx, other, attr, "a string literal", example);
                None
            }
        }
    }

    /// `key = 123`, reported at the value when it is something else.
    pub fn lit_int(&self, cx: &Ctxt, attr: &str, example: &str) -> Option<LitInt> {
        match self.value(cx, attr, example)? {
            Expr::Lit(ExprLit {
                lit: Lit::Int(i), ..
            }) => Some(i.clone()),
            other => {
                self.wrong_kind(cx, other, attr, "an integer literal", example);
                None
            }
        }
    }

    /// `key = true` or `key = false`, reported at the value otherwise.
    pub fn lit_bool(&self, cx: &Ctxt, attr: &str, example: &str) -> Option<LitBool> {
        match self.value(cx, attr, example)? {
            Expr::Lit(ExprLit {
                lit: Lit::Bool(b), ..
            }) => Some(b.clone()),
            other => {
                self.wrong_kind(cx, other, attr, "`true` or `false`", example);
                None
            }
        }
    }

    /// The options of `key(...)`; anything else is reported.
    pub fn list(&self, cx: &Ctxt, attr: &str, example: &str) -> Option<&[RawOpt]> {
        match &self.value {
            RawValue::List(_, inner) => Some(inner),
            RawValue::Broken => None,
            RawValue::Flag => {
                cx.error_spanned_by(
                    &self.path,
                    format!(
                        "`{attr}` option `{}` takes a list, as in `{example}`",
                        self.name
                    ),
                );
                None
            }
            RawValue::Value(e) => {
                cx.error_spanned_by(
                    e,
                    format!(
                        "`{attr}` option `{}` takes a list in parentheses, as in `{example}`",
                        self.name
                    ),
                );
                None
            }
        }
    }

    fn wrong_kind(&self, cx: &Ctxt, value: &Expr, attr: &str, kind: &str, example: &str) {
        cx.error_spanned_by(
            value,
            format!(
                "`{attr}` option `{}` takes {kind}, as in `{example}`",
                self.name
            ),
        );
    }

    /// Reports this option as one `attr` does not have, with a hint when
    /// it looks like a typo of one of `expected`.
    pub fn unknown(&self, cx: &Ctxt, attr: &str, expected: &[&str]) {
        cx.syn_error(unknown_option(&self.path, &self.name, attr, expected));
    }
}

/// One option of an attribute: set at most once, remembering where. A
/// value that was given but could not be read still counts as given, so
/// that no "missing option" error lands on top of the one about the value.
pub struct Opt<'c, T> {
    cx: &'c Ctxt,
    attr: &'static str,
    name: &'static str,
    /// Where it was given, and its value if it could be read.
    value: Option<(Span, Option<T>)>,
}

impl<'c, T> Opt<'c, T> {
    pub fn new(cx: &'c Ctxt, attr: &'static str, name: &'static str) -> Self {
        Opt {
            cx,
            attr,
            name,
            value: None,
        }
    }

    /// Records `value`, or reports a duplicate at `at`.
    pub fn set<A: ToTokens>(&mut self, at: A, value: T) {
        self.put(at, Some(value));
    }

    /// Records that the option was given with a value already reported as
    /// wrong, or reports a duplicate at `at`.
    pub fn set_bad<A: ToTokens>(&mut self, at: A) {
        self.put(at, None);
    }

    fn put<A: ToTokens>(&mut self, at: A, value: Option<T>) {
        if self.value.is_some() {
            self.cx.error_spanned_by(
                at,
                format!("duplicate `{}` option `{}`", self.attr, self.name),
            );
        } else {
            let span = at.into_token_stream().span();
            self.value = Some((span, value));
        }
    }

    /// Whether the option was written, read or not.
    pub fn given(&self) -> bool {
        self.value.is_some()
    }

    /// The value so far, if it was given and read.
    pub fn value(&self) -> Option<&T> {
        self.value.as_ref().and_then(|(_, v)| v.as_ref())
    }

    /// The value with where it was written, if it was given and read.
    pub fn get(self) -> Option<(Span, T)> {
        self.value.and_then(|(s, v)| Some((s, v?)))
    }
}

impl<T: ToTokens> Opt<'_, T> {
    /// What `opt`'s value read as: [`Opt::set`] at the value when it could
    /// be read, [`Opt::set_bad`] at the key when not.
    pub fn take(&mut self, opt: &RawOpt, value: Option<T>) {
        match value {
            Some(v) => {
                let at = v.to_token_stream();
                self.put(at, Some(v));
            }
            None => self.set_bad(&opt.path),
        }
    }
}

/// The `#[name]` attributes among a struct's `attrs`, of which it may have
/// one: each after the first is reported as a duplicate. `None` when there
/// is none; otherwise all of them, the first first.
pub fn single<'a>(cx: &Ctxt, attrs: &'a [Attribute], name: &str) -> Option<Vec<&'a Attribute>> {
    found(cx, attrs, name, "attribute")
}

/// [`single`] for the attributes on one field.
pub fn single_on_field<'a>(
    cx: &Ctxt,
    attrs: &'a [Attribute],
    name: &str,
) -> Option<Vec<&'a Attribute>> {
    found(cx, attrs, name, "on one field")
}

fn found<'a>(
    cx: &Ctxt,
    attrs: &'a [Attribute],
    name: &str,
    place: &str,
) -> Option<Vec<&'a Attribute>> {
    let all: Vec<&Attribute> = attrs.iter().filter(|a| a.path().is_ident(name)).collect();
    for dup in all.iter().skip(1) {
        cx.error_spanned_by(
            dup,
            format!("duplicate `#[{name}]` {place}; put all options in one"),
        );
    }
    (!all.is_empty()).then_some(all)
}

/// Why the server would refuse `name` as a collection name, if it would.
pub fn bad_collection_name(name: &str) -> Option<&'static str> {
    if name.is_empty() {
        Some("it is empty")
    } else if name.contains('$') {
        Some("MongoDB reserves `$` in collection names")
    } else if name.contains('\0') {
        Some("it contains a NUL character")
    } else if name.starts_with("system.") {
        Some("`system.` collections belong to the server")
    } else {
        None
    }
}

/// `e` without the invisible groups a `macro_rules!` macro wraps a
/// `$x:literal` (or `$x:expr`) in, which syn keeps as [`Expr::Group`]: every
/// option reads the value as if written in place.
pub fn ungroup(mut e: Expr) -> Expr {
    while let Expr::Group(g) = e {
        e = *g.expr;
    }
    e
}

/// The key of an option of a foreign attribute (serde's), as text.
pub fn option_name(meta: &ParseNestedMeta) -> String {
    path_name(&meta.path)
}

/// The error for an option `attr` does not have, at its key.
fn unknown_option(path: &Path, got: &str, attr: &str, expected: &[&str]) -> syn::Error {
    let list = expected
        .iter()
        .map(|e| format!("`{e}`"))
        .collect::<Vec<_>>()
        .join(", ");
    let mut msg = match expected {
        [only] => format!("unknown `{attr}` option `{got}`; expected `{only}`"),
        _ => format!("unknown `{attr}` option `{got}`; expected one of {list}"),
    };
    msg.push_str(&hint(got, expected.iter().copied()));
    syn::Error::new_spanned(path, msg)
}

/// Consumes whatever value an option we do not interpret carries
/// (`= expr` or `(...)`), so a foreign attribute parses in full.
pub fn skip_value(meta: &ParseNestedMeta) -> syn::Result<()> {
    if meta.input.peek(syn::Token![=]) {
        meta.value()?.parse::<Expr>()?;
    } else if meta.input.peek(syn::token::Paren) {
        meta.parse_nested_meta(|inner| skip_value(&inner))?;
    }
    Ok(())
}

/// `"\nhelp: did you mean `x`?"` for the candidate closest to `got`, or
/// nothing: the tail of an error message about a value.
pub fn hint<'a>(got: &str, candidates: impl IntoIterator<Item = &'a str>) -> String {
    did_you_mean(got, candidates)
        .map(|s| format!("\nhelp: did you mean `{s}`?"))
        .unwrap_or_default()
}

/// The closest candidate to `got`, if one is close enough to be a typo.
pub fn did_you_mean<'a>(
    got: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<&'a str> {
    let got_l = got.to_lowercase();
    candidates
        .into_iter()
        .map(|c| (edit_distance(&got_l, &c.to_lowercase()), c))
        .filter(|(d, c)| *d <= (c.chars().count().max(got.chars().count()) / 3).max(1))
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

/// Edits between `a` and `b`: insertions, deletions, substitutions and
/// swaps of two neighbours (optimal string alignment), so that `sotr` is one
/// typo away from `sort`, not two.
fn edit_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    // d[i][j]: distance between a[..i] and b[..j].
    let mut d = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in d.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in d[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut best = (d[i - 1][j] + 1)
                .min(d[i][j - 1] + 1)
                .min(d[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                best = best.min(d[i - 2][j - 2] + 1);
            }
            d[i][j] = best;
        }
    }
    d[a.len()][b.len()]
}

#[cfg(test)]
mod tests;
