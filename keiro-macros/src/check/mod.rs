//! Rules shared by `#[workflow]` and `#[step]`: what an annotated item must
//! look like, and (in [`determinism`]) what a workflow body must not call.
//!
//! Every rule reports a spanned error that names the attribute and says how to
//! fix the code, and every rule runs, so one compile lists all problems.

mod determinism;
mod escape;
mod hash_order;
mod spawn;
pub(crate) mod transaction;

pub(crate) use escape::{
    strip as strip_escapes, strip_tokens as strip_escape_tokens,
    with_arguments as escape_with_arguments,
};

use proc_macro2::TokenStream;
use quote::{quote, ToTokens};
use syn::punctuated::Punctuated;
use syn::visit::Visit;
use syn::{
    Block, FnArg, GenericParam, Item, ItemFn, Lifetime, Pat, PatIdent, ReturnType, Signature,
    Token, Type, TypeImplTrait, TypeReference,
};

use crate::diag::{error, Errors};
use crate::model::{Arg, Macro, Output};

/// Refuses every spawn, clock read, random draw, non-durable wait or race and
/// hash-order iteration in a workflow body (see [`determinism`]): one error
/// per occurrence, none under `#[keiro::nondeterministic_ok]`.
pub(crate) fn deterministic_body(
    inputs: &Punctuated<FnArg, Token![,]>,
    body: &Block,
) -> syn::Result<()> {
    let inputs: Vec<FnArg> = inputs.iter().cloned().collect();
    let mut errors = Errors::default();
    for error in determinism::check(&inputs, body) {
        errors.push(error);
    }
    errors.finish()
}

/// The annotated item, which must be a function with a body.
pub(crate) fn item_fn(mac: Macro, item: TokenStream) -> syn::Result<ItemFn> {
    let attr = mac.attr();
    let item = match syn::parse2::<Item>(item.clone()) {
        Ok(Item::Fn(func)) => return Ok(func),
        Ok(item) => item,
        Err(_) => {
            return Err(error(
                item,
                format!("`{attr}` can only be applied to an `async fn` with a body"),
            ))
        }
    };
    let (what, head) = match &item {
        Item::Struct(i) => ("a struct", head(&i.struct_token, &i.ident)),
        Item::Enum(i) => ("an enum", head(&i.enum_token, &i.ident)),
        Item::Union(i) => ("a union", head(&i.union_token, &i.ident)),
        Item::Trait(i) => ("a trait", head(&i.trait_token, &i.ident)),
        Item::TraitAlias(i) => ("a trait alias", head(&i.trait_token, &i.ident)),
        Item::Impl(i) => ("an `impl` block", head(&i.impl_token, &i.self_ty)),
        Item::Mod(i) => ("a module", head(&i.mod_token, &i.ident)),
        Item::Const(i) => ("a constant", head(&i.const_token, &i.ident)),
        Item::Static(i) => ("a static", head(&i.static_token, &i.ident)),
        Item::Type(i) => ("a type alias", head(&i.type_token, &i.ident)),
        Item::Use(i) => ("a `use` declaration", i.to_token_stream()),
        Item::ExternCrate(i) => ("an `extern crate` declaration", i.to_token_stream()),
        Item::ForeignMod(i) => ("an `extern` block", i.abi.to_token_stream()),
        Item::Macro(i) => ("a macro invocation", i.mac.path.to_token_stream()),
        other => ("this item", other.to_token_stream()),
    };
    Err(error(
        head,
        format!("`{attr}` can only be applied to an `async fn`, not to {what}; move it onto an `async fn`"),
    ))
}

/// The keyword and name of an item (`struct Order`), to underline just that.
fn head(keyword: &dyn ToTokens, name: &dyn ToTokens) -> TokenStream {
    let mut tokens = keyword.to_token_stream();
    name.to_tokens(&mut tokens);
    tokens
}

