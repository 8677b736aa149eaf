//! TLS to PostgreSQL with libpq's `sslmode` and `sslrootcert` URL
//! parameters, against a throwaway cluster serving a certificate signed by a
//! CA the test creates: `verify-full` connects with the right CA and is
//! refused with a clear error with a wrong one or a certificate for another
//! host name (which `verify-ca` accepts); `require` encrypts without
//! verifying.

use keiro::Keiro;
use keiro_tests::pg_cluster::cluster_or_skip;
use keiro_tests::tls::TestCa;
use keiro_tests::workflows::three_marks;

/// A runtime on `url`, or the error's text.
async fn connect(url: &str) -> Result<Keiro, String> {
    Keiro::builder(url)
        .executor_id(format!("tls-{}", uuid::Uuid::new_v4().simple()))
        .connect()
        .await
        .map_err(|e| e.to_string())
}

/// Whether the runtime's own pooled connection is encrypted.
async fn encrypted(keiro: &Keiro) -> bool {
    let pool = keiro.store().postgres_pool().expect("a PostgreSQL store");
    sqlx::query_scalar("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
        .fetch_one(pool)
        .await
        .expect("read pg_stat_ssl")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sslmodes_verify_the_server_as_libpq_does() {
    let Some(cluster) = cluster_or_skip("sslmodes_verify_the_server_as_libpq_does") else {
        return;
    };
    let port = cluster.port();
    let url = |host: &str, params: &str| {
        format!("postgres://postgres@{host}:{port}/keiro_fault?{params}")
    };
    let ca = TestCa::new("keiro-test-ca", &["localhost", "127.0.0.1"]);
    cluster.enable_tls(&ca.server_cert(), &ca.server_key());
    let root = ca.root().display().to_string();

    // The right CA: connected, encrypted, and a workflow runs.
    let keiro = connect(&url(
        "localhost",
        &format!("sslmode=verify-full&sslrootcert={root}"),
    ))
    .await
    .expect("verify-full with the server's CA");
    assert!(
        encrypted(&keiro).await,
        "verify-full left the connection plain"
    );
    let file = ca.dir().join("marks.log").display().to_string();
    let out = three_marks(file, 4)
        .id("over-tls")
        .on(&keiro)
        .await
        .unwrap();
    assert_eq!(out, 43);
    keiro.shutdown().await.unwrap();

    // Another CA: refused, naming the store and the certificate problem.
    let stranger = TestCa::new("some-other-ca", &["localhost"]);
    let wrong = stranger.root().display().to_string();
    let error = connect(&url(
        "localhost",
        &format!("sslmode=verify-full&sslrootcert={wrong}"),
    ))
    .await
    .expect_err("verify-full trusted a server its CA did not sign");
    assert!(
        error.contains("cannot connect to the keiro store"),
        "{error}"
    );
    assert!(error.to_lowercase().contains("certificate"), "{error}");
    assert!(
        error.contains(&format!("localhost:{port}")),
        "the error names the server: {error}"
    );

    // `require` encrypts without verifying anything.
    let keiro = connect(&url("localhost", "sslmode=require"))
        .await
        .expect("sslmode=require");
    assert!(encrypted(&keiro).await, "require left the connection plain");
    keiro.shutdown().await.unwrap();

    // A certificate for another host name: the CA checks out (verify-ca
    // connects), the name does not (verify-full refuses).
    let elsewhere = TestCa::new("keiro-test-ca-2", &["db.elsewhere.example"]);
    cluster.enable_tls(&elsewhere.server_cert(), &elsewhere.server_key());
    let root = elsewhere.root().display().to_string();
    let keiro = connect(&url(
        "localhost",
        &format!("sslmode=verify-ca&sslrootcert={root}"),
    ))
    .await
    .expect("verify-ca checks the CA only");
    assert!(encrypted(&keiro).await);
    keiro.shutdown().await.unwrap();
    let error = connect(&url(
        "localhost",
        &format!("sslmode=verify-full&sslrootcert={root}"),
    ))
    .await
    .expect_err("verify-full accepted a certificate for another host");
    assert!(
        error.contains("cannot connect to the keiro store"),
        "{error}"
    );
}
