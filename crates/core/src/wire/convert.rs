//! Field-by-field conversion between k8s-pb's prost messages and Kubernetes JSON.
//!
//! Every message type gets a [`Json`] implementation from the `json_message!` table in `kinds`:
//! one line per field with its JSON name and how the Go struct declares it ([`Go`]). That
//! declaration decides everything Go's `encoding/json` and gogo-protobuf do differently: JSON
//! omits an `omitempty` zero value, writes `null` for an unset pointer without `omitempty`,
//! never omits a struct; Go's protobuf writes every non-pointer field, zero or not, which is why
//! JSON → protobuf fills absent non-pointer fields with their zero value (the bytes then match
//! Go's). The struct literal in the macro names every prost field, so a field k8s-pb adds is a
//! compile error here, not a silent loss.
//!
//! The special JSON forms live here too: `metav1.Time` (RFC 3339, seconds, `null` when zero),
//! `MicroTime` (six fractional digits), `Quantity` (a string), `FieldsV1` (raw JSON), bytes
//! (base64).

use std::collections::BTreeMap;

use base64::Engine;
use k8s_pb::apimachinery::pkg::api::resource::Quantity;
use k8s_pb::apimachinery::pkg::apis::meta::v1::{FieldsV1, MicroTime, Time};
use serde_json::{Map, Value};

use crate::time::Timestamp;

/// How the Go struct declares a field.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Go {
    /// A value with `omitempty`: absent from JSON when zero; always in Go's protobuf.
    Omit,
    /// A value without `omitempty`, or a struct (which `omitempty` never omits): always in JSON
    /// (an empty slice or map as `null`) and in protobuf.
    Always,
    /// A pointer with `omitempty`: in JSON and in protobuf exactly when set.
    Ptr,
    /// A pointer without `omitempty`: `null` in JSON when unset.
    Nullable,
}

/// A JSON value that does not fit its field, and where it is.
#[derive(Debug, thiserror::Error)]
#[error("{}: {problem}", if path.is_empty() { "object" } else { path.as_str() })]
pub struct FieldError {
    /// Dotted JSON path from the object's root, e.g. `spec.taints[0].timeAdded`.
    pub path: String,
    pub problem: Problem,
}

