//! The BSON types each stored field takes, as the struct's Rust types say
//! and serde stores them: `Model::FIELDS`, from which the runtime builds
//! the `$jsonSchema` a validator enforces, and `Model::nested`, the fields
//! whose type the derive cannot see through (a nested struct, an enum, an
//! alias), asked at run time whether they implement `Schema`; and
//! `#[derive(Schema)]` itself. A field serialized by a helper (`with`),
//! or whose type names a generic parameter, is left open.

use proc_macro2::{Ident, Span, TokenStream};
use quote::quote;
use syn::{GenericArgument, PathArguments, Type};

use crate::ast::Input;
use crate::ctxt::Ctxt;
use crate::private::Private;
use crate::serde_rules::RenameRule;

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

/// How a field holds a type the derive cannot see through, outermost
/// first: `Option<Vec<Fill>>` is `[Option, Seq]` around `Fill`. `None`
/// for a type the derive types itself, or one that names a generic
/// parameter of the struct (its impl of `Schema` is not known there).
fn nested<'t>(ty: &'t Type, generics: &[&Ident]) -> Option<(Vec<&'static str>, &'t Type)> {
    let mut wraps = Vec::new();
    let mut ty = ty;
    loop {
        let Type::Path(path) = ty else {
            return None;
        };
        if path.qself.is_some() {
            return None;
        }
        let last = path.path.segments.last()?;
        let arg = match &last.arguments {
            PathArguments::AngleBracketed(a) => a.args.iter().find_map(|g| match g {
                GenericArgument::Type(t) => Some(t),
                _ => None,
            }),
            _ => None,
        };
        let wrap = match last.ident.to_string().as_str() {
            "Option" => Some("Option"),
            "Vec" | "VecDeque" | "HashSet" | "BTreeSet" => Some("Seq"),
            "Box" | "Arc" | "Rc" => None,
            _ => {
                let plain = path.path.segments.iter().all(|s| s.arguments.is_none());
                let generic =
                    path.path.segments.len() == 1 && generics.iter().any(|g| last.ident == **g);
                return (plain && !generic && types(ty).is_none()).then_some((wraps, ty));
            }
        };
        wraps.extend(wrap);
        ty = arg?;
    }
}

