//! `keiro check --binary-hashes FILE`: the pre-deploy check. Lists the
//! unfinished instances whose recorded step-call skeleton the new binary's
//! code differs from (or whose workflow it no longer links), and exits
//! non-zero when there is any, so a deploy pipeline can gate on it.

use std::path::Path;

use keiro::admin::json::{self as shapes};
use keiro::{BinaryHashes, HashMismatchReason, Keiro};
use serde_json::json;

use crate::table::Table;
use crate::{Failure, Report};

/// Reads the hashes file; unreadable or malformed is a usage error naming it.
fn read(path: &Path) -> Result<BinaryHashes, Failure> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        Failure::Usage(format!(
            "cannot read the binary hashes file {}: {e}",
            path.display()
        ))
    })?;
    BinaryHashes::from_json(&text).map_err(|e| {
        Failure::Usage(format!(
            "the binary hashes file {} is not what `keiro::binary_hashes().to_json()` writes \
             ({e}); expected {{\"app_version\": \"..\", \"workflows\": {{\"name\": \"hash\", ..}}}}",
            path.display()
        ))
    })
}

/// `keiro check --binary-hashes FILE`.
pub(crate) async fn run(keiro: &Keiro, path: &Path) -> Result<Report, Failure> {
    let hashes = read(path)?;
    let report = keiro.check_hashes(&hashes).await?;
    let mut table = Table::new(&["ID", "NAME", "STATUS", "VERSION", "WHY"]);
    let mut items = Vec::new();
    for d in &report.diverging {
        let s = &d.summary;
        let (why, recorded, new) = match &d.reason {
            HashMismatchReason::SkeletonChanged { recorded, new } => (
                format!("skeleton {recorded} -> {new}"),
                Some(recorded.as_str()),
                Some(new.as_str()),
            ),
            HashMismatchReason::WorkflowMissing => (
                "workflow not in the new binary".to_owned(),
                s.skeleton_hash.as_deref(),
                None,
            ),
            other => (format!("{other:?}"), s.skeleton_hash.as_deref(), None),
        };
        table.row(vec![
            s.id.clone(),
            s.name.clone(),
            shapes::status_name(&s.status).to_owned(),
            s.version.clone().unwrap_or_default(),
            why,
        ]);
        let reason = match d.reason {
            HashMismatchReason::WorkflowMissing => "workflow_missing",
            _ => "skeleton_changed",
        };
        items.push(json!({
            "id": s.id,
            "name": s.name,
            "status": shapes::status_name(&s.status),
            "version": s.version,
            "reason": reason,
            "recorded_hash": recorded,
            "new_hash": new,
        }));
    }
    let tail = format!(
        "{} unfinished instance(s) checked against {} (version {}); {} diverge; {} have no \
         recorded skeleton and were not judged\n",
        report.checked,
        path.display(),
        hashes.app_version,
        report.diverging.len(),
        report.unrecorded
    );
    let human = if report.diverging.is_empty() {
        tail
    } else {
        format!("{}{tail}", table.render())
    };
    let out = Report {
        human,
        json: json!({
            "binary_hashes": path.display().to_string(),
            "app_version": hashes.app_version,
            "checked": report.checked,
            "unrecorded": report.unrecorded,
            "diverging": items,
        }),
    };
    if report.diverging.is_empty() {
        Ok(out)
    } else {
        Err(Failure::Listed(out))
    }
}
