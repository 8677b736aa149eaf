//! Checks on the ids, names and keys callers hand the store, so a value a
//! database would refuse (or index badly) is reported as what it is before it
//! reaches a statement or a shared group-commit transaction.

use crate::StoreError;

/// The longest id, name, key or topic keiro stores, in bytes (UTF-8).
///
/// Ids are primary keys and parts of composite indexes; PostgreSQL refuses an
/// index row over about 2,700 bytes (a third of a page), so two such columns
/// in one index still fit with room to spare. A child's default id
/// (`<parent id>/<seq>`) must fit too, so leave room under the limit for the
/// ids of nested children.
pub const MAX_ID_BYTES: usize = 1024;

/// How many characters of a refused value an error shows.
const PREVIEW_CHARS: usize = 48;

/// Refuses `value` as `what` (e.g. `"workflow id"`, `"timer key"`) when it is
/// empty, holds a NUL byte (PostgreSQL text cannot) or is longer than
/// [`MAX_ID_BYTES`], with [`StoreError::InvalidId`].
pub fn validate_id(what: &'static str, value: &str) -> Result<(), StoreError> {
    validate_id_within(what, value, MAX_ID_BYTES)
}

/// [`validate_id`] with another length limit, for a value built from an id
/// (an awakeable id holds its workflow's id and more).
pub fn validate_id_within(what: &'static str, value: &str, max: usize) -> Result<(), StoreError> {
    let reason = if value.is_empty() {
        "it is empty; give a non-empty one".to_owned()
    } else if let Some(at) = value.bytes().position(|b| b == 0) {
        format!("it holds a NUL byte at byte {at}, which the database cannot store; remove it")
    } else if value.len() > max {
        format!(
            "it is {} bytes long, over the limit of {max} bytes; use a shorter one (for \
             example a hash of it)",
            value.len()
        )
    } else {
        return Ok(());
    };
    Err(StoreError::InvalidId {
        what,
        value_preview: preview(value),
        reason,
    })
}

/// `value` as an error may show it: its first characters, escaped (a NUL is
/// `\0`), followed by its length when it was cut.
pub fn preview(value: &str) -> String {
    let mut shown: String = value
        .chars()
        .take(PREVIEW_CHARS)
        .flat_map(char::escape_debug)
        .collect();
    if value.chars().nth(PREVIEW_CHARS).is_some() {
        shown.push_str(&format!("… ({} bytes)", value.len()));
    }
    shown
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reason(value: &str) -> String {
        match validate_id("workflow id", value) {
            Err(StoreError::InvalidId { reason, .. }) => reason,
            other => panic!("expected InvalidId, got {other:?}"),
        }
    }

    #[test]
    fn ordinary_ids_pass() {
        for id in ["order-42", "a/b/0", "ü", &"x".repeat(MAX_ID_BYTES)] {
            validate_id("workflow id", id).unwrap();
        }
    }

    #[test]
    fn empty_nul_and_oversize_are_refused_naming_why() {
        assert!(reason("").contains("empty"));
        assert!(reason("ab\0c").contains("NUL byte at byte 2"));
        let long = "y".repeat(MAX_ID_BYTES + 1);
        assert!(reason(&long).contains("1025 bytes"), "{}", reason(&long));
    }

    #[test]
    fn a_preview_is_short_and_escaped() {
        let error = validate_id("timer key", &format!("k\0{}", "z".repeat(1 << 20))).unwrap_err();
        let text = error.to_string();
        assert!(text.len() < 300, "{text}");
        assert!(
            text.contains("timer key") && text.contains("k\\0zz"),
            "{text}"
        );
        assert!(text.contains("1048578 bytes"), "{text}");
    }
}
