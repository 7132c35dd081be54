//! Watch streams as kube-apiserver writes them: one JSON event per line,
//! `{"type":"ADDED","object":{…}}\n`.
//!
//! [`WatchEvent`] reads a line (borrowing the object's text), [`EventType`] names its type, and
//! [`event_line`] / [`bookmark_line`] write lines the same way. [`EventType::of_line`] and
//! [`split_event`] read kube-apiserver's own layout off a line's first bytes, for the hot paths
//! that must not parse every event.

use std::borrow::Cow;
use std::fmt;
use std::str::FromStr;

use bytes::Bytes;
use serde::Deserialize;
use serde_json::value::RawValue;

/// The annotation on the BOOKMARK that ends a streaming list's initial events.
pub const INITIAL_EVENTS_END: &str = "k8s.io/initial-events-end";

/// A watch event's `type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
    /// Only `metadata.resourceVersion` (and annotations) of an object of the watched kind.
    Bookmark,
    /// The object is a `Status`; the stream ends after it (410 Gone: relist).
    Error,
}

impl EventType {
    pub const fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
            EventType::Bookmark => "BOOKMARK",
            EventType::Error => "ERROR",
        }
    }

    /// ADDED, MODIFIED and DELETED carry an object of the watched kind.
    pub const fn changes_an_object(self) -> bool {
        matches!(
            self,
            EventType::Added | EventType::Modified | EventType::Deleted
        )
    }

    /// The type of a line written as kube-apiserver writes it (`{"type":"ADDED",…`), read off
    /// its first bytes; `None` for any other layout (the line must then be read in full).
    pub fn of_line(line: &[u8]) -> Option<EventType> {
        let rest = line.strip_prefix(br#"{"type":""#)?;
        let end = memchr::memchr(b'"', rest)?;
        if rest.get(end + 1) != Some(&b',') {
            return None;
        }
        std::str::from_utf8(&rest[..end]).ok()?.parse().ok()
    }
}

impl fmt::Display for EventType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A `type` that is none of the five.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a watch event type: {0:?}")]
pub struct UnknownEventType(pub String);

impl FromStr for EventType {
    type Err = UnknownEventType;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "ADDED" => EventType::Added,
            "MODIFIED" => EventType::Modified,
            "DELETED" => EventType::Deleted,
            "BOOKMARK" => EventType::Bookmark,
            "ERROR" => EventType::Error,
            other => return Err(UnknownEventType(other.to_owned())),
        })
    }
}

/// Why a line is not a watch event.
#[derive(Debug, thiserror::Error)]
pub enum EventError {
    #[error("watch event: {0}")]
    Json(#[from] serde_json::Error),
    #[error("watch event without a type")]
    NoType,
    #[error(transparent)]
    UnknownType(#[from] UnknownEventType),
    #[error("watch event without an object")]
    NoObject,
}

/// One watch event, borrowed from its line: the type as written and the object's JSON text.
#[derive(Debug, Deserialize)]
pub struct WatchEvent<'a> {
    #[serde(rename = "type", borrow)]
    type_name: Option<Cow<'a, str>>,
    #[serde(borrow)]
    object: Option<&'a RawValue>,
}

impl<'a> WatchEvent<'a> {
    /// Reads one event line (any key order, whitespace allowed). A missing type or object is
    /// not an error here: [`WatchEvent::event_type`] and [`WatchEvent::object`] say so.
    pub fn parse(line: &'a [u8]) -> Result<WatchEvent<'a>, serde_json::Error> {
        serde_json::from_slice(line)
    }

    /// [`WatchEvent::parse`] of a line held as text.
    pub fn parse_str(line: &'a str) -> Result<WatchEvent<'a>, serde_json::Error> {
        serde_json::from_str(line)
    }

    /// The `type` as written, if the event has one.
    pub fn type_name(&self) -> Option<&str> {
        self.type_name.as_deref()
    }

    pub fn event_type(&self) -> Result<EventType, EventError> {
        Ok(self.type_name().ok_or(EventError::NoType)?.parse()?)
    }

    /// The object's JSON text.
    pub fn object(&self) -> Result<&'a str, EventError> {
        self.object.map(RawValue::get).ok_or(EventError::NoObject)
    }

    /// Whether this is the BOOKMARK that ends a streaming list's initial events
    /// ([`INITIAL_EVENTS_END`] is `"true"` on its object).
    pub fn ends_initial_events(&self) -> bool {
        #[derive(Deserialize)]
        struct Object<'a> {
            #[serde(borrow, default)]
            metadata: Metadata<'a>,
        }
        #[derive(Deserialize, Default)]
        struct Metadata<'a> {
            #[serde(borrow, default)]
            annotations: std::collections::HashMap<Cow<'a, str>, Cow<'a, str>>,
        }
        self.type_name() == Some(EventType::Bookmark.as_str())
            && self.object().is_ok_and(|object| {
                serde_json::from_str::<Object<'_>>(object).is_ok_and(|o| {
                    o.metadata
                        .annotations
                        .get(INITIAL_EVENTS_END)
                        .is_some_and(|v| v == "true")
                })
            })
    }
}

