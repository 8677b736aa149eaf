//! Inspecting and repairing durable timers, on both backends: the pending,
//! dead and stuck pages (stable under inserts, filters, refused requests) and
//! the mutations an operator makes by id (reschedule, requeue, cancel).

use std::collections::BTreeSet;
use std::time::{Duration, SystemTime};

use keiro::timers::{
    FireOutcome, TimerChange, TimerError, TimerFilter, TimerId, TimerList, TimerPageRequest,
    TimerReasonFilter, TimerRequest, TimerRow, TimerStatus, TimerWorkerOptions, MAX_PAGE_LIMIT,
};
use keiro_tests::timers::{dead, past, schedule, schedule_all, timers, PM};
use keiro_tests::{on_both_backends, Backend, TestDb};

on_both_backends!(
    pages_visit_every_timer_once_with_inserts_between,
    bad_page_requests_are_refused,
    dead_and_stuck_pages_filter,
    id_only_mutations_by_id,
);

async fn pages_visit_every_timer_once_with_inserts_between(backend: Backend) {
    let db = TestDb::new(backend).await;
    let timers = timers(&db).await;
    let base = SystemTime::now() + Duration::from_secs(3600);
    let requests: Vec<TimerRequest> = (0..45)
        .map(|i| {
            // Three timers share each fire time: ties are paged by id.
            TimerRequest::new(
                format!("t-{i:02}"),
                PM,
                "o",
                base + Duration::from_secs(i / 3),
            )
        })
        .collect();
    schedule_all(&timers, &requests).await;

    let mut seen = Vec::new();
    let mut request = TimerPageRequest::first(8);
    let mut pages = 0;
    loop {
        let page = timers.pending(&request).await.unwrap();
        assert!(page.items.len() <= 8);
        seen.extend(page.items.iter().map(|t| t.id.to_string()));
        pages += 1;
        // Between pages: one timer sorting before the cursor, one after all.
        schedule(
            &timers,
            TimerRequest::new(
                format!("early-{pages}"),
                PM,
                "o",
                base - Duration::from_secs(10),
            ),
        )
        .await;
        schedule(
            &timers,
            TimerRequest::new(
                format!("late-{pages}"),
                PM,
                "o",
                base + Duration::from_secs(100 + pages),
            ),
        )
        .await;
        match page.next_cursor {
            Some(cursor) => request = request.after(cursor),
            None => break,
        }
        assert!(pages < 100, "paging must end");
    }
    let distinct: BTreeSet<&String> = seen.iter().collect();
    assert_eq!(distinct.len(), seen.len(), "no timer twice: {seen:?}");
    let original: Vec<String> = requests.iter().map(|r| r.id.to_string()).collect();
    let seen_original: Vec<&String> = seen.iter().filter(|id| id.starts_with("t-")).collect();
    assert_eq!(seen_original.len(), 45);
    assert!(
        seen_original.iter().zip(&original).all(|(a, b)| *a == b),
        "in (fire_at, id) order"
    );
    assert!(!seen.iter().any(|id| id.starts_with("early-")));
    // Every "late" timer but the one added after the last page was picked up.
    assert_eq!(
        seen.iter().filter(|id| id.starts_with("late-")).count(),
        pages as usize - 1
    );
}

async fn bad_page_requests_are_refused(backend: Backend) {
    let db = TestDb::new(backend).await;
    let timers = timers(&db).await;
    for limit in [0, MAX_PAGE_LIMIT + 1] {
        let error = timers
            .pending(&TimerPageRequest::first(limit))
            .await
            .unwrap_err();
        assert!(
            matches!(error, TimerError::InvalidPageLimit { limit: l, max } if l == limit && max == MAX_PAGE_LIMIT),
            "{error}"
        );
    }
    assert!(timers
        .pending(&TimerPageRequest::first(MAX_PAGE_LIMIT))
        .await
        .is_ok());
    for cursor in ["", "garbage", "kt1p.12", "kt1p.x.61", "kt1p.1.6"] {
        let error = timers
            .dead(&TimerPageRequest::first(5).after(cursor))
            .await
            .unwrap_err();
        assert!(
            matches!(error, TimerError::MalformedCursor { .. }),
            "{cursor:?}: {error}"
        );
    }
    // A real cursor of one listing refused by another.
    for i in 0..3 {
        schedule(&timers, past(&format!("t-{i}"))).await;
    }
    let cursor = timers
        .pending(&TimerPageRequest::first(1))
        .await
        .unwrap()
        .next_cursor
        .expect("more than one page");
    let error = timers
        .dead(&TimerPageRequest::first(1).after(cursor.clone()))
        .await
        .unwrap_err();
    assert!(matches!(
        error,
        TimerError::WrongCursorKind {
            expected: TimerList::Dead,
            found: TimerList::Pending
        }
    ));
    let error = timers
        .stuck(Duration::ZERO, &TimerPageRequest::first(1).after(cursor))
        .await
        .unwrap_err();
    assert!(matches!(
        error,
        TimerError::WrongCursorKind {
            expected: TimerList::Stuck,
            ..
        }
    ));
}

