//! Which local bindings of a `#[workflow]` body hold a `HashMap` or a
//! `HashSet`, as far as the syntax shows, and which expressions iterate them.
//!
//! A binding is known to be a hash collection when its `let` (or the
//! function argument) has a `HashMap`/`HashSet` type annotation (any path
//! ending in that name, behind `&`/`&mut` too), or when it is initialised with
//! `HashMap::new()`, `::with_capacity(..)`, `::from(..)`, `::from_iter(..)`,
//! `::default()`, `::with_hasher(..)`, `::with_capacity_and_hasher(..)` (the
//! same for `HashSet`), `.collect::<HashMap<..>>()` or `.clone()` of a known
//! binding. Iterating it means `for .. in m`, `for .. in &m` / `&mut m`, or a
//! call of `.iter()`, `.iter_mut()`, `.keys()`, `.values()`, `.values_mut()`,
//! `.into_iter()`, `.into_keys()`, `.into_values()` or `.drain()` on it.
//! An iteration whose elements are directly collected into a `BTreeMap` or
//! `BTreeSet` (`m.into_iter().map(..).collect::<BTreeMap<_, _>>()`, or
//! `.collect()` into a `let` annotated with one) is allowed: the result is
//! sorted. Fields (`self.m`), values returned by functions, and type aliases
//! are not seen.

use syn::{Expr, ExprMethodCall, GenericArgument, Pat, Type};

/// The constructors whose result is a hash collection of the type named just
/// before them (`HashMap::new`).
const CONSTRUCTORS: &[&str] = &[
    "new",
    "with_capacity",
    "from",
    "from_iter",
    "default",
    "with_hasher",
    "with_capacity_and_hasher",
];

/// The methods that visit every element, in the collection's order.
const ITERATING_METHODS: &[&str] = &[
    "iter",
    "iter_mut",
    "keys",
    "values",
    "values_mut",
    "into_iter",
    "into_keys",
    "into_values",
    "drain",
];

/// `"HashMap"` or `"HashSet"` when `name` is one of them.
fn hash_kind(name: &str) -> Option<&'static str> {
    ["HashMap", "HashSet"]
        .into_iter()
        .find(|kind| *kind == name)
}

/// `"HashMap"`/`"HashSet"` when `ty` is written as one (behind references and
/// parentheses too).
pub(super) fn hash_type(ty: &Type) -> Option<&'static str> {
    match ty {
        Type::Path(path) if path.qself.is_none() => {
            hash_kind(&path.path.segments.last()?.ident.to_string())
        }
        Type::Reference(reference) => hash_type(&reference.elem),
        Type::Paren(paren) => hash_type(&paren.elem),
        Type::Group(group) => hash_type(&group.elem),
        _ => None,
    }
}

/// `"HashMap"`/`"HashSet"` when `init` builds one; `known` tells whether a
/// name is a binding already known to hold one (for `.clone()`).
pub(super) fn hash_init(
    init: &Expr,
    known: &dyn Fn(&syn::Ident) -> Option<&'static str>,
) -> Option<&'static str> {
    match init {
        Expr::Call(call) => {
            let Expr::Path(path) = &*call.func else {
                return None;
            };
            let segments: Vec<_> = path.path.segments.iter().collect();
            let [.., ty, function] = segments.as_slice() else {
                return None;
            };
            if !CONSTRUCTORS.contains(&function.ident.to_string().as_str()) {
                return None;
            }
            hash_kind(&ty.ident.to_string())
        }
        Expr::MethodCall(call) if call.method == "collect" => {
            let turbofish = call.turbofish.as_ref()?;
            match turbofish.args.first()? {
                GenericArgument::Type(ty) => hash_type(ty),
                _ => None,
            }
        }
        Expr::MethodCall(call) if call.method == "clone" => binding(&call.receiver).and_then(known),
        Expr::Paren(paren) => hash_init(&paren.expr, known),
        Expr::Group(group) => hash_init(&group.expr, known),
        _ => None,
    }
}

/// Whether `ty` is written as a `BTreeMap`/`BTreeSet`.
pub(super) fn ordered_type(ty: &Type) -> bool {
    match ty {
        Type::Path(path) if path.qself.is_none() => path
            .path
            .segments
            .last()
            .is_some_and(|last| last.ident == "BTreeMap" || last.ident == "BTreeSet"),
        _ => false,
    }
}

/// For `expr` = `.collect()` (into an ordered collection, which the caller
/// knows), the iterating call at the start of its chain
/// (`m.into_iter()` in `m.into_iter().map(f).collect()`).
pub(super) fn collected_iteration(expr: &Expr) -> Option<&ExprMethodCall> {
    match expr {
        Expr::MethodCall(collect) => collected_iteration_of(collect),
        _ => None,
    }
}

/// [`collected_iteration`] of the call `collect`.
pub(super) fn collected_iteration_of(collect: &ExprMethodCall) -> Option<&ExprMethodCall> {
    if collect.method != "collect" {
        return None;
    }
    let mut receiver = &*collect.receiver;
    while let Expr::MethodCall(call) = receiver {
        if is_iterating_method(&call.method) && binding(&call.receiver).is_some() {
            return Some(call);
        }
        receiver = &call.receiver;
    }
    None
}