/// What is wrong with one field.
#[derive(Debug, thiserror::Error)]
pub enum Problem {
    #[error("expected {0}")]
    Expected(&'static str),
    #[error("integer out of range")]
    OutOfRange,
    #[error("not an RFC 3339 time: {0:?}")]
    Time(String),
    #[error("not base64: {0}")]
    Base64(#[from] base64::DecodeError),
    #[error("fieldsV1 is not JSON: {0}")]
    FieldsV1(#[from] serde_json::Error),
}

impl FieldError {
    fn new(problem: impl Into<Problem>) -> FieldError {
        FieldError {
            path: String::new(),
            problem: problem.into(),
        }
    }

    /// The same error one level further out: `segment` is a field name or `[index]`.
    fn at(mut self, segment: &str) -> FieldError {
        self.path = match self.path.as_str() {
            "" => segment.to_owned(),
            rest if rest.starts_with('[') => format!("{segment}{rest}"),
            rest => format!("{segment}.{rest}"),
        };
        self
    }
}

/// One Kubernetes type's JSON form.
pub(crate) trait Json: Sized + Default {
    fn to_json(&self) -> Result<Value, FieldError>;
    /// `null` reads as the zero value, as Go's `encoding/json` leaves it.
    fn from_json(value: &Value) -> Result<Self, FieldError>;
    /// Go's zero value, which `omitempty` omits (never a struct).
    fn is_zero(&self) -> bool {
        false
    }
}

/// A struct field of some prost type: optional (proto2 `optional`), repeated, or a map.
pub(crate) trait Field: Sized {
    /// The JSON value, or `None` to leave the field out.
    fn write(&self, go: Go) -> Result<Option<Value>, FieldError>;
    fn read(value: Option<&Value>, go: Go) -> Result<Self, FieldError>;
}

impl<T: Json> Field for Option<T> {
    fn write(&self, go: Go) -> Result<Option<Value>, FieldError> {
        match (go, self) {
            (Go::Omit, Some(v)) if !v.is_zero() => v.to_json().map(Some),
            (Go::Omit, _) | (Go::Ptr, None) => Ok(None),
            (Go::Always, v) => match v {
                Some(v) => v.to_json().map(Some),
                None => T::default().to_json().map(Some),
            },
            (Go::Ptr | Go::Nullable, Some(v)) => v.to_json().map(Some),
            (Go::Nullable, None) => Ok(Some(Value::Null)),
        }
    }

    fn read(value: Option<&Value>, go: Go) -> Result<Self, FieldError> {
        let value = value.filter(|v| !v.is_null());
        match go {
            Go::Omit | Go::Always => value
                .map_or_else(|| Ok(T::default()), T::from_json)
                .map(Some),
            Go::Ptr | Go::Nullable => value.map(T::from_json).transpose(),
        }
    }
}

impl<T: Json> Field for Vec<T> {
    fn write(&self, go: Go) -> Result<Option<Value>, FieldError> {
        if self.is_empty() {
            return Ok(matches!(go, Go::Always | Go::Nullable).then_some(Value::Null));
        }
        let items = self
            .iter()
            .enumerate()
            .map(|(i, item)| item.to_json().map_err(|e| e.at(&format!("[{i}]"))))
            .collect::<Result<_, _>>()?;
        Ok(Some(Value::Array(items)))
    }

    fn read(value: Option<&Value>, _: Go) -> Result<Self, FieldError> {
        match value {
            None | Some(Value::Null) => Ok(Vec::new()),
            Some(Value::Array(items)) => items
                .iter()
                .enumerate()
                .map(|(i, item)| T::from_json(item).map_err(|e| e.at(&format!("[{i}]"))))
                .collect(),
            Some(_) => Err(FieldError::new(Problem::Expected("an array"))),
        }
    }
}

impl<T: Json> Field for BTreeMap<String, T> {
    fn write(&self, go: Go) -> Result<Option<Value>, FieldError> {
        if self.is_empty() {
            return Ok(matches!(go, Go::Always | Go::Nullable).then_some(Value::Null));
        }
        let mut out = Map::new();
        for (key, value) in self {
            let v = value.to_json().map_err(|e| e.at(&format!("[{key}]")))?;
            out.insert(key.clone(), v);
        }
        Ok(Some(Value::Object(out)))
    }

    fn read(value: Option<&Value>, _: Go) -> Result<Self, FieldError> {
        match value {
            None | Some(Value::Null) => Ok(BTreeMap::new()),
            Some(Value::Object(entries)) => entries
                .iter()
                .map(|(key, v)| {
                    let v = T::from_json(v).map_err(|e| e.at(&format!("[{key}]")))?;
                    Ok((key.clone(), v))
                })
                .collect(),
            Some(_) => Err(FieldError::new(Problem::Expected("an object"))),
        }
    }
}

/// Adds one field to a message's JSON object (used by `json_message!`).
pub(crate) fn put(
    out: &mut Map<String, Value>,
    name: &str,
    field: &impl Field,
    go: Go,
) -> Result<(), FieldError> {
    if let Some(value) = field.write(go).map_err(|e| e.at(name))? {
        out.insert(name.to_owned(), value);
    }
    Ok(())
}

/// Reads one field of a message's JSON object (used by `json_message!`).
pub(crate) fn take<F: Field>(
    object: &Map<String, Value>,
    name: &str,
    go: Go,
) -> Result<F, FieldError> {
    F::read(object.get(name), go).map_err(|e| e.at(name))
}

/// A message's JSON object; `null` reads as the empty object. Fields JSON has and the message
/// does not are ignored, as Go's decoder ignores them.
pub(crate) fn fields(value: &Value) -> Result<Option<&Map<String, Value>>, FieldError> {
    match value {
        Value::Object(object) => Ok(Some(object)),
        Value::Null => Ok(None),
        _ => Err(FieldError::new(Problem::Expected("an object"))),
    }
}

/// `impl Json` for prost message types, from their fields in the Go struct's order (which is the
/// order kube-apiserver writes JSON in): `rust_field: "jsonName" GoDeclaration`.
macro_rules! json_message {
    ($($ty:ty { $($field:ident: $name:literal $go:ident),* $(,)? })*) => {$(
        impl $crate::wire::convert::Json for $ty {
            fn to_json(&self) -> Result<serde_json::Value, $crate::wire::convert::FieldError> {
                #[allow(unused_mut)]
                let mut out = serde_json::Map::new();
                $($crate::wire::convert::put(
                    &mut out, $name, &self.$field, $crate::wire::convert::Go::$go,
                )?;)*
                Ok(serde_json::Value::Object(out))
            }

            fn from_json(
                value: &serde_json::Value,
            ) -> Result<Self, $crate::wire::convert::FieldError> {
                let empty = serde_json::Map::new();
                #[allow(unused_variables)]
                let object = $crate::wire::convert::fields(value)?.unwrap_or(&empty);
                Ok(Self {$(
                    $field: $crate::wire::convert::take(
                        object, $name, $crate::wire::convert::Go::$go,
                    )?,
                )*})
            }
        }
    )*};
}
pub(crate) use json_message;

fn expected(what: &'static str) -> FieldError {
    FieldError::new(Problem::Expected(what))
}

impl Json for String {
    fn to_json(&self) -> Result<Value, FieldError> {
        Ok(Value::String(self.clone()))
    }
    fn from_json(value: &Value) -> Result<Self, FieldError> {
        match value {
            Value::String(s) => Ok(s.clone()),
            Value::Null => Ok(String::new()),
            _ => Err(expected("a string")),
        }
    }
    fn is_zero(&self) -> bool {
        self.is_empty()
    }
}

impl Json for bool {
    fn to_json(&self) -> Result<Value, FieldError> {
        Ok(Value::Bool(*self))
    }
    fn from_json(value: &Value) -> Result<Self, FieldError> {
        match value {
            Value::Bool(b) => Ok(*b),
            Value::Null => Ok(false),
            _ => Err(expected("a boolean")),
        }
    }
    fn is_zero(&self) -> bool {
        !*self
    }
}

fn integer(value: &Value) -> Result<i64, FieldError> {
    match value {
        Value::Null => Ok(0),
        Value::Number(n) => n
            .as_i64()
            .ok_or_else(|| FieldError::new(Problem::OutOfRange)),
        _ => Err(expected("an integer")),
    }
}

impl Json for i64 {
    fn to_json(&self) -> Result<Value, FieldError> {
        Ok(Value::from(*self))
    }
    fn from_json(value: &Value) -> Result<Self, FieldError> {
        integer(value)
    }
    fn is_zero(&self) -> bool {
        *self == 0
    }
}

impl Json for i32 {
    fn to_json(&self) -> Result<Value, FieldError> {
        Ok(Value::from(*self))
    }
    fn from_json(value: &Value) -> Result<Self, FieldError> {
        i32::try_from(integer(value)?).map_err(|_| FieldError::new(Problem::OutOfRange))
    }
    fn is_zero(&self) -> bool {
        *self == 0
    }
}

/// `[]byte`: base64 in JSON.
impl Json for Vec<u8> {
    fn to_json(&self) -> Result<Value, FieldError> {
        Ok(base64::engine::general_purpose::STANDARD
            .encode(self)
            .into())
    }
    fn from_json(value: &Value) -> Result<Self, FieldError> {
        match value {
            Value::String(s) => base64::engine::general_purpose::STANDARD
                .decode(s)
                .map_err(FieldError::new),
            Value::Null => Ok(Vec::new()),
            _ => Err(expected("a base64 string")),
        }
    }
    fn is_zero(&self) -> bool {
        self.is_empty()
    }
}

/// The zero time travels as an empty message (Go's `Time.Marshal` writes nothing for it), and
/// is `null` in JSON.
fn timestamp_to_json(
    seconds: Option<i64>,
    nanos: Option<i32>,
    text: fn(Timestamp) -> String,
) -> Value {
    if seconds.is_none() && nanos.is_none() {
        return Value::Null;
    }
    // Go's `time.Unix` normalizes nanoseconds outside 0..1e9 into the seconds.
    let total = i128::from(seconds.unwrap_or(0)) * 1_000_000_000 + i128::from(nanos.unwrap_or(0));
    let seconds = i64::try_from(total.div_euclid(1_000_000_000)).unwrap_or(i64::MAX);
    let nanos = total.rem_euclid(1_000_000_000) as u32;
    text(Timestamp { seconds, nanos }).into()
}

fn timestamp_from_json(value: &Value) -> Result<Option<Timestamp>, FieldError> {
    match value {
        Value::Null => Ok(None),
        Value::String(s) => Timestamp::parse(s)
            .map(Some)
            .ok_or_else(|| FieldError::new(Problem::Time(s.clone()))),
        _ => Err(expected("an RFC 3339 time string")),
    }
}

/// `metav1.Time`: whole seconds; Go's `Time.ProtoTime` writes `nanos` as 0.
impl Json for Time {
    fn to_json(&self) -> Result<Value, FieldError> {
        // Go's `Time.Unmarshal` drops the nanoseconds.
        let nanos = self.nanos.map(|_| 0);
        Ok(timestamp_to_json(self.seconds, nanos, Timestamp::rfc3339))
    }
    fn from_json(value: &Value) -> Result<Self, FieldError> {
        Ok(
            timestamp_from_json(value)?.map_or_else(Time::default, |t| Time {
                seconds: Some(t.seconds),
                nanos: Some(0),
            }),
        )
    }
}

/// `metav1.MicroTime`: microseconds in JSON, nanoseconds in protobuf.
impl Json for MicroTime {
    fn to_json(&self) -> Result<Value, FieldError> {
        Ok(timestamp_to_json(
            self.seconds,
            self.nanos,
            Timestamp::micro_time,
        ))
    }
    fn from_json(value: &Value) -> Result<Self, FieldError> {
        Ok(
            timestamp_from_json(value)?.map_or_else(MicroTime::default, |t| MicroTime {
                seconds: Some(t.seconds),
                // JSON carries microseconds; so does the time Go parses from it.
                nanos: Some((t.nanos / 1000 * 1000) as i32),
            }),
        )
    }
}

/// `resource.Quantity`: its canonical string in both encodings. A JSON number is accepted as Go
/// accepts it; the text is not re-canonicalized (`1000m` stays `1000m`, Go would write `1`).
impl Json for Quantity {
    fn to_json(&self) -> Result<Value, FieldError> {
        Ok(self.string.clone().unwrap_or_else(|| "0".into()).into())
    }
    fn from_json(value: &Value) -> Result<Self, FieldError> {
        let string = match value {
            Value::String(s) => s.clone(),
            Value::Number(n) => n.to_string(),
            Value::Null => "0".into(),
            _ => return Err(expected("a quantity string")),
        };
        Ok(Quantity {
            string: Some(string),
        })
    }
}

/// `metav1.FieldsV1`: its raw bytes are the JSON itself (compact, keys in the order given).
impl Json for FieldsV1 {
    fn to_json(&self) -> Result<Value, FieldError> {
        match &self.raw {
            None => Ok(Value::Null),
            Some(raw) => serde_json::from_slice(raw).map_err(FieldError::new),
        }
    }
    fn from_json(value: &Value) -> Result<Self, FieldError> {
        Ok(FieldsV1 {
            raw: (!value.is_null()).then(|| serde_json::to_vec(value).unwrap_or_default()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[derive(Clone, PartialEq, ::prost::Message)]
    struct Sample {
        #[prost(string, optional, tag = "1")]
        omit: Option<String>,
        #[prost(string, optional, tag = "2")]
        always: Option<String>,
        #[prost(bool, optional, tag = "3")]
        ptr: Option<bool>,
        #[prost(int64, optional, tag = "4")]
        nullable: Option<i64>,
        #[prost(string, repeated, tag = "5")]
        list: Vec<String>,
        #[prost(message, optional, tag = "6")]
        time: Option<Time>,
    }

    json_message! {
        Sample {
            omit: "omit" Omit,
            always: "always" Always,
            ptr: "ptr" Ptr,
            nullable: "nullable" Nullable,
            list: "list" Always,
            time: "time" Always,
        }
    }

    #[test]
    fn go_declarations_decide_what_json_shows() {
        let zero = Sample {
            omit: Some(String::new()),
            ptr: Some(false),
            ..Sample::default()
        };
        assert_eq!(
            zero.to_json().unwrap(),
            json!({"always": "", "ptr": false, "nullable": null, "list": null, "time": null})
        );
        // Back from JSON, every non-pointer field is set, as Go's protobuf writes it.
        let back = Sample::from_json(&json!({})).unwrap();
        assert_eq!(back.omit.as_deref(), Some(""));
        assert_eq!(back.always.as_deref(), Some(""));
        assert_eq!((back.ptr, back.nullable), (None, None));
        assert_eq!(back.time, Some(Time::default()));
    }

    #[test]
    fn errors_name_the_field() {
        let err = Sample::from_json(&json!({"list": ["a", 1]})).unwrap_err();
        assert_eq!(err.to_string(), "list[1]: expected a string");
        let err = Sample::from_json(&json!({"time": "yesterday"})).unwrap_err();
        assert_eq!(err.path, "time");
        assert!(matches!(err.problem, Problem::Time(_)));
        let err = i32::from_json(&json!(1u64 << 40)).unwrap_err();
        assert!(matches!(err.problem, Problem::OutOfRange));
    }

    #[test]
    fn times_keep_their_precision() {
        let micro = MicroTime::from_json(&json!("2004-01-01T01:01:01.000004Z")).unwrap();
        assert_eq!(micro.nanos, Some(4000));
        assert_eq!(
            micro.to_json().unwrap(),
            json!("2004-01-01T01:01:01.000004Z")
        );
        let time = Time::from_json(&json!("2004-01-01T01:01:01.5Z")).unwrap();
        assert_eq!(time.nanos, Some(0));
        assert_eq!(time.to_json().unwrap(), json!("2004-01-01T01:01:01Z"));
        // The epoch is a time; an empty message is the zero time.
        let epoch = Time {
            seconds: Some(0),
            nanos: Some(0),
        };
        assert_eq!(epoch.to_json().unwrap(), json!("1970-01-01T00:00:00Z"));
        assert_eq!(Time::default().to_json().unwrap(), Value::Null);
    }
}
