//! The first argument of a `#[step(transaction)]`: `&mut keiro::Transaction<'_>`,
//! which keiro passes in, so the call site passes only the others.

use quote::quote;
use syn::{FnArg, GenericArgument, Pat, PatIdent, PathArguments, Signature, Type};

use crate::args::TRANSACTION;
use crate::diag::error;
use crate::model::Arg;

/// What the attribute wants as the first argument, for messages.
const EXPECTED: &str = "tx: &mut keiro::Transaction<'_>";

/// Splits the transaction argument off `sig` when `flagged` (the step says
/// `transaction`): returns it and the signature of the other arguments, which
/// go through the ordinary checks. A missing or wrong first argument, or one
/// that is a transaction on a step without `transaction`, is an error at the
/// user's tokens saying how to fix it.
pub(crate) fn split(sig: &Signature, flagged: bool) -> (syn::Result<Option<Arg>>, Signature) {
    let first = sig.inputs.first().and_then(|input| match input {
        FnArg::Typed(typed) if is_transaction(&typed.ty) => Some(typed),
        _ => None,
    });
    let mut rest = sig.clone();
    if first.is_some() {
        rest.inputs = sig.inputs.iter().skip(1).cloned().collect();
    }
    let arg = match (first, flagged) {
        (Some(typed), true) => match &*typed.pat {
            Pat::Ident(PatIdent {
                by_ref: None,
                subpat: None,
                ident,
                ..
            }) => Ok(Some(Arg {
                ident: ident.clone(),
                ty: typed.ty.clone(),
            })),
            pat => Err(error(
                pat,
                format!(
                    "the transaction of a `#[step({TRANSACTION})]` must be a plain name; \
                     write `{EXPECTED}`"
                ),
            )),
        },
        (Some(typed), false) => Err(error(
            &typed.ty,
            format!(
                "a `#[step]` taking `&mut keiro::Transaction<'_>` runs in a transaction on \
                 keiro's database, which the attribute must ask for; add `{TRANSACTION}`: \
                 `#[step({TRANSACTION})]`"
            ),
        )),
        (None, true) => {
            let message = format!(
                "`#[step({TRANSACTION})]` passes the step a transaction on keiro's database as \
                 its first argument; make the first argument `{EXPECTED}` (the call site passes \
                 only the others)"
            );
            Err(match sig.inputs.first() {
                Some(input) => error(input, message),
                None => {
                    let (ident, parens) = (&sig.ident, &sig.paren_token);
                    let mut group = proc_macro2::Group::new(
                        proc_macro2::Delimiter::Parenthesis,
                        proc_macro2::TokenStream::new(),
                    );
                    group.set_span(parens.span.join());
                    error(quote!(#ident #group), message)
                }
            })
        }
        (None, false) => Ok(None),
    };
    (arg, rest)
}

/// Whether `ty` is `&mut Transaction` (through any path, with or without
/// its lifetime argument).
fn is_transaction(ty: &Type) -> bool {
    let Type::Reference(reference) = ty else {
        return false;
    };
    if reference.mutability.is_none() {
        return false;
    }
    let Type::Path(path) = &*reference.elem else {
        return false;
    };
    let Some(last) = path.path.segments.last() else {
        return false;
    };
    if path.qself.is_some() || last.ident != "Transaction" {
        return false;
    }
    match &last.arguments {
        PathArguments::None => true,
        PathArguments::AngleBracketed(args) => {
            args.args.len() == 1 && matches!(args.args[0], GenericArgument::Lifetime(_))
        }
        PathArguments::Parenthesized(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use syn::parse_quote;

    fn split_of(sig: Signature, flagged: bool) -> (Result<Option<String>, String>, usize) {
        let (arg, rest) = split(&sig, flagged);
        let arg = arg
            .map(|a| a.map(|a| a.ident.to_string()))
            .map_err(|e| e.to_string());
        (arg, rest.inputs.len())
    }

    #[test]
    fn the_transaction_is_split_off() {
        for sig in [
            parse_quote!(async fn debit(tx: &mut keiro::Transaction<'_>, account: i64)),
            parse_quote!(async fn debit(tx: &mut Transaction, account: i64)),
            parse_quote!(async fn debit(mut tx: &mut ::keiro::Transaction<'static>, account: i64)),
        ] {
            assert_eq!(split_of(sig, true), (Ok(Some("tx".to_owned())), 1));
        }
    }

    #[test]
    fn a_step_without_the_flag_keeps_its_arguments() {
        let sig: Signature = parse_quote!(async fn f(a: String));
        assert_eq!(split_of(sig, false), (Ok(None), 1));
    }

    #[test]
    fn a_missing_transaction_is_refused_with_a_fix() {
        for sig in [
            parse_quote!(async fn debit(account: i64)),
            parse_quote!(async fn debit()),
            parse_quote!(async fn debit(tx: &keiro::Transaction<'_>)),
            parse_quote!(async fn debit(tx: keiro::Transaction<'_>)),
        ] {
            let (arg, _) = split_of(sig, true);
            assert!(
                arg.as_ref().is_err_and(|e| e.contains("make the first argument `tx: &mut keiro::Transaction<'_>`")),
                "{arg:?}"
            );
        }
    }

    #[test]
    fn a_transaction_without_the_flag_asks_for_it() {
        let sig: Signature = parse_quote!(async fn debit(tx: &mut Transaction<'_>, n: i64));
        let (arg, rest) = split_of(sig, false);
        assert!(arg.is_err_and(|e| e.contains("add `transaction`")));
        assert_eq!(rest, 1);
    }
}
