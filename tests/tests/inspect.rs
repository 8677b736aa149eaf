//! Inspecting instances, on both backends: a suspended instance's summary
//! names the journal entry it waits on (one instance per kind of wait), and
//! `keiro.steps` shows how many attempts a step took and when it ran.

use std::time::{Duration, SystemTime};

use keiro::{
    step, workflow, Keiro, ListFilter, ResumeOptions, StepOutcome, WaitKind, WaitingOn,
    WorkflowStatus,
};
use keiro_tests::{count, on_both_backends, ran, Backend, TestDb};

fn quiet() -> ResumeOptions {
    ResumeOptions::default().log(|_| {})
}

/// A runtime that suspends a waiting run after 10 ms.
async fn runtime(db: &TestDb) -> Keiro {
    db.builder()
        .suspend_after(Duration::from_millis(10))
        .connect()
        .await
        .unwrap()
}

#[step]
async fn first(n: u32) -> u32 {
    n
}

/// Seq 0 a step, seq 1 an hour's sleep.
#[workflow]
async fn waits_on_sleep(_tag: String) -> u32 {
    first(1).await;
    keiro::sleep(Duration::from_secs(3600)).await;
    1
}

/// Seq 0 a step, seq 1 the awakeable, seq 2 its answer.
#[workflow]
async fn waits_on_awakeable(_tag: String) -> bool {
    first(1).await;
    let answer = keiro::awakeable::<bool>().await;
    answer.await.unwrap_or(false)
}

/// Seq 0 a step, seq 1 the message on topic `orders`.
#[workflow]
async fn waits_on_message(_tag: String) -> String {
    first(1).await;
    keiro::recv::<String>("orders").await.unwrap_or_default()
}

/// Seq 0 a step, seq 1 a child that sleeps an hour.
#[workflow]
async fn waits_on_child(tag: String) -> u32 {
    first(1).await;
    let child = keiro::spawn(waits_on_sleep(format!("{tag}-child")))
        .await
        .unwrap();
    child.await.unwrap_or(0)
}

fn waiting(kind: WaitKind, seq: i64, name: &str) -> Option<WaitingOn> {
    Some(WaitingOn {
        seq,
        kind,
        name: name.to_owned(),
    })
}

async fn a_suspended_summary_names_what_it_waits_on(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = runtime(&db).await;
    let tag = uuid::Uuid::new_v4().simple().to_string();
    let id = |what: &str| format!("{what}-{tag}");
    waits_on_sleep(tag.clone())
        .id(id("sleep"))
        .on(&keiro)
        .enqueue()
        .await
        .unwrap();
    waits_on_awakeable(tag.clone())
        .id(id("awakeable"))
        .on(&keiro)
        .enqueue()
        .await
        .unwrap();
    waits_on_message(tag.clone())
        .id(id("message"))
        .on(&keiro)
        .enqueue()
        .await
        .unwrap();
    waits_on_child(tag.clone())
        .id(id("child"))
        .on(&keiro)
        .enqueue()
        .await
        .unwrap();
    // The first pass runs the four; the second the child the parent started.
    for _ in 0..2 {
        keiro.resume_once(&quiet()).await.unwrap();
    }
    let page = keiro
        .list(&ListFilter::default().status(WorkflowStatus::Suspended))
        .await
        .unwrap();
    let waits_of = |id: &str| {
        let summary = page
            .items
            .iter()
            .find(|s| s.id == id)
            .unwrap_or_else(|| panic!("{id} is not suspended: {:?}", page.items));
        summary.waiting_on.clone()
    };
    assert_eq!(waits_of(&id("sleep")), waiting(WaitKind::Sleep, 1, "sleep"));
    assert_eq!(
        waits_of(&id("awakeable")),
        waiting(WaitKind::AwakeableAnswer, 2, "awakeable")
    );
    assert_eq!(
        waits_of(&id("message")),
        waiting(WaitKind::Message, 1, "orders")
    );
    assert_eq!(
        waits_of(&id("child")),
        waiting(WaitKind::Child, 1, "waits_on_sleep")
    );
    assert_eq!(
        page.items.len(),
        5,
        "the child sleeps too: {:?}",
        page.items
    );
    // One instance's summary says the same as the listing.
    for item in &page.items {
        let one = keiro.summary(&item.id).await.unwrap();
        assert_eq!(
            (&one.id, &one.status, &one.waiting_on),
            (&item.id, &item.status, &item.waiting_on)
        );
    }
    assert!(matches!(
        keiro.summary("no-such-instance").await,
        Err(keiro::Error::NotFound { .. })
    ));

    // Answered, it runs on and completes: no wait is shown any more.
    keiro.send(id("message"), "orders", "book").await.unwrap();
    keiro.resume_once(&quiet()).await.unwrap();
    let page = keiro
        .list(&ListFilter::default().id_prefix(id("message")))
        .await
        .unwrap();
    assert_eq!(page.items[0].status, WorkflowStatus::Completed);
    assert_eq!(page.items[0].waiting_on, None);
}

/// Fails its first two attempts for `key`, sleeping 30 ms in each.
#[step(max_attempts = 3, backoff_ms = 1)]
async fn flaky(key: String) -> Result<u32, String> {
    tokio::time::sleep(Duration::from_millis(30)).await;
    ran(&key, "flaky");
    if count(&key, "flaky") < 3 {
        return Err("not yet".into());
    }
    Ok(7)
}

#[workflow]
async fn with_retries(key: String) -> Result<u32, String> {
    let n = first(3).await;
    Ok(n + flaky(key).await?)
}

async fn steps_show_attempts_and_times(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    let key = format!("attempts-{}", uuid::Uuid::new_v4().simple());
    let before = SystemTime::now();
    let total = with_retries(key.clone()).id(&key).on(&keiro).await.unwrap();
    assert_eq!(total, Ok(10));
    let steps = keiro.steps(&key).await.unwrap();
    assert_eq!(steps.len(), 2, "{steps:?}");
    let (one, retried) = (&steps[0], &steps[1]);
    assert_eq!(one.attempts, Some(1));
    assert_eq!(
        (retried.name.as_str(), retried.attempts),
        ("flaky", Some(3))
    );
    assert_eq!(retried.outcome, StepOutcome::Ok);
    for step in &steps {
        let started = step.started_at.expect("a step's start is recorded");
        assert!(started >= before - Duration::from_secs(1), "{step:?}");
        assert!(step.finished_at >= started, "{step:?}");
    }
    // Three attempts of 30 ms each lie between its start and its record.
    let took = retried
        .finished_at
        .duration_since(retried.started_at.unwrap())
        .unwrap();
    assert!(took >= Duration::from_millis(90), "{took:?}");
}

on_both_backends!(
    a_suspended_summary_names_what_it_waits_on,
    steps_show_attempts_and_times,
);
