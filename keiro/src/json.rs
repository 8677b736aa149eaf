//! Encoding values for the journal so that they read back.
//!
//! serde_json writes a NaN or infinite float as `null`, which then fails to
//! decode into the float it was, and writes nesting of any depth, while its
//! decoder stops at 128 levels. Either would be journaled fine and fail only
//! on replay. [`to_json`] refuses both while it encodes: a thin wrapper around
//! serde_json's serializer looks at each float and counts the nesting, with no
//! second pass and no second copy of the value. Only when it refuses does it
//! work out where, from the JSON written so far.

use std::cell::Cell;
use std::fmt::Display;

use serde::ser::{self, Serialize, Serializer};

use crate::{Error, Result};

/// The deepest nesting of arrays and objects keiro journals. serde_json reads
/// back at most 127 levels; the margin leaves room for the envelopes a value
/// is stored in (a child's `{"Ok":…}`, a `Result`).
pub(crate) const MAX_DEPTH: usize = 120;

/// Encodes `value` as compact JSON, as `serde_json::to_string` would, but
/// refuses a value that would not read back: a non-finite float anywhere in
/// it, or nesting deeper than [`MAX_DEPTH`], with [`Error::NotJournalable`]
/// whose sentence starts with `what()` (whose value, e.g. ``step `charge`
/// (#2) of workflow `checkout` id `order-42` returned``).
pub(crate) fn to_json<T: Serialize + ?Sized>(
    value: &T,
    what: impl FnOnce() -> String,
) -> Result<String> {
    let mut out = Vec::with_capacity(64);
    let watch = Watch::default();
    let written = value.serialize(Checked {
        inner: &mut serde_json::Serializer::new(&mut out),
        depth: 0,
        watch: &watch,
    });
    match (written, watch.problem.take()) {
        (Ok(()), _) => Ok(String::from_utf8(out)
            .map_err(|_| Error::Internal("serde_json wrote JSON that is not UTF-8".into()))?),
        (Err(_), Some(problem)) => Err(Error::NotJournalable {
            what: what(),
            reason: problem.describe(&path_at_end(&out)),
        }),
        (Err(error), None) => Err(Error::encode(what(), error)),
    }
}

/// Refuses `json` when it is longer than `limit` bytes with
/// [`Error::PayloadTooLarge`] naming `workflow`, `id` and `step` (which value).
pub(crate) fn check_size(
    json: &str,
    limit: usize,
    workflow: &str,
    id: &str,
    step: impl FnOnce() -> String,
) -> Result<()> {
    if json.len() <= limit {
        return Ok(());
    }
    Err(Error::PayloadTooLarge {
        workflow: workflow.to_owned(),
        id: id.to_owned(),
        step: step(),
        size: json.len(),
        limit,
    })
}

/// The payload limit of a write made outside any runtime (inside the
/// caller's own transaction): the process-wide runtime's when there is one,
/// else the default.
pub(crate) fn global_payload_limit() -> usize {
    crate::runtime::try_global().map_or(crate::DEFAULT_MAX_PAYLOAD_BYTES, |keiro| {
        keiro.max_payload_bytes()
    })
}

/// [`to_json`], read back as a `serde_json::Value`.
pub(crate) fn to_value<T: Serialize + ?Sized>(
    value: &T,
    what: impl FnOnce() -> String + Clone,
) -> Result<serde_json::Value> {
    let json = to_json(value, what.clone())?;
    serde_json::from_str(&json).map_err(|e| Error::encode(what(), e))
}

/// What made a value unstorable.
#[derive(Debug, Clone, Copy)]
enum Problem {
    /// A NaN or an infinity.
    NonFinite(f64),
    /// Arrays and objects nested deeper than [`MAX_DEPTH`].
    TooDeep,
}

impl Problem {
    /// The reason an error gives, with the value's `path`.
    fn describe(self, path: &str) -> String {
        let at = if path.is_empty() {
            "as its whole value".to_owned()
        } else {
            format!("at `{path}`")
        };
        match self {
            Problem::NonFinite(value) => {
                let name = if value.is_nan() {
                    "NaN"
                } else if value > 0.0 {
                    "infinity"
                } else {
                    "negative infinity"
                };
                format!(
                    "{name} {at}, which JSON cannot store (it would be written as null and not \
                     read back): return a finite number there, or an Option or a string in its \
                     place"
                )
            }
            Problem::TooDeep => format!(
                "arrays or objects nested more than {MAX_DEPTH} levels deep ({at}), deeper than \
                 keiro reads back: flatten the value, or store the deep part as a string"
            ),
        }
    }
}

