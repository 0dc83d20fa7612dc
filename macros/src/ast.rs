//! The struct as the patterns see it: its fields under the names serde
//! stores them by, and the lookup every option that names a field goes
//! through, by BSON name or by Rust name.

use syn::{Data, DeriveInput, Fields, GenericParam, Ident, LitStr, Type};

use crate::attr;
use crate::ctxt::Ctxt;
use crate::serde_rules;

pub struct Input<'a> {
    pub ident: &'a Ident,
    pub fields: Vec<Field<'a>>,
}

/// One field: its Rust name, its BSON name and whether serde stores it.
pub struct Field<'a> {
    pub ident: &'a Ident,
    pub ty: &'a Type,
    pub rust_name: String,
    pub bson_name: String,
    /// Why serde does not store it under its own name (`skip`, `flatten`).
    pub not_stored: Option<&'static str>,
    /// Whether it names its own serializer (`#[serde(with = "...")]`).
    pub serialized_with: bool,
}

impl<'a> Input<'a> {
    /// Parses the struct; `None` when its shape cannot be a model at all.
    pub fn from_syn(cx: &Ctxt, input: &'a DeriveInput) -> Option<Self> {
        Self::parse(cx, input, "Model")
    }

    /// Parses the struct for `derive` (named in the errors); `None` when
    /// its shape cannot be one.
    pub fn parse(cx: &Ctxt, input: &'a DeriveInput, derive: &str) -> Option<Self> {
        let fields = match &input.data {
            Data::Struct(s) => match &s.fields {
                Fields::Named(named) => &named.named,
                Fields::Unnamed(_) => {
                    cx.error_spanned_by(
                        &input.ident,
                        format!("`{derive}` needs a struct with named fields: a document's fields have names, a tuple struct's do not"),
                    );
                    return None;
                }
                Fields::Unit => {
                    cx.error_spanned_by(
                        &input.ident,
                        format!("`{derive}` needs a struct with named fields; a unit struct stores nothing"),
                    );
                    return None;
                }
            },
            Data::Enum(e) => {
                cx.error_spanned_by(
                    e.enum_token,
                    format!("`{derive}` cannot be derived for an enum; derive it on a struct with named fields"),
                );
                return None;
            }
            Data::Union(u) => {
                cx.error_spanned_by(
                    u.union_token,
                    format!("`{derive}` cannot be derived for a union; derive it on a struct with named fields"),
                );
                return None;
            }
        };
        for param in &input.generics.params {
            if let GenericParam::Lifetime(l) = param {
                cx.error_spanned_by(
                    l,
                    format!("a `{derive}` cannot borrow: documents are read back as owned values (`DeserializeOwned`); use owned types such as `String`"),
                );
            }
        }
        let rule = serde_rules::container_rule(cx, input);
        let fields = fields
            .iter()
            .map(|field| {
                let ident = field.ident.as_ref().expect("named field");
                let rust_name = ident.to_string().trim_start_matches("r#").to_owned();
                let stored = serde_rules::stored(field, &rust_name, rule);
                Field {
                    ident,
                    ty: &field.ty,
                    rust_name,
                    bson_name: stored.bson_name,
                    not_stored: stored.not_stored,
                    serialized_with: stored.serialized_with,
                }
            })
            .collect();
        Some(Input {
            ident: &input.ident,
            fields,
        })
    }

    /// The field `name` means, by BSON name first, then by Rust name, stored
    /// or not; reports nothing.
    pub fn find(&self, name: &str) -> Option<&Field<'a>> {
        self.fields
            .iter()
            .find(|f| f.bson_name == name)
            .or_else(|| self.fields.iter().find(|f| f.rust_name == name))
    }

    /// The field serde stores as `_id`.
    pub fn stored_id(&self) -> Option<&Field<'a>> {
        self.fields
            .iter()
            .find(|f| f.bson_name == "_id" && f.not_stored.is_none())
    }

    /// The stored field that `name` means, by BSON name or Rust name. Reports
    /// an unknown or unstored field at `name` and returns `None`.
    pub fn resolve(
        &self,
        cx: &Ctxt,
        name: &LitStr,
        attr: &str,
        option: &str,
    ) -> Option<&Field<'a>> {
        let value = name.value();
        match self.find(&value) {
            Some(f) => {
                if let Some(why) = f.not_stored {
                    cx.error_spanned_by(
                        name,
                        format!(
                            "`{attr}` option `{option}` cannot use field `{}`: it is {why}",
                            f.rust_name
                        ),
                    );
                    return None;
                }
                if let Some(foreign) = foreign_without_helper(f) {
                    let Foreign {
                        ty,
                        serde_form,
                        bson2,
                        bson3,
                    } = foreign;
                    cx.error_spanned_by(
                        f.ty,
                        format!(
                            "`{attr}` option `{option}` names `{}`, a `{ty}`, which serde's own impl stores as {serde_form}: the pattern would compare that, not the time or UUID, and get the order wrong; store it as the BSON type with bson's helper, `#[serde(with = \"mongo_patterns::bson::serde_helpers::{bson2}\")]` (bson 3: `serde_helpers::{bson3}`), see `mongo_patterns::foreign`",
                            f.rust_name,
                        ),
                    );
                    return None;
                }
                Some(f)
            }
            None => {
                let names: Vec<String> = self
                    .fields
                    .iter()
                    .filter(|f| f.not_stored.is_none())
                    .map(|f| format!("`{}`", f.bson_name))
                    .collect();
                let mut msg = format!(
                    "`{attr}` option `{option}` names `{value}`, which is not a field of `{}`; its stored fields are {}",
                    self.ident,
                    if names.is_empty() { "none".to_owned() } else { names.join(", ") }
                );
                let candidates = self
                    .fields
                    .iter()
                    .flat_map(|f| [f.bson_name.as_str(), f.rust_name.as_str()]);
                if let Some(s) = attr::did_you_mean(&value, candidates) {
                    let f = self
                        .fields
                        .iter()
                        .find(|f| f.bson_name == s || f.rust_name == s)
                        .expect("a candidate");
                    msg.push_str(&format!("\nhelp: did you mean `{}`?", f.bson_name));
                }
                cx.error_spanned_by(name, msg);
                None
            }
        }
    }
}

