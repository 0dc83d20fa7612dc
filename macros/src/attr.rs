//! Pieces every attribute parser shares: option slots that refuse
//! duplicates, literal parsing with the user's span, and "did you mean".

use proc_macro2::Span;
use quote::ToTokens;
use syn::meta::ParseNestedMeta;
use syn::spanned::Spanned;
use syn::{Expr, ExprLit, Lit, LitInt, LitStr};

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

    pub fn get(self) -> Option<(Span, T)> {
        self.value
    }
}

/// `key = "string"`, pointing at the value when it is not a string.
pub fn parse_lit_str(meta: &ParseNestedMeta, attr: &str) -> syn::Result<LitStr> {
    let key = option_name(meta);
    match meta.value()?.parse::<Expr>()? {
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
    match meta.value()?.parse::<Expr>()? {
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
    let mut msg = format!("unknown `{attr}` option `{got}`; expected one of {list}");
    if let Some(s) = did_you_mean(&got, expected.iter().copied()) {
        msg.push_str(&format!("\nhelp: did you mean `{s}`?"));
    }
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

/// The closest candidate to `got`, if one is close enough to be a typo.
pub fn did_you_mean<'a>(
    got: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<&'a str> {
    let got_l = got.to_lowercase();
    candidates
        .into_iter()
        .map(|c| (levenshtein(&got_l, &c.to_lowercase()), c))
        .filter(|(d, c)| *d <= (c.chars().count().max(got.chars().count()) / 3).max(1))
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

fn levenshtein(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = if ca == *cb {
                prev
            } else {
                1 + prev.min(cur).min(row[j])
            };
            prev = cur;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suggestions() {
        let c = ["customerId", "date", "ticker"];
        assert_eq!(did_you_mean("customerID", c), Some("customerId"));
        assert_eq!(did_you_mean("custmerId", c), Some("customerId"));
        assert_eq!(did_you_mean("dat", c), Some("date"));
        assert_eq!(did_you_mean("quantity", c), None);
        assert_eq!(levenshtein("kitten", "sitting"), 3);
    }
}
