//! Code generation. Everything generated names the runtime through absolute
//! `::keiro::__private::…` paths (and `::core::…`), so it works whatever the
//! user's crate has in scope.

mod queue;
mod select;
mod step;
mod workflow;

use proc_macro2::{Span, TokenStream, TokenTree};
use quote::ToTokens;
use syn::Attribute;

use crate::diag;
use crate::model::{Arg, StepFn, WorkflowFn};

/// `#[workflow]`: the expansion, or the original item plus the errors.
pub(crate) fn workflow(args: TokenStream, item: TokenStream) -> TokenStream {
    match WorkflowFn::parse(args, item.clone()) {
        Ok(func) => workflow::expand(&func),
        Err(err) => diag::with_item(crate::check::strip_escape_tokens(item), err),
    }
}

/// `queue!`: the declaration, plus any errors.
pub(crate) fn queue(input: TokenStream) -> TokenStream {
    queue::expand(input)
}

/// `select!`: the expansion, or the errors.
pub(crate) fn select(input: TokenStream) -> TokenStream {
    match crate::select::SelectInput::parse(input) {
        Ok(parsed) => select::expand(&parsed),
        Err(err) => err.to_compile_error(),
    }
}

/// `#[step]`: the expansion, or the original item plus the errors.
pub(crate) fn step(args: TokenStream, item: TokenStream) -> TokenStream {
    match StepFn::parse(args, item.clone()) {
        Ok(func) => step::expand(&func),
        Err(err) => diag::with_item(crate::check::strip_escape_tokens(item), err),
    }
}

/// `#[keiro::nondeterministic_ok]` outside a workflow body: the item
/// unchanged, or an error when given arguments.
pub(crate) fn nondeterministic_ok(args: TokenStream, item: TokenStream) -> TokenStream {
    if args.is_empty() {
        item
    } else {
        diag::with_item(item, crate::check::escape_with_arguments(args))
    }
}

/// The spans of the first and last token of `tokens`: rustc reports an
/// expression whose first token carries the one and last token the other as
/// covering everything between, which is how generated code points at a
/// multi-token type on stable Rust.
fn span_range(tokens: &dyn ToTokens) -> (Span, Span) {
    let mut iter = tokens.to_token_stream().into_iter();
    let first = iter.next().map_or_else(Span::call_site, |tt| tt.span());
    let last = iter.last().map_or(first, |tt| tt.span());
    (first, last)
}

/// The range rustc should report for errors about the arguments as a whole:
/// the one argument's type, or `first: A, .., last: Z`.
fn args_span_range(args: &[Arg]) -> (Span, Span) {
    match args {
        [] => (Span::call_site(), Span::call_site()),
        [only] => span_range(&only.ty),
        [first, .., last] => (first.ident.span(), span_range(&last.ty).1),
    }
}

/// `tokens` with the first top-level token spanned at `start` and the others at
/// `end`, so an error on the expression covers `start..end`.
fn respan((start, end): (Span, Span), tokens: TokenStream) -> TokenStream {
    tokens
        .into_iter()
        .enumerate()
        .map(|(i, mut tt)| {
            let span = if i == 0 { start } else { end };
            if let TokenTree::Group(group) = &mut tt {
                group.set_span(span);
            } else {
                tt.set_span(span);
            }
            tt
        })
        .collect()
}

/// The user's attributes, sorted by the generated item they belong on.
struct SplitAttrs {
    /// Doc comments, `#[deprecated]` and `#[cfg]`: for the public function
    /// (which holds everything else).
    public: Vec<Attribute>,
    /// `#[allow]`, `#[warn]`, `#[deny]`, `#[forbid]`, `#[expect]`.
    lints: Vec<Attribute>,
    /// Everything else (`#[tracing::instrument]`, ...): on the function holding the body.
    rest: Vec<Attribute>,
}

impl SplitAttrs {
    fn new(attrs: &[Attribute]) -> Self {
        let mut split = SplitAttrs {
            public: Vec::new(),
            lints: Vec::new(),
            rest: Vec::new(),
        };
        for attr in attrs {
            let path = attr.path();
            let bucket = if ["doc", "deprecated", "cfg"]
                .iter()
                .any(|name| path.is_ident(name))
            {
                &mut split.public
            } else if ["allow", "warn", "deny", "forbid", "expect"]
                .iter()
                .any(|lint| path.is_ident(lint))
            {
                &mut split.lints
            } else {
                &mut split.rest
            };
            bucket.push(attr.clone());
        }
        split
    }

    /// The lint attributes for a second generated item: `#[expect]` becomes
    /// `#[allow]` there, since only one of the two items can fulfil it.
    fn lints_as_allow(&self) -> Vec<Attribute> {
        self.lints
            .iter()
            .map(|attr| {
                let mut attr = attr.clone();
                if attr.path().is_ident("expect") {
                    if let syn::Meta::List(list) = &mut attr.meta {
                        list.path =
                            syn::Ident::new("allow", list.path.segments[0].ident.span()).into();
                    }
                }
                attr
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use quote::quote;
    use syn::parse_quote;

    #[test]
    fn attributes_are_sorted() {
        let attrs: Vec<Attribute> = vec![
            parse_quote!(#[doc = " Docs."]),
            parse_quote!(#[cfg(feature = "shop")]),
            parse_quote!(#[expect(clippy::too_many_arguments)]),
            parse_quote!(#[deprecated]),
            parse_quote!(#[tracing::instrument]),
        ];
        let split = SplitAttrs::new(&attrs);
        assert_eq!(
            (split.public.len(), split.lints.len(), split.rest.len()),
            (3, 1, 1)
        );
        let allow = &split.lints_as_allow()[0];
        assert_eq!(
            allow.to_token_stream().to_string(),
            "# [allow (clippy :: too_many_arguments)]"
        );
    }

    #[test]
    fn errors_keep_the_original_item() {
        let out = workflow(
            quote!(),
            quote!(
                fn checkout() {}
            ),
        )
        .to_string();
        assert!(out.starts_with("fn checkout () { }"), "{out}");
        assert!(out.contains("compile_error"), "{out}");
        let out = step(
            quote!(max_attempts = 0),
            quote!(
                async fn reserve() {}
            ),
        )
        .to_string();
        assert!(out.starts_with("async fn reserve () { }"), "{out}");
        assert!(out.contains("compile_error"), "{out}");
    }

    #[test]
    fn respan_sets_the_first_and_other_tokens() {
        let tokens = respan((Span::call_site(), Span::call_site()), quote!(&(a, b,)));
        assert_eq!(tokens.to_string(), "& (a , b ,)");
    }
}
