//! The determinism lints of a `#[workflow]` body.
//!
//! A workflow is replayed from its journal: its code must take the same path
//! every time, which the journal guarantees only for what goes through keiro
//! (steps, `keiro::sleep`, `keiro::now`, `keiro::uuid`, `keiro::select!`,
//! child workflows). Calls that read the clock, draw random numbers, wait or
//! race outside the journal, spawn tasks (see [`super::spawn`]) or iterate
//! a hash collection (see [`super::hash_order`]) are refused at their span,
//! each error naming the keiro replacement and the escape attribute
//! ([`super::escape`]).
//!
//! What is walked: the body with its nested blocks, closures, `async` blocks
//! and the arguments of macros that take expressions (`join!`, `vec!`,
//! `format!`) or `keiro::select!` branches. Not walked: nested items (a
//! `fn` or `#[step]` declared in the body, `impl` blocks), code in other
//! functions the body calls, and anything under `#[keiro::nondeterministic_ok]`.
//!
//! Paths are matched as written, so a `use` alias is caught only in the forms
//! listed in each table below (`time::sleep` after `use tokio::time`, but not
//! a bare `sleep(..)`, which may as well be `keiro::sleep`).

use proc_macro2::TokenStream;
use quote::ToTokens;
use syn::punctuated::Punctuated;
use syn::visit::Visit;
use syn::{
    Attribute, Block, Expr, ExprCall, ExprClosure, ExprForLoop, ExprMethodCall, FnArg, Item, Local,
    Macro, Path, Stmt, Token,
};

use super::escape::{self, ESCAPE};
use super::{hash_order, spawn};
use crate::diag::{error, path_text};

/// What a finding is about, which decides its message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Lint {
    /// A spawned task or thread.
    Spawn,
    /// A non-durable `select!`.
    Select,
    /// A non-durable wait.
    Sleep,
    /// A clock read.
    Clock,
    /// A random draw.
    Random,
    /// An iteration over a `HashMap`/`HashSet` binding (its kind).
    HashOrder(&'static str),
}

/// `tokio::time::sleep(..)` and the other waits that are not journaled.
const SLEEPS: &[&[&str]] = &[
    &["tokio", "time", "sleep"],
    &["tokio", "time", "sleep_until"],
    &["time", "sleep"],
    &["time", "sleep_until"],
    &["std", "thread", "sleep"],
    &["thread", "sleep"],
];

/// Clock reads, matched on the last two segments whatever comes before them
/// (`std::time::Instant::now`, `tokio::time::Instant::now`, `Instant::now`).
const CLOCKS: &[&[&str]] = &[&["SystemTime", "now"], &["Instant", "now"]];

/// Random draws.
const RANDOMS: &[&[&str]] = &[
    &["rand", "random"],
    &["rand", "thread_rng"],
    &["rand", "rng"],
];

/// Races decided by whichever future is ready first.
const SELECTS: &[&[&str]] = &[
    &["tokio", "select"],
    &["futures", "select"],
    &["futures", "select_biased"],
];

/// One refused call or iteration in a workflow body.
pub(crate) struct Finding {
    pub(crate) lint: Lint,
    /// The tokens to underline.
    pub(crate) tokens: TokenStream,
    /// How the user wrote it, for the message: "`tokio::time::sleep`".
    pub(crate) what: String,
}

