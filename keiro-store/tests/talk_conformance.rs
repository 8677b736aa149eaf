//! Conformance of the storage for talking to running workflows, on both
//! backends: message queues (order, exactly-once taking, idempotency keys,
//! waking a suspended receiver, the send/suspend race), events and streams.

#[macro_use]
mod support;

use std::sync::Arc;

use keiro_store::{
    AppendOutcome, Finish, InstanceStatus, Lease, NewInstance, NewMessage, Publish, Receive,
    Received, SendOutcome, StepRow, Suspend,
};
use support::TestDb;

conformance!(
    messages_are_taken_in_the_order_sent_each_once,
    a_replayed_receive_reads_its_journaled_message_and_takes_nothing,
    concurrent_senders_lose_nothing_and_keep_each_senders_order,
    an_idempotency_key_makes_a_retried_send_a_no_op,
    sending_to_a_missing_or_finished_instance_is_refused,
    a_send_wakes_a_suspended_receiver,
    suspend_for_a_message_already_waiting_is_due_at_once,
    a_send_racing_a_suspend_is_never_missed,
    a_refused_message_stays_queued,
    an_empty_queue_journals_the_deadline_result_only_when_asked,
    a_send_from_a_workflow_is_journaled_with_the_message,
    a_batch_of_sends_answers_each_message_in_order,
    events_keep_the_last_value_and_write_once_per_step,
    streams_append_in_order_close_once_and_write_once_per_step,
    a_select_suspend_is_due_at_once_when_any_wake_condition_holds,
    an_answer_or_send_racing_a_select_suspend_is_never_missed,
);

const OWNER: &str = "w1";

fn lease() -> Lease<'static> {
    Lease {
        owner: OWNER,
        ttl_us: 60_000_000,
    }
}

async fn running(db: &TestDb, id: &str) {
    let new = NewInstance {
        lease: Some(lease()),
        ..NewInstance::new(id, "flow", "[]")
    };
    assert!(db.store.create_instance(&new).await.unwrap().1);
}

fn message<'a>(id: &'a str, topic: &'a str, payload: &'a str) -> NewMessage<'a> {
    NewMessage {
        workflow_id: id,
        topic,
        payload,
        type_name: Some("u32"),
        idempotency_key: None,
        journal: None,
    }
}

fn receive<'a>(id: &'a str, seq: i64, topic: &'a str) -> Receive<'a> {
    Receive {
        workflow_id: id,
        generation: 0,
        seq,
        name: "recv",
        kind: "recv",
        topic,
        when_empty: None,
    }
}

fn accept_all(_: &keiro_store::MessageRow) -> Result<(), String> {
    Ok(())
}

/// Receives at step `seq`; the journaled result, or `None` when empty.
async fn take(db: &TestDb, id: &str, seq: i64, topic: &str) -> Option<String> {
    match db
        .store
        .receive_message(&receive(id, seq, topic), &accept_all)
        .await
        .unwrap()
    {
        Received::Journaled(row) => Some(row.result),
        Received::Empty => None,
        Received::Refused { reason, .. } => panic!("refused: {reason}"),
    }
}

fn step(id: &str, seq: i64, kind: &str, result: &str) -> StepRow {
    StepRow {
        workflow_id: id.into(),
        generation: 0,
        seq,
        name: kind.into(),
        kind: kind.into(),
        result: result.into(),
    }
}

async fn messages_are_taken_in_the_order_sent_each_once(db: &TestDb) {
    running(db, "wf").await;
    for n in 1..=5 {
        let payload = n.to_string();
        let sent = db
            .store
            .send_message(&message("wf", "t", &payload))
            .await
            .unwrap();
        assert!(matches!(sent, SendOutcome::Sent(_)), "{sent:?}");
    }
    db.store
        .send_message(&message("wf", "other", "99"))
        .await
        .unwrap();
    for n in 1..=5 {
        assert_eq!(
            take(db, "wf", n, "t").await.as_deref(),
            Some(format!("{{\"Ok\":{n}}}").as_str())
        );
    }
    assert_eq!(
        take(db, "wf", 6, "t").await,
        None,
        "every message taken once"
    );
    assert_eq!(db.store.count_waiting_messages("wf", "t").await.unwrap(), 0);
    assert_eq!(
        db.store
            .count_waiting_messages("wf", "other")
            .await
            .unwrap(),
        1
    );
}

