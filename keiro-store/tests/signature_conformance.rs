//! Workflow signatures and original inputs, on both backends: an instance
//! records its workflow's signature; claims take only instances whose
//! signature matches the worker's (or is unrecorded) and report the others;
//! continue-as-new keeps the generation-0 input.

#[macro_use]
mod support;

use keiro_store::{BlockReason, ContinueAsNew, InstanceStatus, Lease, NewInstance, Registered};
use support::TestDb;

conformance!(
    signature_is_stored_and_returned,
    claim_due_takes_only_matching_or_unrecorded_signatures,
    find_blocked_reports_mismatched_signatures_and_unknown_names,
    continue_as_new_keeps_the_first_input,
);

const MINE: &str = "(u32,)->String";
const THEIRS: &str = "(String,)->String";

fn lease(owner: &str) -> Lease<'_> {
    Lease {
        owner,
        ttl_us: 60_000_000,
    }
}

fn greeting<'a>(id: &'a str, signature: Option<&'a str>) -> NewInstance<'a> {
    NewInstance {
        signature,
        ..NewInstance::new(id, "greeting", "[7]")
    }
}

/// What a worker registering `greeting` with [`MINE`] (and `other`) runs.
fn registered() -> [Registered<'static>; 2] {
    [
        Registered {
            name: "greeting",
            signature: MINE,
        },
        Registered {
            name: "other",
            signature: "()->()",
        },
    ]
}

async fn signature_is_stored_and_returned(db: &TestDb) {
    let (row, created) = db
        .store
        .create_instance(&greeting("signed", Some(MINE)))
        .await
        .unwrap();
    assert!(created);
    assert_eq!(row.signature.as_deref(), Some(MINE));
    let read = db.store.get_instance("signed").await.unwrap().unwrap();
    assert_eq!(read.signature.as_deref(), Some(MINE));
    assert_eq!(read.first_input, None);
    assert_eq!(read.original_input(), "[7]");

    // Attaching returns the stored signature, not the caller's.
    let (again, created) = db
        .store
        .create_instance(&greeting("signed", Some(THEIRS)))
        .await
        .unwrap();
    assert!(!created);
    assert_eq!(again.signature.as_deref(), Some(MINE));

    let (unsigned, _) = db
        .store
        .create_instance(&greeting("unsigned", None))
        .await
        .unwrap();
    assert_eq!(unsigned.signature, None);
}

async fn claim_due_takes_only_matching_or_unrecorded_signatures(db: &TestDb) {
    for (id, signature) in [
        ("same", Some(MINE)),
        ("other-types", Some(THEIRS)),
        ("from-before", None),
    ] {
        db.store
            .create_instance(&greeting(id, signature))
            .await
            .unwrap();
    }
    let claimed = db
        .store
        .claim_due(lease("w1"), &registered(), &[], 10)
        .await
        .unwrap();
    let mut ids: Vec<_> = claimed.iter().map(|r| r.id.as_str()).collect();
    ids.sort_unstable();
    assert_eq!(ids, ["from-before", "same"]);
    let left = db.store.get_instance("other-types").await.unwrap().unwrap();
    assert_eq!(
        (left.status, left.lease_owner, left.attempts),
        (InstanceStatus::Pending, None, 0)
    );
    // A worker registering the other types takes it.
    let theirs = [Registered {
        name: "greeting",
        signature: THEIRS,
    }];
    let claimed = db
        .store
        .claim_due(lease("w2"), &theirs, &[], 10)
        .await
        .unwrap();
    assert_eq!(claimed.len(), 1);
    assert_eq!(claimed[0].id, "other-types");
}

async fn find_blocked_reports_mismatched_signatures_and_unknown_names(db: &TestDb) {
    db.store
        .create_instance(&greeting("other-types", Some(THEIRS)))
        .await
        .unwrap();
    db.store
        .create_instance(&greeting("same", Some(MINE)))
        .await
        .unwrap();
    db.store
        .create_instance(&greeting("from-before", None))
        .await
        .unwrap();
    db.store
        .create_instance(&NewInstance {
            name: "retired",
            ..greeting("ghost", Some(MINE))
        })
        .await
        .unwrap();
    db.store
        .create_instance(&NewInstance {
            lease: Some(lease("elsewhere")),
            deadline: None,
            ..greeting("leased", Some(MINE))
        })
        .await
        .unwrap();
    // Make the leased one due while its lease is live.
    db.store.reclaim_own("elsewhere").await.unwrap();

    let mut blocked = db
        .store
        .find_blocked("w1", &registered(), &[], 10)
        .await
        .unwrap();
    blocked.sort_by(|a, b| a.id.cmp(&b.id));
    let reasons: Vec<_> = blocked
        .iter()
        .map(|b| (b.id.as_str(), b.name.as_str(), b.reason.clone()))
        .collect();
    assert_eq!(
        reasons,
        [
            ("ghost", "retired", BlockReason::UnknownName),
            ("leased", "greeting", BlockReason::Leased),
            (
                "other-types",
                "greeting",
                BlockReason::SignatureMismatch {
                    stored: THEIRS.to_owned(),
                    registered: MINE.to_owned(),
                }
            ),
        ]
    );
}

async fn continue_as_new_keeps_the_first_input(db: &TestDb) {
    db.store
        .create_instance(&NewInstance {
            lease: Some(lease("w1")),
            deadline: None,
            ..greeting("counter", Some(MINE))
        })
        .await
        .unwrap();
    assert!(db
        .store
        .continue_as_new(&ContinueAsNew {
            id: "counter",
            generation: 0,
            owner: "w1",
            input: "[8]",
            app_version: None,
        })
        .await
        .unwrap());
    db.store
        .claim("counter", lease("w1"))
        .await
        .unwrap()
        .unwrap();
    assert!(db
        .store
        .continue_as_new(&ContinueAsNew {
            id: "counter",
            generation: 1,
            owner: "w1",
            input: "[9]",
            app_version: None,
        })
        .await
        .unwrap());
    let row = db.store.get_instance("counter").await.unwrap().unwrap();
    assert_eq!(row.generation, 2);
    assert_eq!(row.input, "[9]");
    assert_eq!(row.first_input.as_deref(), Some("[7]"));
    assert_eq!(row.original_input(), "[7]");
    assert_eq!(row.signature.as_deref(), Some(MINE));
}
