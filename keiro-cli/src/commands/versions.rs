//! `keiro versions` and `keiro retarget`: which application versions hold
//! unfinished work, and moving it from one version to another.

use keiro::Keiro;
use serde_json::json;

use crate::table::Table;
use crate::{Failure, Report};

/// How an unversioned instance's version is shown.
const UNVERSIONED: &str = "(unversioned)";

/// `keiro versions`: every version holding unfinished instances.
pub(crate) async fn list(keiro: &Keiro) -> Result<Report, Failure> {
    let counts = keiro.version_counts().await?;
    let mut table = Table::new(&["VERSION", "UNFINISHED", "DUE"]);
    for count in &counts {
        table.row(vec![
            count.version.clone().unwrap_or_else(|| UNVERSIONED.into()),
            count.unfinished.to_string(),
            count.due.to_string(),
        ]);
    }
    let human = if counts.is_empty() {
        "no unfinished workflow instances\n".to_owned()
    } else {
        table.render()
    };
    let items: Vec<_> = counts
        .iter()
        .map(|c| json!({ "version": c.version, "unfinished": c.unfinished, "due": c.due }))
        .collect();
    Ok(Report {
        human,
        json: json!({ "items": items }),
    })
}

/// `keiro retarget --from V1 --to V2`.
pub(crate) async fn retarget(keiro: &Keiro, from: &str, to: &str) -> Result<Report, Failure> {
    let moved = keiro.retarget(from, to).await?;
    let plural = if moved == 1 { "" } else { "s" };
    Ok(Report {
        human: format!(
            "moved {moved} unfinished instance{plural} from version {from} to {to}: workers of \
             {to} run them\n"
        ),
        json: json!({ "from": from, "to": to, "moved": moved }),
    })
}