/// A foreign type stored by serde's own impl, and bson's helpers for it.
struct Foreign {
    ty: &'static str,
    serde_form: &'static str,
    bson2: &'static str,
    bson3: &'static str,
}

/// The foreign type a field holds (an `Option` of it included) and the
/// bson helper that stores it as the BSON type the patterns compare, when
/// it names no serializer of its own: serde's impls store `chrono` and
/// `uuid` values as strings and `time`'s as a tuple, so an order would
/// silently be the wrong one. A bare `Uuid` may be bson's own, which needs
/// nothing: only `uuid::Uuid` is caught.
fn foreign_without_helper(f: &Field) -> Option<Foreign> {
    if f.serialized_with {
        return None;
    }
    let mut ty = f.ty;
    loop {
        let Type::Path(p) = ty else { return None };
        let last = p.path.segments.last()?;
        let generic = |i: usize| match &last.arguments {
            syn::PathArguments::AngleBracketed(a) => match a.args.iter().nth(i) {
                Some(syn::GenericArgument::Type(t)) => Some(t),
                _ => None,
            },
            _ => None,
        };
        let names: Vec<String> = p
            .path
            .segments
            .iter()
            .map(|s| s.ident.to_string())
            .collect();
        match (last.ident.to_string().as_str(), names.len()) {
            ("Option", _) => ty = generic(0)?,
            ("DateTime", _) if generic(0).is_some() => {
                return Some(Foreign {
                    ty: "chrono::DateTime",
                    serde_form: "an RFC 3339 string",
                    bson2: "chrono_datetime_as_bson_datetime",
                    bson3: "datetime::FromChrono04DateTime",
                })
            }
            ("OffsetDateTime", _) => {
                return Some(Foreign {
                    ty: "time::OffsetDateTime",
                    serde_form: "a tuple",
                    bson2: "time_0_3_offsetdatetime_as_bson_datetime",
                    bson3: "datetime::FromTime03OffsetDateTime",
                })
            }
            ("Uuid", n) if n >= 2 && names[n - 2] == "uuid" => {
                return Some(Foreign {
                    ty: "uuid::Uuid",
                    serde_form: "a string",
                    bson2: "uuid_1_as_binary",
                    bson3: "uuid_1::AsBinary",
                })
            }
            _ => return None,
        }
    }
}

/// A sort direction, as `order = "..."` spells it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Order {
    Asc,
    Desc,
}

impl Order {
    pub fn from_spelling(s: &str) -> Option<Self> {
        match s {
            "asc" | "ascending" => Some(Order::Asc),
            "desc" | "descending" => Some(Order::Desc),
            _ => None,
        }
    }

    /// The runtime's specs store the direction as `descending: bool`.
    pub fn is_descending(self) -> bool {
        self == Order::Desc
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use syn::parse_quote;

    fn names(input: DeriveInput) -> Vec<(String, String)> {
        let (out, errors) = crate::ctxt::collect(|cx| {
            Input::from_syn(cx, &input)
                .unwrap()
                .fields
                .iter()
                .map(|f| (f.rust_name.clone(), f.bson_name.clone()))
                .collect::<Vec<_>>()
        });
        assert!(errors.is_empty(), "{errors:?}");
        out
    }

    #[test]
    fn serde_names_resolve() {
        let n = names(parse_quote! {
            #[serde(rename_all = "camelCase")]
            struct Trade {
                customer_id: i64,
                #[serde(rename = "_id")] id: i64,
                #[serde(rename(serialize = "ts", deserialize = "t"))] at: i64,
                #[serde(default, skip_serializing_if = "Option::is_none", with = "x")] r#type: Option<i32>,
            }
        });
        assert_eq!(
            n,
            [
                ("customer_id", "customerId"),
                ("id", "_id"),
                ("at", "ts"),
                ("type", "type")
            ]
            .map(|(a, b)| (a.to_owned(), b.to_owned()))
        );
    }
}
