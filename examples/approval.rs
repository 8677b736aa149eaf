//! An approval flow across two commands: the first starts an expense workflow
//! that asks for approval and suspends; the second answers the awakeable and
//! finishes the workflow.
//!
//! ```text
//! cargo run -p keiro-examples --example approval -- request 120
//! cargo run -p keiro-examples --example approval -- approve <awakeable-id> yes
//! ```

use std::time::Duration;

use keiro::{step, workflow, Keiro, ResumeOptions, WorkflowStatus};

#[step]
async fn ask_approver(amount: u32, awakeable_id: String) -> String {
    println!("  asked the approver about {amount} EUR; answer with:");
    println!("    cargo run -p keiro-examples --example approval -- approve {awakeable_id} yes");
    "asked".to_owned()
}

#[step]
async fn pay_out(amount: u32) -> String {
    println!("  paying out {amount} EUR");
    format!("paid {amount} EUR")
}

#[workflow]
async fn expense(amount: u32) -> String {
    let approval = keiro::awakeable::<bool>().await;
    ask_approver(amount, approval.id().to_owned()).await;
    match approval.await {
        Ok(true) => pay_out(amount).await,
        Ok(false) => "declined".to_owned(),
        Err(e) => format!("no answer: {e}"),
    }
}

#[tokio::main]
async fn main() -> Result<(), keiro::Error> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let keiro = Keiro::builder(
        std::env::var(keiro::DATABASE_URL_ENV).unwrap_or_else(|_| "sqlite:keiro.db".into()),
    )
    // Wait in memory only briefly, then suspend: the state lives in the database.
    .suspend_after(Duration::from_millis(200))
    .connect()
    .await?;
    match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["request", amount] => {
            let amount: u32 = amount.parse().expect("an amount in EUR");
            let id = format!("expense-{}", keiro::Uuid::new_v4().simple());
            println!("{id}: requesting approval");
            let handle = expense(amount).id(&id).on(&keiro).start().await?;
            while handle.status().await? != WorkflowStatus::Suspended {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            println!("{id} is suspended, waiting for the answer; this process can exit");
        }
        ["approve", awakeable_id, answer] => {
            keiro
                .resolve_awakeable(awakeable_id, *answer == "yes")
                .await?;
            println!("answered {awakeable_id}: {answer}");
            // The awakeable id is `<workflow id>/<generation>/<step>/<secret>`.
            let workflow_id = awakeable_id.rsplitn(4, '/').nth(3).unwrap_or_default();
            let worker = keiro.resume_worker(ResumeOptions::default()).await?;
            let result: String = keiro.handle(workflow_id).await?.result().await?;
            worker.shutdown().await;
            println!("{workflow_id} finished: {result}");
        }
        _ => {
            eprintln!("usage: approval request <amount> | approval approve <awakeable-id> yes|no");
            std::process::exit(2);
        }
    }
    Ok(())
}
