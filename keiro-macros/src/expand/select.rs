//! `keiro::select!`: claims the decision's step id, builds the branches in
//! order (each claims its own ids), races them through
//! `::keiro::__private::Select` and runs the winner's handler.

use proc_macro2::TokenStream;
use quote::{format_ident, quote, quote_spanned};
use syn::spanned::Spanned;

use crate::select::SelectInput;

/// The expansion of a parsed `select!`.
pub(super) fn expand(input: &SelectInput) -> TokenStream {
    let variants: Vec<_> = (0..input.branches.len())
        .map(|i| format_ident!("__KeiroBranch{i}"))
        .collect();
    let params: Vec<_> = (0..input.branches.len())
        .map(|i| format_ident!("__KeiroOut{i}"))
        .collect();
    let futures = input.branches.iter().zip(&variants).map(|(branch, variant)| {
        let future = &branch.future;
        // Spanned at the user's expression, so a branch that is not a keiro
        // future (`branch` requires `Durable`) is reported there, once.
        quote_spanned!(future.span()=> ::keiro::__private::branch(#future, __KeiroSelected::#variant))
    });
    let arms = input
        .branches
        .iter()
        .zip(&variants)
        .map(|(branch, variant)| {
            let (pat, handler) = (&branch.pat, &branch.handler);
            quote!(__KeiroSelected::#variant(#pat) => #handler,)
        });
    quote! {
        {
            #[allow(non_camel_case_types, clippy::enum_variant_names)]
            enum __KeiroSelected<#(#params),*> {
                #(#variants(#params)),*
            }
            // The decision's id first: the branches claim theirs as they are built.
            let __keiro_select = ::keiro::__private::Select::begin();
            let __keiro_branches = ::std::vec![#(#futures),*];
            match __keiro_select.run(__keiro_branches).await {
                #(#arms)*
            }
        }
    }
}
