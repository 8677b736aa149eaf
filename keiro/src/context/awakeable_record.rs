//! What an awakeable's creation step journals (the awaited type and the id's
//! secret), how an answer's type is checked against it, and the decoders of
//! awaited types this process knows, which check an answer's value before it
//! is accepted.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use keiro_store::Outcome;
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::awakeable_id::new_secret;
use crate::runtime::lock;

/// The creation step's journaled result, as read back.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Created {
    /// Written by this version: the awaited type's full path
    /// (`std::any::type_name`) and the id's secret.
    Current {
        /// The awaited type's full name.
        type_name: String,
        /// The unguessable part of the id.
        secret: String,
    },
    /// Written before full type names and secrets: the type name without
    /// module paths, as a JSON string. Its ids carry no secret.
    Legacy {
        /// The awaited type's short name.
        short: String,
    },
}

impl Created {
    /// A new awakeable awaiting `T`, with a fresh secret, as journaled.
    pub(crate) fn new_value<T>() -> Value {
        serde_json::json!({
            "type": std::any::type_name::<T>(),
            "secret": new_secret(),
        })
    }

    /// Reads a journaled creation result; `None` when it is neither form.
    pub(crate) fn from_value(value: &Value) -> Option<Created> {
        match value {
            Value::String(short) => Some(Created::Legacy {
                short: short.clone(),
            }),
            Value::Object(fields) => Some(Created::Current {
                type_name: fields.get("type")?.as_str()?.to_owned(),
                secret: fields.get("secret")?.as_str()?.to_owned(),
            }),
            _ => None,
        }
    }

    /// Reads the creation step's journaled JSON text.
    pub(crate) fn from_text(text: &str) -> Option<Created> {
        Created::from_value(&serde_json::from_str(text).ok()?)
    }

    /// The secret ids of this awakeable carry.
    pub(crate) fn secret(&self) -> Option<&str> {
        match self {
            Created::Current { secret, .. } => Some(secret),
            Created::Legacy { .. } => None,
        }
    }

    /// The awaited type as recorded.
    pub(crate) fn type_name(&self) -> &str {
        match self {
            Created::Current { type_name, .. } => type_name,
            Created::Legacy { short } => short,
        }
    }

    /// Whether an answer of type `found` (a full `type_name`) is of the
    /// awaited type: the same full path (a reference answers for its
    /// referent, as both serialize alike). An awakeable of the earlier form
    /// recorded only the short name, so there the short names are compared.
    pub(crate) fn accepts_type(&self, found: &str) -> bool {
        let found = found.trim_start_matches('&');
        match self {
            Created::Current { type_name, .. } => type_name == found,
            Created::Legacy { short } => *short == short_type_name(found),
        }
    }
}

/// Checks that an encoded answer decodes into the awaited type.
type Check = fn(&str) -> Result<(), String>;

/// The awaited types this process has created awakeables of, by full name.
fn decoders() -> &'static Mutex<HashMap<&'static str, Check>> {
    static DECODERS: OnceLock<Mutex<HashMap<&'static str, Check>>> = OnceLock::new();
    DECODERS.get_or_init(Default::default)
}

/// Remembers how to decode `T`, so an answer to an awakeable awaiting `T`
/// given in this process is checked before it is accepted.
pub(crate) fn know_decoder<T: DeserializeOwned>() {
    fn check<T: DeserializeOwned>(encoded: &str) -> Result<(), String> {
        Outcome::decode_as::<T, String>(encoded)
            .map(drop)
            .map_err(|e| e.to_string())
    }
    lock(decoders()).insert(std::any::type_name::<T>(), check::<T>);
}

/// Whether the encoded `answer` decodes into the type named `type_name`,
/// when this process knows that type's decoder (it created an awakeable of
/// it); `Ok` when it does not, as nothing more can be checked here.
pub(crate) fn check_decodes(type_name: &str, answer: &str) -> Result<(), String> {
    let check = lock(decoders()).get(type_name).copied();
    check.map_or(Ok(()), |check| check(answer))
}

/// `a::b::Thing<c::D>` → `Thing<D>`: how awakeables of the earlier form
/// recorded their type.
fn short_type_name(full: &str) -> String {
    let mut out = String::new();
    let mut segment = String::new();
    for c in full.chars() {
        if c.is_alphanumeric() || c == '_' || c == ':' {
            segment.push(c);
        } else {
            out.push_str(segment.rsplit("::").next().unwrap_or(""));
            segment.clear();
            out.push(c);
        }
    }
    out.push_str(segment.rsplit("::").next().unwrap_or(""));
    out
}

#[cfg(test)]
mod tests {
    use super::{short_type_name, Created};

    #[test]
    fn type_names_drop_their_paths() {
        assert_eq!(short_type_name("alloc::string::String"), "String");
        assert_eq!(short_type_name("bool"), "bool");
        assert_eq!(
            short_type_name("alloc::vec::Vec<my_app::orders::Approval>"),
            "Vec<Approval>"
        );
        assert_eq!(
            short_type_name("(u32, core::option::Option<i8>)"),
            "(u32, Option<i8>)"
        );
    }

    #[test]
    fn full_paths_tell_same_named_types_apart() {
        let created = Created::from_value(&serde_json::json!({
            "type": "my_app::a::Approval", "secret": "s"
        }))
        .unwrap();
        assert!(created.accepts_type("my_app::a::Approval"));
        assert!(created.accepts_type("&my_app::a::Approval"));
        assert!(!created.accepts_type("my_app::b::Approval"));
        assert_eq!(created.secret(), Some("s"));
    }

    #[test]
    fn rows_of_the_earlier_form_compare_short_names() {
        let created = Created::from_text(r#""Vec<Approval>""#).unwrap();
        assert_eq!(created.secret(), None);
        assert!(created.accepts_type("alloc::vec::Vec<my_app::a::Approval>"));
        assert!(!created.accepts_type("alloc::vec::Vec<bool>"));
        assert_eq!(Created::from_text("17"), None);
    }
}
