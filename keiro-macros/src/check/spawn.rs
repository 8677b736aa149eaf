//! Spawned tasks in a `#[workflow]` body.
//!
//! A step takes its sequence number from the workflow context, a tokio task
//! local, at the moment it is called. `tokio::spawn(async move { step(x).await })`
//! calls the step in another task, where there is no context: the step runs as
//! a plain call, is not journaled, and runs again after a crash. Nothing can
//! tell that call apart at run time from a step called outside any workflow
//! (which is allowed), so the rule is enforced on the body's syntax, by the
//! walk in [`super::determinism`].

use quote::ToTokens;
use syn::{Expr, ExprCall, ExprMethodCall, Path};

use super::determinism::{Finding, Lint};
use crate::diag::path_text;

/// The paths (without the final `spawn*` segment) whose spawns leave the
/// workflow: `tokio::spawn`, `tokio::task::spawn_blocking`, `task::spawn_local`
/// after `use tokio::task`, `std::thread::spawn`, `thread::spawn`.
const SPAWNING_MODULES: &[&[&str]] = &[
    &["tokio"],
    &["tokio", "task"],
    &["task"],
    &["std", "thread"],
    &["core", "thread"],
    &["thread"],
];

const SPAWN_FNS: &[&str] = &["spawn", "spawn_blocking", "spawn_local"];

/// `tokio::spawn(..)`, `::std::thread::spawn(..)`, ... but not `keiro::spawn`
/// or a bare `spawn(..)`.
pub(super) fn spawn_call(call: &ExprCall) -> Option<Finding> {
    let Expr::Path(path) = &*call.func else {
        return None;
    };
    if path.qself.is_some() || !is_spawn_path(&path.path) {
        return None;
    }
    Some(Finding {
        lint: Lint::Spawn,
        tokens: path.path.to_token_stream(),
        what: format!("`{}`", path_text(&path.path)),
    })
}

/// `set.spawn(fut)` on a `JoinSet`, `handle.spawn(fut)` on a runtime
/// `Handle`, `local.spawn_local(fut)` on a `LocalSet`: one argument, so
/// `Command::spawn()` (a process, no future) is not matched.
pub(super) fn spawn_method_call(call: &ExprMethodCall) -> Option<Finding> {
    let method = call.method.to_string();
    if !SPAWN_FNS.contains(&method.as_str()) || call.args.len() != 1 {
        return None;
    }
    let mut tokens = call.receiver.to_token_stream();
    call.dot_token.to_tokens(&mut tokens);
    call.method.to_tokens(&mut tokens);
    Some(Finding {
        lint: Lint::Spawn,
        tokens,
        what: format!("`.{method}(..)`"),
    })
}

fn is_spawn_path(path: &Path) -> bool {
    let segments: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
    let Some((last, module)) = segments.split_last() else {
        return false;
    };
    SPAWN_FNS.contains(&last.as_str())
        && SPAWNING_MODULES
            .iter()
            .any(|candidate| candidate.iter().eq(module.iter()))
}

#[cfg(test)]
mod tests {
    use syn::{parse_quote, Block};

    use super::super::determinism::{findings, Lint};

    fn found(block: Block) -> Vec<String> {
        findings(&[], &block)
            .into_iter()
            .filter(|f| f.lint == Lint::Spawn)
            .map(|f| f.what)
            .collect()
    }

    #[test]
    fn every_spawning_path_is_found() {
        let block: Block = parse_quote!({
            tokio::spawn(async move { side_effect(x).await });
            ::tokio::spawn(side_effect(x));
            tokio::task::spawn_blocking(move || work());
            task::spawn_local(async {});
            std::thread::spawn(|| {});
            thread::spawn(|| {});
            tokio::task::spawn(async {});
        });
        assert_eq!(
            found(block),
            [
                "`tokio::spawn`",
                "`::tokio::spawn`",
                "`tokio::task::spawn_blocking`",
                "`task::spawn_local`",
                "`std::thread::spawn`",
                "`thread::spawn`",
                "`tokio::task::spawn`",
            ]
        );
    }

    #[test]
    fn nested_blocks_closures_async_blocks_and_macros_are_walked() {
        let block: Block = parse_quote!({
            if ready {
                let f = || tokio::spawn(async {});
            }
            let fut = async move {
                loop {
                    let _ = std::thread::spawn(|| {});
                }
            };
            tokio::join!(step_a(), async { tokio::task::spawn_blocking(|| 1) });
            let handles = vec![tokio::spawn(async {})];
        });
        assert_eq!(
            found(block),
            [
                "`tokio::spawn`",
                "`std::thread::spawn`",
                "`tokio::task::spawn_blocking`",
                "`tokio::spawn`",
            ]
        );
    }

    #[test]
    fn join_set_style_spawns_are_found() {
        let block: Block = parse_quote!({
            let mut set = tokio::task::JoinSet::new();
            set.spawn(async move { side_effect(x).await });
            handle.spawn_blocking(|| 1);
        });
        assert_eq!(found(block), ["`.spawn(..)`", "`.spawn_blocking(..)`"]);
    }

    #[test]
    fn keiro_spawn_and_unrelated_calls_are_allowed() {
        let block: Block = parse_quote!({
            let child = keiro::spawn(child_workflow(1)).await?;
            let child = ::keiro::spawn(child_workflow(2)).await?;
            let child = spawn(child_workflow(3)).await?;
            let out = std::process::Command::new("ls").spawn();
            let (a, b) = futures::join!(step_a(), step_b());
            my::tokio::spawn(x);
            tokio::time::sleep(d).await;
            spawner.spawned(x);
        });
        assert!(found(block).is_empty());
    }

    #[test]
    fn the_message_names_the_call_and_the_fix() {
        let block: Block = parse_quote!({
            tokio::spawn(async {});
        });
        let message = findings(&[], &block)[0].error().to_string();
        assert!(
            message.starts_with(
                "`tokio::spawn` inside a `#[workflow]` runs its task outside the workflow"
            ),
            "{message}"
        );
        assert!(
            message.contains("keiro::spawn(child_workflow(..))"),
            "{message}"
        );
        assert!(
            message.contains("#[keiro::nondeterministic_ok]"),
            "{message}"
        );
    }
}