/// Where a refusal is recorded while serde's error travels up.
#[derive(Default)]
struct Watch {
    problem: Cell<Option<Problem>>,
}

impl Watch {
    fn refuse<E: ser::Error>(&self, problem: Problem) -> E {
        self.problem.set(Some(problem));
        E::custom("a value that would not read back")
    }
}

/// Wraps a serializer: checks floats and counts nesting, forwards the rest.
struct Checked<'w, S> {
    inner: S,
    /// Arrays and objects around the value being written.
    depth: usize,
    watch: &'w Watch,
}

impl<'w, S: Serializer> Checked<'w, S> {
    /// The depth inside `levels` more containers, or the refusal.
    fn enter(&self, levels: usize) -> Result<usize, S::Error> {
        let depth = self.depth + levels;
        if depth > MAX_DEPTH {
            return Err(self.watch.refuse(Problem::TooDeep));
        }
        Ok(depth)
    }

    fn guard<'a, T: ?Sized>(&self, value: &'a T, depth: usize) -> Guard<'a, 'w, T> {
        Guard {
            value,
            depth,
            watch: self.watch,
        }
    }
}

/// A value nested in a container: serialized through [`Checked`] whatever
/// serializer the container hands it.
struct Guard<'a, 'w, T: ?Sized> {
    value: &'a T,
    depth: usize,
    watch: &'w Watch,
}

impl<T: Serialize + ?Sized> Serialize for Guard<'_, '_, T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.value.serialize(Checked {
            inner: serializer,
            depth: self.depth,
            watch: self.watch,
        })
    }
}

/// A container being written: each element goes through a [`Guard`].
struct Compound<'w, C> {
    inner: C,
    depth: usize,
    watch: &'w Watch,
}

impl<'w, C> Compound<'w, C> {
    fn guard<'a, T: ?Sized>(&self, value: &'a T) -> Guard<'a, 'w, T> {
        Guard {
            value,
            depth: self.depth,
            watch: self.watch,
        }
    }
}

macro_rules! forward {
    ($($method:ident($ty:ty)),* $(,)?) => {
        $(
            fn $method(self, v: $ty) -> Result<S::Ok, S::Error> {
                self.inner.$method(v)
            }
        )*
    };
}

impl<'w, S: Serializer> Serializer for Checked<'w, S> {
    type Ok = S::Ok;
    type Error = S::Error;
    type SerializeSeq = Compound<'w, S::SerializeSeq>;
    type SerializeTuple = Compound<'w, S::SerializeTuple>;
    type SerializeTupleStruct = Compound<'w, S::SerializeTupleStruct>;
    type SerializeTupleVariant = Compound<'w, S::SerializeTupleVariant>;
    type SerializeMap = Compound<'w, S::SerializeMap>;
    type SerializeStruct = Compound<'w, S::SerializeStruct>;
    type SerializeStructVariant = Compound<'w, S::SerializeStructVariant>;

    forward!(
        serialize_bool(bool),
        serialize_i8(i8),
        serialize_i16(i16),
        serialize_i32(i32),
        serialize_i64(i64),
        serialize_i128(i128),
        serialize_u8(u8),
        serialize_u16(u16),
        serialize_u32(u32),
        serialize_u64(u64),
        serialize_u128(u128),
        serialize_char(char),
        serialize_str(&str),
        serialize_bytes(&[u8]),
        serialize_unit_struct(&'static str),
    );

    fn serialize_f32(self, v: f32) -> Result<S::Ok, S::Error> {
        if !v.is_finite() {
            return Err(self.watch.refuse(Problem::NonFinite(f64::from(v))));
        }
        self.inner.serialize_f32(v)
    }

    fn serialize_f64(self, v: f64) -> Result<S::Ok, S::Error> {
        if !v.is_finite() {
            return Err(self.watch.refuse(Problem::NonFinite(v)));
        }
        self.inner.serialize_f64(v)
    }

    fn serialize_none(self) -> Result<S::Ok, S::Error> {
        self.inner.serialize_none()
    }

    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<S::Ok, S::Error> {
        let guard = self.guard(value, self.depth);
        self.inner.serialize_some(&guard)
    }

    fn serialize_unit(self) -> Result<S::Ok, S::Error> {
        self.inner.serialize_unit()
    }

    fn serialize_unit_variant(
        self,
        name: &'static str,
        index: u32,
        variant: &'static str,
    ) -> Result<S::Ok, S::Error> {
        self.inner.serialize_unit_variant(name, index, variant)
    }

    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        name: &'static str,
        value: &T,
    ) -> Result<S::Ok, S::Error> {
        let guard = self.guard(value, self.depth);
        self.inner.serialize_newtype_struct(name, &guard)
    }

