//! Stable hashes of a workflow's code, computed at expansion time and
//! emitted as string literals: the body hash (every token of the body, the
//! default application version's input) and, in `skeleton`, the step-call
//! skeleton hash.
//!
//! FNV-1a over the tokens' text: the same source gives the same hash in
//! every build, on every machine and compiler version that prints tokens
//! the same way (spans and whitespace play no part).

use proc_macro2::TokenStream;

/// The 64-bit FNV-1a hash of `bytes`, as 16 lowercase hex digits.
pub(crate) fn fnv1a_hex(bytes: &[u8]) -> String {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let hash = bytes
        .iter()
        .fold(OFFSET, |hash, &b| (hash ^ u64::from(b)).wrapping_mul(PRIME));
    format!("{hash:016x}")
}

/// The hash of `body`'s token text.
pub(crate) fn body_hash(body: &TokenStream) -> String {
    fnv1a_hex(body.to_string().as_bytes())
}

#[cfg(test)]
mod tests {
    use quote::quote;

    use super::*;

    #[test]
    fn fnv1a_matches_the_reference_values() {
        assert_eq!(fnv1a_hex(b""), "cbf29ce484222325");
        assert_eq!(fnv1a_hex(b"a"), "af63dc4c8601ec8c");
    }

    #[test]
    fn the_body_hash_ignores_layout_and_sees_every_token() {
        let a = body_hash(&quote! { { let x = step_a().await; x + 1 } });
        let b = body_hash(&quote! { {let x=step_a().await;
        x+1} });
        let c = body_hash(&quote! { { let x = step_a().await; x + 2 } });
        assert_eq!(a, b);
        assert_ne!(a, c);
    }
}
