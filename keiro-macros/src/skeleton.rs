//! A workflow body's step-call skeleton: the awaited calls in the order the
//! code makes them (the final path segment of each called function or
//! method) and the control flow around them (`if`, `match`, loops), and
//! nothing else. Its hash, recorded with each instance, tells a pre-deploy
//! check (`keiro check --binary-hashes`) which instances new code could
//! replay differently: a change to plain expressions keeps it, inserting,
//! removing or reordering an awaited call changes it.
//!
//! It is a syntactic approximation: an awaited call inside a helper
//! function is invisible to it; a macro's arguments are seen only when they
//! parse as a list of expressions, and the calls handed to a `join`/`select`
//! macro (`join!(a(), b())`) count as awaited there. `keiro::select!`'s own
//! syntax does not parse so: it is skipped.

use syn::punctuated::Punctuated;
use syn::visit::{self, Visit};
use syn::{Block, Expr, Token};

use crate::fingerprint::fnv1a_hex;

/// The skeleton of `body` as text: one token per awaited call or
/// control-flow marker, separated by spaces.
pub(crate) fn skeleton(body: &Block) -> String {
    let mut walk = Skeleton::default();
    walk.visit_block(body);
    walk.out.join(" ")
}

/// The hash of [`skeleton`]`(body)`.
pub(crate) fn skeleton_hash(body: &Block) -> String {
    fnv1a_hex(skeleton(body).as_bytes())
}

#[derive(Default)]
struct Skeleton {
    out: Vec<String>,
}

impl Skeleton {
    fn mark(&mut self, marker: &str) {
        self.out.push(marker.to_owned());
    }

    /// Visits `inner` between `open{` and `}`.
    fn scope(&mut self, open: &str, inner: impl FnOnce(&mut Self)) {
        self.out.push(format!("{open}{{"));
        inner(self);
        self.mark("}");
    }
}

/// What an awaited expression calls: the last segment of a called path
/// (`step_a(..)`, `keiro::sleep(..)`), through builder methods on such a
/// call (`child(..).id(..)` is `child`); else the method's name; `await`
/// for a future held in a variable.
fn callee(expr: &Expr) -> String {
    match expr {
        Expr::Call(call) => match &*call.func {
            Expr::Path(path) => path
                .path
                .segments
                .last()
                .map_or_else(|| "call".to_owned(), |s| s.ident.to_string()),
            other => callee(other),
        },
        Expr::MethodCall(method) => match root_call(&method.receiver) {
            Some(name) => name,
            None => method.method.to_string(),
        },
        Expr::Paren(inner) => callee(&inner.expr),
        Expr::Group(inner) => callee(&inner.expr),
        Expr::Macro(mac) => mac
            .mac
            .path
            .segments
            .last()
            .map_or_else(|| "macro!".to_owned(), |s| format!("{}!", s.ident)),
        Expr::Async(_) | Expr::Block(_) => "async".to_owned(),
        _ => "await".to_owned(),
    }
}

/// The called path's last segment at the root of a method chain, if the
/// chain starts with a path call.
fn root_call(expr: &Expr) -> Option<String> {
    match expr {
        Expr::Call(call) => match &*call.func {
            Expr::Path(path) => path.path.segments.last().map(|s| s.ident.to_string()),
            _ => None,
        },
        Expr::MethodCall(method) => root_call(&method.receiver),
        Expr::Paren(inner) => root_call(&inner.expr),
        _ => None,
    }
}

impl<'ast> Visit<'ast> for Skeleton {
    fn visit_expr_await(&mut self, node: &'ast syn::ExprAwait) {
        // Arguments are evaluated (and their awaits made) before the call.
        visit::visit_expr(self, &node.base);
        self.out.push(callee(&node.base));
    }

    fn visit_expr_if(&mut self, node: &'ast syn::ExprIf) {
        self.visit_expr(&node.cond);
        self.scope("if", |s| s.visit_block(&node.then_branch));
        if let Some((_, otherwise)) = &node.else_branch {
            self.scope("else", |s| s.visit_expr(otherwise));
        }
    }

    fn visit_expr_match(&mut self, node: &'ast syn::ExprMatch) {
        self.visit_expr(&node.expr);
        self.scope("match", |s| {
            for arm in &node.arms {
                s.scope("arm", |s| {
                    if let Some((_, guard)) = &arm.guard {
                        s.visit_expr(guard);
                    }
                    s.visit_expr(&arm.body);
                });
            }
        });
    }

