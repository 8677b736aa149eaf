use keiro::workflow;

#[workflow]
async fn nightly_cleanup() {}

#[workflow]
async fn explicit_unit() -> () {}

pub(crate) fn main() {
    let _call: keiro::WorkflowCall<()> = nightly_cleanup();
    let _call: keiro::WorkflowCall<()> = explicit_unit();
}
