//! `keiro::queue!`: the parsed and checked form,
//! `NAME = "name", key = value, …`.

use proc_macro2::TokenStream;
use syn::parse::{Parse, ParseStream};
use syn::{Attribute, Expr, ExprLit, ExprUnary, Ident, Lit, LitStr, Token, UnOp, Visibility};

use crate::diag::Errors;

/// The settings `queue!` accepts.
const CONCURRENCY: &str = "concurrency";
const WORKER_CONCURRENCY: &str = "worker_concurrency";
const RATE_LIMIT: &str = "rate_limit";
const SUPPORTED: &str = "`concurrency`, `worker_concurrency` and `rate_limit`";
/// A whole declaration, for messages.
const EXAMPLE: &str = "`keiro::queue!(PAYMENTS = \"payments\", concurrency = 10)`";
const EXPECTED_HEAD: &str = "expected `keiro::queue!(NAME = \"name\", concurrency = 10, …)`";
/// The longest name the store keeps (`keiro::MAX_ID_BYTES`; this crate
/// cannot depend on the store).
const MAX_NAME_BYTES: usize = 1024;

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
        let ident: Ident = input
            .parse()
            .map_err(|e| syn::Error::new(e.span(), EXPECTED_HEAD))?;
        // `queue!(concurrency = 10)`: the static and the name left out.
        if [CONCURRENCY, WORKER_CONCURRENCY, RATE_LIMIT].contains(&ident.to_string().as_str()) {
            return Err(syn::Error::new(
                ident.span(),
                format!(
                    "a `keiro::queue!` starts with the static to declare and the queue's name, \
                     then its settings; e.g. {EXAMPLE}"
                ),
            ));
        }
        input.parse::<Token![=]>()?;
        let name: LitStr = input.parse().map_err(|e| {
            syn::Error::new(
                e.span(),
                "expected the queue's name as a string literal, e.g. `PAYMENTS = \"payments\"`",
            )
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
        check_name(&decl.name, &mut errors);
        let mut seen = Vec::new();
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
            if seen.contains(&key_name) {
                errors.spanned(
                    &key,
                    format!("`{key_name}` set multiple times; remove the duplicate"),
                );
                continue;
            }
            seen.push(key_name.clone());
            let valid = match key_name.as_str() {
                RATE_LIMIT => check_rate_limit(&value, &mut errors),
                _ => check_count(&format!("`{key_name}`"), &key_name, &value, &mut errors),
            };
            // A refused value is left out of the static: no follow-on type
            // error at the same tokens.
            if valid {
                *slot = Some(value);
            }
        }
        if let (Some(all), Some(per_worker)) = (
            decl.concurrency.as_ref().and_then(int_literal),
            decl.worker_concurrency.as_ref().and_then(int_literal),
        ) {
            if per_worker > all {
                errors.spanned(
                    decl.worker_concurrency.as_ref(),
                    format!(
                        "`{WORKER_CONCURRENCY}` ({per_worker}) is above `{CONCURRENCY}` \
                         ({all}), so it would never limit anything; lower it to at most \
                         {all}, or leave it out"
                    ),
                );
            }
        }
        (Some(decl), errors.finish())
    }
}

/// Refuses a name the store would refuse, or one of blanks only: a queue's
/// instances are stored under it.
fn check_name(name: &LitStr, errors: &mut Errors) {
    let value = name.value();
    let problem = if value.trim().is_empty() {
        "cannot be empty or blank; name it, e.g. `\"payments\"`".to_owned()
    } else if value.contains('\0') {
        "cannot hold a NUL byte, which the database cannot store; remove it".to_owned()
    } else if value.len() > MAX_NAME_BYTES {
        format!(
            "is {} bytes long, over the limit of {MAX_NAME_BYTES}; use a shorter one",
            value.len()
        )
    } else {
        return;
    };
    errors.spanned(name, format!("a queue's name {problem}"));
}

