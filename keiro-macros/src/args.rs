//! Parsing of the attribute arguments: `#[workflow(name = "..", cron = "..",
//! timezone = "..", journal = "..")]` and
//! `#[step(name = "..", max_attempts = N, backoff_ms = M, timeout_ms = T,
//! retry_if = path)]`.
//!
//! Parsing goes on after a bad key or value so one compile reports every
//! mistake; the cross-key rules run once all keys are read.

use proc_macro2::{TokenStream, TokenTree};
use quote::quote;
use syn::meta::ParseNestedMeta;
use syn::parse::Parser;
use syn::{Expr, ExprLit, ExprUnary, Ident, Lit, LitInt, LitStr, Token, UnOp};

use crate::diag::{error, path_text, Errors};
use crate::model::Macro;

/// `name = "..."`: the registered (workflow) or journaled (step) name.
pub(crate) const NAME: &str = "name";
/// `max_attempts = N`: how many times a step runs before its `Err` is final.
pub(crate) const MAX_ATTEMPTS: &str = "max_attempts";
/// `backoff_ms = M`: the first retry delay of a step, doubled on each retry.
pub(crate) const BACKOFF_MS: &str = "backoff_ms";
/// `timeout_ms = T`: how long one attempt of a step may run.
pub(crate) const TIMEOUT_MS: &str = "timeout_ms";
/// `retry_if = path`: which errors of a retried step are retried.
pub(crate) const RETRY_IF: &str = "retry_if";
/// `transaction`: the step runs in a transaction on keiro's database.
pub(crate) const TRANSACTION: &str = "transaction";
/// `cron = ".."`: the workflow runs at each tick of this cron expression.
pub(crate) const CRON: &str = "cron";
/// `timezone = ".."`: the IANA time zone a `cron` expression is read in.
pub(crate) const TIMEZONE: &str = "timezone";

/// `journal = ".."`: how the workflow journals its steps.
pub(crate) const JOURNAL: &str = "journal";
/// The values `journal = ".."` takes.
const JOURNAL_MODES: &[&str] = &["strict", "pipelined"];

const WORKFLOW_KEYS: &[&str] = &[NAME, CRON, TIMEZONE, JOURNAL];
const STEP_KEYS: &[&str] = &[
    NAME,
    MAX_ATTEMPTS,
    BACKOFF_MS,
    TIMEOUT_MS,
    RETRY_IF,
    TRANSACTION,
];

/// The retry delay used when a step sets `max_attempts > 1` but no `backoff_ms`.
pub(crate) const DEFAULT_BACKOFF_MS: u64 = 100;

/// The arguments of `#[workflow(..)]`.
#[derive(Default)]
pub(crate) struct WorkflowArgs {
    pub(crate) name: Option<LitStr>,
    /// `cron = ".."`, checked: the expression as written.
    pub(crate) cron: Option<LitStr>,
    /// `timezone = ".."`, checked.
    pub(crate) timezone: Option<LitStr>,
    /// `journal = ".."`, checked: one of `strict`, `pipelined`.
    pub(crate) journal: Option<LitStr>,
}

/// The arguments of `#[step(..)]`.
#[derive(Default)]
pub(crate) struct StepArgs {
    pub(crate) name: Option<LitStr>,
    max_attempts: Option<IntSetting<u32>>,
    backoff_ms: Option<IntSetting<u64>>,
    timeout_ms: Option<IntSetting<u64>>,
    retry_if: Option<PathSetting>,
    /// `transaction`, as written (for error spans).
    pub(crate) transaction: Option<Ident>,
}

/// A path argument (`retry_if = is_transient`) with its key, for error spans.
pub(crate) struct PathSetting {
    key: Ident,
    /// The path as written.
    pub(crate) path: syn::ExprPath,
}

