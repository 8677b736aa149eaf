//! `keiro`: the operator's command for keiro databases.
//!
//! Every command works on the rows alone: the binary links no workflow code,
//! runs no workflow and takes no executor identity; `retry`, `fork` and
//! `resume` only mark instances, and a worker that links the workflow runs
//! them. It never migrates a database except through `keiro migrate`.
//!
//! Exit codes: 0 success, 1 a refused operation, an unknown id or a store
//! error (the message, naming the id, on stderr), 2 bad usage, 3 `keiro
//! check` listed instances the new code could diverge from.

mod args;
mod clock;
mod commands;
mod connect;
mod duration;
mod render;
mod table;

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;

use args::{Cli, Command};

/// Why a command did not succeed, and so its exit code.
#[derive(Debug)]
pub(crate) enum Failure {
    /// The command line asks for something that cannot be done as written
    /// (exit 2).
    Usage(String),
    /// The operation was refused, the id is unknown, or the store failed
    /// (exit 1).
    Refused(String),
    /// The command ran and found what it checks for (`keiro check` listed
    /// diverging instances): its report is printed as on success, and the
    /// exit code is 3.
    Listed(Report),
}

impl From<keiro::Error> for Failure {
    fn from(error: keiro::Error) -> Failure {
        // keiro's `Debug` is its sentence followed by any causes it omits.
        Failure::Refused(format!("{error:?}"))
    }
}

impl From<keiro::timers::TimerError> for Failure {
    fn from(error: keiro::timers::TimerError) -> Failure {
        Failure::from(keiro::Error::from(error))
    }
}

impl From<keiro::StoreError> for Failure {
    fn from(error: keiro::StoreError) -> Failure {
        Failure::from(keiro::Error::from(error))
    }
}

/// What a command prints on success: a text for people, or with `--json`
/// one JSON document.
#[derive(Debug)]
pub(crate) struct Report {
    /// The human output, each line ending in `\n`.
    pub(crate) human: String,
    /// The `--json` output.
    pub(crate) json: serde_json::Value,
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) => return usage_error(error),
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("keiro: cannot start the async runtime: {error}");
            return ExitCode::from(1);
        }
    };
    let json = cli.json;
    match runtime.block_on(run(cli)) {
        Ok(report) => print(json, &report, ExitCode::SUCCESS),
        Err(Failure::Listed(report)) => print(json, &report, ExitCode::from(3)),
        Err(Failure::Usage(message)) => fail(json, "usage", &message, 2),
        Err(Failure::Refused(message)) => fail(json, "refused", &message, 1),
    }
}

/// Reports a command line clap refused. `--help` and `--version` print as
/// usual; a real usage error under `--json` (anywhere on the line, since
/// parsing stopped) is one JSON document like every other failure.
fn usage_error(error: clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    let wants_json = std::env::args_os().skip(1).any(|arg| arg == "--json");
    match error.kind() {
        ErrorKind::DisplayHelp
        | ErrorKind::DisplayVersion
        | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => error.exit(),
        _ if wants_json => {
            let message = error.render().to_string();
            let message = message.trim_end().trim_start_matches("error: ");
            fail(true, "usage", message, 2)
        }
        _ => error.exit(),
    }
}

/// Prints a command's report (with `--json`, its JSON document) on stdout;
/// returns `code`, or 1 when stdout cannot be written.
fn print(json: bool, report: &Report, code: ExitCode) -> ExitCode {
    let text = if json {
        format!("{:#}\n", report.json)
    } else {
        report.human.clone()
    };
    // A reader that stops early (`keiro list | head`) closes the pipe: not a
    // failure of the command.
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Err(error) if error.kind() != std::io::ErrorKind::BrokenPipe => {
            eprintln!("keiro: cannot write the output: {error}");
            ExitCode::from(1)
        }
        _ => code,
    }
}

/// Reports a failure on stderr (with `--json`, as one JSON document
/// `{"error": .., "kind": "usage"|"refused", "exit_code": ..}`) and
/// returns its exit code.
fn fail(json: bool, kind: &str, message: &str, code: u8) -> ExitCode {
    if json {
        let document = serde_json::json!({ "error": message, "kind": kind, "exit_code": code });
        eprintln!("{document:#}");
    } else {
        eprintln!("error: {message}");
    }
    ExitCode::from(code)
}

async fn run(cli: Cli) -> Result<Report, Failure> {
    let url = connect::database_url(cli.database)?;
    if let Command::Migrate = cli.command {
        return commands::schema::migrate(&url).await;
    }
    let keiro = connect::operator(&url).await?;
    let result = commands::dispatch(&keiro, cli.command).await;
    keiro.store().close().await;
    result
}
