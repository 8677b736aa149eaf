//! TEMPORARY (replaced by the API branch): JSON shapes.
use std::time::{SystemTime, UNIX_EPOCH};
fn since_epoch(time: SystemTime) -> (i64, u32) {
    match time.duration_since(UNIX_EPOCH) {
        Ok(d) => (d.as_secs() as i64, d.subsec_micros()),
        Err(e) => {
            let d = e.duration();
            let micros = d.subsec_micros();
            if micros == 0 {
                (-(d.as_secs() as i64), 0)
            } else {
                (-(d.as_secs() as i64) - 1, 1_000_000 - micros)
            }
        }
    }
}
fn civil(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}
fn parts(time: SystemTime) -> (String, String, u32) {
    let (secs, micros) = since_epoch(time);
    let (year, month, day) = civil(secs.div_euclid(86_400));
    let of_day = secs.rem_euclid(86_400);
    (
        format!("{year:04}-{month:02}-{day:02}"),
        format!(
            "{:02}:{:02}:{:02}",
            of_day / 3600,
            of_day % 3600 / 60,
            of_day % 60
        ),
        micros,
    )
}
/// RFC 3339.
pub fn rfc3339(time: SystemTime) -> String {
    let (date, clock, micros) = parts(time);
    format!("{date}T{clock}.{micros:06}Z")
}
/// A status's name.
pub fn status_name(status: &crate::WorkflowStatus) -> &'static str {
    use crate::WorkflowStatus;
    match status {
        WorkflowStatus::Pending => "pending",
        WorkflowStatus::Running => "running",
        WorkflowStatus::Suspended => "suspended",
        WorkflowStatus::Completed => "completed",
        WorkflowStatus::Failed => "failed",
        WorkflowStatus::Cancelled => "cancelled",
        WorkflowStatus::TimedOut => "timed_out",
        WorkflowStatus::NonDeterministic { .. } => "nondeterministic",
    }
}
/// Parse.
pub fn parse_status(name: &str) -> Option<crate::WorkflowStatus> {
    use crate::WorkflowStatus;
    Some(match name.trim() {
        "pending" => WorkflowStatus::Pending,
        "running" => WorkflowStatus::Running,
        "suspended" => WorkflowStatus::Suspended,
        "completed" => WorkflowStatus::Completed,
        "failed" => WorkflowStatus::Failed,
        "cancelled" => WorkflowStatus::Cancelled,
        "timed_out" => WorkflowStatus::TimedOut,
        "nondeterministic" => WorkflowStatus::NonDeterministic {
            expected: String::new(),
            found: String::new(),
        },
        _ => return None,
    })
}
