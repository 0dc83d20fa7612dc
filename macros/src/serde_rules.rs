//! The names serde stores a struct's fields under: `rename_all` on the
//! struct, `rename` on a field (the serialize side: that is what is stored),
//! and the fields it does not store under their own name (`skip`,
//! `skip_serializing`, `flatten`). Serde reports its own syntax errors; only
//! the names matter here, so everything else is skipped.

use syn::{DeriveInput, LitStr};

use crate::attr;
use crate::ctxt::Ctxt;

const SERDE: &str = "serde";

/// How serde stores one field.
pub struct Stored {
    pub bson_name: String,
    /// Why serde does not store it under its own name.
    pub not_stored: Option<&'static str>,
    /// Whether it names its own serializer (`with`, `serialize_with`).
    pub serialized_with: bool,
}

/// serde's `rename_all` rules, as serde applies them to field names.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RenameRule {
    None,
    Lower,
    Upper,
    Pascal,
    Camel,
    Snake,
    ScreamingSnake,
    Kebab,
    ScreamingKebab,
}

impl RenameRule {
    const NAMES: [(&'static str, RenameRule); 8] = [
        ("lowercase", RenameRule::Lower),
        ("UPPERCASE", RenameRule::Upper),
        ("PascalCase", RenameRule::Pascal),
        ("camelCase", RenameRule::Camel),
        ("snake_case", RenameRule::Snake),
        ("SCREAMING_SNAKE_CASE", RenameRule::ScreamingSnake),
        ("kebab-case", RenameRule::Kebab),
        ("SCREAMING-KEBAB-CASE", RenameRule::ScreamingKebab),
    ];

    fn from_str(s: &str) -> Option<Self> {
        Self::NAMES.iter().find(|(n, _)| *n == s).map(|(_, r)| *r)
    }

    pub fn apply(self, field: &str) -> String {
        match self {
            RenameRule::None | RenameRule::Lower | RenameRule::Snake => field.to_owned(),
            RenameRule::Upper | RenameRule::ScreamingSnake => field.to_ascii_uppercase(),
            RenameRule::Pascal => {
                let mut out = String::new();
                let mut cap = true;
                for c in field.chars() {
                    if c == '_' {
                        cap = true;
                    } else if cap {
                        out.push(c.to_ascii_uppercase());
                        cap = false;
                    } else {
                        out.push(c);
                    }
                }
                out
            }
            RenameRule::Camel => {
                let pascal = RenameRule::Pascal.apply(field);
                let mut chars = pascal.chars();
                match chars.next() {
                    Some(first) => first.to_ascii_lowercase().to_string() + chars.as_str(),
                    None => pascal,
                }
            }
            RenameRule::Kebab => field.replace('_', "-"),
            RenameRule::ScreamingKebab => field.to_ascii_uppercase().replace('_', "-"),
        }
    }
}

impl RenameRule {
    /// The rule as serde applies it to an enum's variant names, which are
    /// PascalCase.
    pub fn apply_to_variant(self, variant: &str) -> String {
        let snake = || {
            let mut out = String::new();
            for (i, c) in variant.char_indices() {
                if i > 0 && c.is_uppercase() {
                    out.push('_');
                }
                out.push(c.to_ascii_lowercase());
            }
            out
        };
        match self {
            RenameRule::None | RenameRule::Pascal => variant.to_owned(),
            RenameRule::Lower => variant.to_ascii_lowercase(),
            RenameRule::Upper => variant.to_ascii_uppercase(),
            RenameRule::Camel => {
                let mut chars = variant.chars();
                match chars.next() {
                    Some(first) => first.to_ascii_lowercase().to_string() + chars.as_str(),
                    None => String::new(),
                }
            }
            RenameRule::Snake => snake(),
            RenameRule::ScreamingSnake => snake().to_ascii_uppercase(),
            RenameRule::Kebab => snake().replace('_', "-"),
            RenameRule::ScreamingKebab => snake().to_ascii_uppercase().replace('_', "-"),
        }
    }
}

/// How serde stores an enum's variants (`#[serde(tag, content,
/// untagged)]` on the enum).
#[derive(Debug, Clone, PartialEq)]
pub enum Tagging {
    /// The default: a unit variant as its name, any other as
    /// `{name: content}`.
    External,
    /// `tag = "t"`: `{t: name, ..the variant's fields}`.
    Internal { tag: String },
    /// `tag = "t", content = "c"`: `{t: name, c: content}`.
    Adjacent { tag: String, content: String },
    /// `untagged`: the content alone.
    Untagged,
}

/// The enum's [`Tagging`].
pub fn enum_tagging(input: &DeriveInput) -> Tagging {
    let (mut tag, mut content, mut untagged) = (None, None, false);
    for a in input.attrs.iter().filter(|a| a.path().is_ident(SERDE)) {
        let _ = a.parse_nested_meta(|meta| {
            match attr::option_name(&meta).as_str() {
                "tag" => tag = Some(meta.value()?.parse::<LitStr>()?.value()),
                "content" => content = Some(meta.value()?.parse::<LitStr>()?.value()),
                "untagged" => untagged = true,
                _ => attr::skip_value(&meta)?,
            }
            Ok(())
        });
    }
    match (untagged, tag, content) {
        (true, ..) => Tagging::Untagged,
        (false, Some(tag), Some(content)) => Tagging::Adjacent { tag, content },
        (false, Some(tag), None) => Tagging::Internal { tag },
        (false, None, _) => Tagging::External,
    }
}

/// Whether variant `v` is stored untagged whatever the enum's tagging
/// (`#[serde(untagged)]` on the variant).
pub fn variant_untagged(v: &syn::Variant) -> bool {
    let mut found = false;
    for a in v.attrs.iter().filter(|a| a.path().is_ident(SERDE)) {
        let _ = a.parse_nested_meta(|meta| {
            found |= meta.path.is_ident("untagged");
            attr::skip_value(&meta)
        });
    }
    found
}

/// The enum's `#[serde(rename_all_fields = "...")]`: the rule of every
/// struct variant's fields that names none of its own.
pub fn rename_all_fields(input: &DeriveInput) -> Option<LitStr> {
    let mut found = None;
    for a in input.attrs.iter().filter(|a| a.path().is_ident(SERDE)) {
        let _ = a.parse_nested_meta(|meta| {
            if meta.path.is_ident("rename_all_fields") && meta.input.peek(syn::Token![=]) {
                found = Some(meta.value()?.parse::<LitStr>()?);
                Ok(())
            } else {
                attr::skip_value(&meta)
            }
        });
    }
    found
}

/// The name serde stores variant `v` under (`rename`, else the
/// enum's `rule`); `None` when serde never serializes it (`skip`,
/// `skip_serializing`).
pub fn variant_name(v: &syn::Variant, rule: RenameRule) -> Option<String> {
    let mut name = Some(rule.apply_to_variant(&v.ident.to_string()));
    for a in v.attrs.iter().filter(|a| a.path().is_ident(SERDE)) {
        let _ = a.parse_nested_meta(|meta| {
            match attr::option_name(&meta).as_str() {
                "rename" if meta.input.peek(syn::Token![=]) => {
                    name = Some(meta.value()?.parse::<LitStr>()?.value());
                }
                "rename" => meta.parse_nested_meta(|inner| {
                    if inner.path.is_ident("serialize") {
                        name = Some(inner.value()?.parse::<LitStr>()?.value());
                    } else {
                        attr::skip_value(&inner)?;
                    }
                    Ok(())
                })?,
                "skip" | "skip_serializing" => name = None,
                _ => attr::skip_value(&meta)?,
            }
            Ok(())
        });
    }
    name
}

/// The struct's `#[serde(rename_all = "...")]`.
pub fn container_rule(cx: &Ctxt, input: &DeriveInput) -> RenameRule {
    let mut rule = RenameRule::None;
    let mut set = |lit: LitStr| match RenameRule::from_str(&lit.value()) {
        Some(r) => rule = r,
        None => cx.error_spanned_by(&lit, format!("unknown serde rename rule `{}`", lit.value())),
    };
    for a in input.attrs.iter().filter(|a| a.path().is_ident(SERDE)) {
        let _ = a.parse_nested_meta(|meta| {
            if meta.path.is_ident("rename_all") {
                if meta.input.peek(syn::Token![=]) {
                    set(meta.value()?.parse()?);
                } else {
                    meta.parse_nested_meta(|inner| {
                        if inner.path.is_ident("serialize") {
                            set(inner.value()?.parse()?);
                        } else {
                            attr::skip_value(&inner)?;
                        }
                        Ok(())
                    })?;
                }
                Ok(())
            } else {
                attr::skip_value(&meta)
            }
        });
    }
    rule
}

/// How serde stores the field named `rust_name` under the struct's `rule`.
pub fn stored(field: &syn::Field, rust_name: &str, rule: RenameRule) -> Stored {
    let mut bson_name = rule.apply(rust_name);
    let mut not_stored = None;
    // `#[serde_as(as = "...")]` (bson 3's helpers through serde_with) left
    // unexpanded names a serializer too.
    let mut serialized_with = field.attrs.iter().any(|a| a.path().is_ident("serde_as"));
    for a in field.attrs.iter().filter(|a| a.path().is_ident(SERDE)) {
        let _ = a.parse_nested_meta(|meta| {
            let key = attr::option_name(&meta);
            match key.as_str() {
                // rename = "x" | rename(serialize = "x", ...)
                "rename" => {
                    if meta.input.peek(syn::Token![=]) {
                        bson_name = meta.value()?.parse::<LitStr>()?.value();
                    } else {
                        meta.parse_nested_meta(|inner| {
                            if inner.path.is_ident("serialize") {
                                bson_name = inner.value()?.parse::<LitStr>()?.value();
                            } else {
                                attr::skip_value(&inner)?;
                            }
                            Ok(())
                        })?;
                    }
                }
                "skip" => not_stored = Some("`#[serde(skip)]`, so serde never stores it"),
                "skip_serializing" => {
                    not_stored = Some("`#[serde(skip_serializing)]`, so serde never stores it")
                }
                "flatten" => not_stored = Some(
                    "`#[serde(flatten)]`, so its fields are stored at the top level, not under its name",
                ),
                "with" | "serialize_with" => {
                    serialized_with = true;
                    attr::skip_value(&meta)?
                }
                _ => attr::skip_value(&meta)?,
            }
            Ok(())
        });
    }
    Stored {
        bson_name,
        not_stored,
        serialized_with,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variant_rules_match_serde() {
        let v = "LimitOrder";
        let got: Vec<String> = RenameRule::NAMES
            .iter()
            .map(|(_, r)| r.apply_to_variant(v))
            .collect();
        assert_eq!(
            got,
            [
                "limitorder",
                "LIMITORDER",
                "LimitOrder",
                "limitOrder",
                "limit_order",
                "LIMIT_ORDER",
                "limit-order",
                "LIMIT-ORDER"
            ]
        );
    }

    #[test]
    fn rename_rules_match_serde() {
        let f = "customer_id_2";
        let got: Vec<String> = RenameRule::NAMES.iter().map(|(_, r)| r.apply(f)).collect();
        assert_eq!(
            got,
            [
                "customer_id_2",
                "CUSTOMER_ID_2",
                "CustomerId2",
                "customerId2",
                "customer_id_2",
                "CUSTOMER_ID_2",
                "customer-id-2",
                "CUSTOMER-ID-2"
            ]
        );
    }
}