/// `{"type":"<T>","object":<object>}` (+ whitespace), as kube-apiserver writes it: the type and
/// the object's text, for the three types that change an object; `None` for any other shape.
/// The cut is not checked: a caller that rewrites the object reads it to its end.
pub fn split_event(raw: &str) -> Option<(EventType, &str)> {
    let rest = raw.strip_prefix(r#"{"type":""#)?;
    let (name, rest) = rest.split_at(rest.find('"')?);
    let event_type: EventType = name.parse().ok()?;
    if !event_type.changes_an_object() {
        return None;
    }
    let object = rest.strip_prefix(r#"","object":"#)?;
    let object = object.trim_end().strip_suffix('}')?.trim_end();
    (object.starts_with('{') && object.ends_with('}')).then_some((event_type, object))
}

/// One event line as kube-apiserver writes it, newline included.
pub fn event_line(event_type: EventType, object: &[u8]) -> Bytes {
    let mut line = Vec::with_capacity(object.len() + 32);
    line.extend_from_slice(b"{\"type\":\"");
    line.extend_from_slice(event_type.as_str().as_bytes());
    line.extend_from_slice(b"\",\"object\":");
    line.extend_from_slice(object);
    line.extend_from_slice(b"}\n");
    Bytes::from(line)
}

/// A BOOKMARK as kube-apiserver sends it: only kind, apiVersion and resourceVersion, and the
/// [`INITIAL_EVENTS_END`] annotation when it ends a streaming list's initial events.
pub fn bookmark_line(
    kind: &str,
    api_version: &str,
    resource_version: &str,
    initial_events_end: bool,
) -> Bytes {
    let mut metadata = serde_json::json!({ "resourceVersion": resource_version });
    if initial_events_end {
        metadata["annotations"] = serde_json::json!({ INITIAL_EVENTS_END: "true" });
    }
    let object =
        serde_json::json!({ "kind": kind, "apiVersion": api_version, "metadata": metadata });
    event_line(EventType::Bookmark, object.to_string().as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_types_round_trip_and_unknown_ones_are_named() {
        for t in [
            EventType::Added,
            EventType::Modified,
            EventType::Deleted,
            EventType::Bookmark,
            EventType::Error,
        ] {
            assert_eq!(t.as_str().parse::<EventType>(), Ok(t));
        }
        assert_eq!(
            "SYNC".parse::<EventType>(),
            Err(UnknownEventType("SYNC".into()))
        );
    }

    #[test]
    fn the_type_is_read_off_kube_apiservers_layout_only() {
        assert_eq!(
            EventType::of_line(br#"{"type":"ADDED","object":{}}"#),
            Some(EventType::Added)
        );
        assert_eq!(
            EventType::of_line(br#"{"type":"BOOKMARK","object":{}}"#),
            Some(EventType::Bookmark)
        );
        assert_eq!(EventType::of_line(br#"{"object":{},"type":"ADDED"}"#), None);
        assert_eq!(EventType::of_line(br#"{"type":"ADDED"}"#), None);
        assert_eq!(EventType::of_line(br#"{"type":"ADD","object":{}}"#), None);
    }

    #[test]
    fn events_are_read_in_any_layout() {
        let event = WatchEvent::parse(br#"{ "object" : {"a":1}, "type" : "MODIFIED" }"#).unwrap();
        assert_eq!(event.event_type().unwrap(), EventType::Modified);
        assert_eq!(event.object().unwrap(), r#"{"a":1}"#);
        let bare = WatchEvent::parse(b"{}").unwrap();
        assert!(matches!(bare.event_type(), Err(EventError::NoType)));
        assert!(matches!(bare.object(), Err(EventError::NoObject)));
        assert!(WatchEvent::parse(b"[]").is_err());
    }

    #[test]
    fn lines_are_written_as_kube_apiserver_writes_them() {
        let line = event_line(EventType::Added, br#"{"a":1}"#);
        assert_eq!(&line[..], b"{\"type\":\"ADDED\",\"object\":{\"a\":1}}\n");
        let end = bookmark_line("Pod", "v1", "7", true);
        let event = WatchEvent::parse(&end).unwrap();
        assert_eq!(event.event_type().unwrap(), EventType::Bookmark);
        assert!(event.ends_initial_events());
        assert_eq!(
            event.object().unwrap(),
            r#"{"kind":"Pod","apiVersion":"v1","metadata":{"resourceVersion":"7","annotations":{"k8s.io/initial-events-end":"true"}}}"#
        );
        let plain = bookmark_line("Pod", "v1", "7", false);
        assert!(!WatchEvent::parse(&plain).unwrap().ends_initial_events());
    }

    #[test]
    fn events_are_split_in_kube_apiservers_layout_only() {
        let line = "{\"type\":\"MODIFIED\",\"object\":{\"metadata\":{\"name\":\"a\"}}}\n";
        assert_eq!(
            split_event(line),
            Some((EventType::Modified, r#"{"metadata":{"name":"a"}}"#))
        );
        assert_eq!(split_event(r#"{"type":"BOOKMARK","object":{}}"#), None);
        assert_eq!(split_event(r#"{"object":{},"type":"ADDED"}"#), None);
        assert_eq!(split_event(r#"{"type":"ADDED","object":[]}"#), None);
    }
}
