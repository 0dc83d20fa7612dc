//! Pieces every attribute parser shares: option slots that refuse
//! duplicates, literal parsing with the user's span, and "did you mean".

use proc_macro2::Span;
use quote::ToTokens;
use syn::meta::ParseNestedMeta;
use syn::spanned::Spanned;
use syn::{Attribute, Expr, ExprLit, Lit, LitInt, LitStr, Token};

use crate::ctxt::Ctxt;

/// One option of an attribute: set at most once, remembering where.
pub struct Opt<'c, T> {
    cx: &'c Ctxt,
    attr: &'static str,
    name: &'static str,
    value: Option<(Span, T)>,
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

    /// The value so far, while options are still being read.
    pub fn value(&self) -> Option<&T> {
        self.value.as_ref().map(|(_, v)| v)
    }

    pub fn get(self) -> Option<(Span, T)> {
        self.value
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

/// An option's value of the wrong kind is reported, and parsing goes on
/// with the next option (`Ok(None)`); only broken syntax stops it.
pub fn recover<T>(
    cx: &Ctxt,
    meta: &ParseNestedMeta,
    value: syn::Result<T>,
) -> syn::Result<Option<T>> {
    match value {
        Ok(v) => Ok(Some(v)),
        Err(e) if meta.input.is_empty() || meta.input.peek(Token![,]) => {
            cx.syn_error(e);
            Ok(None)
        }
        Err(e) => Err(e),
    }
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

/// The value of `key = value`, as written. A `macro_rules!` macro passes
/// a `$x:literal` (or `$x:expr`) on inside an invisible group (one without
/// delimiters), which syn keeps as [`Expr::Group`]: it is unwrapped here, so
/// that every option reads the value as if written in place.
pub fn parse_value(meta: &ParseNestedMeta) -> syn::Result<Expr> {
    Ok(ungroup(meta.value()?.parse::<Expr>()?))
}

/// `e` without the invisible groups around it (see [`parse_value`]).
pub fn ungroup(mut e: Expr) -> Expr {
    while let Expr::Group(g) = e {
        e = *g.expr;
    }
    e
}

/// `key = "string"`, pointing at the value when it is not a string.
pub fn parse_lit_str(meta: &ParseNestedMeta, attr: &str) -> syn::Result<LitStr> {
    let key = option_name(meta);
    match parse_value(meta)? {
        Expr::Lit(ExprLit {
            lit: Lit::Str(s), ..
        }) => Ok(s),
        other => Err(syn::Error::new_spanned(
            other,
            format!("`{attr}` option `{key}` takes a string literal, as in `{key} = \"...\"`"),
        )),
    }
}

/// `key = 123`, an integer literal without suffix games.
pub fn parse_lit_int(meta: &ParseNestedMeta, attr: &str) -> syn::Result<LitInt> {
    let key = option_name(meta);
    match parse_value(meta)? {
        Expr::Lit(ExprLit {
            lit: Lit::Int(i), ..
        }) => Ok(i),
        other => Err(syn::Error::new_spanned(
            other,
            format!("`{attr}` option `{key}` takes an integer literal, as in `{key} = 100`"),
        )),
    }
}

pub fn option_name(meta: &ParseNestedMeta) -> String {
    meta.path
        .get_ident()
        .map(|i| i.to_string())
        .unwrap_or_else(|| meta.path.to_token_stream().to_string().replace(' ', ""))
}

/// The error for an option this attribute does not have.
pub fn unknown_option(meta: &ParseNestedMeta, attr: &str, expected: &[&str]) -> syn::Error {
    let got = option_name(meta);
    let list = expected
        .iter()
        .map(|e| format!("`{e}`"))
        .collect::<Vec<_>>()
        .join(", ");
    let mut msg = match expected {
        [only] => format!("unknown `{attr}` option `{got}`; expected `{only}`"),
        _ => format!("unknown `{attr}` option `{got}`; expected one of {list}"),
    };
    msg.push_str(&hint(&got, expected.iter().copied()));
    syn::Error::new_spanned(&meta.path, msg)
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
mod tests {
    use super::*;
    use proc_macro2::{Delimiter, Group, TokenStream};
    use quote::quote;
    use syn::parse::Parser;

    /// `tokens` as a `macro_rules!` macro passes on a `$x:literal`: inside
    /// a group without delimiters.
    fn invisible(tokens: TokenStream) -> TokenStream {
        Group::new(Delimiter::None, tokens).into_token_stream()
    }

    /// Parses `key = <value>` with `f`.
    fn parse_with<T>(
        value: TokenStream,
        f: impl Fn(&ParseNestedMeta) -> syn::Result<T>,
    ) -> syn::Result<T> {
        let mut out = None;
        syn::meta::parser(|meta| {
            out = Some(f(&meta)?);
            Ok(())
        })
        .parse2(quote!(key = #value))?;
        Ok(out.expect("one option"))
    }

    #[test]
    fn literals_from_macro_rules() {
        let s = parse_with(invisible(quote!("month")), |m| parse_lit_str(m, "x")).unwrap();
        assert_eq!(s.value(), "month");
        let i = parse_with(invisible(quote!(100)), |m| parse_lit_int(m, "x")).unwrap();
        assert_eq!(i.base10_digits(), "100");
        // Nested groups (a macro calling a macro) unwrap too.
        let twice = invisible(invisible(quote!("a")));
        assert_eq!(
            parse_with(twice, |m| parse_lit_str(m, "x"))
                .unwrap()
                .value(),
            "a"
        );
        // The error still points at a value that is not a literal.
        let e = parse_with(invisible(quote!(a + b)), |m| parse_lit_str(m, "x")).unwrap_err();
        assert!(e.to_string().contains("takes a string literal"), "{e}");
        let e = parse_with(invisible(quote!("s")), |m| parse_lit_int(m, "x")).unwrap_err();
        assert!(e.to_string().contains("takes an integer literal"), "{e}");
    }

    #[test]
    fn suggestions() {
        let c = ["customerId", "date", "ticker"];
        assert_eq!(did_you_mean("customerID", c), Some("customerId"));
        assert_eq!(did_you_mean("custmerId", c), Some("customerId"));
        assert_eq!(did_you_mean("dat", c), Some("date"));
        assert_eq!(did_you_mean("quantity", c), None);
        assert_eq!(
            did_you_mean("sotr", ["sort", "order", "page_size"]),
            Some("sort")
        );
        assert_eq!(did_you_mean("up", ["asc", "desc"]), None);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(edit_distance("sotr", "sort"), 1);
    }
}