impl PathSetting {
    /// `key = path`, so an error underlines the whole argument.
    pub(crate) fn tokens(&self) -> TokenStream {
        let (key, path) = (&self.key, &self.path);
        quote!(#key = #path)
    }
}

/// An integer argument with the tokens it came from, for error spans.
struct IntSetting<T> {
    value: T,
    key: Ident,
    lit: LitInt,
}

impl<T> IntSetting<T> {
    /// `key = lit`, so an error underlines the whole argument.
    fn tokens(&self) -> TokenStream {
        let (key, lit) = (&self.key, &self.lit);
        quote!(#key = #lit)
    }
}

impl WorkflowArgs {
    pub(crate) fn parse(tokens: TokenStream) -> syn::Result<Self> {
        let mut args = WorkflowArgs::default();
        let mut state = State::new(Macro::Workflow);
        let parser = syn::meta::parser(|meta| {
            let Some(key) = state.key(&meta)? else {
                return Ok(());
            };
            match key {
                NAME => args.name = state.name(&meta)?,
                CRON => args.cron = state.cron(&meta)?,
                TIMEZONE => args.timezone = state.timezone(&meta)?,
                JOURNAL => args.journal = state.journal(&meta)?,
                _ => unreachable!("State::key only returns keys of WORKFLOW_KEYS"),
            }
            Ok(())
        });
        let parsed = parser.parse2(tokens);
        if let (None, Some(timezone)) = (&args.cron, &args.timezone) {
            if !state.seen.contains(&CRON) {
                state.errors.spanned(
                    timezone,
                    format!(
                        "`{TIMEZONE}` is the time zone of a `{CRON}` schedule, and this workflow \
                         has none; add e.g. `{CRON} = \"0 0 2 * * *\"` or remove `{TIMEZONE}`"
                    ),
                );
            }
        }
        state.finish(parsed)?;
        Ok(args)
    }
}

impl StepArgs {
    pub(crate) fn parse(tokens: TokenStream) -> syn::Result<Self> {
        let mut args = StepArgs::default();
        let mut state = State::new(Macro::Step);
        let parser = syn::meta::parser(|meta| {
            let Some(key) = state.key(&meta)? else {
                return Ok(());
            };
            match key {
                NAME => args.name = state.name(&meta)?,
                MAX_ATTEMPTS => args.max_attempts = state.int(&meta, "u32", "5")?,
                BACKOFF_MS => args.backoff_ms = state.int(&meta, "u64", "200")?,
                TIMEOUT_MS => args.timeout_ms = state.int(&meta, "u64", "5000")?,
                RETRY_IF => args.retry_if = state.path(&meta, "is_transient")?,
                TRANSACTION => args.transaction = state.flag(&meta)?,
                _ => unreachable!("State::key only returns keys of STEP_KEYS"),
            }
            Ok(())
        });
        let parsed = parser.parse2(tokens);
        args.validate(&mut state);
        state.finish(parsed)?;
        Ok(args)
    }

    /// Rules that involve more than one key.
    fn validate(&self, state: &mut State) {
        let errors = &mut state.errors;
        if let Some(timeout) = &self.timeout_ms {
            if timeout.value == 0 {
                errors.spanned(
                    timeout.tokens(),
                    format!(
                        "`{TIMEOUT_MS}` must be at least 1 (milliseconds one attempt may run); \
                         use e.g. `{TIMEOUT_MS} = 5000`, or remove it for no limit"
                    ),
                );
            }
        }
        if let Some(max) = &self.max_attempts {
            if max.value == 0 {
                errors.spanned(
                    max.tokens(),
                    format!(
                        "`{MAX_ATTEMPTS}` must be at least 1 (1 runs the step once, without retries); \
                         use e.g. `{MAX_ATTEMPTS} = 3`"
                    ),
                );
                return;
            }
        }
        // An unusable `max_attempts` was already reported; judging `backoff_ms`
        // against it would only add noise.
        let max_attempts_invalid =
            self.max_attempts.is_none() && state.seen.contains(&MAX_ATTEMPTS);
        if let Some(retry_if) = &self.retry_if {
            if self.max_attempts() <= 1 && !max_attempts_invalid {
                errors.spanned(
                    retry_if.tokens(),
                    format!(
                        "`{RETRY_IF}` chooses which errors are retried, and this step runs once; \
                         add `{MAX_ATTEMPTS} = 3` (or more) or remove `{RETRY_IF}`"
                    ),
                );
            }
        }
        if let Some(backoff) = &self.backoff_ms {
            if self.max_attempts() <= 1 && !max_attempts_invalid {
                errors.spanned(
                    backoff.tokens(),
                    format!(
                        "`{BACKOFF_MS}` only applies to retries, and this step runs once; \
                         add `{MAX_ATTEMPTS} = 3` (or more) or remove `{BACKOFF_MS}`"
                    ),
                );
            }
        }
    }

