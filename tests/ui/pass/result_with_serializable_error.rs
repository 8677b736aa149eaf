use keiro::{step, workflow};
use serde::{Deserialize, Serialize};

#[derive(Debug, Serialize, Deserialize, thiserror::Error)]
pub enum PaymentError {
    #[error("card declined")]
    Declined,
    #[error("limit exceeded by {0} cents")]
    Limit(u64),
}

#[step(max_attempts = 3, backoff_ms = 10)]
async fn charge(cents: u64) -> Result<u64, PaymentError> {
    match cents {
        0 => Err(PaymentError::Declined),
        c if c > 10_000 => Err(PaymentError::Limit(c - 10_000)),
        c => Ok(c),
    }
}

#[workflow]
pub async fn pay(cents: u64) -> Result<u64, PaymentError> {
    let charged = charge(cents).await?;
    Ok(charged)
}

pub(crate) fn main() {
    let _call: keiro::WorkflowCall<Result<u64, PaymentError>> = pay(500);
}
