//! The Kubernetes wire model: how objects travel in request and response bodies.
//!
//! kube-apiserver speaks JSON and Kubernetes protobuf. kubelet writes protobuf bodies on POST/PUT
//! (`Content-Type: application/vnd.kubernetes.protobuf`) and asks for protobuf answers first
//! (`Accept: application/vnd.kubernetes.protobuf,application/json`). Outpost works on JSON
//! ([`serde_json::Value`], exactly as kube-apiserver writes it), so bodies are converted at the
//! edges: read with [`read_body`], written with [`write_body`] in the [`Encoding`] that
//! [`negotiate`] picks from the client's `Accept`.
//!
//! The JSON shapes every part of the hub reads and writes are defined here once, borrowed from
//! the bytes as they came:
//! - [`watch`]: a watch stream's event lines ([`WatchEvent`], [`EventType`], [`event_line`],
//!   [`bookmark_line`]), framed by [`LineFramer`] ([`framing`]).
//! - [`list`]: list bodies ([`List`], [`ListMeta`], [`list_head`] / [`list_chunks`]);
//!   [`located`]: the same with items found but not read ([`LocatedList`], for the cache), and
//!   a list's head alone ([`ListHead`]).
//! - [`object`]: an object's head ([`ObjectHead`]: kind, apiVersion and identity;
//!   [`ObjectMeta::peek`] reads the identity alone, stopping early).
//!
//! - this module: media types, `Accept` negotiation, reading and writing bodies.
//! - [`protobuf`]: the `k8s\0` + `runtime.Unknown` envelope and [`protobuf::decode_object`] /
//!   [`protobuf::encode_object`], for the kinds in [`protobuf::is_supported`].
//! - `convert` and `kinds` (private): the field-by-field mapping between k8s-pb's prost types
//!   and Kubernetes JSON, following Go's `encoding/json` rules.

mod convert;
pub mod framing;
mod kinds;
pub mod list;
pub mod located;
pub mod object;
pub mod protobuf;
pub mod watch;

use serde_json::Value;

pub use convert::{FieldError, Problem};
pub use framing::LineFramer;
pub use list::{LIST_END, List, ListMeta, list_chunks, list_head};
pub use located::{ListHead, LocateError, LocatedList};
pub use object::{ObjectHead, ObjectMeta, PeekError};
pub use protobuf::ProtobufError;
pub use watch::{
    EventError, EventType, UnknownEventType, WatchEvent, bookmark_line, event_line, split_event,
};

/// The Kubernetes protobuf media type.
pub const PROTOBUF: &str = "application/vnd.kubernetes.protobuf";
/// The JSON media type.
pub const JSON: &str = "application/json";

/// How a body is encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    Json,
    Protobuf,
}

impl Encoding {
    /// The `Content-Type` of a body in this encoding.
    pub fn content_type(self) -> &'static str {
        match self {
            Encoding::Json => JSON,
            Encoding::Protobuf => PROTOBUF,
        }
    }
}

/// A media type without its parameters, trimmed (`application/json; charset=utf-8` →
/// `application/json`).
fn essence(media: &str) -> &str {
    media.split(';').next().unwrap_or("").trim()
}

/// Whether a `Content-Type` value is Kubernetes protobuf (parameters ignored, case-insensitive).
pub fn is_protobuf(content_type: &str) -> bool {
    essence(content_type).eq_ignore_ascii_case(PROTOBUF)
}

/// Whether a `Content-Type` value is JSON (parameters ignored, case-insensitive).
pub fn is_json(content_type: &str) -> bool {
    essence(content_type).eq_ignore_ascii_case(JSON)
}

/// The encoding kube-apiserver answers a single object in for this `Accept` value, as its
/// `NegotiateOutputMediaType` picks it: clauses by descending `q` (a specific type before a
/// wildcard at equal `q`, otherwise in the order given), the first one the server offers wins;
/// `*/*` and `application/*` mean JSON, the server's first choice. A clause with `q=0` or with an
/// `as=` transformation (`as=Table`, `as=PartialObjectMetadata`) does not ask for a plain object,
/// and media types Outpost does not write (YAML, CBOR) are passed over. An empty `Accept` means
/// JSON; `None` when no clause is acceptable (kube-apiserver's 406).
pub fn negotiate(accept: &str) -> Option<Encoding> {
    if accept.trim().is_empty() {
        return Some(Encoding::Json);
    }
    let mut clauses: Vec<(f32, u8, Option<Encoding>)> = accept
        .split(',')
        .filter_map(|clause| {
            let mut parts = clause.split(';');
            let media = parts.next().unwrap_or("").trim().to_ascii_lowercase();
            let mut q = 1.0f32;
            for param in parts {
                let (key, value) = param.split_once('=').unwrap_or((param, ""));
                match key.trim() {
                    "q" => q = value.trim().parse().unwrap_or(0.0),
                    "as" => return None,
                    _ => {}
                }
            }
            let (encoding, wildcards) = match media.as_str() {
                PROTOBUF => (Some(Encoding::Protobuf), 0),
                JSON => (Some(Encoding::Json), 0),
                "application/*" => (Some(Encoding::Json), 1),
                "*/*" => (Some(Encoding::Json), 2),
                _ => (None, 0),
            };
            (q > 0.0).then_some((q, wildcards, encoding))
        })
        .collect();
    // Stable: clauses of equal weight keep the client's order.
    clauses.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    clauses.into_iter().find_map(|(_, _, encoding)| encoding)
}

