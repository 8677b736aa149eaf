//! The result envelope journaled for anything that ends in success or failure
//! (a child workflow, an awakeable's answer): `{"Ok":…}` or `{"Err":…}`.

use serde::de::DeserializeOwned;
use serde_json::Value;

/// A journaled success or failure, stored as `{"Ok":<value>}` or
/// `{"Err":<value>}` (compact JSON, the value as given).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Success, with its JSON value.
    Ok(Value),
    /// Failure, with its JSON value (a reason, or an object describing it).
    Err(Value),
}

impl Outcome {
    /// The stored text: `{"Ok":…}` or `{"Err":…}`.
    pub fn encode(&self) -> String {
        let (tag, value) = match self {
            Outcome::Ok(value) => ("Ok", value),
            Outcome::Err(value) => ("Err", value),
        };
        format!("{{\"{tag}\":{value}}}")
    }

    /// Reads stored text back; `None` when it is not JSON or not an object
    /// with exactly one key, `Ok` or `Err`.
    pub fn decode(text: &str) -> Option<Outcome> {
        let Value::Object(map) = serde_json::from_str(text).ok()? else {
            return None;
        };
        let mut entries = map.into_iter();
        let (tag, value) = entries.next()?;
        if entries.next().is_some() {
            return None;
        }
        match tag.as_str() {
            "Ok" => Some(Outcome::Ok(value)),
            "Err" => Some(Outcome::Err(value)),
            _ => None,
        }
    }

    /// Reads stored text straight into typed values: the success as `T`, the
    /// failure as `E` (`Err` when it is not an envelope or a value does not
    /// fit its type). Decoding from the text rather than through
    /// [`Outcome::decode`]'s `Value` keeps what a `Value` would lose: the order
    /// of a map's keys and integers beyond 64 bits.
    pub fn decode_as<T: DeserializeOwned, E: DeserializeOwned>(
        text: &str,
    ) -> serde_json::Result<Result<T, E>> {
        // serde writes and reads `Result` as exactly this envelope.
        serde_json::from_str(text)
    }

    /// The outcome as a `Result`.
    pub fn into_result(self) -> Result<Value, Value> {
        match self {
            Outcome::Ok(value) => Ok(value),
            Outcome::Err(value) => Err(value),
        }
    }
}

impl From<Result<Value, Value>> for Outcome {
    fn from(result: Result<Value, Value>) -> Outcome {
        match result {
            Ok(value) => Outcome::Ok(value),
            Err(value) => Outcome::Err(value),
        }
    }
}

/// The SQL expression building a finished child's [`Outcome`] from its
/// `keiro_workflows` row: `{"Ok":<output>}` when it returned (completed, or
/// failed with an error value it returned), else `{"Err":{"status":…,
/// "message":…}}` (plus `"deadline"`, in µs, for a timed-out child).
/// `json_object` is the backend's JSON object constructor
/// (`json_object` on SQLite, `json_build_object` on PostgreSQL) and `as_text`
/// what turns its result into text (empty, or `::text`).
pub(crate) fn child_outcome_sql(json_object: &str, as_text: &str) -> String {
    format!(
        "CASE WHEN output IS NOT NULL AND status IN ('completed', 'failed') \
             THEN '{{\"Ok\":' || output || '}}' \
             WHEN status = 'timed_out' \
             THEN {json_object}('Err', {json_object}('status', status, \
                 'message', COALESCE(error, ''), 'deadline', deadline)){as_text} \
             ELSE {json_object}('Err', {json_object}('status', status, \
                 'message', COALESCE(error, ''))){as_text} END"
    )
}

#[cfg(test)]
mod tests {
    use super::Outcome;
    use serde_json::json;

    #[test]
    fn encodes_like_the_stored_envelope() {
        assert_eq!(
            Outcome::Ok(json!({"a": [1, 2]})).encode(),
            r#"{"Ok":{"a":[1,2]}}"#
        );
        assert_eq!(Outcome::Err(json!("no")).encode(), r#"{"Err":"no"}"#);
        assert_eq!(
            Outcome::Ok(json!(1)).encode(),
            json!({ "Ok": 1 }).to_string(),
            "the same text serde_json writes for the envelope"
        );
    }

    #[test]
    fn decodes_what_it_encodes_and_nothing_else() {
        for outcome in [
            Outcome::Ok(json!(null)),
            Outcome::Err(json!({"status": "failed"})),
        ] {
            assert_eq!(Outcome::decode(&outcome.encode()), Some(outcome));
        }
        for text in ["", "1", r#"{"Maybe":1}"#, r#"{"Ok":1,"Err":2}"#, "{}"] {
            assert_eq!(Outcome::decode(text), None, "{text}");
        }
    }

    #[test]
    fn decodes_typed_values_from_the_text() {
        let big = u128::from(u64::MAX) + 1;
        let text = Outcome::Ok(json!(1))
            .encode()
            .replace('1', &big.to_string());
        assert_eq!(Outcome::decode_as::<u128, String>(&text).unwrap(), Ok(big));
        let text = Outcome::Err(json!("no")).encode();
        assert_eq!(
            Outcome::decode_as::<u128, String>(&text).unwrap(),
            Err("no".to_owned())
        );
        for text in [r#"{"Maybe":1}"#, r#"{"Ok":"not a number"}"#, "{}"] {
            assert!(Outcome::decode_as::<u128, String>(text).is_err(), "{text}");
        }
    }
}