/// Checks the signature and returns its arguments and return type.
pub(crate) fn signature(mac: Macro, sig: &Signature) -> syn::Result<(Vec<Arg>, Output)> {
    let attr = mac.attr();
    let mut errors = Errors::default();

    if let Some(token) = &sig.constness {
        errors.spanned(
            token,
            format!("`{attr}` functions cannot be `const`; remove `const`"),
        );
    }
    if sig.asyncness.is_none() {
        let (fn_token, ident) = (&sig.fn_token, &sig.ident);
        errors.spanned(
            &quote!(#fn_token #ident),
            format!("`{attr}` functions must be async; add `async` before `fn`"),
        );
    }
    if let Some(token) = &sig.unsafety {
        errors.spanned(
            token,
            format!(
                "`{attr}` functions cannot be `unsafe`; remove `unsafe` \
                 and use an `unsafe {{ .. }}` block inside the body"
            ),
        );
    }
    if let Some(abi) = &sig.abi {
        errors.spanned(
            abi,
            format!("`{attr}` functions cannot be `extern`; remove the ABI"),
        );
    }
    for param in &sig.generics.params {
        let message = match param {
            GenericParam::Lifetime(def) => format!(
                "`{attr}` functions cannot have lifetime parameters: {}; remove `{}` and take owned values",
                owned_reason(mac),
                def.lifetime
            ),
            GenericParam::Type(def) => format!(
                "`{attr}` functions cannot be generic: {}; remove `{}` and use a concrete type",
                concrete_reason(mac),
                def.ident
            ),
            GenericParam::Const(def) => format!(
                "`{attr}` functions cannot be generic: {}; remove `{}` and use a concrete value",
                concrete_reason(mac),
                def.ident
            ),
        };
        errors.spanned(param, message);
    }
    if let Some(where_clause) = &sig.generics.where_clause {
        errors.spanned(
            where_clause,
            format!(
                "`{attr}` functions cannot have a `where` clause; remove it and use concrete types"
            ),
        );
    }
    if let Some(variadic) = &sig.variadic {
        errors.spanned(
            variadic,
            format!("`{attr}` functions cannot be variadic; remove `...`"),
        );
    }

    let mut args = Vec::new();
    for input in &sig.inputs {
        match input {
            FnArg::Receiver(receiver) => errors.spanned(
                receiver,
                format!(
                    "`{attr}` functions cannot take `self`; remove the receiver \
                     and pass what the function needs as owned arguments"
                ),
            ),
            FnArg::Typed(pat_type) => {
                let type_ok = match borrowed_or_opaque(&pat_type.ty) {
                    Some(problem) => {
                        errors.spanned(problem.tokens(), problem.argument_message(mac));
                        false
                    }
                    None => true,
                };
                match &*pat_type.pat {
                    Pat::Ident(PatIdent {
                        by_ref: None,
                        subpat: None,
                        ident,
                        ..
                    }) => {
                        if type_ok {
                            args.push(Arg {
                                ident: ident.clone(),
                                ty: pat_type.ty.clone(),
                            });
                        }
                    }
                    pat => errors.spanned(
                        pat,
                        format!(
                            "`{attr}` arguments must be plain names such as `order: Order`; \
                             name the argument and destructure it inside the body"
                        ),
                    ),
                }
            }
        }
    }

    let output = match &sig.output {
        ReturnType::Default => Output { ty: None },
        ReturnType::Type(_, ty) => {
            if let Some(problem) = borrowed_or_opaque(ty) {
                errors.spanned(problem.tokens(), problem.return_message(mac));
            }
            Output {
                ty: Some(ty.clone()),
            }
        }
    };

    errors.finish()?;
    Ok((args, output))
}

fn owned_reason(mac: Macro) -> &'static str {
    match mac {
        Macro::Workflow => "arguments are journaled and rebuilt by the worker",
        Macro::Step => "a step runs as a `'static` future and may be retried",
    }
}

fn concrete_reason(mac: Macro) -> &'static str {
    match mac {
        Macro::Workflow => {
            "the worker rebuilds a call from its registered name and journaled input, \
             so every type must be known"
        }
        Macro::Step => "a step's result is journaled and replayed as one concrete type",
    }
}