/// Whether kube-apiserver would answer this `Accept` value in protobuf.
pub fn prefers_protobuf(accept: &str) -> bool {
    negotiate(accept) == Some(Encoding::Protobuf)
}

/// Why a request body could not be read.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    #[error("the body is not valid JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error(transparent)]
    Protobuf(#[from] ProtobufError),
    #[error("the body's content type {0:?} is neither {JSON} nor {PROTOBUF}")]
    UnsupportedMediaType(String),
}

impl BodyError {
    /// The body's encoding (or kind) is one Outpost cannot read, rather than a malformed body:
    /// kube-apiserver answers the first 415 UnsupportedMediaType and the second 400 BadRequest.
    pub fn is_unsupported(&self) -> bool {
        match self {
            BodyError::UnsupportedMediaType(_) => true,
            BodyError::Protobuf(e) => e.is_unsupported(),
            BodyError::Json(_) => false,
        }
    }
}

/// Reads a request or response body as JSON, whatever it was sent in: JSON, or Kubernetes
/// protobuf of a kind [`protobuf::is_supported`] lists. No `Content-Type` means JSON, as
/// kube-apiserver assumes.
pub fn read_body(content_type: Option<&str>, body: &[u8]) -> Result<Value, BodyError> {
    let content_type = content_type.unwrap_or("");
    if essence(content_type).is_empty() || is_json(content_type) {
        Ok(serde_json::from_slice(body)?)
    } else if is_protobuf(content_type) {
        Ok(protobuf::decode_object(body)?)
    } else {
        Err(BodyError::UnsupportedMediaType(content_type.to_owned()))
    }
}

/// Writes an object (with `apiVersion` and `kind`) in `encoding`; its `Content-Type` is
/// [`Encoding::content_type`].
pub fn write_body(object: &Value, encoding: Encoding) -> Result<Vec<u8>, ProtobufError> {
    match encoding {
        Encoding::Json => Ok(serde_json::to_vec(object).unwrap_or_default()),
        Encoding::Protobuf => protobuf::encode_object(object),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn media_types_ignore_parameters_and_case() {
        assert!(is_protobuf("application/vnd.kubernetes.protobuf"));
        assert!(is_protobuf(
            " Application/VND.Kubernetes.Protobuf ; stream=watch"
        ));
        assert!(!is_protobuf("application/json"));
        assert!(is_json("application/json; charset=utf-8"));
        assert!(!is_json("application/merge-patch+json"));
    }

    #[test]
    fn negotiation_follows_the_apiserver() {
        let cases = [
            (
                "application/vnd.kubernetes.protobuf,application/json",
                Some(Encoding::Protobuf),
            ),
            (
                "application/vnd.kubernetes.protobuf, application/json",
                Some(Encoding::Protobuf),
            ),
            (
                "application/json,application/vnd.kubernetes.protobuf",
                Some(Encoding::Json),
            ),
            (
                "application/vnd.kubernetes.protobuf;q=0.5,application/json",
                Some(Encoding::Json),
            ),
            (
                "application/json;q=0.9,application/vnd.kubernetes.protobuf",
                Some(Encoding::Protobuf),
            ),
            (
                "*/*,application/vnd.kubernetes.protobuf",
                Some(Encoding::Protobuf),
            ),
            ("*/*", Some(Encoding::Json)),
            ("application/*", Some(Encoding::Json)),
            ("", Some(Encoding::Json)),
            (
                "application/vnd.kubernetes.protobuf;q=0,application/json",
                Some(Encoding::Json),
            ),
            (
                "application/json;as=Table;v=v1;g=meta.k8s.io,application/json",
                Some(Encoding::Json),
            ),
            (
                "application/vnd.kubernetes.protobuf;as=Table;v=v1;g=meta.k8s.io",
                None,
            ),
            ("text/html,application/xhtml+xml", None),
            (
                "application/yaml,application/vnd.kubernetes.protobuf",
                Some(Encoding::Protobuf),
            ),
        ];
        for (accept, want) in cases {
            assert_eq!(negotiate(accept), want, "{accept}");
        }
        assert!(prefers_protobuf(
            "application/vnd.kubernetes.protobuf,application/json"
        ));
        assert!(!prefers_protobuf("application/json"));
    }

    #[test]
    fn bodies_are_read_from_either_encoding() {
        let lease = json!({"kind": "Lease", "apiVersion": "coordination.k8s.io/v1",
            "metadata": {"name": "n1", "namespace": "kube-node-lease", "creationTimestamp": null},
            "spec": {"holderIdentity": "n1", "leaseDurationSeconds": 40,
                     "renewTime": "2026-11-23T19:44:21.123456Z"}});
        let pb = write_body(&lease, Encoding::Protobuf).unwrap();
        assert_eq!(read_body(Some(PROTOBUF), &pb).unwrap(), lease);
        let js = write_body(&lease, Encoding::Json).unwrap();
        assert_eq!(read_body(Some("application/json"), &js).unwrap(), lease);
        assert_eq!(read_body(None, &js).unwrap(), lease);

        let not_json = read_body(Some(JSON), &pb).unwrap_err();
        assert!(matches!(not_json, BodyError::Json(_)) && !not_json.is_unsupported());
        let not_pb = read_body(Some(PROTOBUF), &js).unwrap_err();
        assert!(matches!(
            not_pb,
            BodyError::Protobuf(ProtobufError::NoMagic)
        ));
        assert!(!not_pb.is_unsupported());
        let yaml = read_body(Some("application/yaml"), b"kind: Lease").unwrap_err();
        assert!(matches!(yaml, BodyError::UnsupportedMediaType(_)) && yaml.is_unsupported());
    }
}
