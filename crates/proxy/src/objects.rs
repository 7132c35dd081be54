//! Kubernetes objects the hub itself reads from request bodies and writes in its answers, in
//! JSON or protobuf ([`outpost_core::wire`]): kubelet writes protobuf and prefers it back.
//!
//! Only the few requests the hub answers locally go through here (kubelet's lease, its
//! registration, TokenRequests, pod status, events); everything else streams through untouched.

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{HeaderMap, Response, StatusCode};
use http_body_util::BodyExt;
use outpost_core::wire::{self, Encoding};
use outpost_core::{Reason, Status};
use serde_json::{Map, Value, json};

use crate::body::{self, ProxyBody};
use crate::error::ProxyError;

/// A request body the hub reads: its bytes as sent (to send them on unchanged) and the object.
pub struct RequestObject {
    pub bytes: Bytes,
    pub object: Value,
}

/// Reads a request body of at most `limit` bytes as a Kubernetes object, whatever it was sent
/// in. A body the hub cannot read is answered as kube-apiserver would: 415 for an encoding (or
/// a protobuf kind) it does not know, 400 for a malformed one, 413 when too large.
pub async fn read_request(
    headers: &HeaderMap,
    body: ProxyBody,
    limit: usize,
) -> Result<RequestObject, ProxyError> {
    let bytes = read_bytes(body, limit).await?;
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok());
    let object = parse(content_type, &bytes)?;
    Ok(RequestObject { bytes, object })
}

/// A body of at most `limit` bytes, whole. (Read frame by frame rather than through
/// `http_body_util::Limited`, whose error conversion trips the compiler's `Send` check of the
/// request future.)
pub async fn read_bytes(mut body: ProxyBody, limit: usize) -> Result<Bytes, ProxyError> {
    let mut pieces = bytes::BytesMut::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| {
            ProxyError::InvalidRequest(format!("the request body could not be read: {e}"))
        })?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        if pieces.len() + data.len() > limit {
            return Err(ProxyError::Local(Status::new(
                Reason::RequestEntityTooLarge,
                format!("the request body is larger than the {limit} bytes the hub reads"),
            )));
        }
        pieces.extend_from_slice(&data);
    }
    Ok(pieces.freeze())
}

/// A body in `content_type` as JSON.
pub fn parse(content_type: Option<&str>, bytes: &[u8]) -> Result<Value, ProxyError> {
    wire::read_body(content_type, bytes).map_err(|e| {
        let reason = if e.is_unsupported() {
            Reason::UnsupportedMediaType
        } else {
            Reason::BadRequest
        };
        ProxyError::Local(Status::new(reason, format!("the request body: {e}")))
    })
}

/// The encoding to answer a client in, from its `Accept` (kube-apiserver's negotiation).
pub fn encoding_for(headers: &HeaderMap) -> Encoding {
    let accept = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    wire::negotiate(accept).unwrap_or(Encoding::Json)
}

/// `object` as an answer with `code`, in the encoding the client prefers (JSON where the kind
/// has no protobuf form here), marked as answered by the hub (`served_from`).
pub fn answer(
    code: StatusCode,
    object: &Value,
    encoding: Encoding,
    served_from: &'static str,
) -> Response<ProxyBody> {
    let (bytes, encoding) = match wire::write_body(object, encoding) {
        Ok(bytes) => (bytes, encoding),
        Err(_) => (object.to_string().into_bytes(), Encoding::Json),
    };
    let mut resp = Response::new(body::full(bytes));
    *resp.status_mut() = code;
    let headers = resp.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(encoding.content_type()),
    );
    headers.insert(
        crate::headers::SERVED_FROM,
        HeaderValue::from_static(served_from),
    );
    resp
}

/// Applies a strategic merge patch, the subset kubelet's status patches use: maps merge,
/// `null` deletes, a list whose `merge_key` is known merges item by item on that key (an item
/// with `$patch: delete` removes its match), other lists are replaced, and the other
/// `$`-directives (`$setElementOrder/…`, `$retainKeys`) are dropped.
pub fn strategic_merge(
    target: &mut Value,
    patch: &Value,
    merge_key: fn(&str) -> Option<&'static str>,
) {
    let Some(patch) = patch.as_object() else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let target = target.as_object_mut().expect("made an object above");
    for (key, value) in patch {
        if key.starts_with('$') {
            continue;
        }
        match (value, merge_key(key)) {
            (Value::Null, _) => {
                target.shift_remove(key);
            }
            (Value::Array(items), Some(by)) => {
                let list = target.entry(key.clone()).or_insert_with(|| json!([]));
                merge_by_key(list, items, by, merge_key);
            }
            (Value::Object(_), _) => strategic_merge(
                target.entry(key.clone()).or_insert(Value::Null),
                value,
                merge_key,
            ),
            (other, _) => {
                target.insert(key.clone(), other.clone());
            }
        }
    }
}

fn merge_by_key(
    list: &mut Value,
    items: &[Value],
    by: &str,
    merge_key: fn(&str) -> Option<&'static str>,
) {
    if !list.is_array() {
        *list = json!([]);
    }
    let list = list.as_array_mut().expect("made an array above");
    for item in items {
        if item.get("$patch").and_then(Value::as_str) == Some("delete") {
            list.retain(|existing| existing[by] != item[by]);
            continue;
        }
        match list.iter_mut().find(|existing| existing[by] == item[by]) {
            Some(existing) => strategic_merge(existing, item, merge_key),
            None => {
                let mut fresh = Value::Null;
                strategic_merge(&mut fresh, item, merge_key);
                list.push(fresh);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unreadable_bodies_are_answered_as_kube_apiserver_does() {
        let code = |content_type: &str, body: &[u8]| match parse(Some(content_type), body) {
            Err(e) => e.into_status().code,
            Ok(_) => 200,
        };
        assert_eq!(code("application/json", b"{}"), 200);
        assert_eq!(code("application/json", b"{"), 400);
        assert_eq!(code("application/yaml", b"a: 1"), 415);
        assert_eq!(code(wire::PROTOBUF, b"k8s\0garbage"), 400);
        assert_eq!(code(wire::PROTOBUF, b"not even the magic"), 400);
    }

    #[test]
    fn answers_follow_the_clients_preference() {
        let lease = serde_json::json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": "n", "namespace": "kube-node-lease"}});
        let mut headers = HeaderMap::new();
        headers.insert(
            header::ACCEPT,
            HeaderValue::from_static("application/vnd.kubernetes.protobuf,application/json"),
        );
        let resp = answer(StatusCode::OK, &lease, encoding_for(&headers), "test");
        assert_eq!(resp.headers()[header::CONTENT_TYPE], wire::PROTOBUF);
        let status = serde_json::json!({"kind": "NotAKind", "apiVersion": "v1"});
        let resp = answer(StatusCode::OK, &status, Encoding::Protobuf, "test");
        assert_eq!(
            resp.headers()[header::CONTENT_TYPE],
            "application/json",
            "a kind without a protobuf form here is answered in JSON"
        );
    }
}
