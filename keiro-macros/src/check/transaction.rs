//! The first argument of a `#[step(transaction)]`: `&mut keiro::Transaction<'_>`,
//! which keiro passes in, so the call site passes only the others.

use quote::quote;
use syn::{FnArg, GenericArgument, Pat, PatIdent, PathArguments, Signature, Type};

use crate::args::TRANSACTION;
use crate::diag::error;
use crate::model::Arg;

/// What the attribute wants as the first argument, for messages.
const EXPECTED: &str = "tx: &mut keiro::Transaction<'_>";

/// Splits the transaction argument off `sig`: returns it and the signature
/// of the other arguments, which go through the ordinary checks. `flagged`
/// says whether the step asks for `transaction` (`None` when its attribute
/// arguments are invalid: then only what looks like a transaction is split
/// off, so no follow-on error is reported). A missing or wrong first
/// argument, or a transaction on a step without `transaction`, is an error at
/// the user's tokens saying how to fix it.
pub(crate) fn split(
    sig: &Signature,
    flagged: Option<bool>,
) -> (syn::Result<Option<Arg>>, Signature) {
    let first = sig.inputs.first().and_then(|input| match input {
        FnArg::Typed(typed) => Some((typed, shape(&typed.ty)?)),
        FnArg::Receiver(_) => None,
    });
    // A transaction after the first argument: misplaced, or a second one.
    // Split off too, so the rule that arguments are owned adds no advice
    // of its own on it.
    let later: Vec<&syn::PatType> = sig
        .inputs
        .iter()
        .skip(1)
        .filter_map(|input| match input {
            FnArg::Typed(typed) if shape(&typed.ty).is_some() => Some(typed),
            _ => None,
        })
        .collect();
    let mut rest = sig.clone();
    rest.inputs = sig
        .inputs
        .iter()
        .enumerate()
        .filter(|(at, input)| {
            let split_off = match input {
                FnArg::Typed(typed) => {
                    (*at == 0 && first.is_some()) || later.iter().any(|t| std::ptr::eq(*t, typed))
                }
                FnArg::Receiver(_) => false,
            };
            !split_off
        })
        .map(|(_, input)| input.clone())
        .collect();
    let arg = split_first(sig, first, flagged);
    let Some(misplaced) = later.first() else {
        return (arg, rest);
    };
    let message = match (first.is_some(), flagged) {
        // Invalid attribute arguments: no follow-on error.
        (_, None) => return (arg, rest),
        (true, _) => {
            "a `#[step]` has one transaction, its first argument; remove this one".to_owned()
        }
        (false, Some(true)) => format!(
            "`#[step({TRANSACTION})]` passes the transaction as the step's first argument; \
             move `{EXPECTED}` to the front"
        ),
        (false, Some(false)) => format!(
            "a `#[step]` taking a `keiro::Transaction` runs in a transaction on keiro's \
             database, which the attribute must ask for; add `{TRANSACTION}`: \
             `#[step({TRANSACTION})]`, and take it as the first argument, `{EXPECTED}`"
        ),
    };
    let misplaced = error(misplaced, message);
    let arg = match arg {
        // A flagged step with no transaction first: the misplaced one is
        // the whole story.
        Err(_) if first.is_none() => Err(misplaced),
        Err(mut error) => {
            error.combine(misplaced);
            Err(error)
        }
        Ok(_) => Err(misplaced),
    };
    (arg, rest)
}

