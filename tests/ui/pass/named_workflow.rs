use keiro::workflow;

#[workflow(name = "billing.invoice")]
async fn invoice(customer: String, cents: u64) -> String {
    format!("{customer}: {cents}")
}

pub(crate) fn main() {
    let _call: keiro::WorkflowCall<String> = invoice("acme".to_owned(), 1200);
}