    // `{"Variant":value}`: one object around the value.
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        name: &'static str,
        index: u32,
        variant: &'static str,
        value: &T,
    ) -> Result<S::Ok, S::Error> {
        let guard = self.guard(value, self.enter(1)?);
        self.inner
            .serialize_newtype_variant(name, index, variant, &guard)
    }

    fn serialize_seq(self, len: Option<usize>) -> Result<Self::SerializeSeq, S::Error> {
        let depth = self.enter(1)?;
        let watch = self.watch;
        Ok(Compound {
            inner: self.inner.serialize_seq(len)?,
            depth,
            watch,
        })
    }

    fn serialize_tuple(self, len: usize) -> Result<Self::SerializeTuple, S::Error> {
        let depth = self.enter(1)?;
        let watch = self.watch;
        Ok(Compound {
            inner: self.inner.serialize_tuple(len)?,
            depth,
            watch,
        })
    }

    fn serialize_tuple_struct(
        self,
        name: &'static str,
        len: usize,
    ) -> Result<Self::SerializeTupleStruct, S::Error> {
        let depth = self.enter(1)?;
        let watch = self.watch;
        Ok(Compound {
            inner: self.inner.serialize_tuple_struct(name, len)?,
            depth,
            watch,
        })
    }

    // `{"Variant":[…]}`: an object and an array.
    fn serialize_tuple_variant(
        self,
        name: &'static str,
        index: u32,
        variant: &'static str,
        len: usize,
    ) -> Result<Self::SerializeTupleVariant, S::Error> {
        let depth = self.enter(2)?;
        let watch = self.watch;
        Ok(Compound {
            inner: self
                .inner
                .serialize_tuple_variant(name, index, variant, len)?,
            depth,
            watch,
        })
    }

    fn serialize_map(self, len: Option<usize>) -> Result<Self::SerializeMap, S::Error> {
        let depth = self.enter(1)?;
        let watch = self.watch;
        Ok(Compound {
            inner: self.inner.serialize_map(len)?,
            depth,
            watch,
        })
    }

    fn serialize_struct(
        self,
        name: &'static str,
        len: usize,
    ) -> Result<Self::SerializeStruct, S::Error> {
        let depth = self.enter(1)?;
        let watch = self.watch;
        Ok(Compound {
            inner: self.inner.serialize_struct(name, len)?,
            depth,
            watch,
        })
    }

    // `{"Variant":{…}}`: two objects.
    fn serialize_struct_variant(
        self,
        name: &'static str,
        index: u32,
        variant: &'static str,
        len: usize,
    ) -> Result<Self::SerializeStructVariant, S::Error> {
        let depth = self.enter(2)?;
        let watch = self.watch;
        Ok(Compound {
            inner: self
                .inner
                .serialize_struct_variant(name, index, variant, len)?,
            depth,
            watch,
        })
    }

    fn collect_str<T: Display + ?Sized>(self, value: &T) -> Result<S::Ok, S::Error> {
        self.inner.collect_str(value)
    }

    fn is_human_readable(&self) -> bool {
        self.inner.is_human_readable()
    }
}

impl<C: ser::SerializeSeq> ser::SerializeSeq for Compound<'_, C> {
    type Ok = C::Ok;
    type Error = C::Error;

    fn serialize_element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), C::Error> {
        let guard = self.guard(value);
        self.inner.serialize_element(&guard)
    }

    fn end(self) -> Result<C::Ok, C::Error> {
        self.inner.end()
    }
}

impl<C: ser::SerializeTuple> ser::SerializeTuple for Compound<'_, C> {
    type Ok = C::Ok;
    type Error = C::Error;

    fn serialize_element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), C::Error> {
        let guard = self.guard(value);
        self.inner.serialize_element(&guard)
    }

    fn end(self) -> Result<C::Ok, C::Error> {
        self.inner.end()
    }
}

impl<C: ser::SerializeTupleStruct> ser::SerializeTupleStruct for Compound<'_, C> {
    type Ok = C::Ok;
    type Error = C::Error;

    fn serialize_field<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), C::Error> {
        let guard = self.guard(value);
        self.inner.serialize_field(&guard)
    }

    fn end(self) -> Result<C::Ok, C::Error> {
        self.inner.end()
    }
}

impl<C: ser::SerializeTupleVariant> ser::SerializeTupleVariant for Compound<'_, C> {
    type Ok = C::Ok;
    type Error = C::Error;

    fn serialize_field<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), C::Error> {
        let guard = self.guard(value);
        self.inner.serialize_field(&guard)
    }

    fn end(self) -> Result<C::Ok, C::Error> {
        self.inner.end()
    }
}

