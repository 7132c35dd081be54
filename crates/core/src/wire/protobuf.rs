//! Kubernetes protobuf bodies: the envelope and whole objects.
//!
//! A body is the 4-byte magic `k8s\0` followed by a `runtime.Unknown` message: `typeMeta`
//! (`apiVersion`, `kind`), `raw` (the object, encoded with the kind's `generated.proto`),
//! `contentEncoding` and `contentType` (both empty as kube-apiserver and client-go write them).
//! Start at [`decode_object`] and [`encode_object`]: they turn a body into the JSON
//! kube-apiserver would write for the same object (with `kind` and `apiVersion`) and back, for
//! the kinds [`is_supported`] lists; [`decode_envelope`] / [`encode_envelope`] handle the
//! envelope alone.
//!
//! Fields come from k8s-pb's prost types (Kubernetes 1.34's protos): a field a newer
//! kube-apiserver writes that those types lack is skipped when decoding, as an older Go
//! apiserver skips it. Lists and watch events are not converted.

use k8s_pb::apimachinery::pkg::runtime::{TypeMeta, Unknown};
use prost::Message;
use serde_json::{Map, Value};

use super::convert::FieldError;
use super::kinds::{self, Decode};

/// The magic bytes every Kubernetes protobuf body starts with.
pub const MAGIC: &[u8; 4] = b"k8s\0";

/// Why a protobuf body could not be read or an object not written.
#[derive(Debug, thiserror::Error)]
pub enum ProtobufError {
    #[error("not a Kubernetes protobuf body: it does not start with the magic bytes k8s\\0")]
    NoMagic,
    #[error("malformed protobuf {part}: {source}")]
    Malformed {
        /// `envelope` (the `runtime.Unknown`) or the kind whose message failed.
        part: String,
        #[source]
        source: prost::DecodeError,
    },
    #[error("the object names no kind or no apiVersion")]
    MissingTypeMeta,
    #[error("protobuf content encoding {0:?} is not supported")]
    ContentEncoding(String),
    #[error("no protobuf conversion for kind {kind:?} of apiVersion {api_version:?}")]
    UnsupportedKind { api_version: String, kind: String },
    #[error("{kind}: {source}")]
    Field {
        kind: String,
        #[source]
        source: FieldError,
    },
}

impl ProtobufError {
    /// A well-formed body Outpost cannot convert (kube-apiserver's 415 UnsupportedMediaType),
    /// rather than a malformed one (400 BadRequest).
    pub fn is_unsupported(&self) -> bool {
        matches!(
            self,
            ProtobufError::UnsupportedKind { .. } | ProtobufError::ContentEncoding(_)
        )
    }
}

/// A body's envelope: which object it carries, and the object's protobuf bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Envelope {
    pub api_version: String,
    pub kind: String,
    pub raw: Vec<u8>,
}

/// Reads the magic and the `runtime.Unknown` envelope. `contentType` is ignored, as Go's
/// decoder ignores it.
pub fn decode_envelope(body: &[u8]) -> Result<Envelope, ProtobufError> {
    let message = body.strip_prefix(MAGIC).ok_or(ProtobufError::NoMagic)?;
    let unknown = Unknown::decode(message).map_err(|source| ProtobufError::Malformed {
        part: "envelope".into(),
        source,
    })?;
    let encoding = unknown.content_encoding.unwrap_or_default();
    if !encoding.is_empty() {
        return Err(ProtobufError::ContentEncoding(encoding));
    }
    let type_meta = unknown.type_meta.unwrap_or_default();
    let api_version = type_meta.api_version.unwrap_or_default();
    let kind = type_meta.kind.unwrap_or_default();
    if api_version.is_empty() || kind.is_empty() {
        return Err(ProtobufError::MissingTypeMeta);
    }
    Ok(Envelope {
        api_version,
        kind,
        raw: unknown.raw.unwrap_or_default(),
    })
}

/// The body for an object's protobuf bytes, byte for byte as Go's serializer writes it.
pub fn encode_envelope(api_version: &str, kind: &str, raw: &[u8]) -> Vec<u8> {
    let unknown = Unknown {
        type_meta: Some(TypeMeta {
            api_version: Some(api_version.to_owned()),
            kind: Some(kind.to_owned()),
        }),
        raw: Some(raw.to_vec()),
        content_encoding: Some(String::new()),
        content_type: Some(String::new()),
    };
    let mut body = MAGIC.to_vec();
    body.extend(unknown.encode_to_vec());
    body
}

/// Whether [`decode_object`] and [`encode_object`] convert this kind: `coordination.k8s.io/v1`
/// `Lease`, `v1` `Node`, `Event`, `ConfigMap`, `Secret`, `Namespace`, `ServiceAccount`,
/// `authentication.k8s.io/v1` `TokenRequest`, `storage.k8s.io/v1` `CSINode`, and `Status` and
/// `DeleteOptions` of any apiVersion.
pub fn is_supported(api_version: &str, kind: &str) -> bool {
    kinds::find(api_version, kind).is_some()
}

