//! The validated shape of an annotated function.
//!
//! `WorkflowFn` and `StepFn` keep the user's original syntax nodes (the whole
//! `ItemFn`, each argument's identifier and type) so the expansion can put every
//! generated token, and therefore every type error, on the user's own spans.

use proc_macro2::TokenStream;
use quote::{quote, ToTokens};
use syn::ext::IdentExt;
use syn::{GenericArgument, Ident, ItemFn, LitStr, PathArguments, Type};

use crate::args::{StepArgs, WorkflowArgs, MAX_ATTEMPTS, TIMEOUT_MS};
use crate::{check, diag};

/// Which attribute is being expanded; used to word error messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Macro {
    Workflow,
    Step,
}

impl Macro {
    /// The attribute as a user writes it, for messages: "`#[step]` functions must be async".
    pub(crate) fn attr(self) -> &'static str {
        match self {
            Macro::Workflow => "#[workflow]",
            Macro::Step => "#[step]",
        }
    }
}

/// One argument of the annotated function: always a plain identifier. The body
/// keeps the original argument (with `mut` and attributes); generated wrappers
/// use only the identifier and type.
pub(crate) struct Arg {
    pub(crate) ident: Ident,
    pub(crate) ty: Box<Type>,
}

/// The declared return type; `None` when the function has no `-> R` (returns `()`).
pub(crate) struct Output {
    pub(crate) ty: Option<Box<Type>>,
}

impl Output {
    /// The return type as tokens, `()` when omitted.
    pub(crate) fn tokens(&self) -> TokenStream {
        match &self.ty {
            Some(ty) => ty.to_token_stream(),
            None => quote!(()),
        }
    }

    /// `T` and `E` when the return type is written `Result<T, E>` (bare, or as
    /// `std::result::Result` / `core::result::Result`), so each can be asserted
    /// at its own span. Only for messages: whether a type *is* a `Result`, under
    /// any alias, is decided by a trait in the generated code.
    pub(crate) fn result_parts(&self) -> Option<(&Type, &Type)> {
        let mut ty = self.ty.as_deref()?;
        while let Type::Group(group) = ty {
            ty = &group.elem;
        }
        let Type::Path(path) = ty else {
            return None;
        };
        let segments: Vec<_> = path.path.segments.iter().collect();
        let (last, module) = segments.split_last()?;
        let module: Vec<String> = module.iter().map(|s| s.ident.to_string()).collect();
        let std_result = match module.as_slice() {
            [] => true,
            [root, result] => (root == "std" || root == "core") && result == "result",
            _ => false,
        };
        if path.qself.is_some() || last.ident != "Result" || !std_result {
            return None;
        }
        let PathArguments::AngleBracketed(args) = &last.arguments else {
            return None;
        };
        match args.args.iter().collect::<Vec<_>>().as_slice() {
            [GenericArgument::Type(ok), GenericArgument::Type(err)] => Some((ok, err)),
            _ => None,
        }
    }
}

/// A function annotated with `#[workflow]` that passed every check.
pub(crate) struct WorkflowFn {
    /// The registered name: `#[workflow(name = "..")]` or the function's name.
    pub(crate) name: String,
    /// The user's function exactly as written.
    pub(crate) func: ItemFn,
    pub(crate) args: Vec<Arg>,
    pub(crate) output: Output,
    /// `cron = ".."` and its time zone (`UTC` unless `timezone = ".."`).
    pub(crate) cron: Option<(String, String)>,
    /// `journal = ".."`, checked: `strict` or `pipelined`.
    pub(crate) journal: Option<String>,
}