impl<C: ser::SerializeMap> ser::SerializeMap for Compound<'_, C> {
    type Ok = C::Ok;
    type Error = C::Error;

    // Keys are strings (serde_json refuses a non-finite float key itself).
    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), C::Error> {
        self.inner.serialize_key(key)
    }

    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), C::Error> {
        let guard = self.guard(value);
        self.inner.serialize_value(&guard)
    }

    fn end(self) -> Result<C::Ok, C::Error> {
        self.inner.end()
    }
}

impl<C: ser::SerializeStruct> ser::SerializeStruct for Compound<'_, C> {
    type Ok = C::Ok;
    type Error = C::Error;

    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        key: &'static str,
        value: &T,
    ) -> Result<(), C::Error> {
        let guard = self.guard(value);
        self.inner.serialize_field(key, &guard)
    }

    fn skip_field(&mut self, key: &'static str) -> Result<(), C::Error> {
        self.inner.skip_field(key)
    }

    fn end(self) -> Result<C::Ok, C::Error> {
        self.inner.end()
    }
}

impl<C: ser::SerializeStructVariant> ser::SerializeStructVariant for Compound<'_, C> {
    type Ok = C::Ok;
    type Error = C::Error;

    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        key: &'static str,
        value: &T,
    ) -> Result<(), C::Error> {
        let guard = self.guard(value);
        self.inner.serialize_field(key, &guard)
    }

    fn skip_field(&mut self, key: &'static str) -> Result<(), C::Error> {
        self.inner.skip_field(key)
    }

    fn end(self) -> Result<C::Ok, C::Error> {
        self.inner.end()
    }
}

/// The path (`.total`, `[2]`, `.items[0].price`) of the value that comes
/// next after `written`, the JSON serde_json wrote before it stopped. Read
/// only when a value is refused, so the hot path tracks no path at all.
fn path_at_end(written: &[u8]) -> String {
    enum Frame {
        Array(usize),
        Object { key: Vec<u8>, expect_key: bool },
    }
    let mut frames: Vec<Frame> = Vec::new();
    let mut bytes = written.iter().copied();
    while let Some(byte) = bytes.next() {
        match byte {
            b'"' => {
                let mut text = Vec::new();
                while let Some(b) = bytes.next() {
                    match b {
                        b'"' => break,
                        b'\\' => {
                            text.push(b);
                            text.extend(bytes.next());
                        }
                        _ => text.push(b),
                    }
                }
                if let Some(Frame::Object {
                    key,
                    expect_key: expect_key @ true,
                }) = frames.last_mut()
                {
                    *key = text;
                    *expect_key = false;
                }
            }
            b'[' => frames.push(Frame::Array(0)),
            b'{' => frames.push(Frame::Object {
                key: Vec::new(),
                expect_key: true,
            }),
            b']' | b'}' => {
                frames.pop();
            }
            b',' => match frames.last_mut() {
                Some(Frame::Array(index)) => *index += 1,
                Some(Frame::Object { expect_key, .. }) => *expect_key = true,
                None => {}
            },
            _ => {}
        }
    }
    let mut path = String::new();
    for frame in &frames {
        match frame {
            Frame::Array(index) => path.push_str(&format!("[{index}]")),
            Frame::Object { key, .. } => {
                path.push('.');
                path.push_str(&String::from_utf8_lossy(key));
            }
        }
    }
    shorten(path)
}