/// A part of a type that cannot cross the journal or outlive the call.
enum Problem<'a> {
    Reference(&'a TypeReference),
    Lifetime(&'a Lifetime),
    ImplTrait(&'a TypeImplTrait),
}

impl Problem<'_> {
    fn tokens(&self) -> TokenStream {
        match self {
            Problem::Reference(r) => r.to_token_stream(),
            Problem::Lifetime(l) => l.to_token_stream(),
            Problem::ImplTrait(i) => i.to_token_stream(),
        }
    }

    fn argument_message(&self, mac: Macro) -> String {
        let attr = mac.attr();
        let reason = owned_reason(mac);
        match self {
            Problem::Reference(_) => format!(
                "`{attr}` arguments must be owned values, not references ({reason}); \
                 take an owned type such as `String` instead of `&str`"
            ),
            Problem::Lifetime(lifetime) => format!(
                "`{attr}` arguments must be owned values ({reason}); \
                 remove the borrow `{lifetime}` and take an owned type"
            ),
            Problem::ImplTrait(_) => {
                format!("`{attr}` arguments cannot be `impl Trait`; use a concrete type")
            }
        }
    }

    fn return_message(&self, mac: Macro) -> String {
        let attr = mac.attr();
        match self {
            Problem::Reference(_) => format!(
                "`{attr}` functions must return owned values, not references (the result is journaled); \
                 return an owned type such as `String` instead of `&str`"
            ),
            Problem::Lifetime(lifetime) => format!(
                "`{attr}` functions must return owned values (the result is journaled); \
                 remove the borrow `{lifetime}` and return an owned type"
            ),
            Problem::ImplTrait(_) => format!(
                "`{attr}` functions cannot return `impl Trait` (the result is journaled); \
                 return a concrete type"
            ),
        }
    }
}

/// The first reference, non-`'static` lifetime or `impl Trait` inside `ty`.
///
/// Function pointers and trait objects are not looked into: `fn(&str)` and
/// `Box<dyn Fn(&str) + Send>` are owned values.
fn borrowed_or_opaque(ty: &Type) -> Option<Problem<'_>> {
    struct Finder<'ast> {
        found: Option<Problem<'ast>>,
    }

    impl<'ast> Visit<'ast> for Finder<'ast> {
        fn visit_type_reference(&mut self, node: &'ast TypeReference) {
            self.found.get_or_insert(Problem::Reference(node));
        }
        fn visit_type_impl_trait(&mut self, node: &'ast TypeImplTrait) {
            self.found.get_or_insert(Problem::ImplTrait(node));
        }
        fn visit_lifetime(&mut self, node: &'ast Lifetime) {
            if node.ident != "static" {
                self.found.get_or_insert(Problem::Lifetime(node));
            }
        }
        fn visit_type_bare_fn(&mut self, _: &'ast syn::TypeBareFn) {}
        fn visit_type_trait_object(&mut self, _: &'ast syn::TypeTraitObject) {}
        fn visit_expr(&mut self, _: &'ast syn::Expr) {}
    }

    let mut finder = Finder { found: None };
    finder.visit_type(ty);
    finder.found
}

#[cfg(test)]
mod tests {
    use super::*;
    use syn::parse_quote;

    fn check(mac: Macro, func: ItemFn) -> Vec<String> {
        match signature(mac, &func.sig) {
            Ok(_) => Vec::new(),
            Err(err) => err.into_iter().map(|e| e.to_string()).collect(),
        }
    }

    fn single(mac: Macro, func: ItemFn) -> String {
        let errors = check(mac, func);
        assert_eq!(errors.len(), 1, "{errors:?}");
        errors.into_iter().next().unwrap_or_default()
    }

    #[test]
    fn plain_async_fns_pass() {
        let func: ItemFn = parse_quote! {
            async fn checkout(order: Order, mut n: u32, names: Vec<String>, s: Cow<'static, str>) -> Result<Receipt, ShopError> {}
        };
        let (args, output) = signature(Macro::Workflow, &func.sig).unwrap();
        let names: Vec<String> = args.iter().map(|a| a.ident.to_string()).collect();
        assert_eq!(names, ["order", "n", "names", "s"]);
        assert!(output.ty.is_some());
    }

    #[test]
    fn fn_pointers_and_trait_objects_are_owned() {
        let func: ItemFn = parse_quote! {
            async fn hook(f: fn(&str) -> bool, g: Box<dyn Fn(&str) + Send>, a: [u8; N]) {}
        };
        assert!(check(Macro::Step, func).is_empty());
    }

    #[test]
    fn must_be_async() {
        assert_eq!(
            single(
                Macro::Step,
                parse_quote!(
                    fn reserve() {}
                )
            ),
            "`#[step]` functions must be async; add `async` before `fn`"
        );
        assert_eq!(
            single(
                Macro::Workflow,
                parse_quote!(
                    pub fn checkout() {}
                )
            ),
            "`#[workflow]` functions must be async; add `async` before `fn`"
        );
    }

    #[test]
    fn no_self() {
        for func in [
            parse_quote!(
                async fn f(&self) {}
            ),
            parse_quote!(
                async fn f(self) {}
            ),
            parse_quote!(
                async fn f(self: Box<Self>) {}
            ),
        ] {
            assert!(single(Macro::Workflow, func)
                .starts_with("`#[workflow]` functions cannot take `self`"));
        }
    }

    #[test]
    fn no_generics() {
        assert!(single(
            Macro::Workflow,
            parse_quote!(
                async fn f<T: Serialize>(t: T) {}
            )
        )
        .starts_with("`#[workflow]` functions cannot be generic"));
        assert!(single(
            Macro::Step,
            parse_quote!(
                async fn f<const N: usize>() {}
            )
        )
        .starts_with("`#[step]` functions cannot be generic"));
        assert!(single(
            Macro::Step,
            parse_quote!(
                async fn f<'a>() {}
            )
        )
        .starts_with("`#[step]` functions cannot have lifetime parameters"));
        assert!(single(
            Macro::Step,
            parse_quote!(
                async fn f()
                where
                    u32: Copy,
                {
                }
            )
        )
        .starts_with("`#[step]` functions cannot have a `where` clause"));
    }

    #[test]
    fn no_borrowed_arguments() {
        assert!(single(
            Macro::Workflow,
            parse_quote!(
                async fn f(s: &str) {}
            )
        )
        .starts_with("`#[workflow]` arguments must be owned values, not references"));
        assert!(single(
            Macro::Step,
            parse_quote!(
                async fn f(s: Vec<&'static str>) {}
            )
        )
        .starts_with("`#[step]` arguments must be owned values, not references"));
        assert!(single(
            Macro::Step,
            parse_quote!(
                async fn f(s: Cow<'_, str>) {}
            )
        )
        .contains("remove the borrow `'_`"));
    }

    #[test]
    fn no_impl_trait() {
        assert_eq!(
            single(
                Macro::Step,
                parse_quote!(
                    async fn f(s: impl Into<String>) {}
                )
            ),
            "`#[step]` arguments cannot be `impl Trait`; use a concrete type"
        );
        assert!(single(
            Macro::Workflow,
            parse_quote!(
                async fn f() -> impl Serialize {}
            )
        )
        .starts_with("`#[workflow]` functions cannot return `impl Trait`"));
        assert!(single(
            Macro::Workflow,
            parse_quote!(
                async fn f() -> &'static str {}
            )
        )
        .starts_with("`#[workflow]` functions must return owned values, not references"));
    }

    #[test]
    fn only_plain_identifiers() {
        for func in [
            parse_quote!(
                async fn f((a, b): (u32, u32)) {}
            ),
            parse_quote!(
                async fn f(_: u32) {}
            ),
            parse_quote!(
                async fn f(ref a: u32) {}
            ),
            parse_quote!(
                async fn f(a @ 1..=2: u32) {}
            ),
            parse_quote!(
                async fn f(Wrapper(a): Wrapper) {}
            ),
        ] {
            assert!(single(Macro::Step, func)
                .starts_with("`#[step]` arguments must be plain names such as `order: Order`"));
        }
    }

    #[test]
    fn no_const_unsafe_extern_or_variadic() {
        assert!(single(
            Macro::Step,
            parse_quote!(
                const async fn f() {}
            )
        )
        .starts_with("`#[step]` functions cannot be `const`"));
        assert!(single(
            Macro::Step,
            parse_quote!(
                async unsafe fn f() {}
            )
        )
        .starts_with("`#[step]` functions cannot be `unsafe`"));
        assert!(single(
            Macro::Step,
            parse_quote!(
                async extern "C" fn f() {}
            )
        )
        .starts_with("`#[step]` functions cannot be `extern`"));
        let errors = check(
            Macro::Workflow,
            parse_quote!(
                unsafe extern "C" fn f(a: u32, ...) {}
            ),
        );
        assert_eq!(errors.len(), 4, "{errors:?}");
    }

    #[test]
    fn all_problems_are_reported() {
        let errors = check(
            Macro::Workflow,
            parse_quote!(
                fn f<T>(&self, a: &str, (b, c): (u32, u32), d: impl Sized) -> &str {}
            ),
        );
        assert_eq!(errors.len(), 7, "{errors:?}");
    }

    #[test]
    fn non_functions_are_rejected() {
        let cases = [
            (
                quote!(
                    struct Order {
                        id: u32,
                    }
                ),
                "a struct",
            ),
            (
                quote!(
                    enum E {
                        A,
                    }
                ),
                "an enum",
            ),
            (quote!(impl Order {}), "an `impl` block"),
            (
                quote!(
                    mod m {}
                ),
                "a module",
            ),
            (
                quote!(
                    const X: u32 = 1;
                ),
                "a constant",
            ),
            (
                quote!(
                    trait T {}
                ),
                "a trait",
            ),
        ];
        for (item, what) in cases {
            let err = item_fn(Macro::Workflow, item).err().unwrap().to_string();
            assert_eq!(
                err,
                format!("`#[workflow]` can only be applied to an `async fn`, not to {what}; move it onto an `async fn`")
            );
        }
        let err = item_fn(
            Macro::Step,
            quote!(
                async fn f();
            ),
        )
        .err()
        .unwrap()
        .to_string();
        assert!(
            err.starts_with("`#[step]` can only be applied to an `async fn`"),
            "{err}"
        );
        assert!(item_fn(
            Macro::Step,
            quote!(
                async fn f() {}
            )
        )
        .is_ok());
    }
}
