//! The group-commit writer isolates a write the database refuses: the writes
//! that shared its transaction still commit, and only the refused write's
//! caller gets the (permanent) error. On both backends, for each kind of
//! write (new instances, step results, finished instances).
//!
//! The database is made to refuse one marked value (a trigger on SQLite, a
//! `CHECK` constraint on PostgreSQL): a real refusal by the database, past
//! every check keiro makes before writing. The tests run on a current-thread
//! runtime, so every write is queued before the writer task runs and they all
//! share one round.

#[macro_use]
mod support;

use keiro_store::{
    AppendOutcome, CreateRequest, FinishRequest, InstanceStatus, JournalWriter, StepRow, StoreError,
};
use support::{Backend, TestDb};

/// The value the database refuses, in an input, a step name or an output.
const POISON: &str = "\"poison\"";

#[tokio::test]
async fn sqlite_a_refused_write_fails_alone() {
    let db = TestDb::sqlite().await;
    a_refused_write_fails_alone(&db).await;
    db.finish().await;
}

#[tokio::test]
async fn postgres_a_refused_write_fails_alone() {
    let db = TestDb::postgres().await;
    a_refused_write_fails_alone(&db).await;
    db.finish().await;
}

#[tokio::test]
async fn pgbouncer_a_refused_write_fails_alone() {
    let db = TestDb::pgbouncer().await;
    a_refused_write_fails_alone(&db).await;
    db.finish().await;
}

#[tokio::test]
async fn sqlite_a_round_of_every_kind_isolates_a_refused_write() {
    let db = TestDb::sqlite().await;
    a_round_of_every_kind_isolates_a_refused_write(&db).await;
    db.finish().await;
}

#[tokio::test]
async fn postgres_a_round_of_every_kind_isolates_a_refused_write() {
    let db = TestDb::postgres().await;
    a_round_of_every_kind_isolates_a_refused_write(&db).await;
    db.finish().await;
}

#[tokio::test]
async fn pgbouncer_a_round_of_every_kind_isolates_a_refused_write() {
    let db = TestDb::pgbouncer().await;
    a_round_of_every_kind_isolates_a_refused_write(&db).await;
    db.finish().await;
}

/// Makes the database refuse [`POISON`] as an instance's input or output and
/// as a step's result.
async fn refuse_poison(db: &TestDb) {
    let statements: &[&str] = match db.backend {
        Backend::Sqlite => &[
            "CREATE TRIGGER poison_input BEFORE INSERT ON keiro_workflows \
             WHEN NEW.input = '\"poison\"' BEGIN SELECT RAISE(ABORT, 'poison refused'); END",
            "CREATE TRIGGER poison_output BEFORE UPDATE ON keiro_workflows \
             WHEN NEW.output = '\"poison\"' BEGIN SELECT RAISE(ABORT, 'poison refused'); END",
            "CREATE TRIGGER poison_step BEFORE INSERT ON keiro_steps \
             WHEN NEW.result = '\"poison\"' BEGIN SELECT RAISE(ABORT, 'poison refused'); END",
        ],
        Backend::Postgres => &[
            "ALTER TABLE keiro_workflows ADD CONSTRAINT no_poison \
             CHECK (input <> '\"poison\"' AND output IS DISTINCT FROM '\"poison\"')",
            "ALTER TABLE keiro_steps ADD CONSTRAINT no_poison CHECK (result <> '\"poison\"')",
        ],
    };
    for statement in statements {
        db.execute_raw(statement, &[]).await;
    }
}

fn create(id: &str, input: &str) -> CreateRequest {
    CreateRequest::new(id, "checkout", input)
}

fn step(id: &str, result: &str) -> StepRow {
    StepRow {
        workflow_id: id.to_owned(),
        generation: 0,
        seq: 0,
        name: "charge".to_owned(),
        kind: "step".to_owned(),
        result: result.to_owned(),
    }
}

fn finish(id: &str, output: &str) -> FinishRequest {
    FinishRequest {
        id: id.to_owned(),
        generation: 0,
        owner: "worker-1".to_owned(),
        status: InstanceStatus::Completed,
        output: Some(output.to_owned()),
        error: None,
    }
}

/// Asserts that the poisoned write (index `bad`) alone failed, with a
/// permanent error, and every other write succeeded.
fn assert_only<T: std::fmt::Debug>(results: &[Result<T, StoreError>], bad: usize) {
    for (i, result) in results.iter().enumerate() {
        if i == bad {
            let error = result.as_ref().expect_err("the poisoned write must fail");
            assert!(
                matches!(error, StoreError::Query { .. }),
                "expected a query error, got {error:?}"
            );
            assert!(!error.is_transient(), "a refusal is permanent: {error}");
        } else {
            assert!(result.is_ok(), "write {i} failed: {result:?}");
        }
    }
}

