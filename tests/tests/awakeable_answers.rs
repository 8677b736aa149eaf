//! Hostile and wrong answers to awakeables, on both backends: a same-named
//! type from another module and a value that does not decode are refused
//! and leave the awakeable open for the right answer; an awakeable of an
//! ended workflow refuses answers naming its status; ids carry a journaled
//! secret, so a guessed id is unknown, and ids handed out before secrets
//! still work.

use std::sync::Mutex;
use std::time::Duration;

use keiro::{workflow, Error, Keiro, ResumeOptions, WorkflowStatus};
use keiro_store::{NewInstance, StepRow};
use keiro_tests::{on_both_backends, Backend, TestDb};
use serde::{Deserialize, Serialize};

/// Every awakeable id a workflow body saw, per test key: on every run,
/// replays included.
static SEEN: Mutex<Vec<(String, String)>> = Mutex::new(Vec::new());

fn seen(key: &str) -> Vec<String> {
    SEEN.lock()
        .unwrap()
        .iter()
        .filter(|(k, _)| k == key)
        .map(|(_, id)| id.clone())
        .collect()
}

fn announce(key: &str, id: &str) {
    SEEN.lock().unwrap().push((key.to_owned(), id.to_owned()));
}

async fn wait_for_id(key: &str) -> String {
    for _ in 0..400 {
        if let Some(id) = seen(key).pop() {
            return id;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("workflow {key} never handed out its awakeable");
}

/// Two types of one short name, `Approval`, in two modules.
mod a {
    use super::{Deserialize, Serialize};

    /// What the workflow awaits.
    #[derive(Serialize, Deserialize)]
    pub(crate) struct Approval {
        pub(crate) approved: bool,
    }
}

mod b {
    use super::{Deserialize, Serialize};

    /// Another `Approval`, of another shape.
    #[derive(Serialize, Deserialize)]
    pub(crate) struct Approval {
        pub(crate) approver: String,
    }
}

/// A percentage: any `u32` serializes, only 0..=100 deserializes.
#[derive(Serialize, Deserialize)]
#[serde(try_from = "u32")]
struct Percent(u32);

impl TryFrom<u32> for Percent {
    type Error = String;
    fn try_from(n: u32) -> Result<Self, String> {
        if n <= 100 {
            Ok(Percent(n))
        } else {
            Err(format!("{n} is over 100"))
        }
    }
}

#[workflow]
async fn approve(key: String) -> Result<bool, String> {
    let answer = keiro::awakeable::<a::Approval>().await;
    announce(&key, answer.id());
    answer.await.map(|a| a.approved).map_err(|e| e.to_string())
}

#[workflow]
async fn discount(key: String) -> Result<u32, String> {
    let answer = keiro::awakeable::<Percent>().await;
    announce(&key, answer.id());
    answer.await.map(|p| p.0).map_err(|e| e.to_string())
}

/// Hands out an awakeable and ends without awaiting it.
#[workflow]
async fn forgetful(key: String) -> u32 {
    let answer = keiro::awakeable::<bool>().await;
    announce(&key, answer.id());
    1
}

#[workflow]
async fn yes_or_no(key: String) -> Result<bool, String> {
    let answer = keiro::awakeable::<bool>().await;
    announce(&key, answer.id());
    answer.await.map_err(|e| e.to_string())
}

/// Hands out an awakeable in generation 0, then continues as new and awaits
/// one in generation 1.
#[workflow]
async fn two_generations(key: String, generation: u32) -> Result<bool, String> {
    let answer = keiro::awakeable::<bool>().await;
    announce(&key, answer.id());
    if generation == 0 {
        return keiro::continue_as_new(two_generations(key, 1))
            .await
            .map_err(|e| e.to_string());
    }
    answer.await.map_err(|e| e.to_string())
}

async fn runtime(db: &TestDb, suspend_after: Duration) -> Keiro {
    Keiro::builder(&db.url)
        .executor_id(format!("aa-{}", uuid::Uuid::new_v4().simple()))
        .suspend_after(suspend_after)
        .connect()
        .await
        .unwrap()
}

fn quiet() -> ResumeOptions {
    ResumeOptions::default().log(|_| {})
}

async fn a_same_named_type_of_another_module_is_refused(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = runtime(&db, Duration::from_secs(5)).await;
    let key = uuid::Uuid::new_v4().to_string();
    let handle = approve(key.clone())
        .id(&key)
        .on(&keiro)
        .start()
        .await
        .unwrap();
    let id = wait_for_id(&key).await;
    let answerer = db.keiro().await;
    let wrong = b::Approval {
        approver: "mallory".into(),
    };
    let err = answerer.resolve_awakeable(&id, wrong).await.unwrap_err();
    let Error::AwakeableTypeMismatch {
        id: named,
        expected,
        found,
    } = &err
    else {
        panic!("{err}")
    };
    assert_eq!(named, &id);
    assert!(expected.ends_with("a::Approval"), "{expected}");
    assert!(found.ends_with("b::Approval"), "{found}");
    // Nothing was recorded: the right answer still lands and is what the
    // workflow gets.
    let right = a::Approval { approved: true };
    answerer.resolve_awakeable(&id, &right).await.unwrap();
    assert_eq!(handle.result().await.unwrap(), Ok(true));
}

async fn an_answer_that_does_not_decode_is_refused(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = runtime(&db, Duration::from_secs(5)).await;
    let key = uuid::Uuid::new_v4().to_string();
    let handle = discount(key.clone())
        .id(&key)
        .on(&keiro)
        .start()
        .await
        .unwrap();
    let id = wait_for_id(&key).await;
    let err = keiro
        .resolve_awakeable(&id, Percent(150))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::AwakeableAnswerInvalid { .. }), "{err}");
    let text = err.to_string();
    assert!(
        text.contains(&id) && text.contains("Percent") && text.contains("150 is over 100"),
        "{text}"
    );
    keiro.resolve_awakeable(&id, Percent(50)).await.unwrap();
    assert_eq!(handle.result().await.unwrap(), Ok(50));
}

