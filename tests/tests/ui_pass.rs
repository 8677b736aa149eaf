//! The programs in `ui/pass` (correct uses of `#[workflow]` and `#[step]`)
//! compile, without warnings where they `#![deny(warnings)]`, and run.
//!
//! Each file is a module of this test binary with a `pub fn main`, rather than
//! a trybuild `pass` case: trybuild would build all of keiro's dependencies a
//! second time, in its own target directory, and link one binary per file.
//! Workflow names registered twice across files (`billing.invoice`) are only
//! refused when a runtime starts, which none of these programs does.

macro_rules! pass_cases {
    ($($name:ident = $path:literal),* $(,)?) => {
        $(
            // Written as programs (`pub` items of a binary crate).
            #[allow(unreachable_pub, missing_docs)]
            #[path = $path]
            mod $name;

            #[test]
            fn $name() {
                $name::main();
            }
        )*

        /// The listed cases, to compare with the files on disk.
        const LISTED: &[&str] = &[$(stringify!($name)),*];
    };
}

/// A program added to `ui/pass` but not listed here would silently never be
/// compiled.
#[test]
fn every_pass_program_is_listed() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("ui/pass");
    let mut on_disk: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "rs"))
        .map(|path| path.file_stem().unwrap().to_string_lossy().into_owned())
        .collect();
    on_disk.sort();
    assert_eq!(
        on_disk,
        LISTED,
        "list every file of {} in `pass_cases!`",
        dir.display()
    );
}

pass_cases!(
    associated_functions = "../ui/pass/associated_functions.rs",
    attributes_and_names = "../ui/pass/attributes_and_names.rs",
    named_workflow = "../ui/pass/named_workflow.rs",
    no_arguments_unit_return = "../ui/pass/no_arguments_unit_return.rs",
    nondeterministic_ok = "../ui/pass/nondeterministic_ok.rs",
    nondeterministic_outside_workflows = "../ui/pass/nondeterministic_outside_workflows.rs",
    result_with_serializable_error = "../ui/pass/result_with_serializable_error.rs",
    spawn_child_workflow = "../ui/pass/spawn_child_workflow.rs",
    step_timeout_and_retry_if = "../ui/pass/step_timeout_and_retry_if.rs",
    step_with_retry_options = "../ui/pass/step_with_retry_options.rs",
    workflow_with_steps = "../ui/pass/workflow_with_steps.rs",
);
