//! `keiro::queue!`: a `static` [`keiro::Queue`] and its link-time
//! registration.

use proc_macro2::TokenStream;
use quote::quote;
use syn::Expr;

use crate::queue::QueueDecl;

/// The declaration, plus any errors (the static is still emitted when its
/// head parsed, so uses of it raise no follow-on errors).
pub(crate) fn expand(input: TokenStream) -> TokenStream {
    let (decl, checked) = QueueDecl::parse(input);
    let errors = checked
        .err()
        .map(syn::Error::into_compile_error)
        .unwrap_or_default();
    let Some(decl) = decl else {
        return errors;
    };
    let QueueDecl {
        attrs,
        vis,
        ident,
        name,
        ..
    } = &decl;
    let some = |value: &Option<Expr>| match value {
        Some(value) => quote!(::core::option::Option::Some(#value)),
        None => quote!(::core::option::Option::None),
    };
    let (concurrency, worker_concurrency, rate_limit) = (
        some(&decl.concurrency),
        some(&decl.worker_concurrency),
        some(&decl.rate_limit),
    );
    quote! {
        #(#attrs)*
        #vis static #ident: ::keiro::Queue = ::keiro::Queue::__new(
            #name,
            #concurrency,
            #worker_concurrency,
            #rate_limit,
        );
        ::keiro::__private::inventory::submit! {
            ::keiro::__private::QueueRegistration { queue: &#ident }
        }
        #errors
    }
}