impl WorkflowFn {
    /// Parses the attribute arguments and the item, runs every check and
    /// reports all problems at once.
    pub(crate) fn parse(args: TokenStream, item: TokenStream) -> syn::Result<Self> {
        let args = WorkflowArgs::parse(args);
        let func = check::item_fn(Macro::Workflow, item).and_then(|mut func| {
            let signature = check::signature(Macro::Workflow, &func.sig);
            let body = check::deterministic_body(&func.sig.inputs, &func.block);
            let ((inputs, output), ()) = diag::join(signature, body)?;
            check::strip_escapes(&mut func);
            Ok((func, inputs, output))
        });
        let (args, (func, inputs, output)) = diag::join(args, func)?;
        let cron = match &args.cron {
            Some(cron) => {
                cron_argument(&func, &inputs, cron)?;
                // A schedule's ids are `cron:<name>:<tick>` and
                // `cron:<name>:trigger:<time>`: a `:` in the name could
                // make two schedules' ids meet.
                if let Some(name) = args.name.as_ref().filter(|name| name.value().contains(':')) {
                    return Err(syn::Error::new_spanned(
                        name,
                        "a `cron` workflow's name is its schedule's, and its ticks run under \
                         ids `cron:<name>:<tick>`, so a `:` in it could make two schedules' \
                         ids meet; choose a name without one (`-`, `.` and `/` are fine)",
                    ));
                }
                let timezone = args
                    .timezone
                    .as_ref()
                    .map_or("UTC".to_owned(), LitStr::value);
                Some((cron.value(), timezone))
            }
            None => None,
        };
        let name = match args.name {
            Some(lit) => lit.value(),
            None => func.sig.ident.unraw().to_string(),
        };
        Ok(WorkflowFn {
            name,
            func,
            args: inputs,
            output,
            cron,
            journal: args.journal.as_ref().map(LitStr::value),
        })
    }
}

/// A `cron` workflow takes exactly one argument, the tick time, typed
/// `SystemTime` (`std::time::SystemTime` or an imported `SystemTime`).
fn cron_argument(func: &ItemFn, inputs: &[Arg], cron: &LitStr) -> syn::Result<()> {
    let message = "a `cron` workflow takes exactly one argument, the tick it runs for: \
                   `scheduled_at: std::time::SystemTime`";
    match inputs {
        [arg] => {
            let is_system_time = match &*arg.ty {
                Type::Path(path) if path.qself.is_none() => path
                    .path
                    .segments
                    .last()
                    .is_some_and(|last| last.ident == "SystemTime" && last.arguments.is_none()),
                _ => false,
            };
            if is_system_time {
                Ok(())
            } else {
                Err(syn::Error::new_spanned(&arg.ty, message))
            }
        }
        [] => {
            let mut error = syn::Error::new_spanned(&func.sig.ident, message);
            error.combine(syn::Error::new_spanned(cron, "the schedule is set here"));
            Err(error)
        }
        [_, extra, ..] => Err(syn::Error::new_spanned(&extra.ident, message)),
    }
}

/// A function annotated with `#[step]` that passed every check.
pub(crate) struct StepFn {
    /// The journaled name: `#[step(name = "..")]` or the function's name.
    pub(crate) name: String,
    pub(crate) max_attempts: u32,
    pub(crate) backoff_ms: u64,
    /// `timeout_ms = T`: the limit and its tokens (where a type error points).
    pub(crate) timeout_ms: Option<(u64, TokenStream)>,
    /// `retry_if = path`: the predicate and its `key = path` tokens.
    pub(crate) retry_if: Option<(syn::ExprPath, TokenStream)>,
    /// The user's function exactly as written.
    pub(crate) func: ItemFn,
    /// `#[step(transaction)]`: the transaction argument keiro passes (the
    /// first), which `args` leaves out.
    pub(crate) transaction: Option<Arg>,
    pub(crate) args: Vec<Arg>,
    pub(crate) output: Output,
}