    /// How many times the step may run; 1 (no retries) when not set.
    pub(crate) fn max_attempts(&self) -> u32 {
        self.max_attempts.as_ref().map_or(1, |max| max.value)
    }

    /// The first retry delay: as set, else [`DEFAULT_BACKOFF_MS`] for a retried step, else 0.
    pub(crate) fn backoff_ms(&self) -> u64 {
        match &self.backoff_ms {
            Some(backoff) => backoff.value,
            None if self.max_attempts() > 1 => DEFAULT_BACKOFF_MS,
            None => 0,
        }
    }

    /// How long one attempt may run, in milliseconds, and the `timeout_ms = T`
    /// tokens (to point an error at them); `None` for no limit.
    pub(crate) fn timeout_ms(&self) -> Option<(u64, TokenStream)> {
        self.timeout_ms.as_ref().map(|t| (t.value, t.tokens()))
    }

    /// The `retry_if` predicate, if set.
    pub(crate) fn retry_if(&self) -> Option<&PathSetting> {
        self.retry_if.as_ref()
    }

    /// The `max_attempts = N` tokens, to point an error at them.
    pub(crate) fn max_attempts_tokens(&self) -> Option<TokenStream> {
        self.max_attempts.as_ref().map(IntSetting::tokens)
    }
}

/// The cron field names, in order.
const CRON_FIELDS: [&str; 7] = [
    "seconds",
    "minutes",
    "hours",
    "day-of-month",
    "month",
    "day-of-week",
    "year",
];

/// The one field of a six- or seven-field `expression` that makes it
/// invalid (the expression parses with that field as `*`), and its text.
fn bad_cron_field(expression: &str) -> Option<(&'static str, String)> {
    let fields: Vec<&str> = expression.split_whitespace().collect();
    (0..fields.len()).find_map(|i| {
        let mut fixed = fields.clone();
        fixed[i] = "*";
        <cron::Schedule as std::str::FromStr>::from_str(&fixed.join(" "))
            .is_ok()
            .then(|| (CRON_FIELDS[i], fields[i].to_owned()))
    })
}

/// The day-of-week field of a six- or seven-field `expression` when it
/// numbers days (a range, a list or a step): the
/// `cron` crate counts 1 = Sunday, crontab 1 = Monday, so a number is a
/// silent off-by-one for anyone used to crontab.
fn numeric_day_of_week(expression: &str) -> Option<&str> {
    let field = expression.split_whitespace().nth(5)?;
    field.bytes().any(|b| b.is_ascii_digit()).then_some(field)
}

/// Error collection and duplicate tracking while the keys are read.
struct State {
    mac: Macro,
    seen: Vec<&'static str>,
    errors: Errors,
}

impl State {
    fn new(mac: Macro) -> Self {
        State {
            mac,
            seen: Vec::new(),
            errors: Errors::default(),
        }
    }

    fn keys(&self) -> &'static [&'static str] {
        match self.mac {
            Macro::Workflow => WORKFLOW_KEYS,
            Macro::Step => STEP_KEYS,
        }
    }

