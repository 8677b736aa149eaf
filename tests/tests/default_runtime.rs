//! What a program that sets nothing up sees: the process-wide runtime says at
//! `info` which database it opened and why, and an error returned from `main`
//! prints keiro's sentence, not a struct dump. Real child processes.

use std::process::Command;

fn run(cwd: &std::path::Path, database_url: Option<&str>) -> (String, String, bool) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_default_runtime"));
    command
        .current_dir(cwd)
        .env_remove("KEIRO_DATABASE_URL")
        .env(
            "KEIRO_EXECUTOR_ID",
            format!("default-runtime-{}", uuid::Uuid::new_v4()),
        );
    if let Some(url) = database_url {
        command.env("KEIRO_DATABASE_URL", url);
    }
    let out = command.output().expect("run default_runtime");
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        out.status.success(),
    )
}

#[test]
fn the_default_database_is_logged_with_its_path() {
    let dir = tempfile::tempdir().unwrap();
    let (stdout, _, _) = run(dir.path(), None);
    assert!(stdout.contains("DONE"), "{stdout}");
    let line = stdout
        .lines()
        .find(|l| l.contains("keiro opened its default SQLite database"))
        .unwrap_or_else(|| panic!("no info line about the default database in:\n{stdout}"));
    assert!(line.contains("KEIRO_DATABASE_URL is unset"), "{line}");
    let file = dir.path().join("keiro.db");
    assert!(line.contains(&file.display().to_string()), "{line}");
    assert!(file.exists());
    assert_eq!(
        stdout.matches("keiro opened").count(),
        1,
        "logged once:\n{stdout}"
    );
}

#[test]
fn a_database_from_the_environment_is_logged() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite:{}", dir.path().join("chosen.db").display());
    let (stdout, _, _) = run(dir.path(), Some(&url));
    let line = stdout
        .lines()
        .find(|l| l.contains("keiro opened the database named by KEIRO_DATABASE_URL"))
        .unwrap_or_else(|| panic!("no info line about the chosen database in:\n{stdout}"));
    assert!(line.contains("chosen.db"), "{line}");
    assert!(!dir.path().join("keiro.db").exists());
}

#[test]
fn an_error_returned_from_main_prints_the_sentence() {
    let dir = tempfile::tempdir().unwrap();
    let (_, stderr, success) = run(dir.path(), None);
    assert!(!success);
    assert!(
        stderr.contains("Error: no workflow instance has id `no-such-instance`"),
        "{stderr}"
    );
    assert!(!stderr.contains("NotFound"), "{stderr}");
}
