//! `#[workflow]` expansion: the body, a type-erased runner, its link-time
//! registration and the public constructor of `keiro::WorkflowCall`.

use proc_macro2::{Literal, TokenStream};
use quote::{format_ident, quote, quote_spanned};
use syn::ext::IdentExt;
use syn::spanned::Spanned;
use syn::{parse_quote, Visibility};

use super::{args_span_range, respan, span_range, SplitAttrs};
use crate::model::WorkflowFn;

pub(super) fn expand(workflow: &WorkflowFn) -> TokenStream {
    let func = &workflow.func;
    let ident = &func.sig.ident;
    let fn_name = ident.unraw().to_string();
    let body_ident = format_ident!("__keiro_workflow_body_{}", ident.unraw());
    let run_ident = format_ident!("__keiro_workflow_run_{}", ident.unraw());
    let name = Literal::string(&workflow.name);
    let block = &func.block;
    let body_hash = Literal::string(&crate::fingerprint::body_hash(&quote!(#block)));
    let skeleton_hash = Literal::string(&crate::skeleton::skeleton_hash(block));
    let ret = workflow.output.tokens();
    let attrs = SplitAttrs::new(&func.attrs);

    let idents: Vec<_> = workflow.args.iter().map(|arg| &arg.ident).collect();
    let types: Vec<_> = workflow.args.iter().map(|arg| &arg.ty).collect();

    // Asserting every argument type and the return type where they are used, at
    // the user's spans, makes a type that is not Serialize + DeserializeOwned an
    // error on that type with keiro's message. The encode/decode calls below get
    // the same span, so rustc drops their identical failure; with several
    // arguments those calls span the whole list, and are reported there too.
    let arg_asserts: Vec<_> = types
        .iter()
        .map(|ty| quote_spanned!(ty.span()=> ::keiro::__private::assert_workflow_value::<#ty>();))
        .collect();
    let ret_assert =
        workflow.output.ty.as_ref().map(
            |ty| quote_spanned!(ty.span()=> ::keiro::__private::assert_workflow_value::<#ty>();),
        );
    let args_range = args_span_range(&workflow.args);
    let ret_range = match &workflow.output.ty {
        Some(ty) => span_range(ty),
        None => span_range(&func.sig.ident),
    };

    // The user's function, renamed and hidden.
    let mut body = func.clone();
    body.sig.ident = body_ident.clone();
    body.vis = Visibility::Inherited;
    body.attrs = attrs
        .lints
        .iter()
        .chain(&attrs.rest)
        .cloned()
        .chain([
            parse_quote!(#[doc(hidden)]),
            parse_quote!(#[allow(non_snake_case, dead_code)]),
        ])
        .collect();

    // The runner the worker calls with the journaled input.
    let decode = respan(
        args_range,
        quote!(::keiro::__private::WorkflowInput::decode(&__keiro_input)),
    );
    let out_ref = respan(ret_range, quote!(&__keiro_out));
    // Whether the output is an `Err`, decided by the type (any alias or path of
    // `Result`), not by how the return type is spelled: see `OutcomeProbe`.
    let is_err = quote! {{
        #[allow(unused_imports)]
        use ::keiro::__private::{PlainOutcome as _, ResultOutcome as _};
        (&::keiro::__private::OutcomeProbe(&__keiro_out)).__keiro_is_err()
    }};
    // A workflow whose future is not `Send` is reported on its `async fn`.
    let sig_range = span_range(&{
        let (asyncness, fn_token, ident) = (&func.sig.asyncness, &func.sig.fn_token, ident);
        quote!(#asyncness #fn_token #ident)
    });
    let run_body = respan(
        sig_range,
        quote! {
            ::std::boxed::Box::pin(async move {
                let (#(#idents,)*): (#(#types,)*) = #decode?;
                let __keiro_out: #ret = #body_ident(#(#idents),*).await;
                let __keiro_is_err: bool = #is_err;
                ::keiro::__private::WorkflowOutput::encode(#out_ref, __keiro_is_err)
            })
        },
    );

    // The public function: same name, visibility and docs; builds the call.
    let vis = &func.vis;
    let public_attrs = &attrs.public;
    let public_lints = attrs.lints_as_allow();
    let args_ref = respan(args_range, quote!(&(#(#idents,)*)));
    let public_ret = quote!(::keiro::WorkflowCall<#ret>);
    // The argument tuple and return type name the workflow's signature,
    // recorded with each instance it starts.
    let args_tuple = quote!((#(#types,)*));
    let call = respan(
        ret_range,
        quote! {
            ::keiro::__private::workflow_call::<#args_tuple, #ret>(
                #name,
                #run_ident,
                ::keiro::__private::encode_args(#name, #args_ref),
            )
        },
    );

    // `journal = ".."`, checked by the parser.
    let journal = workflow.journal.as_deref().map(|mode| {
        let variant = match mode {
            "pipelined" => quote!(Pipelined),
            _ => quote!(Strict),
        };
        quote!(.with_journal(::keiro::Journal::#variant))
    });
    // A `cron` workflow also registers its schedule, checked by the parser.
    let cron = workflow.cron.as_ref().map(|(cron, timezone)| {
        let (cron, timezone) = (Literal::string(cron), Literal::string(timezone));
        // The parser checked the argument's name only (`SystemTime`).
        let tick = types
            .first()
            .map(|ty| quote_spanned!(ty.span()=> ::keiro::__private::assert_cron_tick::<#ty>();));
        quote! {
            #tick
            ::keiro::__private::inventory::submit! {
                ::keiro::__private::CronRegistration::new(#name, #cron, #timezone)
            }
        }
    });

    // The helpers live inside the public function: nothing but the
    // function's own name is added to the user's namespace, and the expansion
    // is equally valid as an associated function in an `impl` block.
    quote! {
        #(#public_attrs)*
        #(#public_lints)*
        #vis fn #ident(#(#idents: #types),*) -> #public_ret {
            #body

            #[doc(hidden)]
            fn #run_ident(
                __keiro_input: ::keiro::__private::WorkflowInput,
            ) -> ::keiro::__private::BoxFuture<
                'static,
                ::core::result::Result<::keiro::__private::WorkflowOutput, ::keiro::Error>,
            > {
                #(#arg_asserts)*
                #ret_assert
                #run_body
            }

            ::keiro::__private::inventory::submit! {
                ::keiro::__private::WorkflowRegistration::new(
                    #name,
                    ::core::concat!(::core::module_path!(), "::", #fn_name),
                    #run_ident,
                    ::keiro::__private::signature::<#args_tuple, #ret>,
                )
                .with_body_hash(#body_hash)
                .with_skeleton_hash(#skeleton_hash)
                #journal
            }
            #cron

            #(#arg_asserts)*
            #ret_assert
            #call
        }
    }
}

#[cfg(test)]
mod tests {
    use quote::quote;

    use crate::model::WorkflowFn;

    fn expand(args: proc_macro2::TokenStream, item: proc_macro2::TokenStream) -> syn::File {
        let func = WorkflowFn::parse(args, item).unwrap();
        syn::parse2(super::expand(&func)).unwrap()
    }

    #[test]
    fn generates_one_public_fn_holding_body_runner_and_registration() {
        let file = expand(
            quote!(),
            quote! {
                /// Checks out.
                #[inline]
                pub async fn checkout(mut order: Order, n: u32) -> Result<Receipt, ShopError> { todo!() }
            },
        );
        assert_eq!(file.items.len(), 1);
        let syn::Item::Fn(public) = &file.items[0] else {
            panic!("expected a function");
        };
        assert_eq!(public.sig.ident, "checkout");
        assert!(public.sig.asyncness.is_none());
        assert!(matches!(public.vis, syn::Visibility::Public(_)));
        let public_attrs = &public.attrs;
        let public_attrs = quote!(#(#public_attrs)*).to_string();
        assert_eq!(public_attrs, "# [doc = r\" Checks out.\"]");
        let signature = &public.sig;
        assert_eq!(
            quote!(#signature).to_string(),
            "fn checkout (order : Order , n : u32) \
             -> :: keiro :: WorkflowCall < Result < Receipt , ShopError > >"
        );

        let stmts = &public.block.stmts;
        let (
            syn::Stmt::Item(syn::Item::Fn(body)),
            syn::Stmt::Item(syn::Item::Fn(run)),
            syn::Stmt::Macro(submit),
        ) = (&stmts[0], &stmts[1], &stmts[2])
        else {
            panic!(
                "expected body, runner and registration first, got {}",
                quote!(#(#stmts)*)
            );
        };

        assert_eq!(body.sig.ident, "__keiro_workflow_body_checkout");
        assert!(body.sig.asyncness.is_some());
        assert!(matches!(body.vis, syn::Visibility::Inherited));
        let body_sig = &body.sig;
        assert!(quote!(#body_sig).to_string().contains("mut order : Order"));
        let body_attrs = &body.attrs;
        assert_eq!(
            quote!(#(#body_attrs)*).to_string(),
            "# [inline] # [doc (hidden)] # [allow (non_snake_case , dead_code)]"
        );

        assert_eq!(run.sig.ident, "__keiro_workflow_run_checkout");
        let run = quote!(#run).to_string();
        assert!(run.contains("let (order , n ,) : (Order , u32 ,)"), "{run}");
        assert!(
            run.contains(
                "(& :: keiro :: __private :: OutcomeProbe (& __keiro_out)) . __keiro_is_err ()"
            ),
            "{run}"
        );

        assert!(submit
            .mac
            .path
            .segments
            .last()
            .is_some_and(|s| s.ident == "submit"));
        let submit = quote!(#submit).to_string();
        assert!(
            submit.contains("WorkflowRegistration :: new (\"checkout\""),
            "{submit}"
        );

        let public = quote!(#public).to_string();
        assert!(
            public.contains(
                ":: keiro :: __private :: workflow_call :: < (Order , u32 ,) , Result < Receipt , ShopError > > (\"checkout\" , \
                 __keiro_workflow_run_checkout , \
                 :: keiro :: __private :: encode_args (\"checkout\" , & (order , n ,)) ,)"
            ),
            "{public}"
        );
    }

    #[test]
    fn cfg_and_lint_attributes_reach_the_right_functions() {
        let file = expand(
            quote!(),
            quote! {
                #[cfg(feature = "shop")]
                #[expect(clippy::too_many_arguments)]
                #[tracing::instrument]
                async fn checkout() {}
            },
        );
        let all = quote!(#file).to_string();
        assert!(
            all.starts_with("# [cfg (feature = \"shop\")] # [allow (clippy :: too_many_arguments)] fn checkout ()"),
            "{all}"
        );
        assert!(
            all.contains("# [expect (clippy :: too_many_arguments)] # [tracing :: instrument] # [doc (hidden)]"),
            "{all}"
        );
    }

    #[test]
    fn named_workflow_without_arguments_returning_unit() {
        let file = expand(
            quote!(name = "nightly"),
            quote!(
                async fn cleanup() {}
            ),
        );
        let all = quote!(#file).to_string();
        assert!(
            all.contains("WorkflowRegistration :: new (\"nightly\""),
            "{all}"
        );
        assert!(all.contains("\"::\" , \"cleanup\""), "{all}");
        assert!(all.contains("let __keiro_out : () ="), "{all}");
        assert!(all.contains("OutcomeProbe (& __keiro_out)"), "{all}");
        assert!(all.contains("WorkflowCall < () >"), "{all}");
        assert!(!all.contains("assert_workflow_value"), "{all}");
    }
}