    fn visit_expr_loop(&mut self, node: &'ast syn::ExprLoop) {
        self.scope("loop", |s| s.visit_block(&node.body));
    }

    fn visit_expr_while(&mut self, node: &'ast syn::ExprWhile) {
        self.scope("loop", |s| {
            s.visit_expr(&node.cond);
            s.visit_block(&node.body);
        });
    }

    fn visit_expr_for_loop(&mut self, node: &'ast syn::ExprForLoop) {
        self.visit_expr(&node.expr);
        self.scope("loop", |s| s.visit_block(&node.body));
    }

    fn visit_macro(&mut self, node: &'ast syn::Macro) {
        let name = node
            .path
            .segments
            .last()
            .map_or_else(String::new, |s| s.ident.to_string());
        let Ok(args) = node.parse_body_with(Punctuated::<Expr, Token![,]>::parse_terminated) else {
            return;
        };
        if name.contains("join") || name.contains("select") {
            // The futures it runs together are calls it is given, not awaits.
            self.scope(&format!("{name}!"), |s| {
                for arg in &args {
                    s.visit_expr(arg);
                    if matches!(arg, Expr::Call(_) | Expr::MethodCall(_)) {
                        s.out.push(callee(arg));
                    }
                }
            });
        } else {
            // Logging and formatting macros: only awaits inside count.
            for arg in &args {
                self.visit_expr(arg);
            }
        }
    }

    // A nested item (fn, impl, …) is not part of the body's run.
    fn visit_item(&mut self, _: &'ast syn::Item) {}
}

#[cfg(test)]
mod tests {
    use proc_macro2::TokenStream;
    use quote::quote;

    use super::*;

    fn hash_of(body: TokenStream) -> String {
        skeleton_hash(&syn::parse2(body).expect("a block"))
    }

    fn text(body: TokenStream) -> String {
        skeleton(&syn::parse2(body).expect("a block"))
    }

    #[test]
    fn awaited_calls_are_kept_in_order_with_their_final_segment() {
        let s = text(quote! {{
            let hold = reserve(order.sku.clone(), order.qty).await?;
            keiro::sleep(Duration::from_secs(3600)).await;
            let approval = keiro::awakeable::<bool>().await;
            let approved = approval.await?;
            let label = ship(order.clone()).id("x").await?;
            Ok(Receipt { hold, approved, label })
        }});
        assert_eq!(s, "reserve sleep awakeable await ship");
    }

    #[test]
    fn plain_expressions_do_not_change_the_hash() {
        let a = hash_of(quote! {{
            let x = step_a(1).await;
            let y = x + 1;
            step_b(y, "a").await
        }});
        let b = hash_of(quote! {{
            let x = step_a(2 * n).await;
            let y = x * 3 - 7;
            tracing::info!(y, "computed");
            step_b(format!("{y}"), "b").await
        }});
        assert_eq!(a, b);
    }

    #[test]
    fn inserting_removing_or_reordering_an_awaited_call_changes_the_hash() {
        let base = hash_of(quote! {{ step_a().await; step_b().await; }});
        let inserted = hash_of(quote! {{ step_a().await; audit().await; step_b().await; }});
        let removed = hash_of(quote! {{ step_a().await; }});
        let reordered = hash_of(quote! {{ step_b().await; step_a().await; }});
        for other in [&inserted, &removed, &reordered] {
            assert_ne!(&base, other);
        }
    }

    #[test]
    fn control_flow_around_calls_is_part_of_the_skeleton() {
        let s = text(quote! {{
            if step_a().await { step_b().await; } else { step_c().await; }
            match kind { A => step_d().await, _ => {} }
            for item in items { step_e(item).await; }
            loop { break; }
            while keep() { step_f().await; }
        }});
        assert_eq!(
            s,
            "step_a if{ step_b } else{ step_c } match{ arm{ step_d } arm{ } } \
             loop{ step_e } loop{ } loop{ step_f }"
        );
        let moved_into_branch = hash_of(quote! {{ if c { step_a().await; } }});
        let outside = hash_of(quote! {{ if c { } step_a().await; }});
        assert_ne!(moved_into_branch, outside);
    }

    #[test]
    fn macro_arguments_and_nested_awaits_are_seen() {
        let s = text(quote! {{
            let (a, b) = futures::join!(step_a(), step_b());
            step_c(step_d().await).await;
            fn helper() { ignored(); }
        }});
        assert_eq!(s, "join!{ step_a step_b } step_d step_c");
    }
}