async fn a_replayed_receive_reads_its_journaled_message_and_takes_nothing(db: &TestDb) {
    running(db, "wf").await;
    for payload in ["\"a\"", "\"b\""] {
        db.store
            .send_message(&message("wf", "t", payload))
            .await
            .unwrap();
    }
    assert_eq!(
        take(db, "wf", 3, "t").await.as_deref(),
        Some("{\"Ok\":\"a\"}")
    );
    // The same step again (a replay, or a racing run): the same message.
    assert_eq!(
        take(db, "wf", 3, "t").await.as_deref(),
        Some("{\"Ok\":\"a\"}")
    );
    assert_eq!(db.store.count_waiting_messages("wf", "t").await.unwrap(), 1);
    assert_eq!(
        take(db, "wf", 4, "t").await.as_deref(),
        Some("{\"Ok\":\"b\"}")
    );
}

async fn concurrent_senders_lose_nothing_and_keep_each_senders_order(db: &TestDb) {
    running(db, "wf").await;
    let store = Arc::new(db.store.clone());
    let senders: Vec<_> = (0..4)
        .map(|sender| {
            let store = store.clone();
            tokio::spawn(async move {
                for n in 0..25 {
                    let payload = format!("[{sender},{n}]");
                    let sent = store
                        .send_message(&message("wf", "t", &payload))
                        .await
                        .unwrap();
                    assert!(matches!(sent, SendOutcome::Sent(_)), "{sent:?}");
                }
            })
        })
        .collect();
    // Two receivers race for the same steps while the senders run.
    let mut taken = Vec::new();
    let mut seq = 0;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while taken.len() < 100 && std::time::Instant::now() < deadline {
        let (a, b) = tokio::join!(take(db, "wf", seq, "t"), take(db, "wf", seq, "t"));
        // One run may find the queue empty just before a message arrives for
        // the other; any run that took something took the journaled message.
        let journaled = match (&a, &b) {
            (None, None) => None,
            _ => take(db, "wf", seq, "t").await,
        };
        for got in [&a, &b].into_iter().flatten() {
            assert_eq!(Some(got), journaled.as_ref(), "two runs of step {seq}");
        }
        match journaled {
            Some(result) => {
                taken.push(result);
                seq += 1;
            }
            None => tokio::task::yield_now().await,
        }
    }
    for sender in senders {
        sender.await.unwrap();
    }
    assert_eq!(taken.len(), 100, "every message delivered");
    for sender in 0..4 {
        let order: Vec<i64> = taken
            .iter()
            .filter_map(|r| {
                let v: serde_json::Value = serde_json::from_str(r).unwrap();
                let pair = v["Ok"].as_array().unwrap().clone();
                (pair[0] == sender).then(|| pair[1].as_i64().unwrap())
            })
            .collect();
        assert_eq!(order, (0..25).collect::<Vec<_>>(), "sender {sender}");
    }
    assert_eq!(take(db, "wf", seq, "t").await, None);
}

async fn an_idempotency_key_makes_a_retried_send_a_no_op(db: &TestDb) {
    running(db, "wf").await;
    let keyed = NewMessage {
        idempotency_key: Some("order-7"),
        ..message("wf", "t", "7")
    };
    assert!(matches!(
        db.store.send_message(&keyed).await.unwrap(),
        SendOutcome::Sent(_)
    ));
    assert_eq!(
        db.store.send_message(&keyed).await.unwrap(),
        SendOutcome::Duplicate
    );
    assert_eq!(take(db, "wf", 0, "t").await.as_deref(), Some("{\"Ok\":7}"));
    // Still a no-op after delivery.
    assert_eq!(
        db.store.send_message(&keyed).await.unwrap(),
        SendOutcome::Duplicate
    );
    assert_eq!(db.store.count_waiting_messages("wf", "t").await.unwrap(), 0);
}

