//! `keiro list` and `keiro show`: reading instances and their journals.

use std::time::SystemTime;

use keiro::{Keiro, ListFilter};
use serde_json::{json, Value};

use crate::args::ListArgs;
use keiro::admin::json::{self as shapes, STATUSES};

use crate::render;
use crate::table::{fields, fit, Table, WIDTH};
use crate::{clock, Failure, Report};

/// The filter `args` describe; an unknown status is a usage error naming it
/// and listing the valid ones.
fn filter(args: &ListArgs) -> Result<ListFilter, Failure> {
    let mut filter = ListFilter::default().limit(args.limit);
    for name in &args.status {
        let status = shapes::parse_status(name).ok_or_else(|| {
            Failure::Usage(format!(
                "unknown status `{name}` in --status; valid statuses: {}",
                STATUSES.join(", ")
            ))
        })?;
        filter = filter.status(status);
    }
    if let Some(name) = &args.name {
        filter = filter.name(name);
    }
    if let Some(prefix) = &args.prefix {
        filter = filter.id_prefix(prefix);
    }
    if let Some(parent) = &args.parent {
        filter = filter.parent_id(parent);
    }
    if let Some(version) = &args.app_version {
        filter = filter.version(version);
    }
    if let Some(queue) = &args.queue {
        filter = filter.queue(queue);
    }
    if let Some(age) = args.since {
        let after = SystemTime::now()
            .checked_sub(age)
            .unwrap_or(SystemTime::UNIX_EPOCH);
        filter = filter.created(Some(after), None);
    }
    if args.oldest_first {
        filter = filter.oldest_first();
    }
    if let Some(cursor) = &args.cursor {
        filter = filter.cursor(cursor);
    }
    Ok(filter)
}

/// `keiro list`: one page, and how to get the next.
pub(crate) async fn list(keiro: &Keiro, args: &ListArgs) -> Result<Report, Failure> {
    let page = keiro.list(&filter(args)?).await?;
    let now = SystemTime::now();
    let mut table = Table::new(&["ID", "NAME", "STATUS", "ATT", "CHANGED", "DETAIL"]);
    for s in &page.items {
        table.row(vec![
            s.id.clone(),
            s.name.clone(),
            shapes::status_name(&s.status).to_owned(),
            s.attempts.to_string(),
            format!("{} ago", clock::age(s.updated_at, now)),
            render::detail(s),
        ]);
    }
    let human = table.page("no workflow instances match", page.next_cursor.as_deref());
    Ok(Report {
        human,
        json: json!({
            "items": page.items.iter().map(shapes::summary).collect::<Vec<_>>(),
            "next_cursor": page.next_cursor,
        }),
    })
}