/// A protobuf body as the JSON object kube-apiserver writes for it, `kind` and `apiVersion`
/// first (from the envelope).
pub fn decode_object(body: &[u8]) -> Result<Value, ProtobufError> {
    let envelope = decode_envelope(body)?;
    let Envelope {
        api_version,
        kind,
        raw,
    } = envelope;
    let codec = kinds::find(&api_version, &kind).ok_or_else(|| ProtobufError::UnsupportedKind {
        api_version: api_version.clone(),
        kind: kind.clone(),
    })?;
    let fields = (codec.to_json)(&raw).map_err(|e| match e {
        Decode::Protobuf(source) => ProtobufError::Malformed {
            part: kind.clone(),
            source,
        },
        Decode::Field(source) => ProtobufError::Field {
            kind: kind.clone(),
            source,
        },
    })?;
    let mut object = Map::new();
    object.insert("kind".into(), kind.into());
    object.insert("apiVersion".into(), api_version.into());
    if let Value::Object(fields) = fields {
        object.extend(fields);
    }
    Ok(Value::Object(object))
}

/// A JSON object (with `kind` and `apiVersion`) as a protobuf body. Fields the kind does not
/// have are ignored, as Go's JSON decoder ignores them.
pub fn encode_object(object: &Value) -> Result<Vec<u8>, ProtobufError> {
    let text = |key: &str| object.get(key).and_then(Value::as_str).unwrap_or("");
    let (api_version, kind) = (text("apiVersion"), text("kind"));
    if api_version.is_empty() || kind.is_empty() {
        return Err(ProtobufError::MissingTypeMeta);
    }
    let codec = kinds::find(api_version, kind).ok_or_else(|| ProtobufError::UnsupportedKind {
        api_version: api_version.to_owned(),
        kind: kind.to_owned(),
    })?;
    let raw = (codec.from_json)(object).map_err(|source| ProtobufError::Field {
        kind: kind.to_owned(),
        source,
    })?;
    Ok(encode_envelope(api_version, kind, &raw))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node_status_403() -> Value {
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
               "message": "nodes \"n2\" is forbidden: node \"n1\" cannot modify node \"n2\"",
               "reason": "Forbidden",
               "details": {"name": "n2", "kind": "nodes"}, "code": 403})
    }

    #[test]
    fn the_envelope_round_trips() {
        let body = encode_envelope("v1", "Node", b"\x0a\x00");
        assert!(body.starts_with(MAGIC));
        let envelope = decode_envelope(&body).unwrap();
        assert_eq!(
            envelope,
            Envelope {
                api_version: "v1".into(),
                kind: "Node".into(),
                raw: b"\x0a\x00".to_vec()
            }
        );
    }

    #[test]
    fn objects_round_trip_through_protobuf() {
        let status = node_status_403();
        let body = encode_object(&status).unwrap();
        assert_eq!(decode_object(&body).unwrap(), status);
        // kind and apiVersion come first, as kube-apiserver writes them.
        let text = serde_json::to_string(&decode_object(&body).unwrap()).unwrap();
        assert!(text.starts_with(r#"{"kind":"Status","apiVersion":"v1","metadata":{}"#));
    }

    #[test]
    fn bad_bodies_get_typed_errors() {
        assert!(matches!(decode_object(b"{}"), Err(ProtobufError::NoMagic)));
        assert!(matches!(
            decode_object(b"k8s\0\x0a\xff"),
            Err(ProtobufError::Malformed { .. })
        ));
        let pod = encode_envelope("v1", "Pod", b"");
        let err = decode_object(&pod).unwrap_err();
        assert!(matches!(err, ProtobufError::UnsupportedKind { .. }));
        assert!(err.is_unsupported());
        assert!(matches!(
            decode_object(&encode_envelope("", "Node", b"")),
            Err(ProtobufError::MissingTypeMeta)
        ));
        // A field of the wrong wire type inside the object: malformed, naming the kind.
        let err = decode_object(&encode_envelope("v1", "Node", b"\x0a\x05ab")).unwrap_err();
        assert!(matches!(&err, ProtobufError::Malformed { part, .. } if part == "Node"));
        assert!(!err.is_unsupported());

        let mut gzip = Unknown::decode(&encode_envelope("v1", "Node", b"")[4..]).unwrap();
        gzip.content_encoding = Some("gzip".into());
        let mut body = MAGIC.to_vec();
        body.extend(gzip.encode_to_vec());
        assert!(matches!(
            decode_object(&body),
            Err(ProtobufError::ContentEncoding(e)) if e == "gzip"
        ));
    }

    #[test]
    fn json_that_does_not_fit_is_refused() {
        assert!(matches!(
            encode_object(&json!({"metadata": {}})),
            Err(ProtobufError::MissingTypeMeta)
        ));
        assert!(matches!(
            encode_object(&json!({"kind": "Pod", "apiVersion": "v1"})),
            Err(ProtobufError::UnsupportedKind { .. })
        ));
        let err = encode_object(&json!({"kind": "Node", "apiVersion": "v1",
            "spec": {"taints": [{"key": "k", "timeAdded": "soon"}]}}))
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "Node: spec.taints[0].timeAdded: not an RFC 3339 time: \"soon\""
        );
    }

    #[test]
    fn status_and_delete_options_take_any_api_version() {
        assert!(is_supported("v1", "Status"));
        assert!(is_supported("meta.k8s.io/v1", "DeleteOptions"));
        assert!(is_supported("coordination.k8s.io/v1", "Lease"));
        assert!(!is_supported("coordination.k8s.io/v1beta1", "Lease"));
    }
}
