//! `keiro gc`: retention from the command line.

use keiro::{Keiro, Retention};
use serde_json::json;

use crate::args::GcArgs;
use crate::table::fields;
use crate::{Failure, Report};

/// Runs one gc (or dry run) and reports what went (or would go).
pub(crate) async fn run(keiro: &Keiro, args: &GcArgs) -> Result<Report, Failure> {
    let mut retention = Retention::finished_older_than(args.finished_older_than)
        .batch_size(args.batch_size as usize);
    if let Some(age) = args.failed_older_than {
        retention = retention.failed_older_than(age);
    }
    if args.dry_run {
        retention = retention.dry_run();
    }
    let summary = keiro.gc(&retention).await?;
    let mut human = if args.dry_run {
        "dry run: nothing was deleted; a real run would delete\n".to_owned()
    } else {
        "deleted\n".to_owned()
    };
    human.push_str(&fields(&[
        ("  instances", summary.instances.to_string()),
        ("  journal entries", summary.steps.to_string()),
        ("  messages", summary.messages.to_string()),
        ("  events", summary.events.to_string()),
        ("  stream entries", summary.stream_entries.to_string()),
        ("  timers", summary.timers.to_string()),
        (
            "  old-generation entries",
            summary.old_generation_steps.to_string(),
        ),
    ]));
    human.push_str(&format!("in {} batches\n", summary.batches));
    let mut json = serde_json::to_value(&summary)
        .map_err(|e| Failure::Refused(format!("cannot print the gc summary as JSON: {e}")))?;
    json["dry_run"] = json!(args.dry_run);
    Ok(Report { human, json })
}
