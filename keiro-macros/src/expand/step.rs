//! `#[step]` expansion: a synchronous function that hands the body to the
//! runtime, which allocates the step's sequence number at the call (so `join!`
//! of several steps is deterministic) and journals or replays its result.

use proc_macro2::{Literal, Span, TokenStream};
use quote::{format_ident, quote, quote_spanned};
use syn::spanned::Spanned;

use super::{respan, span_range};
use crate::model::{Arg, StepFn};

pub(super) fn expand(step: &StepFn) -> TokenStream {
    let func = &step.func;
    let attrs = &func.attrs;
    let vis = &func.vis;
    let ident = &func.sig.ident;
    let ret = step.output.tokens();
    let name = Literal::string(&step.name);
    let retried = step.max_attempts > 1;

    let idents: Vec<_> = step.args.iter().map(|arg| &arg.ident).collect();
    let types: Vec<_> = step.args.iter().map(|arg| &arg.ty).collect();

    // The body keeps the user's signature (argument attributes and `mut`
    // included) under a fixed name, nested so it is invisible outside.
    let body_ident = format_ident!("__keiro_step_body");
    let mut body_sig = func.sig.clone();
    body_sig.ident = body_ident.clone();
    let block = &func.block;

    // Type assertions at the user's spans. The runtime call below is given the
    // return type's span too, so rustc reports a non-journalable return type
    // once, with keiro's message.
    let ret_range = match &step.output.ty {
        Some(ty) => span_range(ty),
        None => span_range(ident),
    };
    // `Result<T, E>` is asserted part by part, so an error type that cannot be
    // journaled (`std::io::Error`) gets advice for step errors, naming it. Both
    // parts are reported over the whole return type (rustc points at the
    // turbofish argument, respanned here): the runtime call fails on the same
    // leaf bound (`E: Serialize`), with serde's message, unless that is at the
    // same span, where rustc drops it as implied by keiro's.
    let ret_assert = match (step.output.result_parts(), &step.output.ty) {
        (Some((ok, err)), _) => {
            // Through an identity alias, so even a one-token type spans the range.
            let ok = respan(ret_range, quote!(::keiro::__private::Same<#ok>));
            let err = respan(ret_range, quote!(::keiro::__private::Same<#err>));
            Some(quote! {
                ::keiro::__private::assert_step_value::<#ok>();
                ::keiro::__private::assert_step_error::<#err>();
            })
        }
        (None, Some(ty)) => {
            Some(quote_spanned!(ty.span()=> ::keiro::__private::assert_step_value::<#ty>();))
        }
        (None, None) => None,
    };
    let meta = meta(step);

    // `timeout_ms`: each attempt runs under the limit; one that overruns is
    // dropped and becomes `Err(StepTimeout.into())`. Whether the return type
    // can hold that is asserted at the attribute, where the user wrote it.
    let (timed, timeout_assert) = match &step.timeout_ms {
        Some((ms, tokens)) => {
            let ms = Literal::u64_unsuffixed(*ms);
            let range = span_range(tokens);
            // `Result<T, E>` as written: `E` is checked alone, so the message
            // names the error type; an alias is checked as a whole.
            let converter = match (step.output.result_parts(), &step.output.ty) {
                (Some((ok, err)), _) => quote!(::keiro::__private::timeout_into::<#ok, #err>()),
                (None, Some(ty)) => quote!(::keiro::__private::timeout_outcome::<#ty>()),
                (None, None) => quote!(::keiro::__private::timeout_outcome::<()>()),
            };
            let assert = respan(
                range,
                quote!(let __keiro_timed_out: fn(::keiro::StepTimeout) -> #ret = #converter;),
            );
            (Some(ms), Some(assert))
        }
        None => (None, None),
    };
    let run_body = |args: TokenStream| match &timed {
        Some(ms) => quote! {
            ::keiro::__private::with_timeout(#ms, #name, __keiro_timed_out, #body_ident(#args))
        },
        None => quote!(#body_ident(#args)),
    };

    let (arg_asserts, call) = if let Some(tx) = &step.transaction {
        transactional(step, tx, &run_body, ret_range)
    } else if retried {
        let mut arg_asserts: Vec<_> = types
            .iter()
            .map(|ty| quote_spanned!(ty.span()=> ::keiro::__private::assert_retry_arg::<#ty>();))
            .collect();
        let (is_err, retry_asserts) = retry_predicate(step, ret_range);
        arg_asserts.extend(retry_asserts);
        let clones = clones(step);
        let body = run_body(quote!(#(#clones),*));
        let call = quote! {
            ::keiro::__private::step_retry(
                #meta,
                #is_err,
                move || #body,
            )
        };
        (arg_asserts, call)
    } else {
        let body = run_body(quote!(#(#idents),*));
        let call = quote! {
            ::keiro::__private::step_once(#meta, move || #body)
        };
        (Vec::new(), call)
    };

    // The runtime's future is boxed behind `dyn Future`: with its opaque type
    // as the hidden type of the `impl Future` we return, rustc would report
    // each unmet bound of `step_once` a second time when checking that type.
    let call = respan(ret_range, call);
    let boxed = respan(ret_range, quote!(::std::boxed::Box::pin(#call)));
    let boxed_ty = quote! {
        ::core::pin::Pin<
            ::std::boxed::Box<dyn ::core::future::Future<Output = #ret> + ::core::marker::Send>,
        >
    };
    // A keiro future: `keiro::select!` can race it durably.
    let future = quote! {
        impl ::core::future::Future<Output = #ret>
            + ::core::marker::Send
            + ::keiro::__private::Durable
    };

    quote! {
        #(#attrs)*
        #vis fn #ident(#(#idents: #types),*) -> #future {
            #[allow(non_snake_case)]
            #body_sig #block

            #ret_assert
            #timeout_assert
            #(#arg_asserts)*
            let __keiro_step: #boxed_ty = #boxed;
            ::keiro::__private::DurableFuture::boxed(__keiro_step)
        }
    }
}

/// The step's options, as the runtime takes them.
fn meta(step: &StepFn) -> TokenStream {
    let name = Literal::string(&step.name);
    let max_attempts = Literal::u32_unsuffixed(step.max_attempts);
    let backoff_ms = Literal::u64_unsuffixed(step.backoff_ms);
    let timeout_ms = match &step.timeout_ms {
        Some((ms, _)) => {
            let ms = Literal::u64_unsuffixed(*ms);
            quote!(::core::option::Option::Some(#ms))
        }
        None => quote!(::core::option::Option::None),
    };
    quote! {
        ::keiro::__private::StepMeta {
            name: #name,
            max_attempts: #max_attempts,
            backoff_ms: #backoff_ms,
            timeout_ms: #timeout_ms,
        }
    }
}

/// Fresh copies of the step's arguments, for one attempt. (At each
/// argument's type, like its `Clone` assertion, so a type that is not
/// `Clone` is reported once.)
fn clones(step: &StepFn) -> Vec<TokenStream> {
    step.args
        .iter()
        .map(|arg| {
            let range = span_range(&arg.ty);
            let mut ident = arg.ident.clone();
            ident.set_span(range.1);
            let reference = respan(range, quote!(&#ident));
            respan(range, quote!(::core::clone::Clone::clone(#reference)))
        })
        .collect()
}

/// Whether a failed attempt of a retried step is retried (a closure over
/// its outcome), and the assertions that type it at the user's tokens.
fn retry_predicate(step: &StepFn, ret_range: (Span, Span)) -> (TokenStream, Vec<TokenStream>) {
    let ret = step.output.tokens();
    // `R` is inferred from this closure, so rustc reports unmet bounds on
    // `R` at it: give it the return type's span as well. `RetryOutcome`
    // accepts any `Result`, whatever alias names it, and reports any other
    // type at the return type (asserted there first).
    let mut asserts: Vec<_> = step
        .output
        .ty
        .as_ref()
        .map(|ty| quote_spanned!(ty.span()=> ::keiro::__private::assert_retry_outcome::<#ty>();))
        .into_iter()
        .collect();
    let is_err = match &step.retry_if {
        None => respan(
            ret_range,
            quote!(|__keiro_result: &#ret| ::keiro::__private::RetryOutcome::is_err(__keiro_result)),
        ),
        // The predicate sees the error of a failed attempt; `false` makes
        // that error final at once.
        Some(_) => respan(
            ret_range,
            quote!(move |__keiro_result: &#ret| ::keiro::__private::retry_if(__keiro_result, __keiro_retry_if)),
        ),
    };
    // The predicate is typed where the user named it, so a wrong signature
    // is reported there, once.
    if let Some((predicate, tokens)) = &step.retry_if {
        let range = span_range(tokens);
        let error = respan(
            range,
            quote!(<#ret as ::keiro::__private::RetryOutcome>::Error),
        );
        asserts.push(quote! {
            let __keiro_retry_if: fn(&#error) -> bool = #predicate;
        });
    }
    (is_err, asserts)
}

/// The runtime call of a `#[step(transaction)]` (keiro passes `tx`, the
/// first argument, to each run of the body) and the assertions on its
/// arguments.
fn transactional(
    step: &StepFn,
    tx: &Arg,
    run_body: &dyn Fn(TokenStream) -> TokenStream,
    ret_range: (Span, Span),
) -> (Vec<TokenStream>, TokenStream) {
    let ret = step.output.tokens();
    // Every run of the body (a retry, or a conflict with another
    // transaction) gets fresh copies of the arguments.
    let mut asserts: Vec<_> = step
        .args
        .iter()
        .map(|arg| {
            let ty = &arg.ty;
            quote_spanned!(ty.span()=> ::keiro::__private::assert_transaction_arg::<#ty>();)
        })
        .collect();
    // Any `Err` rolls the attempt's writes back, retried or not; a type
    // that is no `Result` never does.
    let is_err = respan(
        ret_range,
        quote!(|__keiro_result: &#ret| {
            use ::keiro::__private::{PlainOutcome as _, ResultOutcome as _};
            (&::keiro::__private::OutcomeProbe(__keiro_result)).__keiro_is_err()
        }),
    );
    let retry = if step.max_attempts > 1 {
        let (retry, retry_asserts) = retry_predicate(step, ret_range);
        asserts.extend(retry_asserts);
        retry
    } else {
        respan(ret_range, quote!(|_: &#ret| false))
    };
    let tx_ident = &tx.ident;
    let mut args = vec![quote!(#tx_ident)];
    args.extend(clones(step));
    let body = run_body(quote!(#(#args),*));
    let meta = meta(step);
    let call = quote! {
        ::keiro::__private::step_transaction(
            #meta,
            #is_err,
            #retry,
            move |#tx_ident| ::std::boxed::Box::pin(#body),
        )
    };
    (asserts, call)
}

#[cfg(test)]
mod tests {
    use quote::quote;

    use crate::model::StepFn;

    fn expand(args: proc_macro2::TokenStream, item: proc_macro2::TokenStream) -> String {
        let step = StepFn::parse(args, item).unwrap();
        let tokens = super::expand(&step);
        let file: syn::File = syn::parse2(tokens.clone()).unwrap();
        assert_eq!(file.items.len(), 1);
        tokens.to_string()
    }

    #[test]
    fn single_attempt_step() {
        let out = expand(
            quote!(),
            quote! {
                /// Reserves stock.
                pub(crate) async fn reserve(mut sku: String, qty: u32) -> Result<String, ShopError> { todo!() }
            },
        );
        assert!(out.starts_with("# [doc = r\" Reserves stock.\"] pub (crate) fn reserve (sku : String , qty : u32) -> impl :: core :: future :: Future < Output = Result < String , ShopError > > + :: core :: marker :: Send"), "{out}");
        assert!(
            out.contains("async fn __keiro_step_body (mut sku : String , qty : u32)"),
            "{out}"
        );
        assert!(
            out.contains("name : \"reserve\" , max_attempts : 1 , backoff_ms : 0"),
            "{out}"
        );
        assert!(out.contains(":: keiro :: __private :: step_once"), "{out}");
        assert!(
            out.contains("move || __keiro_step_body (sku , qty)"),
            "{out}"
        );
        assert!(
            out.contains("assert_step_value :: < :: keiro :: __private :: Same < String > >")
                && out.contains(
                    "assert_step_error :: < :: keiro :: __private :: Same < ShopError > >"
                ),
            "{out}"
        );
        assert!(!out.contains("assert_retry_arg"), "{out}");
    }

    #[test]
    fn retried_step() {
        let out = expand(
            quote!(name = "send_email", max_attempts = 5, backoff_ms = 200),
            quote!(
                async fn email(to: String) -> Result<(), ShopError> {
                    Ok(())
                }
            ),
        );
        assert!(
            out.contains("name : \"send_email\" , max_attempts : 5 , backoff_ms : 200"),
            "{out}"
        );
        assert!(out.contains(":: keiro :: __private :: step_retry"), "{out}");
        assert!(
            out.contains(
                "| __keiro_result : & Result < () , ShopError > | :: keiro :: __private :: RetryOutcome :: is_err (__keiro_result)"
            ),
            "{out}"
        );
        assert!(
            out.contains("move || __keiro_step_body (:: core :: clone :: Clone :: clone (& to))"),
            "{out}"
        );
        assert!(out.contains("assert_retry_arg :: < String >"), "{out}");
    }

    #[test]
    fn transactional_step() {
        let out = expand(
            quote!(transaction),
            quote!(
                async fn debit(tx: &mut keiro::Transaction<'_>, account: i64) -> Result<i64, E> {
                    Ok(account)
                }
            ),
        );
        assert!(out.contains("fn debit (account : i64) ->"), "{out}");
        assert!(
            out.contains("async fn __keiro_step_body (tx : & mut keiro :: Transaction < '_ > , account : i64)"),
            "{out}"
        );
        assert!(
            out.contains(":: keiro :: __private :: step_transaction"),
            "{out}"
        );
        assert!(
            out.contains("move | tx | :: std :: boxed :: Box :: pin (__keiro_step_body (tx , :: core :: clone :: Clone :: clone (& account)))"),
            "{out}"
        );
        assert!(out.contains("assert_transaction_arg :: < i64 >"), "{out}");
        assert!(out.contains("| _ : & Result < i64 , E > | false"), "{out}");
    }

    #[test]
    fn step_returning_unit() {
        let out = expand(
            quote!(),
            quote!(
                async fn ping() {}
            ),
        );
        assert!(out.contains("Future < Output = () >"), "{out}");
        assert!(!out.contains("assert_step_value"), "{out}");
    }
}