/// A path of at most about 100 characters: a very deep one keeps its start
/// and its end.
fn shorten(path: String) -> String {
    const KEEP: usize = 48;
    let chars: Vec<char> = path.chars().collect();
    if chars.len() <= 2 * KEEP + 4 {
        return path;
    }
    let head: String = chars[..KEEP].iter().collect();
    let tail: String = chars[chars.len() - KEEP..].iter().collect();
    format!("{head}…{tail}")
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    #[derive(serde::Serialize)]
    struct Line {
        sku: String,
        price: f64,
    }

    #[derive(serde::Serialize)]
    struct Order {
        id: u32,
        lines: Vec<Line>,
        total: f32,
    }

    #[derive(serde::Serialize)]
    enum Shape {
        Circle { radius: f64 },
        Pair(f64, f64),
        Boxed(Box<Shape>),
    }

    fn refused<T: Serialize + ?Sized>(value: &T) -> String {
        match to_json(value, || "the value".to_owned()) {
            Err(Error::NotJournalable { reason, .. }) => reason,
            other => panic!("expected NotJournalable, got {other:?}"),
        }
    }

    #[test]
    fn ordinary_values_encode_as_serde_json_does() {
        let order = Order {
            id: 7,
            lines: vec![Line {
                sku: "a\"b".into(),
                price: 1.5,
            }],
            total: 1.5,
        };
        let mut map = BTreeMap::new();
        map.insert("k", vec![Some(1.0), None]);
        let shapes = vec![
            Shape::Circle { radius: 2.0 },
            Shape::Pair(1.0, 2.0),
            Shape::Boxed(Box::new(Shape::Pair(0.0, -0.5))),
        ];
        let raw = serde_json::value::RawValue::from_string("{\"x\": [1, 2]}".into()).unwrap();
        let cases = [
            serde_json::to_string(&order).unwrap(),
            serde_json::to_string(&map).unwrap(),
            serde_json::to_string(&shapes).unwrap(),
            serde_json::to_string(&Ok::<f64, String>(f64::MAX)).unwrap(),
            serde_json::to_string(&serde_json::json!({"a": [1, {"b": null}]})).unwrap(),
            serde_json::to_string(&raw).unwrap(),
        ];
        assert_eq!(to_json(&order, String::new).unwrap(), cases[0]);
        assert_eq!(to_json(&map, String::new).unwrap(), cases[1]);
        assert_eq!(to_json(&shapes, String::new).unwrap(), cases[2]);
        assert_eq!(
            to_json(&Ok::<f64, String>(f64::MAX), String::new).unwrap(),
            cases[3]
        );
        assert_eq!(
            to_json(&serde_json::json!({"a": [1, {"b": null}]}), String::new).unwrap(),
            cases[4]
        );
        assert_eq!(to_json(&raw, String::new).unwrap(), cases[5]);
    }

    #[test]
    fn non_finite_floats_are_refused_with_their_path() {
        let order = Order {
            id: 7,
            lines: vec![
                Line {
                    sku: "a".into(),
                    price: 1.0,
                },
                Line {
                    sku: "b".into(),
                    price: f64::NAN,
                },
            ],
            total: 1.0,
        };
        let reason = refused(&order);
        assert!(reason.starts_with("NaN at `.lines[1].price`"), "{reason}");
        let reason = refused(&Order {
            id: 1,
            lines: vec![],
            total: f32::INFINITY,
        });
        assert!(reason.starts_with("infinity at `.total`"), "{reason}");
        let reason = refused(&f64::NEG_INFINITY);
        assert!(
            reason.starts_with("negative infinity as its whole value"),
            "{reason}"
        );
        let reason = refused(&Ok::<_, String>(vec![Shape::Pair(1.0, f64::NAN)]));
        assert!(reason.starts_with("NaN at `.Ok[0].Pair[1]`"), "{reason}");
        let mut map = BTreeMap::new();
        map.insert("we\"ird", Some(f64::NAN));
        let reason = refused(&map);
        assert!(reason.starts_with("NaN at `.we\\\"ird`"), "{reason}");
    }

    #[test]
    fn sizes_up_to_the_limit_pass_and_one_byte_more_is_refused() {
        let step = || "the input".to_owned();
        assert!(check_size("\"abc\"", 5, "w", "i", step).is_ok());
        match check_size("\"abcd\"", 5, "w", "i", step) {
            Err(Error::PayloadTooLarge {
                workflow,
                id,
                step,
                size,
                limit,
            }) => {
                assert_eq!((workflow.as_str(), id.as_str()), ("w", "i"));
                assert_eq!((step.as_str(), size, limit), ("the input", 6, 5));
            }
            other => panic!("expected PayloadTooLarge, got {other:?}"),
        }
    }

    /// `[[[…]]]` nested `depth` levels deep.
    fn nested(depth: usize) -> serde_json::Value {
        let mut value = serde_json::Value::Null;
        for _ in 0..depth {
            value = serde_json::Value::Array(vec![value]);
        }
        value
    }

    #[test]
    fn nesting_is_refused_past_the_depth_keiro_reads_back() {
        let json = to_json(&nested(MAX_DEPTH), String::new).unwrap();
        serde_json::from_str::<serde_json::Value>(&json).unwrap();
        // Even inside the envelopes the journal wraps values in.
        let wrapped = format!("{{\"Ok\":{{\"Ok\":{json}}}}}");
        serde_json::from_str::<serde_json::Value>(&wrapped).unwrap();
        let reason = refused(&nested(MAX_DEPTH + 1));
        assert!(reason.contains("more than 120 levels"), "{reason}");
        assert!(reason.contains("[0][0]"), "{reason}");
        assert!(reason.len() < 400, "{reason}");
        let reason = refused(&nested(200));
        assert!(reason.contains("more than 120 levels"), "{reason}");
    }
}