impl Finding {
    /// The error at the user's span: what is wrong, the keiro replacement and
    /// the escape attribute.
    pub(crate) fn error(&self) -> syn::Error {
        let what = &self.what;
        let problem = match self.lint {
            Lint::Spawn => format!(
                "{what} inside a `#[workflow]` runs its task outside the workflow, so steps called \
                 there are not journaled and run again after a crash; use \
                 `keiro::spawn(child_workflow(..))` for concurrent work, `futures::join!`/`tokio::join!` \
                 of steps, or move the spawn into a `#[step]`"
            ),
            Lint::Select => format!(
                "{what} inside a `#[workflow]` takes whichever branch is ready first, which can \
                 differ when the workflow is replayed; use `keiro::select!`, which journals the \
                 winning branch"
            ),
            Lint::Sleep => format!(
                "{what} inside a `#[workflow]` waits outside the journal: the wait starts over on \
                 every replay and is lost in a crash; use `keiro::sleep(..)` or \
                 `keiro::sleep_until(..)`, a durable timer"
            ),
            Lint::Clock => format!(
                "{what} inside a `#[workflow]` reads the clock, which answers differently when the \
                 workflow is replayed; use `keiro::now().await`, whose answer is journaled, or read \
                 the clock in a `#[step]`"
            ),
            Lint::Random => format!(
                "{what} inside a `#[workflow]` draws a new value when the workflow is replayed; use \
                 `keiro::uuid().await`, whose value is journaled, or draw the value in a `#[step]`"
            ),
            Lint::HashOrder(kind) => {
                let ordered = kind.replace("Hash", "BTree");
                format!(
                    "{what} iterates a `{kind}` inside a `#[workflow]`: its order changes from one \
                     process to the next, so a replay can call steps in another order; use a \
                     `{ordered}`, or sort the entries before using them"
                )
            }
        };
        error(
            &self.tokens,
            format!("{problem} (or put `{ESCAPE}` on the statement or expression to allow it on purpose)"),
        )
    }
}

/// Every finding in a workflow body whose arguments are `inputs`, in source
/// order, plus an error for each escape attribute written with arguments.
pub(crate) fn check(inputs: &[FnArg], block: &Block) -> Vec<syn::Error> {
    let mut walker = Walker::new(inputs);
    walker.visit_block(block);
    walker
        .misused
        .into_iter()
        .chain(walker.found.iter().map(Finding::error))
        .collect()
}

/// [`check`]'s findings, for the unit tests of each lint.
#[cfg(test)]
pub(crate) fn findings(inputs: &[FnArg], block: &Block) -> Vec<Finding> {
    let mut walker = Walker::new(inputs);
    walker.visit_block(block);
    walker.found
}

struct Walker {
    found: Vec<Finding>,
    misused: Vec<syn::Error>,
    /// The names in scope, innermost scope last, each with the hash
    /// collection it is known to hold (`None`: something else, which shadows).
    scopes: Vec<Vec<(syn::Ident, Option<&'static str>)>>,
    /// Iterating calls whose elements end up sorted (collected into a
    /// `BTreeMap`/`BTreeSet`), by address.
    sorted: Vec<*const ExprMethodCall>,
}

impl Walker {
    fn new(inputs: &[FnArg]) -> Self {
        let arguments = inputs
            .iter()
            .filter_map(|input| match input {
                FnArg::Typed(typed) => hash_order::single_binding(&typed.pat)
                    .map(|(ident, _)| (ident.clone(), hash_order::hash_type(&typed.ty))),
                FnArg::Receiver(_) => None,
            })
            .collect();
        Walker {
            found: Vec::new(),
            misused: Vec::new(),
            scopes: vec![arguments],
            sorted: Vec::new(),
        }
    }

    /// Whether the escape attribute is among `attrs` (reporting it if it is
    /// misused).
    fn escaped(&mut self, attrs: &[Attribute]) -> bool {
        self.misused.extend(escape::misused(attrs));
        escape::escaped(attrs)
    }

    /// The hash collection `name` holds, looking from the innermost scope out.
    fn hash_binding(&self, name: &syn::Ident) -> Option<&'static str> {
        self.scopes
            .iter()
            .rev()
            .flat_map(|scope| scope.iter().rev())
            .find(|(ident, _)| ident == name)
            .and_then(|(_, kind)| *kind)
    }

