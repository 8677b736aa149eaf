//! How the macros build and report errors, shared by parsing, checking and
//! expansion (serde_derive's `Ctxt`, in one small file so those stages do not
//! import each other).
//!
//! Every error is spanned at the user's own tokens and says how to fix the
//! code; [`Errors`] and [`join`] keep going after the first problem so one
//! compile lists them all; [`with_item`] emits them next to the user's item.

use std::fmt::Display;

use proc_macro2::TokenStream;
use quote::{quote, ToTokens};

/// An error underlining `tokens` (the first to the last token) with `message`.
pub(crate) fn error(tokens: impl ToTokens, message: impl Display) -> syn::Error {
    syn::Error::new_spanned(tokens, message)
}

/// Collects errors so one expansion reports all of them.
#[derive(Default)]
pub(crate) struct Errors {
    error: Option<syn::Error>,
}

impl Errors {
    /// Adds `error` after the ones already collected.
    pub(crate) fn push(&mut self, error: syn::Error) {
        match &mut self.error {
            Some(existing) => existing.combine(error),
            None => self.error = Some(error),
        }
    }

    /// Adds an error underlining `tokens` with `message` (see [`error`]).
    pub(crate) fn spanned(&mut self, tokens: impl ToTokens, message: impl Display) {
        self.push(error(tokens, message));
    }

    /// `Ok` when nothing was collected, else every error together.
    pub(crate) fn finish(self) -> syn::Result<()> {
        match self.error {
            Some(error) => Err(error),
            None => Ok(()),
        }
    }
}

/// Both values, or every error of either.
pub(crate) fn join<A, B>(a: syn::Result<A>, b: syn::Result<B>) -> syn::Result<(A, B)> {
    match (a, b) {
        (Ok(a), Ok(b)) => Ok((a, b)),
        (Err(mut a), Err(b)) => {
            a.combine(b);
            Err(a)
        }
        (Err(e), Ok(_)) | (Ok(_), Err(e)) => Err(e),
    }
}

/// The user's item unchanged plus the errors, so the item still exists (no
/// follow-on "cannot find function" errors, and IDEs keep working).
pub(crate) fn with_item(item: TokenStream, err: syn::Error) -> TokenStream {
    let errors = err.into_compile_error();
    quote!(#item #errors)
}

/// `a::b` for a path, as a message names it: without the spaces
/// `to_token_stream().to_string()` puts in, with a leading `::` if written.
pub(crate) fn path_text(path: &syn::Path) -> String {
    let segments = path
        .segments
        .iter()
        .map(|segment| segment.ident.to_string())
        .collect::<Vec<_>>()
        .join("::");
    if path.leading_colon.is_some() {
        format!("::{segments}")
    } else {
        segments
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use syn::parse_quote;

    #[test]
    fn errors_are_reported_together() {
        let mut errors = Errors::default();
        assert!(Errors::default().finish().is_ok());
        errors.spanned(quote!(a), "first");
        errors.push(error(quote!(b), "second"));
        let messages: Vec<String> = errors
            .finish()
            .unwrap_err()
            .into_iter()
            .map(|e| e.to_string())
            .collect();
        assert_eq!(messages, ["first", "second"]);
        let both = join::<(), ()>(Err(error(quote!(a), "x")), Err(error(quote!(b), "y")));
        assert_eq!(both.unwrap_err().into_iter().count(), 2);
    }

    #[test]
    fn paths_read_as_written() {
        assert_eq!(path_text(&parse_quote!(tokio::spawn)), "tokio::spawn");
        assert_eq!(path_text(&parse_quote!(::std::thread)), "::std::thread");
    }
}
