//! `#[workflow]` expansion: the body, a type-erased runner, its link-time
//! registration and the public constructor of `keiro::WorkflowCall`.

use proc_macro2::{Literal, TokenStream};
use quote::{format_ident, quote, quote_spanned, ToTokens};
use syn::ext::IdentExt;
use syn::spanned::Spanned;
use syn::Visibility;

use super::{args_span_range, respan, span_range, SplitAttrs};
use crate::model::WorkflowFn;

pub(super) fn expand(workflow: &WorkflowFn) -> TokenStream {
    let func = &workflow.func;
    let ident = &func.sig.ident;
    let fn_name = ident.unraw().to_string();
    let body_ident = format_ident!("__keiro_workflow_body_{}", ident.unraw());
    let run_ident = format_ident!("__keiro_workflow_run_{}", ident.unraw());
    let name = Literal::string(&workflow.name);
    let ret = workflow.output.tokens();
    let attrs = SplitAttrs::new(&func.attrs);
    let cfg = &attrs.cfg;

    let idents: Vec<_> = workflow.args.iter().map(|arg| &arg.ident).collect();
    let types: Vec<_> = workflow.args.iter().map(|arg| &arg.ty).collect();

    // Asserting every argument type and the return type where they are used, at
    // the user's spans, makes a type that is not Serialize + DeserializeOwned an
    // error on that type with keiro's message (rustc drops the same failure of
    // the encode/decode call below, which is given the same span).
    let arg_asserts: Vec<_> = types
        .iter()
        .map(|ty| quote_spanned!(ty.span()=> ::keiro::__private::assert_workflow_value::<#ty>();))
        .collect();
    let ret_assert = workflow.output.ty.as_ref().map(|ty| {
        quote_spanned!(ty.span()=> ::keiro::__private::assert_workflow_value::<#ty>();)
    });
    let args_range = args_span_range(&workflow.args);
    let ret_range = match &workflow.output.ty {
        Some(ty) => span_range(ty),
        None => span_range(&func.sig.ident),
    };

    // 1. The user's function, renamed and hidden.
    let mut body = func.clone();
    body.sig.ident = body_ident.clone();
    body.vis = Visibility::Inherited;
    body.attrs = cfg
        .iter()
        .chain(&attrs.lints)
        .chain(&attrs.rest)
        .cloned()
        .collect();

    // 2. The runner the worker calls with the journaled input.
    let decode = respan(
        args_range,
        quote!(::keiro::__private::WorkflowInput::decode(&__keiro_input)),
    );
    let out_ref = respan(ret_range, quote!(&__keiro_out));
    let is_err = if workflow.output.is_result() {
        quote!(__keiro_out.is_err())
    } else {
        quote!(false)
    };
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

    // 4. The public function: same name, visibility and docs; builds the call.
    let vis = &func.vis;
    let public_attrs = &attrs.public;
    let public_lints = attrs.lints_as_allow();
    let args_ref = respan(args_range, quote!(&(#(#idents,)*)));
    let public_ret = quote!(::keiro::WorkflowCall<#ret>);
    let call = respan(
        ret_range,
        quote! {
            ::keiro::__private::workflow_call::<#ret>(
                #name,
                #run_ident,
                ::keiro::__private::encode_args(#name, #args_ref),
            )
        },
    );

    quote! {
        #body

        #(#cfg)*
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

        #(#cfg)*
        ::keiro::__private::inventory::submit! {
            ::keiro::__private::WorkflowRegistration::new(
                #name,
                ::core::concat!(::core::module_path!(), "::", #fn_name),
                #run_ident,
            )
        }

        #(#cfg)*
        #(#public_attrs)*
        #(#public_lints)*
        #vis fn #ident(#(#idents: #types),*) -> #public_ret {
            #(#arg_asserts)*
            #ret_assert
            #call
        }
    }
    .into_token_stream()
}

#[cfg(test)]
mod tests {
    use quote::quote;

    use crate::model::WorkflowFn;

    fn expand(args: proc_macro2::TokenStream, item: proc_macro2::TokenStream) -> syn::File {
        let func = WorkflowFn::parse(args, item).unwrap();
        syn::parse2(super::expand(&func)).unwrap()
    }

    fn item_names(file: &syn::File) -> Vec<String> {
        file.items
            .iter()
            .map(|item| match item {
                syn::Item::Fn(f) => f.sig.ident.to_string(),
                syn::Item::Macro(m) => m.mac.path.segments.last().unwrap().ident.to_string(),
                other => panic!("unexpected item {}", quote!(#other)),
            })
            .collect()
    }

    #[test]
    fn generates_body_runner_registration_and_public_fn() {
        let file = expand(
            quote!(),
            quote! {
                /// Checks out.
                #[inline]
                pub async fn checkout(mut order: Order, n: u32) -> Result<Receipt, ShopError> { todo!() }
            },
        );
        assert_eq!(
            item_names(&file),
            [
                "__keiro_workflow_body_checkout",
                "__keiro_workflow_run_checkout",
                "submit",
                "checkout"
            ]
        );
        let syn::Item::Fn(body) = &file.items[0] else { unreachable!() };
        assert!(body.sig.asyncness.is_some());
        assert!(matches!(body.vis, syn::Visibility::Inherited));
        let body_attrs = &body.attrs;
        let body_attrs = quote!(#(#body_attrs)*).to_string();
        assert!(body_attrs.contains("inline") && !body_attrs.contains("Checks out"), "{body_attrs}");

        let syn::Item::Fn(public) = &file.items[3] else { unreachable!() };
        assert!(public.sig.asyncness.is_none());
        assert!(matches!(public.vis, syn::Visibility::Public(_)));
        let public = quote!(#public).to_string();
        assert!(public.contains("Checks out"), "{public}");
        assert!(!public.contains("mut order"), "{public}");
        assert!(public.contains("-> :: keiro :: WorkflowCall < Result < Receipt , ShopError > >"), "{public}");
        assert!(public.contains(":: keiro :: __private :: encode_args (\"checkout\" , & (order , n ,))"), "{public}");

        let run = file.items[1].to_token_stream().to_string();
        assert!(run.contains("__keiro_out . is_err ()"), "{run}");
        assert!(run.contains("let (order , n ,) : (Order , u32 ,)"), "{run}");
        let submit = file.items[2].to_token_stream().to_string();
        assert!(submit.contains("WorkflowRegistration :: new (\"checkout\""), "{submit}");
    }

    #[test]
    fn named_workflow_without_arguments_returning_unit() {
        let file = expand(quote!(name = "nightly"), quote!(async fn cleanup() {}));
        let all = quote!(#file).to_string();
        assert!(all.contains("WorkflowRegistration :: new (\"nightly\""), "{all}");
        assert!(all.contains("\"::\" , \"cleanup\""), "{all}");
        assert!(all.contains("let __keiro_out : () ="), "{all}");
        assert!(all.contains("let __keiro_is_err : bool = false"), "{all}");
        assert!(all.contains("WorkflowCall < () >"), "{all}");
        assert!(!all.contains("assert_workflow_value"), "{all}");
    }

    use quote::ToTokens;
}