async fn answering_an_ended_workflow_is_refused_with_its_status(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = runtime(&db, Duration::from_secs(5)).await;
    let answerer = db.keiro().await;

    let key = uuid::Uuid::new_v4().to_string();
    let handle = yes_or_no(key.clone())
        .id(&key)
        .on(&keiro)
        .start()
        .await
        .unwrap();
    let id = wait_for_id(&key).await;
    keiro.cancel(&key).await.unwrap();
    assert_eq!(handle.status().await.unwrap(), WorkflowStatus::Cancelled);
    for err in [
        answerer.resolve_awakeable(&id, true).await.unwrap_err(),
        answerer.reject_awakeable(&id, "no").await.unwrap_err(),
    ] {
        assert!(
            matches!(&err, Error::AwakeableWorkflowFinished { status, .. } if status == "cancelled"),
            "{err}"
        );
        let text = err.to_string();
        assert!(
            text.contains(&id) && text.contains(&format!("`{key}`")),
            "{text}"
        );
    }

    let key = uuid::Uuid::new_v4().to_string();
    assert_eq!(forgetful(key.clone()).id(&key).on(&keiro).await.unwrap(), 1);
    let id = wait_for_id(&key).await;
    let err = answerer.resolve_awakeable(&id, true).await.unwrap_err();
    assert!(
        matches!(&err, Error::AwakeableWorkflowFinished { status, .. } if status == "completed"),
        "{err}"
    );
    // Nothing was recorded for either.
    let journal = keiro.store().load_journal(&key, 0).await.unwrap();
    assert_eq!(journal.len(), 1, "{journal:?}");
}

async fn answering_a_generation_continued_past_is_refused(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = runtime(&db, Duration::from_millis(100)).await;
    let key = uuid::Uuid::new_v4().to_string();
    let handle = two_generations(key.clone(), 0)
        .id(&key)
        .on(&keiro)
        .enqueue()
        .await
        .unwrap();
    // Generation 0 continues as new; generation 1 suspends on its awakeable.
    let mut ids = Vec::new();
    for _ in 0..5 {
        keiro.resume_once(&quiet()).await.unwrap();
        ids = seen(&key);
        if ids.len() >= 2 {
            break;
        }
    }
    let (old, new) = (&ids[0], &ids[1]);
    assert!(old.starts_with(&format!("{key}/0/")) && new.starts_with(&format!("{key}/1/")));
    let err = keiro.resolve_awakeable(old, true).await.unwrap_err();
    assert!(
        matches!(&err, Error::AwakeableWorkflowFinished { status, .. }
            if status.contains("continued as new")),
        "{err}"
    );
    keiro.resolve_awakeable(new, true).await.unwrap();
    assert_eq!(keiro.resume_once(&quiet()).await.unwrap().completed, 1);
    assert_eq!(handle.result().await.unwrap(), Ok(true));
}