    fn declare(&mut self, ident: syn::Ident, kind: Option<&'static str>) {
        if let Some(scope) = self.scopes.last_mut() {
            scope.push((ident, kind));
        }
    }

    /// Runs `walk` in a new scope holding the names `pats` bind.
    fn scoped<'p>(
        &mut self,
        pats: impl IntoIterator<Item = &'p syn::Pat>,
        walk: impl FnOnce(&mut Self),
    ) {
        let names = pats
            .into_iter()
            .flat_map(hash_order::pattern_names)
            .map(|ident| (ident, None))
            .collect();
        self.scopes.push(names);
        walk(self);
        self.scopes.pop();
    }

    /// Records a finding when `path` is one of the forms of `tables` (each a
    /// lint, its forms, and whether a form matches as a suffix or only
    /// whole); `bang` is `"!"` for a macro, for the message.
    fn path_lint(&mut self, path: &Path, tables: &[(Lint, &[&[&str]], bool)], bang: &str) {
        let segments: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
        for (lint, forms, suffix) in tables {
            let hit = forms.iter().any(|form| {
                if *suffix {
                    segments.ends_with(&form.iter().map(|s| s.to_string()).collect::<Vec<_>>())
                } else {
                    form.iter().eq(segments.iter())
                }
            });
            if hit {
                self.found.push(Finding {
                    lint: *lint,
                    tokens: path.to_token_stream(),
                    what: format!("`{}{bang}`", path_text(path)),
                });
                return;
            }
        }
    }

    fn hash_iteration(&mut self, binding: &syn::Ident, tokens: TokenStream, what: String) {
        if let Some(kind) = self.hash_binding(binding) {
            self.found.push(Finding {
                lint: Lint::HashOrder(kind),
                tokens,
                what,
            });
        }
    }
}