async fn dead_and_stuck_pages_filter(backend: Backend) {
    let db = TestDb::new(backend).await;
    let timers = timers(&db).await;
    let options = TimerWorkerOptions::default().max_attempts(Some(1));
    for (id, pm) in [("a", "billing"), ("b", "shipping"), ("c", "billing")] {
        schedule(
            &timers,
            TimerRequest {
                process_manager: pm.into(),
                ..past(id)
            },
        )
        .await;
    }
    timers
        .drain(&options, 10, |timer: TimerRow| async move {
            if timer.id.as_str() == "b" {
                FireOutcome::failed_permanently("address is unknown")
            } else {
                FireOutcome::retry_later(Duration::ZERO, "busy")
            }
        })
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(5)).await;
    timers
        .drain(&options, 10, |_| async { FireOutcome::completed("never") })
        .await
        .unwrap();

    let all = timers.dead(&TimerPageRequest::first(10)).await.unwrap();
    assert_eq!(all.items.len(), 3);
    assert_eq!(all.next_cursor, None);
    let billing = timers
        .dead(&TimerPageRequest::first(10).filter(TimerFilter {
            process_manager: Some("billing".into()),
            reason: None,
        }))
        .await
        .unwrap();
    let ids: BTreeSet<String> = billing.items.iter().map(|t| t.id.to_string()).collect();
    assert_eq!(ids, BTreeSet::from(["a".to_owned(), "c".to_owned()]));
    let ceiling = timers
        .dead(&TimerPageRequest::first(10).filter(TimerFilter {
            process_manager: None,
            reason: Some(TimerReasonFilter::Contains("attempt ceiling".into())),
        }))
        .await
        .unwrap();
    assert_eq!(ceiling.items.len(), 2);
    let exact = timers
        .dead(&TimerPageRequest::first(10).filter(TimerFilter {
            process_manager: Some("shipping".into()),
            reason: Some(TimerReasonFilter::Exact("address is unknown".into())),
        }))
        .await
        .unwrap();
    assert_eq!(exact.items.len(), 1);
    assert_eq!(exact.items[0].id.as_str(), "b");
    assert_eq!(exact.items[0].attempts, 1);

    // Stuck: claimed and never finished.
    for id in ["s-1", "s-2"] {
        schedule(&timers, past(id)).await;
        timers.claim_due().await.unwrap().unwrap();
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    let stuck = timers
        .stuck(Duration::from_millis(20), &TimerPageRequest::first(1))
        .await
        .unwrap();
    assert_eq!(stuck.items.len(), 1);
    let rest = timers
        .stuck(
            Duration::from_millis(20),
            &TimerPageRequest::first(1).after(stuck.next_cursor.unwrap()),
        )
        .await
        .unwrap();
    assert_eq!(rest.items.len(), 1);
    assert_ne!(rest.items[0].id, stuck.items[0].id);
    assert_eq!(rest.next_cursor, None);
    let recent = timers
        .stuck(Duration::from_secs(3600), &TimerPageRequest::first(10))
        .await
        .unwrap();
    assert!(
        recent.items.is_empty(),
        "claims younger than the age are not stuck"
    );
}

async fn id_only_mutations_by_id(backend: Backend) {
    let db = TestDb::new(backend).await;
    let timers = timers(&db).await;
    // Reschedule a claimed timer in one call.
    schedule(&timers, past("t-1")).await;
    let claimed = timers.claim_due().await.unwrap().unwrap();
    let later = SystemTime::now() + Duration::from_secs(600);
    let TimerChange::Applied(moved) = timers
        .reschedule(&claimed.id, later, Some("moved by hand"))
        .await
        .unwrap()
    else {
        panic!("a claimed timer can be rescheduled")
    };
    assert_eq!((moved.status, moved.attempts), (TimerStatus::Scheduled, 1));
    assert_eq!(moved.last_error.as_deref(), Some("moved by hand"));
    assert_eq!(timers.count_due().await.unwrap(), 0);

    // Requeue a dead timer: a fresh attempt budget.
    dead(&timers, "t-2", "gave up").await;
    let TimerChange::Applied(requeued) = timers.requeue(&TimerId::new("t-2")).await.unwrap() else {
        panic!("a dead timer can be requeued")
    };
    assert_eq!(
        (requeued.status, requeued.attempts),
        (TimerStatus::Scheduled, 0)
    );

    assert_eq!(
        timers.mark_fired(&TimerId::new("t-2"), "ev").await.unwrap(),
        TimerChange::NotApplicable(TimerStatus::Scheduled)
    );
    assert_eq!(
        timers.cancel(&TimerId::new("missing")).await.unwrap(),
        TimerChange::NotFound
    );
    assert!(timers
        .cancel(&TimerId::new("t-2"))
        .await
        .unwrap()
        .is_applied());
    assert_eq!(
        timers.requeue(&TimerId::new("t-2")).await.unwrap(),
        TimerChange::NotApplicable(TimerStatus::Cancelled)
    );
}
