//! The command line: global options and one subcommand per operation.

use std::time::Duration;

use clap::{Args, Parser, Subcommand};

/// The environment variable naming the database (as for every keiro process).
pub(crate) const DATABASE_ENV: &str = keiro::DATABASE_URL_ENV;

/// Operate keiro: inspect, repair and clean up workflow instances.
///
/// List and inspect workflow instances, retry, fork or cancel them, answer
/// their awakeables, send them messages, repair process-manager timers and
/// delete old journals. Works on the database rows alone: it never runs a
/// workflow (a worker that links the workflow does), and only `keiro
/// migrate` changes the schema.
///
/// Exit codes: 0 success, 1 refused operation, unknown id or store error,
/// 2 bad usage, 3 `keiro check` listed diverging instances.
#[derive(Debug, Parser)]
#[command(name = "keiro", version, max_term_width = 100)]
pub(crate) struct Cli {
    /// The keiro database: `sqlite:path/to/keiro.db` or `postgres://user@host/db`.
    #[arg(long, global = true, env = DATABASE_ENV, value_name = "URL", hide_env_values = true)]
    pub(crate) database: Option<String>,

    /// Print one JSON document instead of a table.
    #[arg(long, global = true)]
    pub(crate) json: bool,

    #[command(subcommand)]
    pub(crate) command: Command,
}

