//! The one path generated code names the runtime by: `__private` of the
//! `mongo_patterns` crate, or of the crate `#[model(crate = "...")]` names,
//! so that a renamed dependency or a facade crate still works.

use proc_macro2::{Group, Span, TokenStream, TokenTree};
use quote::{quote, ToTokens};
use syn::Path;

/// Expands to `::mongo_patterns::__private`, or `<crate>::__private`.
#[derive(Clone, Default)]
pub struct Private {
    krate: Option<Path>,
    /// Where the path points, for code spanned at a user's field: an error
    /// there (a failed const assertion) then points at the field too.
    span: Option<Span>,
}

impl Private {
    pub fn new(krate: Option<Path>) -> Self {
        Private { krate, span: None }
    }

    /// The same path, spanned at `span`.
    pub fn at(&self, span: Span) -> Self {
        Private {
            krate: self.krate.clone(),
            span: Some(span),
        }
    }
}

impl ToTokens for Private {
    fn to_tokens(&self, tokens: &mut TokenStream) {
        let path = match &self.krate {
            Some(krate) => quote!(#krate::__private),
            None => quote!(::mongo_patterns::__private),
        };
        match self.span {
            Some(span) => tokens.extend(respan(path, span)),
            None => tokens.extend(path),
        }
    }
}

fn respan(tokens: TokenStream, span: Span) -> TokenStream {
    tokens
        .into_iter()
        .map(|mut tt| {
            if let TokenTree::Group(g) = &tt {
                let mut inner = Group::new(g.delimiter(), respan(g.stream(), span));
                inner.set_span(span);
                tt = TokenTree::Group(inner);
            } else {
                tt.set_span(span);
            }
            tt
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use syn::parse_quote;

    #[test]
    fn default_and_override() {
        let p = Private::default();
        assert_eq!(
            quote!(#p::Model).to_string(),
            ":: mongo_patterns :: __private :: Model"
        );
        let p = Private::new(Some(parse_quote!(crate::facade)));
        assert_eq!(
            quote!(#p::Model).to_string(),
            "crate :: facade :: __private :: Model"
        );
    }
}