impl StepFn {
    /// Parses the attribute arguments and the item, runs every check and
    /// reports all problems at once.
    pub(crate) fn parse(args: TokenStream, item: TokenStream) -> syn::Result<Self> {
        let args = StepArgs::parse(args);
        let flagged = args.as_ref().ok().map(|args| args.transaction.is_some());
        let func = check::item_fn(Macro::Step, item).and_then(|mut func| {
            // A transaction's `&mut` is keiro's to pass: split off before the
            // rule that arguments are owned.
            let (transaction, rest) = check::transaction::split(&func.sig, flagged);
            let signature = check::signature(Macro::Step, &rest);
            let (transaction, (inputs, output)) = diag::join(transaction, signature)?;
            // A step body is not linted; the attribute is removed all the same.
            check::strip_escapes(&mut func);
            Ok((func, transaction, inputs, output))
        });
        let (args, (func, transaction, inputs, output)) = diag::join(args, func)?;
        let max_attempts = args.max_attempts();
        // A declared return type is checked to be a `Result` by the generated
        // code (`RetryOutcome`), which sees through aliases; none at all is `()`.
        if max_attempts > 1 && output.ty.is_none() {
            return Err(diag::error(
                args.max_attempts_tokens()
                    .unwrap_or_else(|| func.sig.to_token_stream()),
                format!(
                    "`{MAX_ATTEMPTS}` retries a step on `Err`, so the step must return a `Result`; \
                     return `Result<T, E>` or remove `{MAX_ATTEMPTS}`"
                ),
            ));
        }
        let timeout_ms = args.timeout_ms();
        if let (Some((_, tokens)), None) = (&timeout_ms, &output.ty) {
            return Err(diag::error(
                tokens.clone(),
                format!(
                    "`{TIMEOUT_MS}` ends a slow attempt with `Err(keiro::StepTimeout)`, so the step \
                     must return a `Result<T, E>` whose `E: From<keiro::StepTimeout>`; \
                     return one or remove `{TIMEOUT_MS}`"
                ),
            ));
        }
        let name = match &args.name {
            Some(lit) => lit.value(),
            None => func.sig.ident.unraw().to_string(),
        };
        Ok(StepFn {
            name,
            max_attempts,
            backoff_ms: args.backoff_ms(),
            timeout_ms,
            retry_if: args
                .retry_if()
                .map(|setting| (setting.path.clone(), setting.tokens())),
            func,
            transaction,
            args: inputs,
            output,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use quote::quote;

    fn unwrap_err<T>(result: syn::Result<T>) -> syn::Error {
        match result {
            Ok(_) => panic!("expected an error"),
            Err(err) => err,
        }
    }

    fn messages(err: syn::Error) -> Vec<String> {
        err.into_iter().map(|e| e.to_string()).collect()
    }

    #[test]
    fn workflow_name_defaults_to_the_function_name() {
        let f = WorkflowFn::parse(
            quote!(),
            quote!(
                async fn checkout(mut order: u32) {}
            ),
        );
        let f = f.unwrap_or_else(|err| panic!("{err}"));
        assert_eq!(f.name, "checkout");
        assert_eq!(f.args.len(), 1);
        assert!(f.output.ty.is_none());
        assert_eq!(f.output.tokens().to_string(), "()");
    }

    #[test]
    fn raw_identifiers_are_registered_without_the_prefix() {
        let f = WorkflowFn::parse(
            quote!(),
            quote!(
                async fn r#match() {}
            ),
        )
        .unwrap();
        assert_eq!(f.name, "match");
    }

    #[test]
    fn workflow_name_can_be_overridden() {
        let f = WorkflowFn::parse(
            quote!(name = "shop.checkout"),
            quote!(
                async fn checkout() -> u32 {
                    1
                }
            ),
        )
        .unwrap();
        assert_eq!(f.name, "shop.checkout");
    }

    #[test]
    fn argument_and_signature_errors_are_reported_together() {
        let err = unwrap_err(StepFn::parse(
            quote!(max_attempts = 0),
            quote!(
                fn reserve(sku: &str) -> String {
                    todo!()
                }
            ),
        ));
        assert_eq!(messages(err).len(), 3);
    }

    #[test]
    fn argument_and_item_errors_are_reported_together() {
        let err = unwrap_err(WorkflowFn::parse(
            quote!(retries = 3),
            quote!(
                struct S;
            ),
        ));
        let messages = messages(err);
        assert_eq!(messages.len(), 2, "{messages:?}");
        assert!(messages[0].starts_with("unknown `#[workflow]` argument `retries`"));
        assert!(messages[1].starts_with("`#[workflow]` can only be applied to an `async fn`"));
    }

    #[test]
    fn every_spawn_in_a_workflow_body_is_refused_with_the_signature_errors() {
        let err = unwrap_err(WorkflowFn::parse(
            quote!(),
            quote!(
                async fn fan_out(s: &str) {
                    tokio::spawn(async {});
                    let _ = || std::thread::spawn(|| {});
                    keiro::spawn(child(1)).await;
                }
            ),
        ));
        let messages = messages(err);
        assert_eq!(messages.len(), 3, "{messages:?}");
        assert!(messages[0].starts_with("`#[workflow]` arguments must be owned values"));
        assert!(messages[1].starts_with("`tokio::spawn` inside a `#[workflow]`"));
        assert!(messages[2].starts_with("`std::thread::spawn` inside a `#[workflow]`"));
    }

    #[test]
    fn steps_may_spawn() {
        let step = StepFn::parse(
            quote!(),
            quote!(
                async fn hash(data: Vec<u8>) -> u64 {
                    tokio::task::spawn_blocking(move || data.len() as u64)
                        .await
                        .unwrap_or(0)
                }
            ),
        );
        assert!(step.is_ok());
    }

    #[test]
    fn step_defaults() {
        let s = StepFn::parse(
            quote!(),
            quote!(
                async fn reserve(sku: String) -> u32 {
                    1
                }
            ),
        )
        .unwrap();
        assert_eq!(s.name, "reserve");
        assert_eq!(s.max_attempts, 1);
        assert_eq!(s.backoff_ms, 0);
    }

    #[test]
    fn step_with_retries() {
        let s = StepFn::parse(
            quote!(name = "email", max_attempts = 5, backoff_ms = 200),
            quote!(
                async fn send(to: String) -> Result<(), String> {
                    Ok(())
                }
            ),
        )
        .unwrap();
        assert_eq!(s.name, "email");
        assert_eq!(s.max_attempts, 5);
        assert_eq!(s.backoff_ms, 200);
    }

    #[test]
    fn retried_step_gets_the_default_backoff() {
        let s = StepFn::parse(
            quote!(max_attempts = 3),
            quote!(
                async fn send() -> std::io::Result<()> {
                    Ok(())
                }
            ),
        )
        .unwrap();
        assert_eq!(s.backoff_ms, crate::args::DEFAULT_BACKOFF_MS);
    }

    #[test]
    fn retries_require_a_return_type() {
        // A declared type that is not a `Result` is refused by the compiler,
        // through `RetryOutcome` (see `ui/fail/max_attempts_without_result.rs`).
        let item = quote!(
            async fn send() {}
        );
        let err = unwrap_err(StepFn::parse(quote!(max_attempts = 3), item));
        assert!(err.to_string().starts_with(
            "`max_attempts` retries a step on `Err`, so the step must return a `Result`"
        ));
        let alias = quote!(
            async fn send() -> Count {
                1
            }
        );
        assert!(StepFn::parse(quote!(max_attempts = 3), alias).is_ok());
    }

    fn parts(ty: TokenStream) -> Option<(String, String)> {
        let output = Output {
            ty: Some(syn::parse2(ty).unwrap()),
        };
        output
            .result_parts()
            .map(|(ok, err)| (quote!(#ok).to_string(), quote!(#err).to_string()))
    }

    #[test]
    fn result_parts_are_split_only_for_std_result() {
        let pair = |ok: &str, err: &str| Some((ok.to_owned(), err.to_owned()));
        assert_eq!(
            parts(quote!(Result<u32, std::io::Error>)),
            pair("u32", "std :: io :: Error")
        );
        assert_eq!(parts(quote!(std::result::Result<(), E>)), pair("()", "E"));
        assert_eq!(
            parts(quote!(::core::result::Result<Vec<u8>, E>)),
            pair("Vec < u8 >", "E")
        );
        for ty in [
            quote!(std::io::Result<()>),
            quote!(errors::Res<u32>),
            quote!(my::Result<u32, E>),
            quote!(u32),
            quote!(<T as Trait>::Result),
            quote!(Result<u32>),
        ] {
            assert_eq!(parts(ty.clone()), None, "{ty}");
        }
    }

    #[test]
    fn single_attempt_does_not_require_a_result() {
        assert!(StepFn::parse(
            quote!(max_attempts = 1),
            quote!(
                async fn send() -> u32 {
                    1
                }
            )
        )
        .is_ok());
    }
}