impl<'ast> Visit<'ast> for Walker {
    /// Nested items are other functions, not the workflow.
    fn visit_item(&mut self, _: &'ast Item) {}

    fn visit_block(&mut self, block: &'ast Block) {
        self.scoped([], |walker| syn::visit::visit_block(walker, block));
    }

    fn visit_stmt(&mut self, stmt: &'ast Stmt) {
        // An expression statement's attributes are the expression's, which
        // `visit_expr` reads.
        let attrs: &[Attribute] = match stmt {
            Stmt::Local(local) => &local.attrs,
            Stmt::Macro(mac) => &mac.attrs,
            Stmt::Expr(..) | Stmt::Item(_) => &[],
        };
        if self.escaped(attrs) {
            // An allowed `let` still shadows; a hash collection it creates may
            // be iterated freely.
            if let Stmt::Local(local) = stmt {
                for ident in hash_order::pattern_names(&local.pat) {
                    self.declare(ident, None);
                }
            }
            return;
        }
        syn::visit::visit_stmt(self, stmt);
    }

    fn visit_local(&mut self, local: &'ast Local) {
        let annotated_ordered = hash_order::single_binding(&local.pat)
            .and_then(|(_, ty)| ty)
            .is_some_and(hash_order::ordered_type);
        if let (true, Some(init)) = (annotated_ordered, &local.init) {
            self.sorted
                .extend(hash_order::collected_iteration(&init.expr).map(|c| c as *const _));
        }
        if let Some(init) = &local.init {
            self.visit_expr(&init.expr);
            if let Some((_, diverge)) = &init.diverge {
                self.visit_expr(diverge);
            }
        }
        match hash_order::single_binding(&local.pat) {
            Some((ident, ty)) => {
                let kind = ty.and_then(hash_order::hash_type).or_else(|| {
                    let init = &local.init.as_ref()?.expr;
                    hash_order::hash_init(init, &|name| self.hash_binding(name))
                });
                self.declare(ident.clone(), kind);
            }
            None => {
                for ident in hash_order::pattern_names(&local.pat) {
                    self.declare(ident, None);
                }
            }
        }
    }

    fn visit_expr(&mut self, expr: &'ast Expr) {
        if self.escaped(escape::expr_attrs(expr)) {
            return;
        }
        syn::visit::visit_expr(self, expr);
    }

    fn visit_expr_call(&mut self, call: &'ast ExprCall) {
        if let Some(finding) = spawn::spawn_call(call) {
            self.found.push(finding);
        } else if let Expr::Path(path) = &*call.func {
            if path.qself.is_none() {
                self.path_lint(
                    &path.path,
                    &[
                        (Lint::Sleep, SLEEPS, false),
                        (Lint::Clock, CLOCKS, true),
                        (Lint::Random, RANDOMS, false),
                    ],
                    "",
                );
            }
        }
        syn::visit::visit_expr_call(self, call);
    }

    fn visit_expr_method_call(&mut self, call: &'ast ExprMethodCall) {
        if let Some(finding) = spawn::spawn_method_call(call) {
            self.found.push(finding);
        }
        if hash_order::collects_ordered(call) {
            self.sorted
                .extend(hash_order::collected_iteration_of(call).map(|c| c as *const _));
        }
        let sorted = self.sorted.contains(&(call as *const _));
        if hash_order::is_iterating_method(&call.method) && !sorted {
            if let Some(binding) = hash_order::binding(&call.receiver) {
                let mut tokens = call.receiver.to_token_stream();
                call.dot_token.to_tokens(&mut tokens);
                call.method.to_tokens(&mut tokens);
                let what = format!("`{binding}.{}()`", call.method);
                self.hash_iteration(binding, tokens, what);
            }
        }
        syn::visit::visit_expr_method_call(self, call);
    }

    fn visit_expr_for_loop(&mut self, for_loop: &'ast ExprForLoop) {
        if let Some(binding) = hash_order::for_loop_binding(&for_loop.expr) {
            let what = format!("`for .. in {}`", path_text_of(&for_loop.expr));
            self.hash_iteration(binding, for_loop.expr.to_token_stream(), what);
        }
        self.visit_expr(&for_loop.expr);
        self.scoped([&*for_loop.pat], |walker| {
            walker.visit_block(&for_loop.body)
        });
    }

    fn visit_expr_closure(&mut self, closure: &'ast ExprClosure) {
        self.scoped(&closure.inputs, |walker| walker.visit_expr(&closure.body));
    }

    fn visit_macro(&mut self, mac: &'ast Macro) {
        self.path_lint(&mac.path, &[(Lint::Select, SELECTS, false)], "!");
        // Macro arguments are opaque tokens; look into those that parse as
        // comma-separated expressions (`tokio::join!`, `vec!`, `assert!`) or
        // as `keiro::select!` branches.
        if let Ok(args) = mac.parse_body_with(Punctuated::<Expr, Token![,]>::parse_terminated) {
            for arg in &args {
                self.visit_expr(arg);
            }
        } else if let Ok(select) = mac.parse_body::<crate::select::SelectInput>() {
            for branch in &select.branches {
                self.visit_expr(&branch.future);
                self.scoped([&branch.pat], |walker| walker.visit_expr(&branch.handler));
            }
        }
    }
}

/// `m`, `&m` or `&mut m` as written, for the message.
fn path_text_of(expr: &Expr) -> String {
    match expr {
        Expr::Reference(reference) => {
            let mutability = if reference.mutability.is_some() {
                "mut "
            } else {
                ""
            };
            format!("&{mutability}{}", path_text_of(&reference.expr))
        }
        Expr::Path(path) => path_text(&path.path),
        Expr::Paren(paren) => path_text_of(&paren.expr),
        other => other.to_token_stream().to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use syn::{parse_quote, ItemFn};

    /// `(lint, what)` of every finding in `func`'s body.
    fn found(func: ItemFn) -> Vec<(Lint, String)> {
        let inputs: Vec<FnArg> = func.sig.inputs.iter().cloned().collect();
        findings(&inputs, &func.block)
            .into_iter()
            .map(|f| (f.lint, f.what))
            .collect()
    }

    fn whats(func: ItemFn) -> Vec<String> {
        found(func).into_iter().map(|(_, what)| what).collect()
    }

    #[test]
    fn clock_random_wait_and_race_calls_are_found() {
        let func: ItemFn = parse_quote! {
            async fn f() {
                let a = std::time::SystemTime::now();
                let b = SystemTime::now();
                let c = ::std::time::Instant::now();
                let d = tokio::time::Instant::now();
                tokio::time::sleep(d).await;
                time::sleep_until(d).await;
                std::thread::sleep(d);
                thread::sleep(d);
                let r: u8 = rand::random();
                let g = rand::thread_rng();
                let h = ::rand::rng();
                tokio::select! { _ = a => {} }
                futures::select! { _ = a => {} }
            }
        };
        assert_eq!(
            found(func),
            [
                (Lint::Clock, "`std::time::SystemTime::now`".to_string()),
                (Lint::Clock, "`SystemTime::now`".into()),
                (Lint::Clock, "`::std::time::Instant::now`".into()),
                (Lint::Clock, "`tokio::time::Instant::now`".into()),
                (Lint::Sleep, "`tokio::time::sleep`".into()),
                (Lint::Sleep, "`time::sleep_until`".into()),
                (Lint::Sleep, "`std::thread::sleep`".into()),
                (Lint::Sleep, "`thread::sleep`".into()),
                (Lint::Random, "`rand::random`".into()),
                (Lint::Random, "`rand::thread_rng`".into()),
                (Lint::Random, "`::rand::rng`".into()),
                (Lint::Select, "`tokio::select!`".into()),
                (Lint::Select, "`futures::select!`".into()),
            ]
        );
    }

    #[test]
    fn keiro_replacements_and_bare_names_are_allowed() {
        let func: ItemFn = parse_quote! {
            async fn f() {
                let now = keiro::now().await;
                let id = keiro::uuid().await;
                keiro::sleep(d).await;
                sleep(d).await;
                keiro::select! { v = step() => v, _ = keiro::sleep(d) => 0 }
                select! { v = step() => v }
                let later = now + d;
                let rng = my::rand::random();
                let when = deadline.now();
            }
        };
        assert!(found(func).is_empty());
    }

    #[test]
    fn closures_async_blocks_and_macro_arguments_are_walked_nested_items_are_not() {
        let func: ItemFn = parse_quote! {
            async fn f() {
                let a = || SystemTime::now();
                let b = async { tokio::time::sleep(d).await };
                tokio::join!(step(), async { Instant::now() });
                println!("{:?}", SystemTime::now());
                keiro::select! {
                    v = step() => Instant::now(),
                    _ = keiro::sleep(d) => SystemTime::now(),
                }
                fn helper() -> SystemTime {
                    SystemTime::now()
                }
                #[keiro::step]
                async fn timed() -> u64 {
                    Instant::now().elapsed().as_secs()
                }
                impl Clock {
                    fn read() -> SystemTime {
                        SystemTime::now()
                    }
                }
            }
        };
        assert_eq!(
            whats(func),
            [
                "`SystemTime::now`",
                "`tokio::time::sleep`",
                "`Instant::now`",
                "`SystemTime::now`",
                "`Instant::now`",
                "`SystemTime::now`",
            ]
        );
    }

    #[test]
    fn the_escape_attribute_silences_what_it_is_on() {
        let func: ItemFn = parse_quote! {
            async fn f() {
                #[keiro::nondeterministic_ok]
                let a = SystemTime::now();
                #[keiro::nondeterministic_ok]
                tokio::time::sleep(d).await;
                #[keiro::nondeterministic_ok]
                tokio::select! { _ = a => {} }
                let b = (#[keiro::nondeterministic_ok] Instant::now(), Instant::now());
                #[nondeterministic_ok]
                for x in &m {}
                let c = #[keiro::nondeterministic_ok] || tokio::spawn(async {});
                #[keiro::nondeterministic_ok]
                {
                    rand::random::<u8>();
                }
            }
        };
        assert_eq!(whats(func), ["`Instant::now`"]);
    }

    #[test]
    fn a_misused_escape_is_reported() {
        let func: ItemFn = parse_quote! {
            async fn f() {
                #[keiro::nondeterministic_ok(reason)]
                let a = SystemTime::now();
                #[keiro::nondeterministic_ok = "reason"]
                tokio::time::sleep(d).await;
                #[keiro::nondeterministic_ok(reason)]
                for x in &m {}
            }
        };
        let errors = check(&[], &func.block);
        assert_eq!(errors.len(), 3, "one error per attribute: {errors:?}");
        assert!(errors[0].to_string().contains("takes no arguments"));
    }

    #[test]
    fn hash_collections_are_tracked_through_lets_arguments_and_scopes() {
        let func: ItemFn = parse_quote! {
            async fn f(input: HashMap<String, u64>, list: Vec<u64>) {
                for (k, v) in input {}
                for x in &list {}
                let mut m: std::collections::HashMap<u8, u8> = Default::default();
                let s = HashSet::new();
                let t = list.iter().copied().collect::<HashSet<u64>>();
                let u = t.clone();
                for x in &mut m {}
                let firsts: Vec<_> = s.iter().collect();
                u.into_iter().for_each(drop);
                {
                    let m = BTreeMap::new();
                    for x in &m {}
                }
                m.keys().count();
                let ordered: BTreeMap<_, _> = m.iter().collect();
                let sorted = m.values().collect::<BTreeSet<_>>();
                let m = vec![1];
                for x in &m {}
                let by_value = list.iter().map(|m| m.iter()).count();
                m.len();
            }
        };
        assert_eq!(
            found(func),
            [
                (Lint::HashOrder("HashMap"), "`for .. in input`".to_string()),
                (Lint::HashOrder("HashMap"), "`for .. in &mut m`".into()),
                (Lint::HashOrder("HashSet"), "`s.iter()`".into()),
                (Lint::HashOrder("HashSet"), "`u.into_iter()`".into()),
                (Lint::HashOrder("HashMap"), "`m.keys()`".into()),
            ]
        );
    }

    #[test]
    fn messages_name_the_call_the_replacement_and_the_escape() {
        let func: ItemFn = parse_quote! {
            async fn f(m: HashSet<u8>) {
                tokio::select! { _ = a => {} }
                tokio::time::sleep(d).await;
                SystemTime::now();
                rand::random::<u8>();
                for x in m {}
            }
        };
        let messages: Vec<String> = check(
            &func.sig.inputs.iter().cloned().collect::<Vec<_>>(),
            &func.block,
        )
        .iter()
        .map(|e| e.to_string())
        .collect();
        let expected = [
            (
                "`tokio::select!` inside a `#[workflow]`",
                "use `keiro::select!`",
            ),
            (
                "`tokio::time::sleep` inside a `#[workflow]`",
                "use `keiro::sleep(..)`",
            ),
            (
                "`SystemTime::now` inside a `#[workflow]`",
                "use `keiro::now().await`",
            ),
            (
                "`rand::random` inside a `#[workflow]`",
                "use `keiro::uuid().await`",
            ),
            ("`for .. in m` iterates a `HashSet`", "use a `BTreeSet`"),
        ];
        assert_eq!(messages.len(), expected.len());
        for (message, (start, fix)) in messages.iter().zip(expected) {
            assert!(message.starts_with(start), "{message}");
            assert!(message.contains(fix), "{message}");
            assert!(
                message.contains("#[keiro::nondeterministic_ok]"),
                "{message}"
            );
        }
    }
}