/// `keiro show ID`: the summary, then the journal as a timeline.
pub(crate) async fn show(keiro: &Keiro, id: &str) -> Result<Report, Failure> {
    let row = keiro
        .store()
        .get_instance(id)
        .await?
        .ok_or_else(|| keiro::Error::NotFound { id: id.to_owned() })?;
    let summary = keiro.summary(id).await?;
    let steps = keiro.steps_of(id, summary.generation).await?;
    let input = shapes::stored(row.original_input());
    let output = row.output.as_deref().map(shapes::stored);

    let mut pairs = vec![
        ("id", summary.id.clone()),
        ("workflow", summary.name.clone()),
        ("status", shapes::status_name(&summary.status).to_owned()),
        ("attempts", summary.attempts.to_string()),
        ("generation", summary.generation.to_string()),
        ("created", clock::short(summary.created_at)),
        (
            "updated",
            format!(
                "{} ({} after creation)",
                clock::short(summary.updated_at),
                clock::span(summary.created_at, summary.updated_at)
            ),
        ),
    ];
    let waits = summary
        .waiting_on
        .as_ref()
        .map(|waiting| render::waits(waiting, summary.wake_at));
    let due = summary.wake_at.filter(|_| waits.is_none());
    // The id to answer the awakeable it waits on with (`keiro resolve`):
    // the answer's entry follows the awakeable's creation entry.
    let awaited = summary
        .waiting_on
        .as_ref()
        .filter(|waiting| waiting.kind == keiro::WaitKind::AwakeableAnswer)
        .and_then(|waiting| steps.iter().find(|step| step.seq == waiting.seq - 1))
        .and_then(|step| shapes::awakeable_id(id, summary.generation, step));
    let optional = [
        ("parent", summary.parent_id.clone()),
        ("executor", summary.executor.clone()),
        ("version", summary.version.clone()),
        ("queue", summary.queue.clone()),
        ("debounce", summary.debounce_key.clone()),
        ("waits", waits),
        ("awakeable", awaited.clone()),
        ("due", due.map(clock::short)),
        ("error", summary.error.clone()),
    ];
    pairs.extend(optional.into_iter().filter_map(|(k, v)| v.map(|v| (k, v))));
    if let keiro::WorkflowStatus::NonDeterministic { expected, found } = &summary.status {
        pairs.push((
            "set aside",
            format!("journal has {expected}, code calls {found}"),
        ));
    }
    pairs.push(("input", render::compact(&input)));
    if let Some(output) = &output {
        pairs.push(("output", render::compact(output)));
    }
    let mut human = fields(&pairs);
    human.push('\n');
    if steps.is_empty() {
        human.push_str("no journal entries in this generation\n");
    } else {
        // AT: when the entry was recorded, counted from the instance's
        // creation; TOOK: a step's first attempt to its recorded result.
        let mut table = Table::new(&[
            "SEQ", "KIND", "NAME", "OUTCOME", "ATT", "TOOK", "AT", "VALUE",
        ]);
        for step in &steps {
            table.row(vec![
                step.seq.to_string(),
                step.kind.clone(),
                step.name.clone(),
                shapes::outcome_name(step.outcome).to_owned(),
                step.attempts.map(|n| n.to_string()).unwrap_or_default(),
                shapes::step_duration(step)
                    .map(clock::duration)
                    .unwrap_or_default(),
                format!("+{}", clock::age(summary.created_at, step.finished_at)),
                fit(&render::compact(&step.value), WIDTH),
            ]);
        }
        // The entry it waits on is not journaled yet: show it last, pending.
        if let Some(waiting) = summary
            .waiting_on
            .as_ref()
            .filter(|waiting| steps.iter().all(|step| step.seq != waiting.seq))
        {
            table.row(vec![
                waiting.seq.to_string(),
                waiting.kind.to_string(),
                waiting.name.clone(),
                "pending".to_owned(),
                String::new(),
                String::new(),
                String::new(),
                String::new(),
            ]);
        }
        human.push_str(&table.render());
    }

    let mut json = shapes::summary(&summary);
    json["input"] = input;
    json["output"] = output.unwrap_or(Value::Null);
    json["awaited_awakeable_id"] = awaited.into();
    json["steps"] = steps
        .iter()
        .map(|step| {
            let mut entry = shapes::step(step);
            if let Some(awakeable) = shapes::awakeable_id(id, summary.generation, step) {
                entry["awakeable_id"] = awakeable.into();
            }
            entry
        })
        .collect();
    Ok(Report { human, json })
}

/// `keiro show ID --history [--out FILE]`: the instance's history, the JSON
/// document `keiro::History` reads, on standard output or in FILE.
pub(crate) async fn history(
    keiro: &Keiro,
    id: &str,
    out: Option<&std::path::Path>,
) -> Result<Report, Failure> {
    let history = keiro.export(id).await?;
    let text = format!("{}\n", history.to_json_pretty());
    let Some(path) = out else {
        let json = serde_json::from_str(&text)
            .map_err(|e| Failure::Refused(format!("the history of {id} is not JSON: {e}")))?;
        return Ok(Report { human: text, json });
    };
    std::fs::write(path, &text).map_err(|e| {
        Failure::Refused(format!(
            "cannot write the history of {id} to {}: {e}",
            path.display()
        ))
    })?;
    let entries = history.entries.len();
    Ok(Report {
        human: format!(
            "wrote the history of {id} ({entries} journal entries) to {}\n",
            path.display()
        ),
        json: json!({ "id": id, "file": path.display().to_string(), "entries": entries }),
    })
}