async fn sending_to_a_missing_or_finished_instance_is_refused(db: &TestDb) {
    assert_eq!(
        db.store
            .send_message(&message("nobody", "t", "1"))
            .await
            .unwrap(),
        SendOutcome::NotFound
    );
    running(db, "done").await;
    assert!(db
        .store
        .finish(&Finish {
            id: "done",
            generation: 0,
            owner: OWNER,
            status: InstanceStatus::Completed,
            output: Some("1"),
            error: None,
        })
        .await
        .unwrap());
    assert_eq!(
        db.store
            .send_message(&message("done", "t", "1"))
            .await
            .unwrap(),
        SendOutcome::Finished(InstanceStatus::Completed)
    );
    assert_eq!(
        db.store.count_waiting_messages("done", "t").await.unwrap(),
        0
    );
}

fn suspension(id: &str) -> Suspend<'_> {
    Suspend {
        id,
        generation: 0,
        owner: OWNER,
        wake_at: None,
        awaiting: None,
        waiting: None,
    }
}

async fn a_send_wakes_a_suspended_receiver(db: &TestDb) {
    running(db, "wf").await;
    assert!(db
        .store
        .suspend_for_message(&suspension("wf"), "t")
        .await
        .unwrap());
    let row = db.store.get_instance("wf").await.unwrap().unwrap();
    assert_eq!(row.status, InstanceStatus::Suspended);
    assert_eq!(row.wake_at, None, "a receiver without deadline sleeps");
    let before = keiro_store::now_us();
    db.store
        .send_message(&message("wf", "t", "1"))
        .await
        .unwrap();
    let row = db.store.get_instance("wf").await.unwrap().unwrap();
    let wake_at = row.wake_at.expect("the send made the receiver due");
    assert!(wake_at >= before && wake_at <= keiro_store::now_us());
}

async fn suspend_for_a_message_already_waiting_is_due_at_once(db: &TestDb) {
    running(db, "wf").await;
    db.store
        .send_message(&message("wf", "t", "1"))
        .await
        .unwrap();
    let before = keiro_store::now_us();
    assert!(db
        .store
        .suspend_for_message(&suspension("wf"), "t")
        .await
        .unwrap());
    let row = db.store.get_instance("wf").await.unwrap().unwrap();
    assert_eq!(row.status, InstanceStatus::Suspended);
    let wake_at = row.wake_at.expect("due at once: a message waits");
    assert!(wake_at >= before && wake_at <= keiro_store::now_us());
    // A message on another topic does not make it due.
    running(db, "wf2").await;
    db.store
        .send_message(&message("wf2", "other", "1"))
        .await
        .unwrap();
    assert!(db
        .store
        .suspend_for_message(&suspension("wf2"), "t")
        .await
        .unwrap());
    let row = db.store.get_instance("wf2").await.unwrap().unwrap();
    assert_eq!(row.wake_at, None);
}

async fn a_send_racing_a_suspend_is_never_missed(db: &TestDb) {
    for round in 0..40 {
        let id = format!("race-{round}");
        running(db, &id).await;
        let (to_send, to_suspend) = (message(&id, "t", "1"), suspension(&id));
        let (sent, suspended) = tokio::join!(
            db.store.send_message(&to_send),
            db.store.suspend_for_message(&to_suspend, "t"),
        );
        assert!(matches!(sent.unwrap(), SendOutcome::Sent(_)));
        let row = db.store.get_instance(&id).await.unwrap().unwrap();
        if suspended.unwrap() {
            // It slept: the send must have seen it and made it due.
            assert_eq!(row.status, InstanceStatus::Suspended, "round {round}");
            assert!(
                row.wake_at.is_some(),
                "round {round}: the message was missed"
            );
        } else {
            assert_eq!(row.status, InstanceStatus::Running, "round {round}");
        }
    }
}

