//! The BSON types each stored field takes, as the struct's Rust types say
//! and serde stores them: `Model::FIELDS`, from which the runtime builds
//! the `$jsonSchema` a validator enforces. Only what the type alone
//! decides: a field serialized by a helper (`with`), a type the derive
//! cannot see through (a nested struct, an enum, an alias, a generic) is
//! left open.

use proc_macro2::TokenStream;
use quote::quote;
use syn::{GenericArgument, PathArguments, Type};

use crate::ast::Input;
use crate::private::Private;

const INT: &[&str] = &["int", "long"];
/// A float reads integers too.
const FLOAT: &[&str] = &["double", "int", "long"];

/// The BSON types of a value of `ty`, and of its elements when it is a
/// sequence; `None` when the type does not decide them.
fn types(ty: &Type) -> Option<(Vec<&'static str>, Vec<&'static str>)> {
    let Type::Path(path) = ty else {
        return match ty {
            Type::Reference(r) => types(&r.elem),
            Type::Group(g) => types(&g.elem),
            Type::Paren(p) => types(&p.elem),
            _ => None,
        };
    };
    if path.qself.is_some() {
        return None;
    }
    let last = path.path.segments.last()?;
    let name = last.ident.to_string();
    let arg = || match &last.arguments {
        PathArguments::AngleBracketed(a) => a.args.iter().find_map(|g| match g {
            GenericArgument::Type(t) => Some(t),
            _ => None,
        }),
        _ => None,
    };
    let plain = matches!(last.arguments, PathArguments::None);
    // `Document`, `Binary` and `Timestamp` are common names for a type of
    // one's own: only when the path says bson's.
    let bson = plain && path.path.segments.iter().any(|s| s.ident == "bson");
    let scalar = |t: &[&'static str]| Some((t.to_vec(), Vec::new()));
    match name.as_str() {
        "Option" => {
            let (mut t, items) = types(arg()?)?;
            t.push("null");
            Some((t, items))
        }
        "Box" | "Arc" | "Rc" => types(arg()?),
        "Vec" | "VecDeque" | "HashSet" | "BTreeSet" => {
            let items = arg().and_then(types).map(|(t, _)| t).unwrap_or_default();
            Some((vec!["array"], items))
        }
        "i8" | "i16" | "i32" | "i64" | "isize" | "u8" | "u16" | "u32" | "u64" | "usize"
            if plain =>
        {
            scalar(INT)
        }
        "f32" | "f64" if plain => scalar(FLOAT),
        "bool" if plain => scalar(&["bool"]),
        "String" | "char" if plain => scalar(&["string"]),
        "ObjectId" if plain => scalar(&["objectId"]),
        // bson's `DateTime`: chrono's takes a time zone argument and is a
        // string without a helper.
        "DateTime" if plain => scalar(&["date"]),
        "Decimal128" if plain => scalar(&["decimal"]),
        "Binary" if bson => scalar(&["binData"]),
        "Timestamp" if bson => scalar(&["timestamp"]),
        "Document" if bson => scalar(&["object"]),
        "HashMap" | "BTreeMap" => scalar(&["object"]),
        _ => None,
    }
}

/// `const FIELDS`: each stored field whose type decides its BSON types.
pub fn expand_fields(input: &Input, p: &Private) -> TokenStream {
    let fields = input
        .fields
        .iter()
        .filter(|f| f.not_stored.is_none() && !f.serialized_with)
        .filter_map(|f| {
            let (t, items) = types(f.ty)?;
            let name = &f.bson_name;
            Some(quote! {
                #p::FieldType { name: #name, types: &[#(#t),*], items: &[#(#items),*] }
            })
        });
    quote! {
        const FIELDS: &'static [#p::FieldType] = &[#(#fields),*];
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use syn::parse_quote;

    fn of(ty: Type) -> Option<(Vec<&'static str>, Vec<&'static str>)> {
        types(&ty)
    }

    #[test]
    fn types_the_struct_decides() {
        assert_eq!(of(parse_quote!(i64)), Some((vec!["int", "long"], vec![])));
        assert_eq!(
            of(parse_quote!(Option<f64>)),
            Some((vec!["double", "int", "long", "null"], vec![]))
        );
        assert_eq!(
            of(parse_quote!(Vec<String>)),
            Some((vec!["array"], vec!["string"]))
        );
        assert_eq!(
            of(parse_quote!(bson::DateTime)),
            Some((vec!["date"], vec![]))
        );
        assert_eq!(of(parse_quote!(Vec<Trade>)), Some((vec!["array"], vec![])));
        // What the type alone does not decide.
        assert_eq!(
            of(parse_quote!(mongodb::bson::Document)),
            Some((vec!["object"], vec![]))
        );
        for ty in [
            parse_quote!(Document),
            parse_quote!(Timestamp),
            parse_quote!(chrono::DateTime<Utc>),
            parse_quote!(Trade),
            parse_quote!(T),
            parse_quote!(Option<Trade>),
            parse_quote!(uuid::Uuid),
        ] {
            assert_eq!(of(ty), None);
        }
    }
}
