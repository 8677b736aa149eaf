//! A program that sets nothing up: it logs at `info` to stdout, runs a
//! workflow on the process-wide runtime (so keiro opens its default database,
//! or `KEIRO_DATABASE_URL`), prints `DONE <output>`, then returns the error of
//! a lookup of an unknown id from `main`, the way a user's program would.

use keiro_tests::workflows::five_steps;

#[tokio::main]
async fn main() -> Result<(), keiro::Error> {
    tracing_subscriber::fmt()
        .with_env_filter("keiro=info")
        .with_writer(std::io::stdout)
        .with_ansi(false)
        .init();
    let file = std::env::temp_dir().join(format!("keiro-default-{}", std::process::id()));
    let out = five_steps(file.display().to_string()).await?;
    println!("DONE {out}");
    let _ = std::fs::remove_file(file);
    keiro::handle::<u32>("no-such-instance").await?;
    Ok(())
}