    /// Identifies the key of `meta`. Returns `None` (after recording an error and
    /// skipping the value) for an unknown or repeated key.
    fn key(&mut self, meta: &ParseNestedMeta<'_>) -> syn::Result<Option<&'static str>> {
        let known = meta
            .path
            .get_ident()
            .and_then(|ident| self.keys().iter().copied().find(|key| ident == key));
        let Some(key) = known else {
            self.errors.push(self.unknown_key(meta));
            skip_value(meta)?;
            return Ok(None);
        };
        if self.seen.contains(&key) {
            self.errors.spanned(
                &meta.path,
                format!("`{key}` set multiple times; remove the duplicate"),
            );
            skip_value(meta)?;
            return Ok(None);
        }
        self.seen.push(key);
        Ok(Some(key))
    }

    fn unknown_key(&self, meta: &ParseNestedMeta<'_>) -> syn::Error {
        let attr = self.mac.attr();
        let path = path_text(&meta.path);
        let message = match self.keys() {
            [only] => format!(
                "unknown `{attr}` argument `{path}`; the only supported argument is `{only}`"
            ),
            keys => {
                let list = keys
                    .iter()
                    .map(|key| format!("`{key}`"))
                    .collect::<Vec<_>>()
                    .join(", ");
                format!("unknown `{attr}` argument `{path}`; supported arguments are {list}")
            }
        };
        let message = if self.mac == Macro::Workflow && path == TRANSACTION {
            format!(
                "{message} (`{TRANSACTION}` runs a `#[step]` in a transaction on keiro's \
                 database; put it on the step whose writes commit with its result)"
            )
        } else if self.mac == Macro::Workflow && STEP_KEYS.contains(&path.as_str()) {
            format!(
                "{message} (`{path}` configures retries of a `#[step]`; \
                 put it on the step that should be retried)"
            )
        } else {
            message
        };
        error(&meta.path, message)
    }

    /// `name = "..."`: a non-empty string literal.
    fn name(&mut self, meta: &ParseNestedMeta<'_>) -> syn::Result<Option<LitStr>> {
        let attr = self.mac.attr();
        let example = match self.mac {
            Macro::Workflow => "checkout",
            Macro::Step => "reserve_stock",
        };
        match value(meta)? {
            Some(Expr::Lit(ExprLit {
                lit: Lit::Str(lit), ..
            })) => {
                if lit.value().trim().is_empty() {
                    self.errors.spanned(
                        &lit,
                        format!(
                            "the `{attr}` name must not be empty; write e.g. `{NAME} = \"{example}\"`, \
                             or remove `{NAME}` to use the function's name"
                        ),
                    );
                    return Ok(None);
                }
                Ok(Some(lit))
            }
            value => {
                let message =
                    format!("`{NAME}` expects a string literal, e.g. `{NAME} = \"{example}\"`");
                self.errors.push(match value {
                    Some(expr) => error(expr, message),
                    None => error(&meta.path, message),
                });
                Ok(None)
            }
        }
    }

    /// A string literal value, or `None` after recording an error that gives
    /// `example`.
    fn string(&mut self, meta: &ParseNestedMeta<'_>, example: &str) -> syn::Result<Option<LitStr>> {
        let key = path_text(&meta.path);
        match value(meta)? {
            Some(Expr::Lit(ExprLit {
                lit: Lit::Str(lit), ..
            })) => Ok(Some(lit)),
            value => {
                let message =
                    format!("`{key}` expects a string literal, e.g. `{key} = \"{example}\"`");
                self.errors.push(match value {
                    Some(expr) => error(expr, message),
                    None => error(&meta.path, message),
                });
                Ok(None)
            }
        }
    }

    /// `cron = ".."`: an expression the `cron` crate reads (six or seven
    /// fields, seconds first), checked here so a typo fails the build.
    fn cron(&mut self, meta: &ParseNestedMeta<'_>) -> syn::Result<Option<LitStr>> {
        let Some(lit) = self.string(meta, "0 0 2 * * *")? else {
            return Ok(None);
        };
        match <cron::Schedule as std::str::FromStr>::from_str(&lit.value()) {
            Ok(schedule) => {
                let expression = lit.value();
                // A date that never comes (30 February): the workflow would
                // never run. Judged without the year field, if any, whose
                // answer would depend on the day of the build: a date no
                // year has never comes in the years given either.
                let fields: Vec<&str> = expression.split_whitespace().collect();
                let never = match fields.len() {
                    7 => <cron::Schedule as std::str::FromStr>::from_str(&fields[..6].join(" "))
                        .is_ok_and(|dates| dates.upcoming(chrono_tz::UTC).next().is_none()),
                    _ => schedule.upcoming(chrono_tz::UTC).next().is_none(),
                };
                if never {
                    self.errors.spanned(
                        &lit,
                        format!(
                            "cron expression `{expression}` matches no date that exists, so \
                             this workflow would never run; check its day-of-month and month \
                             fields"
                        ),
                    );
                    return Ok(None);
                }
                if let Some(field) = numeric_day_of_week(&expression) {
                    self.errors.spanned(
                        &lit,
                        format!(
                            "the day-of-week field `{field}` of cron expression `{expression}` \
                             numbers its days, and this cron counts 1 = Sunday to 7 = Saturday \
                             where crontab counts 0 = Sunday, 1 = Monday; name the days instead, \
                             e.g. `MON-FRI` or `SAT,SUN`"
                        ),
                    );
                    return Ok(None);
                }
                Ok(Some(lit))
            }
            Err(e) => {
                let expression = lit.value();
                let fields = expression.split_whitespace().count();
                let problem = if matches!(fields, 6 | 7) {
                    match bad_cron_field(&expression) {
                        Some((field, value)) => format!(
                            "invalid cron expression `{expression}`: the {field} field `{value}` \
                             is out of range or malformed"
                        ),
                        None => format!("invalid cron expression `{expression}` ({e})"),
                    }
                } else {
                    format!("cron expression `{expression}` has {fields} fields")
                };
                self.errors.spanned(
                    &lit,
                    format!(
                        "{problem}; write six or seven fields, seconds first (sec min hour \
                         day-of-month month day-of-week [year]), e.g. `0 0 2 * * *` for \
                         02:00:00 every day or `*/10 * * * * *` for every 10 seconds"
                    ),
                );
                Ok(None)
            }
        }
    }

    /// `journal = ".."`: `"strict"` or `"pipelined"`.
    fn journal(&mut self, meta: &ParseNestedMeta<'_>) -> syn::Result<Option<LitStr>> {
        let Some(lit) = self.string(meta, "pipelined")? else {
            return Ok(None);
        };
        if JOURNAL_MODES.contains(&lit.value().as_str()) {
            return Ok(Some(lit));
        }
        self.errors.spanned(
            &lit,
            format!(
                "unknown journal mode `{}`; write `{JOURNAL} = \"strict\"` (each step durable \
                 before it returns, the default) or `{JOURNAL} = \"pipelined\"` (steps run \
                 ahead of their commits, with a barrier before anything observable)",
                lit.value()
            ),
        );
        Ok(None)
    }

    /// `timezone = ".."`: an IANA time zone name.
    fn timezone(&mut self, meta: &ParseNestedMeta<'_>) -> syn::Result<Option<LitStr>> {
        let Some(lit) = self.string(meta, "Europe/Berlin")? else {
            return Ok(None);
        };
        match <chrono_tz::Tz as std::str::FromStr>::from_str(&lit.value()) {
            Ok(_) => Ok(Some(lit)),
            Err(_) => {
                self.errors.spanned(
                    &lit,
                    format!(
                        "unknown time zone `{}`; use an IANA time zone name such as `UTC`, \
                         `Europe/Berlin` or `America/New_York` (names are case-sensitive)",
                        lit.value()
                    ),
                );
                Ok(None)
            }
        }
    }

    /// A bare `key` that takes no value (`transaction`).
    fn flag(&mut self, meta: &ParseNestedMeta<'_>) -> syn::Result<Option<Ident>> {
        let key = path_text(&meta.path);
        if meta.input.peek(Token![=]) || meta.input.peek(syn::token::Paren) {
            self.errors.spanned(
                &meta.path,
                format!("`{key}` takes no value; write just `{key}`, e.g. `#[step({key})]`"),
            );
            skip_value(meta)?;
            return Ok(None);
        }
        Ok(meta.path.get_ident().cloned())
    }

    /// `key = path`: the path of a function (`is_transient`, `errors::retryable`).
    fn path(
        &mut self,
        meta: &ParseNestedMeta<'_>,
        example: &str,
    ) -> syn::Result<Option<PathSetting>> {
        let key = path_text(&meta.path);
        let expected = format!(
            "`{key}` expects the path of a `fn(&E) -> bool` (E: the step's error type), \
             e.g. `{key} = {example}`"
        );
        match value(meta)? {
            Some(Expr::Path(path)) => Ok(Some(PathSetting {
                key: meta
                    .path
                    .get_ident()
                    .cloned()
                    .unwrap_or_else(|| Ident::new(&key, proc_macro2::Span::call_site())),
                path,
            })),
            Some(expr) => {
                self.errors.spanned(expr, expected);
                Ok(None)
            }
            None => {
                self.errors.spanned(&meta.path, expected);
                Ok(None)
            }
        }
    }

    /// `key = N`: an unsigned integer literal that fits in `T` (named `ty`),
    /// without a suffix or with the suffix `ty`.
    fn int<T>(
        &mut self,
        meta: &ParseNestedMeta<'_>,
        ty: &str,
        example: &str,
    ) -> syn::Result<Option<IntSetting<T>>>
    where
        T: std::str::FromStr,
        T::Err: std::fmt::Display,
    {
        let key = path_text(&meta.path);
        let expected = format!("`{key}` expects an integer, e.g. `{key} = {example}`");
        let lit = match value(meta)? {
            Some(Expr::Lit(ExprLit {
                lit: Lit::Int(lit), ..
            })) => lit,
            Some(
                expr @ Expr::Unary(ExprUnary {
                    op: UnOp::Neg(_), ..
                }),
            ) => {
                self.errors.spanned(
                    expr,
                    format!("`{key}` cannot be negative; e.g. `{key} = {example}`"),
                );
                return Ok(None);
            }
            Some(expr) => {
                self.errors.spanned(expr, expected);
                return Ok(None);
            }
            None => {
                self.errors.spanned(&meta.path, expected);
                return Ok(None);
            }
        };
        let suffix = lit.suffix();
        if !suffix.is_empty() && suffix != ty {
            self.errors.spanned(
                &lit,
                format!("`{key}` is a `{ty}`; remove the `{suffix}` suffix"),
            );
            return Ok(None);
        }
        match lit.base10_parse::<T>() {
            Ok(value) => Ok(Some(IntSetting {
                value,
                key: meta
                    .path
                    .get_ident()
                    .cloned()
                    .unwrap_or_else(|| Ident::new(&key, proc_macro2::Span::call_site())),
                lit,
            })),
            Err(_) => {
                self.errors.spanned(
                    &lit,
                    format!("`{key}` must fit in a `{ty}`; use a smaller number"),
                );
                Ok(None)
            }
        }
    }

    /// Adds the error that stopped parsing, if any, and returns everything collected.
    fn finish(mut self, parsed: syn::Result<()>) -> syn::Result<()> {
        if let Err(err) = parsed {
            self.errors.push(err);
        }
        self.errors.finish()
    }
}

/// The value after `key =`, or `None` (consuming a `(..)` list, if any) when there is no `=`.
fn value(meta: &ParseNestedMeta<'_>) -> syn::Result<Option<Expr>> {
    if meta.input.peek(Token![=]) {
        return Ok(Some(meta.value()?.parse()?));
    }
    skip_value(meta)?;
    Ok(None)
}

/// Consumes whatever follows a key (`= expr`, `(..)` or nothing) so parsing can go on.
fn skip_value(meta: &ParseNestedMeta<'_>) -> syn::Result<()> {
    if meta.input.peek(Token![=]) {
        meta.value()?.parse::<Expr>()?;
    } else if meta.input.peek(syn::token::Paren) {
        meta.input.parse::<TokenTree>()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use quote::quote;

    fn workflow_errors(tokens: TokenStream) -> Vec<String> {
        match WorkflowArgs::parse(tokens) {
            Ok(_) => Vec::new(),
            Err(err) => err.into_iter().map(|e| e.to_string()).collect(),
        }
    }

    fn step_errors(tokens: TokenStream) -> Vec<String> {
        match StepArgs::parse(tokens) {
            Ok(_) => Vec::new(),
            Err(err) => err.into_iter().map(|e| e.to_string()).collect(),
        }
    }

    #[test]
    fn workflow_without_arguments() {
        let args = WorkflowArgs::parse(quote!()).unwrap();
        assert!(args.name.is_none());
    }

    #[test]
    fn workflow_name() {
        let args = WorkflowArgs::parse(quote!(name = "orders.checkout")).unwrap();
        assert_eq!(args.name.unwrap().value(), "orders.checkout");
    }

    #[test]
    fn empty_name_is_rejected() {
        for tokens in [quote!(name = ""), quote!(name = "  ")] {
            let errors = workflow_errors(tokens);
            assert_eq!(errors.len(), 1);
            assert!(
                errors[0].starts_with("the `#[workflow]` name must not be empty"),
                "{errors:?}"
            );
        }
        assert!(
            step_errors(quote!(name = ""))[0].starts_with("the `#[step]` name must not be empty")
        );
    }

    #[test]
    fn name_must_be_a_string_literal() {
        for tokens in [quote!(name = checkout), quote!(name = 5), quote!(name)] {
            assert_eq!(
                workflow_errors(tokens),
                ["`name` expects a string literal, e.g. `name = \"checkout\"`"]
            );
        }
    }

    #[test]
    fn unknown_workflow_key_lists_the_valid_keys() {
        assert_eq!(
            workflow_errors(quote!(label = "x")),
            [
                "unknown `#[workflow]` argument `label`; supported arguments are `name`, \
                 `cron`, `timezone`, `journal`"
            ]
        );
    }

    #[test]
    fn journal_is_strict_or_pipelined() {
        assert!(workflow_errors(quote!(journal = "strict")).is_empty());
        assert!(workflow_errors(quote!(journal = "pipelined")).is_empty());
        let errors = workflow_errors(quote!(journal = "fast"));
        assert_eq!(errors.len(), 1);
        assert!(
            errors[0].starts_with("unknown journal mode `fast`; write `journal = \"strict\"`"),
            "{errors:?}"
        );
    }

    #[test]
    fn cron_and_timezone_are_checked() {
        assert!(
            workflow_errors(quote!(cron = "0 0 2 * * *", timezone = "Europe/Berlin")).is_empty()
        );
        let errors = workflow_errors(quote!(cron = "0 0 2 * *"));
        assert!(errors[0].contains("has 5 fields"), "{errors:?}");
        let errors = workflow_errors(quote!(cron = "0 61 2 * * *"));
        assert!(errors[0].contains("the minutes field `61`"), "{errors:?}");
        let errors = workflow_errors(quote!(cron = "0 0 2 * * *", timezone = "Mars/Base"));
        assert!(
            errors[0].contains("unknown time zone `Mars/Base`"),
            "{errors:?}"
        );
        let errors = workflow_errors(quote!(timezone = "UTC"));
        assert!(errors[0].contains("has none"), "{errors:?}");
    }

    #[test]
    fn step_keys_on_a_workflow_point_to_steps() {
        let errors = workflow_errors(quote!(max_attempts = 3));
        assert_eq!(errors.len(), 1);
        assert!(
            errors[0].contains("configures retries of a `#[step]`"),
            "{errors:?}"
        );
    }

    #[test]
    fn unknown_step_key_lists_the_valid_keys() {
        assert_eq!(
            step_errors(quote!(retries(3))),
            ["unknown `#[step]` argument `retries`; supported arguments are `name`, `max_attempts`, `backoff_ms`, `timeout_ms`, `retry_if`, `transaction`"]
        );
        assert_eq!(
            step_errors(quote!(a::b = 1)),
            ["unknown `#[step]` argument `a::b`; supported arguments are `name`, `max_attempts`, `backoff_ms`, `timeout_ms`, `retry_if`, `transaction`"]
        );
    }

    #[test]
    fn duplicate_keys_are_rejected() {
        assert_eq!(
            step_errors(quote!(max_attempts = 3, max_attempts = 4)),
            ["`max_attempts` set multiple times; remove the duplicate"]
        );
        assert_eq!(
            workflow_errors(quote!(name = "a", name = "b")),
            ["`name` set multiple times; remove the duplicate"]
        );
    }

    #[test]
    fn a_bad_first_value_still_counts_for_duplicates() {
        let errors = step_errors(quote!(max_attempts = "x", max_attempts = 3));
        assert_eq!(
            errors,
            [
                "`max_attempts` expects an integer, e.g. `max_attempts = 5`",
                "`max_attempts` set multiple times; remove the duplicate",
            ]
        );
    }

    #[test]
    fn integer_values_are_checked() {
        assert_eq!(
            step_errors(quote!(max_attempts = "x")),
            ["`max_attempts` expects an integer, e.g. `max_attempts = 5`"]
        );
        assert_eq!(
            step_errors(quote!(max_attempts = 2, backoff_ms = 1.5)),
            ["`backoff_ms` expects an integer, e.g. `backoff_ms = 200`"]
        );
        assert_eq!(
            step_errors(quote!(max_attempts)),
            ["`max_attempts` expects an integer, e.g. `max_attempts = 5`"]
        );
        assert_eq!(
            step_errors(quote!(max_attempts = -1)),
            ["`max_attempts` cannot be negative; e.g. `max_attempts = 5`"]
        );
        assert_eq!(
            step_errors(quote!(max_attempts = 5_000_000_000)),
            ["`max_attempts` must fit in a `u32`; use a smaller number"]
        );
        assert_eq!(
            step_errors(quote!(max_attempts = 5i8)),
            ["`max_attempts` is a `u32`; remove the `i8` suffix"]
        );
    }

    #[test]
    fn max_attempts_zero_is_rejected() {
        let errors = step_errors(quote!(max_attempts = 0));
        assert_eq!(errors.len(), 1);
        assert!(
            errors[0].starts_with("`max_attempts` must be at least 1"),
            "{errors:?}"
        );
    }

    #[test]
    fn backoff_without_retries_is_rejected() {
        for tokens in [
            quote!(backoff_ms = 10),
            quote!(max_attempts = 1, backoff_ms = 10),
        ] {
            let errors = step_errors(tokens);
            assert_eq!(errors.len(), 1);
            assert!(
                errors[0].starts_with("`backoff_ms` only applies to retries"),
                "{errors:?}"
            );
        }
    }

    #[test]
    fn step_values() {
        let args = StepArgs::parse(quote!(
            name = "email",
            max_attempts = 5u32,
            backoff_ms = 250
        ))
        .unwrap();
        assert_eq!(args.name.as_ref().unwrap().value(), "email");
        assert_eq!(args.max_attempts(), 5);
        assert_eq!(args.backoff_ms(), 250);

        let args = StepArgs::parse(quote!()).unwrap();
        assert_eq!((args.max_attempts(), args.backoff_ms()), (1, 0));

        let args = StepArgs::parse(quote!(max_attempts = 2, backoff_ms = 0)).unwrap();
        assert_eq!((args.max_attempts(), args.backoff_ms()), (2, 0));
    }

    #[test]
    fn every_mistake_is_reported_at_once() {
        let errors = step_errors(quote!(
            nme = "x",
            max_attempts = "3",
            backoff_ms = 1,
            backoff_ms = 2
        ));
        assert_eq!(errors.len(), 3, "{errors:?}");
    }

    #[test]
    fn syntax_errors_are_reported() {
        assert_eq!(step_errors(quote!(max_attempts = )).len(), 1);
        assert_eq!(
            step_errors(quote!(max_attempts = 3 backoff_ms = 2)).len(),
            1
        );
    }
}