/// Whether `expr` is `.collect::<BTreeMap<..>>()` / `::<BTreeSet<..>>()`.
pub(super) fn collects_ordered(call: &ExprMethodCall) -> bool {
    call.method == "collect"
        && call
            .turbofish
            .as_ref()
            .and_then(|turbofish| turbofish.args.first())
            .is_some_and(|arg| matches!(arg, GenericArgument::Type(ty) if ordered_type(ty)))
}

/// The local name `expr` is (`m`, or `(m)`), if it is one.
pub(super) fn binding(expr: &Expr) -> Option<&syn::Ident> {
    match expr {
        Expr::Path(path) if path.qself.is_none() => path.path.get_ident(),
        Expr::Paren(paren) => binding(&paren.expr),
        Expr::Group(group) => binding(&group.expr),
        _ => None,
    }
}

/// The name a `for` loop iterates directly: `m`, `&m`, `&mut m`.
pub(super) fn for_loop_binding(expr: &Expr) -> Option<&syn::Ident> {
    match expr {
        Expr::Reference(reference) => for_loop_binding(&reference.expr),
        other => binding(other),
    }
}

/// Whether `method` visits every element in the collection's order.
pub(super) fn is_iterating_method(method: &syn::Ident) -> bool {
    ITERATING_METHODS.contains(&method.to_string().as_str())
}

/// The name and type a `let` pattern declares when it is a single name
/// (`m`, `mut m`, `m: T`), else `None`.
pub(super) fn single_binding(pat: &Pat) -> Option<(&syn::Ident, Option<&Type>)> {
    match pat {
        Pat::Ident(ident) if ident.subpat.is_none() => Some((&ident.ident, None)),
        Pat::Type(typed) => {
            let (ident, _) = single_binding(&typed.pat)?;
            Some((ident, Some(&typed.ty)))
        }
        _ => None,
    }
}

/// Every name a pattern binds (they shadow outer bindings of that name).
pub(super) fn pattern_names(pat: &Pat) -> Vec<syn::Ident> {
    struct Names(Vec<syn::Ident>);
    impl<'ast> syn::visit::Visit<'ast> for Names {
        fn visit_pat_ident(&mut self, ident: &'ast syn::PatIdent) {
            self.0.push(ident.ident.clone());
            syn::visit::visit_pat_ident(self, ident);
        }
        fn visit_expr(&mut self, _: &'ast Expr) {}
    }
    let mut names = Names(Vec::new());
    syn::visit::Visit::visit_pat(&mut names, pat);
    names.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use syn::parse_quote;

    fn none(_: &syn::Ident) -> Option<&'static str> {
        None
    }

    #[test]
    fn types_and_constructors_are_recognised() {
        let types: [Type; 4] = [
            parse_quote!(HashMap<String, u32>),
            parse_quote!(std::collections::HashSet<u8>),
            parse_quote!(&mut HashMap<u8, u8>),
            parse_quote!(&(HashSet<u8>)),
        ];
        assert!(types.iter().all(|ty| hash_type(ty).is_some()));
        let ordered: Type = parse_quote!(BTreeMap<String, u32>);
        assert_eq!(hash_type(&ordered), None);

        let inits: [Expr; 6] = [
            parse_quote!(HashMap::new()),
            parse_quote!(std::collections::HashSet::with_capacity(4)),
            parse_quote!(HashMap::from([(1, 2)])),
            parse_quote!(HashSet::<u8>::default()),
            parse_quote!(xs.into_iter().collect::<HashSet<_>>()),
            parse_quote!((HashMap::new())),
        ];
        assert!(inits.iter().all(|init| hash_init(init, &none).is_some()));
        let others: [Expr; 3] = [
            parse_quote!(BTreeMap::new()),
            parse_quote!(xs.collect::<Vec<_>>()),
            parse_quote!(new()),
        ];
        assert!(others.iter().all(|init| hash_init(init, &none).is_none()));
        let clone: Expr = parse_quote!(m.clone());
        assert_eq!(hash_init(&clone, &|_| Some("HashMap")), Some("HashMap"));
    }

    #[test]
    fn iterations_collected_into_an_ordered_collection() {
        let expr: Expr = parse_quote!(m.into_iter().map(f).collect());
        let root = collected_iteration(&expr).unwrap();
        assert_eq!(root.method, "into_iter");
        let Expr::MethodCall(call) = parse_quote!(m.iter().collect::<BTreeSet<_>>()) else {
            unreachable!()
        };
        assert!(collects_ordered(&call));
        let Expr::MethodCall(call) = parse_quote!(m.iter().collect::<Vec<_>>()) else {
            unreachable!()
        };
        assert!(!collects_ordered(&call));
        let not_collect: Expr = parse_quote!(m.iter().count());
        assert!(collected_iteration(&not_collect).is_none());
    }

    #[test]
    fn patterns() {
        let pat: Pat = parse_quote!((a, Some(b)));
        let names: Vec<String> = pattern_names(&pat).iter().map(|i| i.to_string()).collect();
        assert_eq!(names, ["a", "b"]);
        let expr: Expr = parse_quote!(&mut m);
        assert_eq!(
            for_loop_binding(&expr).map(|i| i.to_string()).as_deref(),
            Some("m")
        );
    }
}