/// What to do.
#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// List workflow instances, newest first, one page at a time.
    List(ListArgs),
    /// Show one instance: its summary and its journal, step by step.
    ///
    /// With --history, write its history instead: the JSON document
    /// `keiro::History` reads (input, every journal entry, outcome), to keep
    /// as a fixture for `keiro::testing::replay` in the workflow's tests.
    Show {
        /// The instance id.
        id: String,
        /// Write the instance's history (JSON) instead of the summary.
        #[arg(long)]
        history: bool,
        /// Write the history to FILE instead of standard output.
        #[arg(long, value_name = "FILE", requires = "history")]
        out: Option<std::path::PathBuf>,
    },
    /// Cancel an instance and its unfinished descendants.
    Cancel {
        /// The instance id.
        id: String,
    },
    /// Run a failed or cancelled instance again from its journal.
    ///
    /// For an instance failed after its crash attempts, or cancelled:
    /// journaled steps are kept, attempts reset. A worker that links the
    /// workflow runs it.
    Retry {
        /// The instance id.
        id: String,
    },
    /// Put an instance set aside for non-determinism back in line.
    ///
    /// Its journal is kept as it is; a worker running the fixed code
    /// resumes it.
    Resume {
        /// The instance id.
        id: String,
    },
    /// Start a new instance from a prefix of another's journal.
    ///
    /// The new instance has the same input and the journal copied up to
    /// (not including) step SEQ; a worker runs the current code from there.
    Fork {
        /// The instance to fork.
        id: String,
        /// The first journal entry not copied (its `seq` in `keiro show`).
        #[arg(long = "from", value_name = "SEQ")]
        from: i64,
        /// The new instance's id (default: `<ID>-fork-<uuid>`).
        #[arg(long = "id", value_name = "NEW")]
        new_id: Option<String>,
    },
    /// Answer an awakeable with a JSON value.
    ///
    /// Its type is checked when the workflow reads it: a value that does not
    /// decode into the awaited type fails that read.
    Resolve {
        /// The awakeable's id, as the workflow handed it out.
        awakeable_id: String,
        /// The answer, as JSON (a string needs its quotes: '"yes"').
        #[arg(value_name = "JSON", value_parser = parse_json)]
        value: serde_json::Value,
    },
    /// Reject an awakeable: the workflow's await returns an error with REASON.
    Reject {
        /// The awakeable's id.
        awakeable_id: String,
        /// Why it is rejected.
        reason: String,
    },
    /// Send a JSON message on TOPIC to an instance.
    Send {
        /// The receiving instance's id.
        id: String,
        /// The topic it receives on.
        topic: String,
        /// The message, as JSON.
        #[arg(value_name = "JSON", value_parser = parse_json)]
        value: serde_json::Value,
        /// Makes a repeated send with the same key a no-op.
        #[arg(long, value_name = "KEY")]
        idempotency_key: Option<String>,
    },
    /// Inspect and repair process-manager timers.
    #[command(subcommand)]
    Timers(TimersCommand),
    /// List cron schedules (with no subcommand), or pause, resume or
    /// trigger one.
    ///
    /// Lists the schedules stored in the database: the `#[workflow(cron)]`
    /// ones a worker has started with, and the dynamic ones.
    Schedules {
        /// What to do; lists the schedules when absent.
        #[command(subcommand)]
        action: Option<SchedulesCommand>,
    },
    /// Delete what finished long ago.
    ///
    /// Root instances with their whole tree (journals, messages, events,
    /// stream entries), journals of old generations, fired and cancelled
    /// timers. Nothing unfinished is ever deleted. Runs in short batches
    /// beside live workers.
    Gc(GcArgs),
    /// Serve the admin HTTP API and the web console.
    ///
    /// Operations (retry, cancel, resolve, …) need `Authorization: Bearer
    /// TOKEN` with the token from KEIRO_ADMIN_TOKEN; without it set, the
    /// console is read-only. Binds 127.0.0.1 unless told otherwise; stops
    /// on Ctrl-C or SIGTERM.
    Serve(ServeArgs),
    /// Application versions holding unfinished instances, with how many are
    /// due.
    ///
    /// A worker runs only instances of its own version (KEIRO_APP_VERSION,
    /// by default a hash of its workflows' code), of versions it declares
    /// compatible, or unversioned ones: due instances of a version no
    /// running worker has wait here until one starts or `keiro retarget`
    /// moves them.
    Versions,
    /// Move the unfinished instances of one application version to another.
    ///
    /// Pending, running, suspended and set-aside instances of version FROM
    /// are recorded as version TO, so workers of TO run them; finished ones
    /// keep their version. Prints how many moved. Check first that TO's
    /// code replays their journals (`keiro check --binary-hashes`).
    Retarget {
        /// The version the instances run under now.
        #[arg(long, value_name = "FROM")]
        from: String,
        /// The version to move them to.
        #[arg(long, value_name = "TO")]
        to: String,
    },
    /// Before a deploy: list the unfinished instances the new binary's code
    /// could replay differently.
    ///
    /// FILE holds the new binary's hashes (`keiro::binary_hashes().to_json()`,
    /// e.g. printed by a `--print-hashes` flag of that binary). Lists every
    /// pending, running or suspended instance whose recorded step-call
    /// skeleton differs from FILE's hash of its workflow, or whose workflow
    /// FILE lacks. Exits 3 when it lists any, so a pipeline can stop the
    /// deploy.
    Check {
        /// The new binary's hashes, as JSON.
        #[arg(long, value_name = "FILE")]
        binary_hashes: std::path::PathBuf,
    },
    /// Run the schema migrations and print the schema version.
    ///
    /// The other commands never migrate: on an older schema they ask for
    /// this first.
    Migrate,
}

/// `keiro list`'s filters and paging.
#[derive(Debug, Args)]
pub(crate) struct ListArgs {
    /// Only these statuses, comma-separated: pending, running, suspended,
    /// completed, failed, cancelled, timed_out, nondeterministic.
    #[arg(long, value_name = "STATUS,..", value_delimiter = ',')]
    pub(crate) status: Vec<String>,
    /// Only instances of this workflow.
    #[arg(long)]
    pub(crate) name: Option<String>,
    /// Only ids starting with this.
    #[arg(long)]
    pub(crate) prefix: Option<String>,
    /// Only children of this instance.
    #[arg(long, value_name = "ID")]
    pub(crate) parent: Option<String>,
    /// Only instances of this application version (see `keiro versions`).
    #[arg(long = "version", value_name = "V")]
    pub(crate) app_version: Option<String>,
    /// Only instances on this queue (a `keiro::queue!` name).
    #[arg(long, value_name = "NAME")]
    pub(crate) queue: Option<String>,
    /// Only instances created within this long (30s, 15m, 1h, 30d, 2w).
    #[arg(long, value_name = "AGE", value_parser = crate::duration::parse)]
    pub(crate) since: Option<Duration>,
    /// Rows per page.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..=i64::from(keiro::MAX_PAGE)))]
    pub(crate) limit: u32,
    /// Continue after a previous page (the cursor it printed).
    #[arg(long, value_name = "CURSOR")]
    pub(crate) cursor: Option<String>,
    /// Oldest first.
    #[arg(long)]
    pub(crate) oldest_first: bool,
}