async fn a_refused_message_stays_queued(db: &TestDb) {
    running(db, "wf").await;
    db.store
        .send_message(&message("wf", "t", "\"not a number\""))
        .await
        .unwrap();
    let refuse = |m: &keiro_store::MessageRow| -> Result<(), String> {
        Err(format!("{} is not a u64", m.payload))
    };
    let got = db
        .store
        .receive_message(&receive("wf", 0, "t"), &refuse)
        .await
        .unwrap();
    let Received::Refused { message, reason } = got else {
        panic!("expected a refusal, got {got:?}");
    };
    assert_eq!(message.payload, "\"not a number\"");
    assert_eq!(message.type_name.as_deref(), Some("u32"));
    assert!(reason.contains("not a u64"), "{reason}");
    assert_eq!(db.store.count_waiting_messages("wf", "t").await.unwrap(), 1);
    assert_eq!(db.store.get_step("wf", 0, 0).await.unwrap(), None);
}

async fn an_empty_queue_journals_the_deadline_result_only_when_asked(db: &TestDb) {
    running(db, "wf").await;
    assert_eq!(take(db, "wf", 0, "t").await, None);
    assert_eq!(db.store.get_step("wf", 0, 0).await.unwrap(), None);
    let timed_out = Receive {
        when_empty: Some("{\"Ok\":null}"),
        ..receive("wf", 0, "t")
    };
    let got = db
        .store
        .receive_message(&timed_out, &accept_all)
        .await
        .unwrap();
    assert!(
        matches!(&got, Received::Journaled(row) if row.result == "{\"Ok\":null}"),
        "{got:?}"
    );
    // A message sent after the deadline is left for the next receive.
    db.store
        .send_message(&message("wf", "t", "5"))
        .await
        .unwrap();
    assert_eq!(
        take(db, "wf", 0, "t").await.as_deref(),
        Some("{\"Ok\":null}")
    );
    assert_eq!(take(db, "wf", 1, "t").await.as_deref(), Some("{\"Ok\":5}"));
}

async fn a_send_from_a_workflow_is_journaled_with_the_message(db: &TestDb) {
    running(db, "sender").await;
    running(db, "receiver").await;
    let sending = step("sender", 2, "send", "{\"Ok\":null}");
    let from_workflow = NewMessage {
        journal: Some(&sending),
        ..message("receiver", "t", "1")
    };
    assert!(matches!(
        db.store.send_message(&from_workflow).await.unwrap(),
        SendOutcome::Sent(_)
    ));
    // The replay of the sending step sends nothing more.
    assert_eq!(
        db.store.send_message(&from_workflow).await.unwrap(),
        SendOutcome::Replayed(sending.clone())
    );
    assert_eq!(
        db.store
            .count_waiting_messages("receiver", "t")
            .await
            .unwrap(),
        1
    );
    // Refused sends journal nothing: the step is not taken.
    let to_nobody = step("sender", 3, "send", "{\"Ok\":null}");
    let refused = NewMessage {
        journal: Some(&to_nobody),
        ..message("nobody", "t", "1")
    };
    assert_eq!(
        db.store.send_message(&refused).await.unwrap(),
        SendOutcome::NotFound
    );
    assert_eq!(db.store.get_step("sender", 0, 3).await.unwrap(), None);
}

