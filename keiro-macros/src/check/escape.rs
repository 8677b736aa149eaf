//! `#[keiro::nondeterministic_ok]`: the attribute that allows, on purpose, a
//! call the workflow-body lints refuse.
//!
//! It goes on a statement, a `let` or an expression inside a `#[workflow]`
//! body. Rust does not accept custom attributes there, so `#[workflow]` and
//! `#[step]` remove every occurrence from the body before the compiler sees
//! it ([`strip`]); the attribute macro of that name is a no-op that only
//! makes the path resolve (and lets it sit on a nested `fn`).

use proc_macro2::TokenStream;
use quote::ToTokens;
use syn::visit_mut::VisitMut;
use syn::{Attribute, Expr, Item, ItemFn, Local, Meta, StmtMacro};

/// The attribute as a user writes it, for messages.
pub(crate) const ESCAPE: &str = "#[keiro::nondeterministic_ok]";

/// The attribute's name: `#[keiro::nondeterministic_ok]`,
/// `#[::keiro::nondeterministic_ok]`, or `#[nondeterministic_ok]` after
/// `use keiro::nondeterministic_ok`.
const NAME: &str = "nondeterministic_ok";

/// Whether `attr` is the escape attribute (with or without arguments; the
/// lints report arguments, see [`misused`]).
pub(crate) fn is_escape(attr: &Attribute) -> bool {
    let segments: Vec<String> = attr
        .path()
        .segments
        .iter()
        .map(|s| s.ident.to_string())
        .collect();
    match segments.as_slice() {
        [name] => name == NAME,
        [krate, name] => krate == "keiro" && name == NAME,
        _ => false,
    }
}

/// Whether one of `attrs` is the escape attribute.
pub(crate) fn escaped(attrs: &[Attribute]) -> bool {
    attrs.iter().any(is_escape)
}

/// The error for an escape attribute written with arguments, which it does
/// not take.
pub(crate) fn misused(attrs: &[Attribute]) -> Option<syn::Error> {
    let attr = attrs
        .iter()
        .find(|attr| is_escape(attr) && !matches!(attr.meta, Meta::Path(_)))?;
    Some(with_arguments(attr))
}

/// The error for the escape attribute given arguments (`tokens`).
pub(crate) fn with_arguments(tokens: impl ToTokens) -> syn::Error {
    crate::diag::error(
        tokens,
        format!(
            "`{ESCAPE}` takes no arguments; write why the code is allowed in a comment next to it"
        ),
    )
}

/// Runs `$body` with `$e` bound to the inner node of every `Expr` variant that
/// has attributes, `$default` for the others.
macro_rules! with_expr_node {
    ($expr:expr, $e:ident => $body:expr, _ => $default:expr) => {
        match $expr {
            Expr::Array($e) => $body,
            Expr::Assign($e) => $body,
            Expr::Async($e) => $body,
            Expr::Await($e) => $body,
            Expr::Binary($e) => $body,
            Expr::Block($e) => $body,
            Expr::Break($e) => $body,
            Expr::Call($e) => $body,
            Expr::Cast($e) => $body,
            Expr::Closure($e) => $body,
            Expr::Const($e) => $body,
            Expr::Continue($e) => $body,
            Expr::Field($e) => $body,
            Expr::ForLoop($e) => $body,
            Expr::Group($e) => $body,
            Expr::If($e) => $body,
            Expr::Index($e) => $body,
            Expr::Infer($e) => $body,
            Expr::Let($e) => $body,
            Expr::Lit($e) => $body,
            Expr::Loop($e) => $body,
            Expr::Macro($e) => $body,
            Expr::Match($e) => $body,
            Expr::MethodCall($e) => $body,
            Expr::Paren($e) => $body,
            Expr::Path($e) => $body,
            Expr::Range($e) => $body,
            Expr::RawAddr($e) => $body,
            Expr::Reference($e) => $body,
            Expr::Repeat($e) => $body,
            Expr::Return($e) => $body,
            Expr::Struct($e) => $body,
            Expr::Try($e) => $body,
            Expr::TryBlock($e) => $body,
            Expr::Tuple($e) => $body,
            Expr::Unary($e) => $body,
            Expr::Unsafe($e) => $body,
            Expr::While($e) => $body,
            Expr::Yield($e) => $body,
            _ => $default,
        }
    };
}

/// The outer attributes of `expr`.
pub(crate) fn expr_attrs(expr: &Expr) -> &[Attribute] {
    with_expr_node!(expr, e => &e.attrs, _ => &[])
}

fn expr_attrs_mut(expr: &mut Expr) -> Option<&mut Vec<Attribute>> {
    with_expr_node!(expr, e => Some(&mut e.attrs), _ => None)
}

/// `func` without any escape attribute in its body, nested items included.
pub(crate) fn strip(func: &mut ItemFn) {
    Stripper.visit_block_mut(&mut func.block);
}

/// [`strip`] on an item not known to be a function (the error path, which
/// re-emits the user's item): unchanged unless it parses as one.
pub(crate) fn strip_tokens(item: TokenStream) -> TokenStream {
    match syn::parse2::<Item>(item.clone()) {
        Ok(Item::Fn(mut func)) => {
            strip(&mut func);
            func.into_token_stream()
        }
        _ => item,
    }
}

struct Stripper;

impl VisitMut for Stripper {
    fn visit_expr_mut(&mut self, expr: &mut Expr) {
        if let Some(attrs) = expr_attrs_mut(expr) {
            attrs.retain(|attr| !is_escape(attr));
        }
        syn::visit_mut::visit_expr_mut(self, expr);
    }

    fn visit_local_mut(&mut self, local: &mut Local) {
        local.attrs.retain(|attr| !is_escape(attr));
        syn::visit_mut::visit_local_mut(self, local);
    }

    fn visit_stmt_macro_mut(&mut self, mac: &mut StmtMacro) {
        mac.attrs.retain(|attr| !is_escape(attr));
        syn::visit_mut::visit_stmt_macro_mut(self, mac);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use quote::quote;
    use syn::parse_quote;

    #[test]
    fn every_spelling_is_recognised() {
        let attrs: Vec<Attribute> = vec![
            parse_quote!(#[keiro::nondeterministic_ok]),
            parse_quote!(#[::keiro::nondeterministic_ok]),
            parse_quote!(#[nondeterministic_ok]),
        ];
        assert!(attrs.iter().all(is_escape));
        let other: Attribute = parse_quote!(#[other::nondeterministic_ok]);
        assert!(!is_escape(&other));
        let with_args: Attribute = parse_quote!(#[keiro::nondeterministic_ok("why")]);
        assert!(misused(&[with_args]).is_some());
        assert!(misused(&attrs).is_none());
    }

    #[test]
    fn strip_removes_it_everywhere_and_keeps_other_attributes() {
        let out = strip_tokens(quote! {
            async fn f() {
                #[keiro::nondeterministic_ok]
                let a = std::time::Instant::now();
                #[keiro::nondeterministic_ok]
                tokio::select! { _ = x => {} }
                let b = #[keiro::nondeterministic_ok] rand::random::<u8>();
                #[allow(unused)]
                let c = async { #[nondeterministic_ok] tokio::time::sleep(d).await };
            }
        })
        .to_string();
        assert!(!out.contains("nondeterministic_ok"), "{out}");
        assert!(out.contains("# [allow (unused)]"), "{out}");
        let not_fn = quote!(
            struct S;
        );
        assert_eq!(strip_tokens(not_fn.clone()).to_string(), not_fn.to_string());
    }
}
