//! The one path generated code names the runtime by: `__private` of the
//! `mongo_patterns` crate, or of the crate `#[model(crate = "...")]` names,
//! so that a renamed dependency or a facade crate still works.

use proc_macro2::TokenStream;
use quote::{quote, ToTokens};
use syn::Path;

/// Expands to `::mongo_patterns::__private`, or `<crate>::__private`.
#[derive(Clone, Default)]
pub struct Private {
    krate: Option<Path>,
}

impl Private {
    pub fn new(krate: Option<Path>) -> Self {
        Private { krate }
    }
}

impl ToTokens for Private {
    fn to_tokens(&self, tokens: &mut TokenStream) {
        match &self.krate {
            Some(krate) => tokens.extend(quote!(#krate::__private)),
            None => tokens.extend(quote!(::mongo_patterns::__private)),
        }
    }
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