async fn a_batch_of_sends_answers_each_message_in_order(db: &TestDb) {
    running(db, "a").await;
    running(db, "b").await;
    running(db, "done").await;
    assert!(db
        .store
        .finish(&Finish {
            id: "done",
            generation: 0,
            owner: OWNER,
            status: InstanceStatus::Completed,
            output: Some("1"),
            error: None,
        })
        .await
        .unwrap());
    assert!(db
        .store
        .suspend_for_message(&suspension("b"), "t")
        .await
        .unwrap());
    let keyed = |payload| NewMessage {
        idempotency_key: Some("k"),
        ..message("a", "t", payload)
    };
    let batch = [
        message("a", "t", "1"),
        message("nobody", "t", "2"),
        keyed("3"),
        message("done", "t", "4"),
        keyed("5"),
        message("b", "t", "6"),
        message("a", "t", "7"),
    ];
    let outcomes = db.store.send_messages(&batch).await.unwrap();
    let kinds: Vec<&str> = outcomes
        .iter()
        .map(|o| match o {
            SendOutcome::Sent(_) => "sent",
            SendOutcome::Duplicate => "duplicate",
            SendOutcome::NotFound => "not found",
            SendOutcome::Finished(_) => "finished",
            SendOutcome::Replayed(_) => "replayed",
        })
        .collect();
    assert_eq!(
        kinds,
        [
            "sent",
            "not found",
            "sent",
            "finished",
            "duplicate",
            "sent",
            "sent"
        ]
    );
    // Each instance's messages keep the batch's order.
    for (seq, expected) in [(0, "1"), (1, "3"), (2, "7")] {
        let got = take(db, "a", seq, "t").await;
        assert_eq!(
            got,
            Some(format!("{{\"Ok\":{expected}}}")),
            "message {seq} of a"
        );
    }
    assert_eq!(take(db, "a", 3, "t").await, None);
    // The suspended receiver was made due.
    let b = db.store.get_instance("b").await.unwrap().unwrap();
    assert!(b.wake_at.is_some(), "b was not woken");
    assert_eq!(
        db.store.count_waiting_messages("done", "t").await.unwrap(),
        0
    );
}

async fn events_keep_the_last_value_and_write_once_per_step(db: &TestDb) {
    running(db, "wf").await;
    assert_eq!(db.store.get_event("wf", "progress").await.unwrap(), None);
    for (seq, value) in [(0, "10"), (1, "50")] {
        let publishing = step("wf", seq, "set_event", "{\"Ok\":null}");
        let set = Publish {
            step: &publishing,
            key: "progress",
            value: Some(value),
            type_name: Some("u8"),
        };
        assert_eq!(
            db.store.set_event(&set).await.unwrap(),
            AppendOutcome::Inserted
        );
    }
    let event = db.store.get_event("wf", "progress").await.unwrap().unwrap();
    assert_eq!(event.value, "50");
    assert_eq!(event.type_name.as_deref(), Some("u8"));
    // Replaying step 0 does not set the old value again.
    let replayed = step("wf", 0, "set_event", "{\"Ok\":null}");
    let again = Publish {
        step: &replayed,
        key: "progress",
        value: Some("10"),
        type_name: Some("u8"),
    };
    assert!(matches!(
        db.store.set_event(&again).await.unwrap(),
        AppendOutcome::Existing(_)
    ));
    assert_eq!(
        db.store
            .get_event("wf", "progress")
            .await
            .unwrap()
            .unwrap()
            .value,
        "50"
    );
}

async fn streams_append_in_order_close_once_and_write_once_per_step(db: &TestDb) {
    running(db, "wf").await;
    let values = ["\"a\"", "\"b\"", "\"c\""];
    for (seq, value) in values.iter().enumerate() {
        let writing = step("wf", seq as i64, "write_stream", "{\"Ok\":null}");
        let write = Publish {
            step: &writing,
            key: "log",
            value: Some(value),
            type_name: Some("alloc::string::String"),
        };
        assert_eq!(
            db.store.write_stream(&write).await.unwrap(),
            AppendOutcome::Inserted
        );
        // A replay of the same step appends nothing.
        assert!(matches!(
            db.store.write_stream(&write).await.unwrap(),
            AppendOutcome::Existing(_)
        ));
    }
    let closing = step("wf", 3, "close_stream", "{\"Ok\":null}");
    let close = Publish {
        step: &closing,
        key: "log",
        value: None,
        type_name: None,
    };
    db.store.write_stream(&close).await.unwrap();
    // Writing after the close changes nothing in the stream.
    let late = step("wf", 4, "write_stream", "{\"Ok\":null}");
    db.store
        .write_stream(&Publish {
            step: &late,
            key: "log",
            value: Some("\"late\""),
            type_name: None,
        })
        .await
        .unwrap();
    let entries = db.store.read_stream("wf", "log", 0, 100).await.unwrap();
    let read: Vec<(i64, Option<&str>)> = entries
        .iter()
        .map(|e| (e.position, e.value.as_deref()))
        .collect();
    assert_eq!(
        read,
        vec![
            (0, Some("\"a\"")),
            (1, Some("\"b\"")),
            (2, Some("\"c\"")),
            (3, None)
        ]
    );
    // Reading on from a position, a page at a time.
    let page = db.store.read_stream("wf", "log", 1, 2).await.unwrap();
    assert_eq!(
        page.iter().map(|e| e.position).collect::<Vec<_>>(),
        vec![1, 2]
    );
    assert!(db
        .store
        .read_stream("wf", "other", 0, 10)
        .await
        .unwrap()
        .is_empty());
}

