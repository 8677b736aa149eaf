use keiro::{step, workflow};

pub struct Billing;

impl Billing {
    /// A step as an associated function (no `self`).
    #[step]
    async fn rate(plan: String) -> u64 {
        if plan == "pro" {
            20
        } else {
            5
        }
    }

    /// A workflow as an associated function, registered under its own name.
    #[workflow(name = "billing.invoice")]
    pub async fn invoice(plan: String, months: u64) -> u64 {
        Billing::rate(plan).await * months
    }
}

#[tokio::main]
pub(crate) async fn main() {
    assert_eq!(Billing::rate("pro".to_owned()).await, 20);
    let _call: keiro::WorkflowCall<u64> = Billing::invoice("pro".to_owned(), 3);
}