/// The transaction argument per the first argument (`first`: it, with its
/// shape, when it names a `Transaction`), or the error saying how to fix it.
fn split_first(
    sig: &Signature,
    first: Option<(&syn::PatType, Shape)>,
    flagged: Option<bool>,
) -> syn::Result<Option<Arg>> {
    let wanted = format!(
        "`#[step({TRANSACTION})]` passes the step a transaction on keiro's database as its \
         first argument; make the first argument `{EXPECTED}` (the call site passes only the \
         others)"
    );
    let arg = match (first, flagged) {
        (Some((typed, Shape::MutRef)), Some(true)) => match &*typed.pat {
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
        (Some((typed, Shape::Other)), Some(true)) => Err(error(typed, wanted)),
        (Some((typed, _)), Some(false)) => Err(error(
            &typed.ty,
            format!(
                "a `#[step]` taking a `keiro::Transaction` runs in a transaction on keiro's \
                 database, which the attribute must ask for; add `{TRANSACTION}`: \
                 `#[step({TRANSACTION})]`, and take it as `{EXPECTED}`"
            ),
        )),
        (Some(_), None) => Ok(None),
        (None, Some(true)) => Err(match sig.inputs.first() {
            Some(input) => error(input, wanted),
            None => {
                let (ident, parens) = (&sig.ident, &sig.paren_token);
                let mut group = proc_macro2::Group::new(
                    proc_macro2::Delimiter::Parenthesis,
                    proc_macro2::TokenStream::new(),
                );
                group.set_span(parens.span.join());
                error(quote!(#ident #group), wanted)
            }
        }),
        (None, _) => Ok(None),
    };
    arg
}

/// How an argument's type names a `Transaction`.
#[derive(Clone, Copy)]
enum Shape {
    /// `&mut Transaction<'_>`: what `#[step(transaction)]` takes.
    MutRef,
    /// `Transaction` by value, behind `&`, or in a `Box`: a mistake.
    Other,
}

/// How `ty` names a `Transaction` (through any path, with or without its
/// lifetime argument), if it does.
fn shape(ty: &Type) -> Option<Shape> {
    match ty {
        Type::Reference(reference) => {
            let named = names_transaction(&reference.elem);
            match reference.mutability {
                Some(_) if named => Some(Shape::MutRef),
                _ if named => Some(Shape::Other),
                _ => None,
            }
        }
        ty if names_transaction(ty) => Some(Shape::Other),
        _ => None,
    }
}

/// Whether `ty` is a path to `Transaction` with at most a lifetime argument.
fn names_transaction(ty: &Type) -> bool {
    let Type::Path(path) = ty else {
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

    fn split_of(sig: Signature, flagged: Option<bool>) -> (Result<Option<String>, String>, usize) {
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
            assert_eq!(split_of(sig, Some(true)), (Ok(Some("tx".to_owned())), 1));
        }
    }

    #[test]
    fn a_step_without_the_flag_keeps_its_arguments() {
        let sig: Signature = parse_quote!(async fn f(a: String));
        assert_eq!(split_of(sig, Some(false)), (Ok(None), 1));
    }

    #[test]
    fn a_missing_transaction_is_refused_with_a_fix() {
        // A transaction of the wrong shape is split off: no second error.
        for (sig, rest_len) in [
            (parse_quote!(async fn debit(account: i64)), 1),
            (parse_quote!(async fn debit()), 0),
            (parse_quote!(async fn debit(tx: &keiro::Transaction<'_>)), 0),
            (parse_quote!(async fn debit(tx: keiro::Transaction<'_>)), 0),
        ] {
            let (arg, rest) = split_of(sig, Some(true));
            assert_eq!(rest, rest_len);
            assert!(
                arg.as_ref().is_err_and(
                    |e| e.contains("make the first argument `tx: &mut keiro::Transaction<'_>`")
                ),
                "{arg:?}"
            );
        }
    }

    #[test]
    fn a_transaction_without_the_flag_asks_for_it() {
        let sig: Signature = parse_quote!(async fn debit(tx: &mut Transaction<'_>, n: i64));
        let (arg, rest) = split_of(sig.clone(), Some(false));
        assert!(arg.is_err_and(|e| e.contains("add `transaction`")));
        assert_eq!(rest, 1);
        // Invalid attribute arguments: split off without a second error.
        assert_eq!(split_of(sig, None), (Ok(None), 1));
    }

    #[test]
    fn a_transaction_after_the_first_argument_is_split_off_with_one_error() {
        for (sig, flagged, says, rest_len) in [
            (
                parse_quote!(async fn debit(n: i64, tx: &mut Transaction<'_>)),
                Some(true),
                "move `tx: &mut keiro::Transaction<'_>` to the front",
                1,
            ),
            (
                parse_quote!(async fn debit(tx: &mut Transaction<'_>, b: &mut Transaction<'_>)),
                Some(true),
                "remove this one",
                0,
            ),
            (
                parse_quote!(async fn debit(n: i64, tx: &mut Transaction<'_>)),
                Some(false),
                "add `transaction`",
                1,
            ),
        ] {
            let (arg, rest) = split_of(sig, flagged);
            assert_eq!(rest, rest_len);
            let error = arg.unwrap_err();
            assert!(error.contains(says), "{error}");
            assert!(!error.contains("make the first argument"), "{error}");
        }
        // Invalid attribute arguments: split off without an error.
        let sig: Signature = parse_quote!(async fn debit(n: i64, tx: &mut Transaction<'_>));
        assert_eq!(split_of(sig, None), (Ok(None), 1));
    }
}
