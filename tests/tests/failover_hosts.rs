//! Several hosts in one URL, on two throwaway clusters whose writability the
//! test switches (`default_transaction_read_only`, the way a demoted primary
//! refuses writes): keiro connects to the writable one, follows a switch
//! without restarting the application, and refuses clearly when no host
//! takes writes. (Each cluster holds its own data here: the replicated case
//! is the pg_auto_failover formation's.)

use std::time::{Duration, Instant};

use keiro::Keiro;
use keiro_tests::pg_cluster::{cluster_or_skip, PgCluster};
use keiro_tests::workflows::three_marks;
use sqlx::{Connection, Executor, PgConnection, Row};

/// Runs `sql` on `cluster`'s `keiro_fault` database.
async fn on(cluster: &PgCluster, sql: &str) -> Vec<sqlx::postgres::PgRow> {
    let mut conn = PgConnection::connect(&cluster.keiro_url()).await.unwrap();
    let rows = conn
        .fetch_all(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    conn.close().await.unwrap();
    rows
}

/// Makes `cluster` refuse (`true`) or take writes, and ends every other
/// session on it, as a demotion or promotion restarts the server.
async fn set_read_only(cluster: &PgCluster, read_only: bool) {
    let value = if read_only { "on" } else { "off" };
    on(
        cluster,
        &format!("ALTER SYSTEM SET default_transaction_read_only = {value}"),
    )
    .await;
    on(cluster, "SELECT pg_reload_conf()").await;
    on(
        cluster,
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE pid <> pg_backend_pid() AND backend_type = 'client backend'",
    )
    .await;
}

/// How many instances with id `id` `cluster` holds.
async fn instances(cluster: &PgCluster, id: &str) -> i64 {
    let rows = on(
        cluster,
        &format!("SELECT count(*) FROM keiro.workflows WHERE id = '{id}'"),
    )
    .await;
    rows[0].get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_hosts_connect_to_the_writable_one_and_follow_it() {
    let test = "several_hosts_connect_to_the_writable_one_and_follow_it";
    let (Some(a), Some(b)) = (cluster_or_skip(test), cluster_or_skip(test)) else {
        return;
    };
    // Both carry keiro's schema, as a replicated standby would.
    for cluster in [&a, &b] {
        let keiro = Keiro::builder(cluster.keiro_url()).connect().await.unwrap();
        keiro.shutdown().await.unwrap();
    }
    let url = format!(
        "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/keiro_fault?target_session_attrs=read-write",
        a.port(),
        b.port()
    );
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("marks.log").display().to_string();

    // A refuses writes: keiro takes B although A comes first.
    set_read_only(&a, true).await;
    let keiro = Keiro::builder(&url)
        .executor_id(format!("hosts-{}", uuid::Uuid::new_v4().simple()))
        .connect()
        .await
        .expect("connect to the writable host");
    assert_eq!(
        three_marks(file.clone(), 1)
            .id("on-b")
            .on(&keiro)
            .await
            .unwrap(),
        13
    );
    assert_eq!(instances(&b, "on-b").await, 1);

    // The roles swap; the same runtime moves to A.
    set_read_only(&a, false).await;
    set_read_only(&b, true).await;
    let swapped = Instant::now();
    let mut attempt = 0;
    loop {
        attempt += 1;
        let id = format!("after-switch-{attempt}");
        match three_marks(file.clone(), 2).id(&id).on(&keiro).await {
            Ok(out) => {
                assert_eq!(out, 23);
                assert_eq!(
                    instances(&a, &id).await,
                    1,
                    "the run after the switch is on A"
                );
                break;
            }
            Err(error) => {
                eprintln!(
                    "attempt {attempt} at {} ms: {error}",
                    swapped.elapsed().as_millis()
                );
                // A new connection that finds its host read-only is
                // replaced by one to the writable host at once (it took 10 s,
                // sqlx's acquire timeout, when the pool refused it instead).
                assert!(
                    swapped.elapsed() < Duration::from_secs(8),
                    "still failing 8 s after the switch: {error}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    eprintln!(
        "first workflow on the new writable host {} ms after the switch ({attempt} attempts)",
        swapped.elapsed().as_millis()
    );
    keiro.shutdown().await.unwrap();

    // Neither takes writes: refused, naming both hosts.
    set_read_only(&a, true).await;
    let error = Keiro::builder(&url)
        .connect()
        .await
        .unwrap_err()
        .to_string();
    assert!(error.contains("no host accepts writes"), "{error}");
    for cluster in [&a, &b] {
        assert!(
            error.contains(&format!("127.0.0.1:{} is read-only", cluster.port())),
            "{error}"
        );
    }
}