async fn a_refused_write_fails_alone(db: &TestDb) {
    refuse_poison(db).await;
    let writer = JournalWriter::spawn(db.store.clone());
    let ids: Vec<String> = (0..12).map(|i| format!("wf-{i}")).collect();
    const BAD: usize = 5;
    let value = |i: usize| {
        if i == BAD {
            POISON.to_owned()
        } else {
            format!("{i}")
        }
    };

    // New instances: the poisoned input is refused.
    let tasks: Vec<_> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| {
            let (writer, request) = (writer.clone(), create(id, &value(i)));
            tokio::spawn(async move { writer.create(request).await })
        })
        .collect();
    let created = join(tasks).await;
    assert_only(&created, BAD);
    for (i, id) in ids.iter().enumerate() {
        let row = db.store.get_instance(id).await.unwrap();
        assert_eq!(row.is_some(), i != BAD, "{id}");
    }
    db.store
        .create_instance(&keiro_store::NewInstance::new(&ids[BAD], "checkout", "0"))
        .await
        .unwrap();

    // Step results: the poisoned result is refused.
    let tasks: Vec<_> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| {
            let (writer, row) = (writer.clone(), step(id, &value(i)));
            tokio::spawn(async move { writer.append(row).await })
        })
        .collect();
    let appended = join(tasks).await;
    assert_only(&appended, BAD);
    for (i, id) in ids.iter().enumerate() {
        let journal = db.store.load_journal(id, 0).await.unwrap();
        assert_eq!(journal.len(), usize::from(i != BAD), "{id}");
        if i != BAD {
            assert!(matches!(appended[i], Ok(AppendOutcome::Inserted)));
        }
    }

    // Finished instances: the poisoned output is refused.
    let tasks: Vec<_> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| {
            let (writer, request) = (writer.clone(), finish(id, &value(i)));
            tokio::spawn(async move { writer.finish(request).await })
        })
        .collect();
    let finished = join(tasks).await;
    assert_only(&finished, BAD);
    for (i, id) in ids.iter().enumerate() {
        let row = db.store.get_instance(id).await.unwrap().unwrap();
        let expected = if i == BAD {
            InstanceStatus::Pending
        } else {
            InstanceStatus::Completed
        };
        assert_eq!(row.status, expected, "{id}");
    }
}

/// One round holding new instances, step rows and finishes together: first
/// all good, and every write lands; then with one poisoned step row, which
/// alone fails, while the new instances and finishes sharing its round still
/// commit; then with one poisoned finish, which alone fails, while the step
/// rows and new instances sharing its round still commit.
async fn a_round_of_every_kind_isolates_a_refused_write(db: &TestDb) {
    refuse_poison(db).await;
    let writer = JournalWriter::spawn(db.store.clone());
    for i in 0..10 {
        writer
            .create(create(&format!("old-{i}"), "0"))
            .await
            .unwrap();
    }
    // Step rows each of old-0 .. old-3 has journaled so far.
    let mut journaled = [0usize; 4];
    for (round, poisoned, poisoned_finish) in
        [(0, None, None), (1, Some(2), None), (2, None, Some(1))]
    {
        // Queued before the writer task runs (current-thread runtime): one
        // round.
        let creates: Vec<_> = (0..3)
            .map(|i| {
                let (writer, request) = (writer.clone(), create(&format!("new-{round}-{i}"), "1"));
                tokio::spawn(async move { writer.create(request).await })
            })
            .collect();
        let steps: Vec<_> = (0..4)
            .map(|i| {
                let result = match poisoned == Some(i) {
                    true => POISON.to_owned(),
                    false => format!("{i}"),
                };
                let mut row = step(&format!("old-{i}"), &result);
                row.seq = round;
                let writer = writer.clone();
                tokio::spawn(async move { writer.append(row).await })
            })
            .collect();
        let finishes: Vec<_> = (0..2)
            .map(|i| {
                let id = format!("old-{}", 4 + 2 * round as usize + i);
                let output = match poisoned_finish == Some(i) {
                    true => POISON,
                    false => "2",
                };
                let (writer, request) = (writer.clone(), finish(&id, output));
                tokio::spawn(async move { writer.finish(request).await })
            })
            .collect();
        for (i, created) in join(creates).await.into_iter().enumerate() {
            let (row, fresh) = created.unwrap_or_else(|e| panic!("create {i}: {e}"));
            assert!(fresh, "new-{round}-{i} is new");
            assert_eq!(row.input, "1");
        }
        let appended = join(steps).await;
        match poisoned {
            Some(bad) => assert_only(&appended, bad),
            None => assert!(appended
                .iter()
                .all(|a| matches!(a, Ok(AppendOutcome::Inserted)))),
        }
        let finished = join(finishes).await;
        match poisoned_finish {
            Some(bad) => assert_only(&finished, bad),
            None => assert!(finished.iter().all(|f| matches!(f, Ok(true)))),
        }
        for i in 0..3 {
            let id = format!("new-{round}-{i}");
            assert!(db.store.get_instance(&id).await.unwrap().is_some(), "{id}");
        }
        for (i, rows) in journaled.iter_mut().enumerate() {
            *rows += usize::from(poisoned != Some(i));
            let journal = db.store.load_journal(&format!("old-{i}"), 0).await.unwrap();
            assert_eq!(journal.len(), *rows, "old-{i} after round {round}");
        }
        for i in 0..2 {
            let id = format!("old-{}", 4 + 2 * round as usize + i);
            let row = db.store.get_instance(&id).await.unwrap().unwrap();
            let expected = match poisoned_finish == Some(i) {
                true => InstanceStatus::Pending,
                false => InstanceStatus::Completed,
            };
            assert_eq!(row.status, expected, "{id}");
        }
    }
}

async fn join<T>(tasks: Vec<tokio::task::JoinHandle<T>>) -> Vec<T> {
    let mut out = Vec::with_capacity(tasks.len());
    for task in tasks {
        out.push(task.await.expect("a write task panicked"));
    }
    out
}