/// A select suspends on all its branches' conditions: due at its earliest
/// wake time, or at once when any awaited step or topic already has what it
/// waits for.
async fn a_select_suspend_is_due_at_once_when_any_wake_condition_holds(db: &TestDb) {
    let later = keiro_store::now_us() + 60_000_000;
    let select = |id| Suspend {
        wake_at: Some(later),
        ..suspension(id)
    };
    let topics = ["a".to_owned(), "b".to_owned()];
    // Nothing has happened: it sleeps until its earliest wake time.
    running(db, "none").await;
    db.store
        .send_message(&message("none", "other", "1"))
        .await
        .unwrap();
    assert!(db
        .store
        .suspend_for_any(&select("none"), &[3, 5], &topics)
        .await
        .unwrap());
    let row = db.store.get_instance("none").await.unwrap().unwrap();
    assert_eq!(row.status, InstanceStatus::Suspended);
    assert_eq!(row.wake_at, Some(later));
    // The second awaited step was recorded meanwhile.
    running(db, "step").await;
    db.store
        .append_steps(&[step("step", 5, "resolution", "{\"Ok\":1}")])
        .await
        .unwrap();
    let before = keiro_store::now_us();
    assert!(db
        .store
        .suspend_for_any(&select("step"), &[3, 5], &topics)
        .await
        .unwrap());
    let row = db.store.get_instance("step").await.unwrap().unwrap();
    assert!(row.wake_at.is_some_and(|w| w >= before && w < later));
    // A message waits on the second topic.
    running(db, "topic").await;
    db.store
        .send_message(&message("topic", "b", "1"))
        .await
        .unwrap();
    assert!(db
        .store
        .suspend_for_any(&select("topic"), &[3, 5], &topics)
        .await
        .unwrap());
    let row = db.store.get_instance("topic").await.unwrap().unwrap();
    assert!(row.wake_at.is_some_and(|w| w >= before && w < later));
    // Without the lease nothing changes.
    assert!(!db
        .store
        .suspend_for_any(&select("topic"), &[3], &topics)
        .await
        .unwrap());
}

async fn an_answer_or_send_racing_a_select_suspend_is_never_missed(db: &TestDb) {
    for round in 0..40 {
        let id = format!("select-race-{round}");
        running(db, &id).await;
        // The awaitable the select waits on (step 0), answered at step 1.
        db.store
            .append_steps(&[step(&id, 0, "awakeable", "\"u32\"")])
            .await
            .unwrap();
        let to_suspend = suspension(&id);
        let topics = ["t".to_owned()];
        let suspended = if round % 2 == 0 {
            let answer = step(&id, 1, "resolution", "{\"Ok\":1}");
            let (answered, suspended) = tokio::join!(
                db.store.resolve(0, "awakeable", &answer),
                db.store.suspend_for_any(&to_suspend, &[1], &topics),
            );
            assert_eq!(answered.unwrap(), keiro_store::Resolution::Recorded);
            suspended
        } else {
            let to_send = message(&id, "t", "1");
            let (sent, suspended) = tokio::join!(
                db.store.send_message(&to_send),
                db.store.suspend_for_any(&to_suspend, &[1], &topics),
            );
            assert!(matches!(sent.unwrap(), SendOutcome::Sent(_)));
            suspended
        };
        let row = db.store.get_instance(&id).await.unwrap().unwrap();
        if suspended.unwrap() {
            assert_eq!(row.status, InstanceStatus::Suspended, "round {round}");
            assert!(row.wake_at.is_some(), "round {round}: the wake was missed");
        } else {
            assert_eq!(row.status, InstanceStatus::Running, "round {round}");
        }
    }
}