/// `keiro serve`'s address.
#[derive(Debug, Args)]
pub(crate) struct ServeArgs {
    /// The address to listen on (port 0 picks a free one, printed at start).
    #[arg(long, default_value = "127.0.0.1:7878", value_name = "ADDR")]
    pub(crate) listen: std::net::SocketAddr,
}

/// `keiro gc`'s retention.
#[derive(Debug, Args)]
pub(crate) struct GcArgs {
    /// Delete completed and timed-out instances last changed longer ago than
    /// this (30s, 15m, 1h, 30d, 2w); also the age for old generations and
    /// finished timers.
    #[arg(long, value_name = "AGE", value_parser = crate::duration::parse)]
    pub(crate) finished_older_than: Duration,
    /// Keep failed and cancelled instances this long instead (default: the
    /// same age).
    #[arg(long, value_name = "AGE", value_parser = crate::duration::parse)]
    pub(crate) failed_older_than: Option<Duration>,
    /// Instances per delete transaction (roots with their whole trees; a
    /// larger tree goes alone).
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u32).range(1..=keiro::MAX_GC_BATCH as i64))]
    pub(crate) batch_size: u32,
    /// Count what would be deleted and delete nothing.
    #[arg(long)]
    pub(crate) dry_run: bool,
}

/// `keiro schedules …`.
#[derive(Debug, Subcommand)]
pub(crate) enum SchedulesCommand {
    /// Stop a schedule's ticks on every worker until it is resumed.
    Pause {
        /// The schedule's name.
        name: String,
    },
    /// Resume a paused schedule from its next tick.
    Resume {
        /// The schedule's name.
        name: String,
    },
    /// Run a schedule once now; prints the instance id.
    Trigger {
        /// The schedule's name.
        name: String,
    },
}

/// `keiro timers …`.
#[derive(Debug, Subcommand)]
pub(crate) enum TimersCommand {
    /// Scheduled timers waiting for their fire time, earliest first.
    Pending(TimerPageArgs),
    /// Timers a worker claimed long ago and has not finished.
    Stuck {
        #[command(flatten)]
        page: TimerPageArgs,
        /// Claimed at least this long ago.
        #[arg(long, value_name = "AGE", default_value = "5m", value_parser = crate::duration::parse)]
        older_than: Duration,
    },
    /// Dead-lettered timers, in the order they died.
    Dead(TimerPageArgs),
    /// Put a stuck (firing) or dead timer back in line at its fire time.
    ///
    /// A dead one starts over with zero attempts.
    Requeue {
        /// The timer id.
        id: String,
    },
    /// Cancel a scheduled, firing or dead timer.
    Cancel {
        /// The timer id.
        id: String,
    },
    /// Resume a dead timer: back in line with zero attempts.
    ///
    /// A worker fires it again. Refused for a timer that is not dead (a
    /// stuck one: use requeue) or that a foreground resume claim holds.
    Resume {
        /// The timer id.
        id: String,
    },
}

/// A page of timers.
#[derive(Debug, Args)]
pub(crate) struct TimerPageArgs {
    /// Only this process manager's timers.
    #[arg(long, value_name = "NAME")]
    pub(crate) pm: Option<String>,
    /// Timers per page.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..=i64::from(keiro::timers::MAX_PAGE_LIMIT)))]
    pub(crate) limit: u32,
    /// Continue after a previous page (the cursor it printed).
    #[arg(long, value_name = "CURSOR")]
    pub(crate) cursor: Option<String>,
}

/// A JSON argument; the error names the text.
fn parse_json(text: &str) -> Result<serde_json::Value, String> {
    serde_json::from_str(text).map_err(|e| {
        format!("`{text}` is not JSON ({e}); a string needs its quotes, e.g. '\"approved\"'")
    })
}