async fn a_guessed_id_is_unknown_and_replays_hand_out_the_same_id(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = runtime(&db, Duration::from_millis(100)).await;
    let answerer = db.keiro().await;
    // A workflow id with `/` in it, suspended and resumed: a replay.
    let key = format!("tenant/{}/approval", uuid::Uuid::new_v4());
    let handle = yes_or_no(key.clone())
        .id(&key)
        .on(&keiro)
        .enqueue()
        .await
        .unwrap();
    assert_eq!(
        keiro.resume_once(&quiet()).await.unwrap().still_suspended,
        1
    );
    let id = wait_for_id(&key).await;
    let secret = id.rsplit('/').next().unwrap();
    assert_eq!(id, format!("{key}/0/0/{secret}"));
    assert!(
        secret.len() == 32 && secret.bytes().all(|b| b.is_ascii_hexdigit()),
        "{id}"
    );
    // The guessable part alone, or with another secret, names no awakeable,
    // with the same error as an id that never existed.
    let other = uuid::Uuid::new_v4().simple().to_string();
    for guess in [
        format!("{key}/0/0"),
        format!("{key}/0/0/{other}"),
        format!("{key}/0/0/{}", &secret[..31]),
    ] {
        let err = answerer.resolve_awakeable(&guess, true).await.unwrap_err();
        assert_eq!(
            err.to_string(),
            format!("no awakeable has id `{guess}`"),
            "{guess}"
        );
        let err = answerer.reject_awakeable(&guess, "x").await.unwrap_err();
        assert!(matches!(err, Error::UnknownAwakeable { .. }), "{err}");
    }
    answerer.resolve_awakeable(&id, true).await.unwrap();
    let summary = keiro.resume_once(&quiet()).await.unwrap();
    assert_eq!(summary.completed, 1);
    assert_eq!(handle.result().await.unwrap(), Ok(true));
    // Both runs (the first and the replay) handed out the one journaled id.
    let ids = seen(&key);
    assert!(ids.len() >= 2 && ids.iter().all(|i| *i == id), "{ids:?}");
}

async fn an_awakeable_created_before_secrets_keeps_its_id(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = runtime(&db, Duration::from_secs(5)).await;
    let key = uuid::Uuid::new_v4().to_string();
    // As the previous version journaled it: the short type name, no secret.
    let store = keiro::unstable::raw_store(&keiro);
    let input = serde_json::to_string(&(key.clone(),)).unwrap();
    store
        .create_instance(&NewInstance::new(&key, "yes_or_no", &input))
        .await
        .unwrap();
    store
        .append_steps(&[StepRow {
            workflow_id: key.clone(),
            generation: 0,
            seq: 0,
            name: "awakeable".into(),
            kind: "awakeable".into(),
            result: r#""bool""#.into(),
        }])
        .await
        .unwrap();
    let handle = yes_or_no(key.clone())
        .id(&key)
        .on(&keiro)
        .start()
        .await
        .unwrap();
    let id = wait_for_id(&key).await;
    assert_eq!(id, format!("{key}/0/0"));
    let err = keiro.resolve_awakeable(&id, "yes").await.unwrap_err();
    assert!(matches!(err, Error::AwakeableTypeMismatch { .. }), "{err}");
    keiro.resolve_awakeable(&id, true).await.unwrap();
    assert_eq!(handle.result().await.unwrap(), Ok(true));
}

on_both_backends!(
    a_same_named_type_of_another_module_is_refused,
    an_answer_that_does_not_decode_is_refused,
    answering_an_ended_workflow_is_refused_with_its_status,
    answering_a_generation_continued_past_is_refused,
    a_guessed_id_is_unknown_and_replays_hand_out_the_same_id,
    an_awakeable_created_before_secrets_keeps_its_id,
);