/// `fn nested()`: each stored field whose type the derive cannot see
/// through, asked at run time whether it implements `Schema`.
pub fn expand_nested(input: &Input, generics: &syn::Generics, p: &Private) -> TokenStream {
    let params: Vec<&Ident> = generics.type_params().map(|t| &t.ident).collect();
    let probes: Vec<TokenStream> = input
        .fields
        .iter()
        .filter(|f| f.not_stored.is_none() && !f.serialized_with)
        .filter_map(|f| {
            let (wraps, ty) = nested(f.ty, &params)?;
            let name = &f.bson_name;
            let wraps = wraps.iter().map(|w| Ident::new(w, Span::call_site()));
            Some(quote! {
                if let #p::core::option::Option::Some(s) =
                    (&&#p::probe::Probe::<#ty>::new()).schema()
                {
                    out.push(#p::Nested::new(#name, s, &[#(#p::Wrap::#wraps),*]));
                }
            })
        })
        .collect();
    if probes.is_empty() {
        return TokenStream::new();
    }
    quote! {
        fn nested() -> #p::Vec<#p::Nested> {
            #[allow(unused_imports)]
            use #p::probe::{ViaNothing as _, ViaSchema as _};
            let mut out = #p::Vec::new();
            #(#probes)*
            out
        }
    }
}

/// `#[derive(Schema)]`: a struct with named fields is an object of its
/// fields' types; an enum, the names serde stores its unit variants
/// under and each other variant's shape under its tagging.
pub fn derive_schema(input: &syn::DeriveInput) -> TokenStream {
    let cx = Ctxt::new();
    let quiet = Ctxt::new();
    let p = crate::model::parse(&quiet, input).private;
    let _ = quiet.check();
    let ident = &input.ident;
    let (impl_g, ty_g, where_g) = input.generics.split_for_impl();
    let body = match &input.data {
        syn::Data::Enum(e) => enum_schema(&cx, input, e, &p),
        _ => Input::parse(&cx, input, "Schema").map(|ast| {
            let fields = fields_list(&ast, &p);
            let nested = expand_nested(&ast, &input.generics, &p);
            let (nested, call) = match nested.is_empty() {
                true => (nested, quote!(#p::Vec::new())),
                false => (
                    quote!(struct Fields; impl Fields { #nested }),
                    quote!(Fields::nested()),
                ),
            };
            quote! {
                #nested
                #p::object_schema(&[#(#fields),*], &#call)
            }
        }),
    };
    if let Some(errors) = cx.into_compile_errors() {
        return errors;
    }
    let Some(body) = body else {
        return TokenStream::new();
    };
    quote! {
        #[automatically_derived]
        impl #impl_g #p::Schema for #ident #ty_g #where_g {
            fn schema() -> #p::Document {
                #body
            }
        }
    }
}

/// An enum's schema: the names its unit variants are stored under, and
/// the shape of each variant with data under the enum's tagging.
fn enum_schema(
    cx: &Ctxt,
    input: &syn::DeriveInput,
    e: &syn::DataEnum,
    p: &Private,
) -> Option<TokenStream> {
    use crate::serde_rules::{variant_name, variant_untagged, Tagging};
    let tagging = crate::serde_rules::enum_tagging(input);
    let rule = crate::serde_rules::container_rule(cx, input);
    let (mut names, mut shapes) = (Vec::new(), Vec::new());
    for v in &e.variants {
        let Some(name) = variant_name(v, rule) else {
            continue;
        };
        let content = variant_content(cx, input, v, p);
        let some = |c: &Option<TokenStream>| match c {
            Some(c) => quote!(#p::core::option::Option::Some(#c)),
            None => quote!(#p::core::option::Option::None),
        };
        let tagging = match variant_untagged(v) {
            true => &Tagging::Untagged,
            false => &tagging,
        };
        let shape = match (tagging, content) {
            (Tagging::Untagged, c) => c.unwrap_or_else(|| quote!(#p::variant::null())),
            (Tagging::External, None) => {
                names.push(name);
                continue;
            }
            (Tagging::External, Some(c)) => quote!(#p::variant::external(#name, #c)),
            (Tagging::Internal { tag }, c) => {
                let c = some(&c);
                quote!(#p::variant::internal(#tag, #name, #c))
            }
            (Tagging::Adjacent { tag, content }, c) => {
                let c = some(&c);
                quote!(#p::variant::adjacent(#tag, #content, #name, #c))
            }
        };
        shapes.push(shape);
    }
    Some(quote! {
        #[allow(unused_imports)]
        use #p::probe::{ViaNothing as _, ViaSchema as _};
        let mut shapes = #p::Vec::<#p::Document>::new();
        #( shapes.push(#shapes); )*
        #p::variant::any_of(&[#(#names),*], shapes)
    })
}

/// What variant `v` stores besides its name, as a `Document` expression;
/// `None` for a unit variant. A newtype's content is its field's schema
/// (open when the derive cannot see through it), a tuple's an array of
/// its length, a struct variant's an object of its fields (named by the
/// variant's `rename_all`, else the enum's `rename_all_fields`).
fn variant_content(
    cx: &Ctxt,
    input: &syn::DeriveInput,
    v: &syn::Variant,
    p: &Private,
) -> Option<TokenStream> {
    let open = quote!(#p::Document::new());
    match &v.fields {
        syn::Fields::Unit => None,
        syn::Fields::Unnamed(f) if f.unnamed.len() == 1 => {
            let field = &f.unnamed[0];
            let stored = crate::serde_rules::stored(field, "0", RenameRule::None);
            let params: Vec<&Ident> = input.generics.type_params().map(|t| &t.ident).collect();
            if stored.serialized_with {
                return Some(open);
            }
            if let Some((t, items)) = types(&field.ty) {
                return Some(quote!(#p::variant::value(&[#(#t),*], &[#(#items),*])));
            }
            let Some((wraps, ty)) = nested(&field.ty, &params) else {
                return Some(open);
            };
            let wraps = wraps.iter().map(|w| Ident::new(w, Span::call_site()));
            Some(quote! {
                match (&&#p::probe::Probe::<#ty>::new()).schema() {
                    #p::core::option::Option::Some(s) => {
                        #p::Nested::new("", s, &[#(#p::Wrap::#wraps),*]).schema
                    }
                    #p::core::option::Option::None => #open,
                }
            })
        }
        syn::Fields::Unnamed(f) => {
            let len = f.unnamed.len();
            Some(quote!(#p::variant::tuple(#len)))
        }
        syn::Fields::Named(fields) => {
            let serde: Vec<&syn::Attribute> = v
                .attrs
                .iter()
                .filter(|a| a.path().is_ident("serde"))
                .collect();
            // The enum's `rename_all_fields` first: a `rename_all` of the
            // variant's own comes after it and wins.
            let fields_rule = crate::serde_rules::rename_all_fields(input)
                .map(|lit| quote!(#[serde(rename_all = #lit)]));
            let generics = &input.generics;
            let synth: syn::DeriveInput =
                syn::parse_quote!(#fields_rule #(#serde)* struct Variant #generics #fields);
            let ast = Input::parse(cx, &synth, "Schema")?;
            let list = fields_list(&ast, p);
            let nested = expand_nested(&ast, generics, p);
            Some(match nested.is_empty() {
                true => quote!(#p::object_schema(&[#(#list),*], &[])),
                false => quote! {{
                    struct Fields;
                    impl Fields { #nested }
                    #p::object_schema(&[#(#list),*], &Fields::nested())
                }},
            })
        }
    }
}

/// Each stored field whose type decides its BSON types, as a
/// `FieldType` expression.
fn fields_list(input: &Input, p: &Private) -> Vec<TokenStream> {
    input
        .fields
        .iter()
        .filter(|f| f.not_stored.is_none() && !f.serialized_with)
        .filter_map(|f| {
            let (t, items) = types(f.ty)?;
            let name = &f.bson_name;
            Some(quote! {
                #p::FieldType { name: #name, types: &[#(#t),*], items: &[#(#items),*] }
            })
        })
        .collect()
}

/// `const FIELDS`: each stored field whose type decides its BSON types.
pub fn expand_fields(input: &Input, p: &Private) -> TokenStream {
    let fields = fields_list(input, p);
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