/// Checks a count (`concurrency`, `worker_concurrency`, a rate limit's
/// starts) the macro can see: a literal must be a whole number of at least
/// one. Anything else (a constant) is checked when the runtime connects.
/// `what` names the count in messages, `key` is the setting it belongs to.
fn check_count(what: &str, key: &str, value: &Expr, errors: &mut Errors) -> bool {
    let problem = match value {
        Expr::Lit(ExprLit {
            lit: Lit::Int(int), ..
        }) => match int.base10_parse::<u32>() {
            Ok(0) => format!(
                "{what} of 0 would never start anything; use at least 1, or leave `{key}` out \
                 for no limit"
            ),
            Ok(_) => return true,
            Err(_) => format!("{what} is a `u32`; use at most {}", u32::MAX),
        },
        Expr::Unary(ExprUnary {
            op: UnOp::Neg(_), ..
        }) => format!("{what} cannot be negative; use at least 1"),
        Expr::Lit(_) => format!("{what} is a whole number of at least 1, e.g. 10"),
        _ => return true,
    };
    errors.spanned(value, problem);
    false
}

/// Checks `rate_limit = (starts, period)` as far as the macro can see it.
fn check_rate_limit(value: &Expr, errors: &mut Errors) -> bool {
    let shape = format!(
        "`{RATE_LIMIT}` expects `(starts, period)`: at most `starts` starts within any \
         `period`, e.g. `{RATE_LIMIT} = (100, Duration::from_secs(60))`"
    );
    let tuple = match value {
        Expr::Tuple(tuple) if tuple.elems.len() == 2 => tuple,
        Expr::Tuple(_) | Expr::Lit(_) | Expr::Array(_) | Expr::Unary(_) | Expr::Binary(_) => {
            errors.spanned(value, shape);
            return false;
        }
        // A constant: checked when the runtime connects.
        _ => return true,
    };
    let starts = check_count(
        "a `rate_limit`'s count",
        RATE_LIMIT,
        &tuple.elems[0],
        errors,
    );
    let period = &tuple.elems[1];
    let problem = if matches!(period, Expr::Lit(_) | Expr::Unary(_)) {
        Some(
            "a `rate_limit`'s period is a `std::time::Duration`, e.g. `Duration::from_secs(60)`"
                .to_owned(),
        )
    } else if is_zero_duration(period) {
        Some(
            "a `rate_limit` period of zero is no window to count starts in; give a positive \
             `Duration`, e.g. `Duration::from_secs(60)`"
                .to_owned(),
        )
    } else {
        None
    };
    if let Some(problem) = &problem {
        errors.spanned(period, problem);
    }
    starts && problem.is_none()
}

/// Whether `expr` is a zero `Duration` written out: `Duration::ZERO`,
/// `Duration::from_secs(0)` (or millis, micros, nanos, `_f32`, `_f64`), or
/// `Duration::new(0, 0)`.
fn is_zero_duration(expr: &Expr) -> bool {
    let last = |path: &syn::Path| path.segments.last().map(|s| s.ident.to_string());
    match expr {
        Expr::Path(path) => last(&path.path).is_some_and(|name| name == "ZERO"),
        Expr::Call(call) => {
            let Expr::Path(func) = &*call.func else {
                return false;
            };
            let Some(name) = last(&func.path) else {
                return false;
            };
            let from = [
                "from_secs",
                "from_millis",
                "from_micros",
                "from_nanos",
                "from_secs_f32",
                "from_secs_f64",
            ];
            (from.contains(&name.as_str()) || name == "new")
                && !call.args.is_empty()
                && call.args.iter().all(is_zero_literal)
        }
        _ => false,
    }
}

/// Whether `expr` is the literal 0 (integer or float).
fn is_zero_literal(expr: &Expr) -> bool {
    match expr {
        Expr::Lit(ExprLit {
            lit: Lit::Int(int), ..
        }) => int.base10_parse::<u64>().is_ok_and(|n| n == 0),
        Expr::Lit(ExprLit {
            lit: Lit::Float(float),
            ..
        }) => float.base10_parse::<f64>().is_ok_and(|n| n == 0.0),
        _ => false,
    }
}

/// The value of an integer literal that fits a `u32`.
fn int_literal(expr: &Expr) -> Option<u32> {
    match expr {
        Expr::Lit(ExprLit {
            lit: Lit::Int(int), ..
        }) => int.base10_parse().ok(),
        _ => None,
    }
}
