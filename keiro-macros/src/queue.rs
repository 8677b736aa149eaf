//! `keiro::queue!`: the parsed and checked form,
//! `NAME = "name", key = value, …`.

use proc_macro2::TokenStream;
use syn::parse::{Parse, ParseStream};
use syn::{Attribute, Expr, Ident, Lit, LitStr, Token, Visibility};

use crate::diag::Errors;

/// The settings `queue!` accepts.
const CONCURRENCY: &str = "concurrency";
const WORKER_CONCURRENCY: &str = "worker_concurrency";
const RATE_LIMIT: &str = "rate_limit";
const SUPPORTED: &str = "`concurrency`, `worker_concurrency` and `rate_limit`";

/// A `queue!` declaration.
pub(crate) struct QueueDecl {
    pub(crate) attrs: Vec<Attribute>,
    pub(crate) vis: Visibility,
    pub(crate) ident: Ident,
    pub(crate) name: LitStr,
    pub(crate) concurrency: Option<Expr>,
    pub(crate) worker_concurrency: Option<Expr>,
    pub(crate) rate_limit: Option<Expr>,
}

impl QueueDecl {
    /// Parses and checks the macro's input: the declaration (when its head
    /// parsed) and every error found.
    pub(crate) fn parse(input: TokenStream) -> (Option<QueueDecl>, syn::Result<()>) {
        match syn::parse2::<Raw>(input) {
            Ok(raw) => raw.check(),
            Err(error) => (None, Err(error)),
        }
    }
}

/// The input before its settings are checked.
struct Raw {
    decl: QueueDecl,
    settings: Vec<(Ident, Expr)>,
}

impl Parse for Raw {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        let attrs = input.call(Attribute::parse_outer)?;
        let vis: Visibility = input.parse()?;
        let ident: Ident = input.parse().map_err(|e| {
            syn::Error::new(
                e.span(),
                "expected `keiro::queue!(NAME = \"name\", concurrency = 10, …)`",
            )
        })?;
        input.parse::<Token![=]>()?;
        let name: LitStr = input.parse().map_err(|e| {
            syn::Error::new(e.span(), "expected the queue's name as a string literal")
        })?;
        let mut settings = Vec::new();
        while !input.is_empty() {
            input.parse::<Token![,]>()?;
            if input.is_empty() {
                break;
            }
            let key: Ident = input.parse()?;
            input.parse::<Token![=]>()?;
            let value: Expr = input.parse()?;
            settings.push((key, value));
        }
        let decl = QueueDecl {
            attrs,
            vis,
            ident,
            name,
            concurrency: None,
            worker_concurrency: None,
            rate_limit: None,
        };
        Ok(Raw { decl, settings })
    }
}

impl Raw {
    fn check(self) -> (Option<QueueDecl>, syn::Result<()>) {
        let mut errors = Errors::default();
        let mut decl = self.decl;
        if decl.name.value().is_empty() {
            errors.spanned(
                &decl.name,
                "a queue's name cannot be empty; name it, e.g. `\"payments\"`",
            );
        }
        for (key, value) in self.settings {
            let key_name = key.to_string();
            let slot = match key_name.as_str() {
                CONCURRENCY => &mut decl.concurrency,
                WORKER_CONCURRENCY => &mut decl.worker_concurrency,
                RATE_LIMIT => &mut decl.rate_limit,
                _ => {
                    errors.spanned(
                        &key,
                        format!(
                            "unknown `keiro::queue!` setting `{key_name}`; supported settings \
                             are {SUPPORTED}"
                        ),
                    );
                    continue;
                }
            };
            if slot.is_some() {
                errors.spanned(
                    &key,
                    format!("`{key_name}` set multiple times; remove the duplicate"),
                );
                continue;
            }
            let count = match (key_name.as_str(), &value) {
                (RATE_LIMIT, Expr::Tuple(tuple)) => tuple.elems.first(),
                (RATE_LIMIT, _) => None,
                _ => Some(&value),
            };
            if let Some(zero) = count.filter(|count| is_zero(count)) {
                errors.spanned(
                    zero,
                    format!(
                        "`{key_name}` of 0 would never start anything; use at least 1, or leave \
                         `{key_name}` out for no limit"
                    ),
                );
            }
            *slot = Some(value);
        }
        (Some(decl), errors.finish())
    }
}

/// Whether `expr` is the integer literal 0.
fn is_zero(expr: &Expr) -> bool {
    matches!(expr, Expr::Lit(lit) if matches!(&lit.lit, Lit::Int(int)
        if int.base10_parse::<u64>().is_ok_and(|n| n == 0)))
}
