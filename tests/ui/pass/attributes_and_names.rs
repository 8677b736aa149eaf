#![deny(warnings)]

use keiro::{step, workflow};

mod shop {
    use keiro::{step, workflow};

    /// A step visible to the parent module.
    #[step]
    pub(crate) async fn double(mut n: u64) -> u64 {
        n *= 2;
        n
    }

    /// A workflow in a nested module, called from outside it.
    #[workflow]
    #[allow(clippy::too_many_arguments)]
    pub async fn quadruple(n: u64) -> u64 {
        double(double(n).await).await
    }
}

#[step]
async fn r#type(#[allow(unused_mut)] mut kind: String) -> String {
    kind
}

#[workflow]
async fn r#match(pair: (u32, String), items: Vec<Option<u64>>) -> Option<u64> {
    let _ = (pair, r#type("x".to_owned()).await);
    items.into_iter().flatten().next()
}

#[cfg(any())]
#[workflow]
async fn compiled_out(not_even_a_type: DoesNotExist) {}

#[tokio::main]
pub(crate) async fn main() {
    assert_eq!(shop::double(4).await, 8);
    let _call: keiro::WorkflowCall<u64> = shop::quadruple(1);
    let _call: keiro::WorkflowCall<Option<u64>> = r#match((1, "a".to_owned()), vec![None, Some(3)]);
}
