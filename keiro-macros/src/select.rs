//! `keiro::select!`: the parsed form. Each branch is
//! `<pattern> = <keiro future> => <handler>`, separated by commas (optional
//! after a block handler), like `tokio::select!`.

use proc_macro2::{Span, TokenStream};
use syn::parse::{Parse, ParseStream};
use syn::{Expr, Pat, Token};

use crate::diag;

/// One branch: `pat = future => handler`.
pub(crate) struct Branch {
    pub(crate) pat: Pat,
    pub(crate) future: Expr,
    pub(crate) handler: Expr,
}

/// The whole `select!` input.
pub(crate) struct SelectInput {
    pub(crate) branches: Vec<Branch>,
}

/// What one branch looks like, for the errors.
const SHAPE: &str = "`<pattern> = <keiro future> => <handler>,` \
                     (e.g. `v = some_step(a) => v,`)";

impl SelectInput {
    /// Parses the macro's input.
    pub(crate) fn parse(input: TokenStream) -> syn::Result<SelectInput> {
        let parsed: SelectInput = syn::parse2(input)?;
        if parsed.branches.is_empty() {
            return Err(syn::Error::new(
                Span::call_site(),
                format!("`keiro::select!` needs at least one branch: {SHAPE}"),
            ));
        }
        Ok(parsed)
    }
}

impl Parse for SelectInput {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        let mut branches = Vec::new();
        while !input.is_empty() {
            if input.peek(Token![else]) {
                let token: Token![else] = input.parse()?;
                return Err(diag::error(
                    token,
                    "`keiro::select!` has no `else` branch: a durable select always has a \
                     winner, so remove it (race a `keiro::sleep` to bound the wait)",
                ));
            }
            let pat = Pat::parse_single(input).map_err(|e| shape(e, "a pattern"))?;
            input
                .parse::<Token![=]>()
                .map_err(|e| shape(e, "`=` after the pattern"))?;
            let future = Expr::parse_without_eager_brace(input)
                .map_err(|e| shape(e, "a keiro future after `=`"))?;
            input
                .parse::<Token![=>]>()
                .map_err(|e| shape(e, "`=>` after the future"))?;
            let handler: Expr = input
                .parse()
                .map_err(|e| shape(e, "a handler after `=>`"))?;
            let block = matches!(handler, Expr::Block(_));
            branches.push(Branch {
                pat,
                future,
                handler,
            });
            if input.is_empty() {
                break;
            }
            if block {
                let _ = input.parse::<Option<Token![,]>>()?;
            } else {
                input
                    .parse::<Token![,]>()
                    .map_err(|e| shape(e, "`,` between branches"))?;
            }
        }
        Ok(SelectInput { branches })
    }
}

/// `error` at its own place, saying what a branch looks like.
fn shape(error: syn::Error, expected: &str) -> syn::Error {
    syn::Error::new(
        error.span(),
        format!("malformed `keiro::select!` branch: expected {expected}; each branch is {SHAPE}"),
    )
}

#[cfg(test)]
mod tests {
    use quote::quote;

    use super::SelectInput;

    #[test]
    fn branches_with_and_without_blocks_parse() {
        let input = quote! {
            v = step_a(1) => { v + 1 }
            _ = keiro::sleep(d) => 0,
            Ok(m) = keiro::recv::<u32>("t") => m
        };
        let parsed = SelectInput::parse(input).unwrap();
        assert_eq!(parsed.branches.len(), 3);
    }

    #[test]
    fn an_empty_select_or_else_is_refused() {
        let empty = SelectInput::parse(quote!()).err().unwrap().to_string();
        assert!(empty.contains("at least one branch"), "{empty}");
        let input = quote!(v = a() => v, else => 0);
        let with_else = SelectInput::parse(input).err().unwrap().to_string();
        assert!(with_else.contains("no `else` branch"), "{with_else}");
    }

    #[test]
    fn a_missing_arrow_says_what_a_branch_looks_like() {
        let error = SelectInput::parse(quote!(v = a() v))
            .err()
            .unwrap()
            .to_string();
        assert!(error.contains("expected `=>` after the future"), "{error}");
    }
}
