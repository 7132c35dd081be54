//! Kubernetes protobuf, as kube-apiserver speaks it to kubelet and client-go's typed clients.
//!
//! - Request bodies ([`decode_body`]): a POST/PUT/DELETE body sent as
//!   `application/vnd.kubernetes.protobuf` is converted to JSON by `outpost_core::wire` and then
//!   handled like a JSON one. A well-formed body of a kind the conversion does not know is 415
//!   UnsupportedMediaType (where a JSON-only fake has to stop); a malformed one is 400
//!   BadRequest, as kube-apiserver answers an object it cannot decode.
//! - Answers ([`wants_protobuf`], [`encode_answer`]): when the request's `Accept` prefers
//!   protobuf, a single object of a kind the conversion knows (GET/POST/PUT/PATCH/DELETE
//!   answers, TokenRequest, and every error `Status`) is written in protobuf.
//!
//! Lists and watch streams stay JSON: kube-apiserver's protobuf lists and its length-prefixed
//! watch framing are not implemented. Clients decode by the answer's `Content-Type`, as
//! client-go does; a client that accepts protobuf only is answered 406 for those
//! ([`check_accept`]).

use bytes::Bytes;
use http::{HeaderValue, Response, header};
use http_body_util::BodyExt;
use outpost_core::wire::{self, Encoding, protobuf};
use outpost_core::{Reason, Status};
use serde_json::Value;

use crate::reply::{self, ApiError, Body};
use crate::resources;
use crate::router::Info;

/// A protobuf request body as the JSON bytes the handlers read.
pub fn decode_body(info: &Info, body: &[u8]) -> Result<Bytes, ApiError> {
    match protobuf::decode_object(body) {
        Ok(object) => Ok(Bytes::from(object.to_string())),
        Err(e) if e.is_unsupported() => Err(unsupported_body(wire::PROTOBUF, &e.to_string())),
        Err(e) => Err(Status::bad_request(format!(
            "the object provided is unrecognized (must be of type {}): {e}",
            expected_kind(info)
        ))
        .into()),
    }
}

/// kube-apiserver's 415 for a body it cannot decode in the media type it came in.
pub fn unsupported_body(media: &str, why: &str) -> ApiError {
    Status::new(
        Reason::UnsupportedMediaType,
        format!(
            "the body of the request was in an unknown format - accepted media types include: \
             application/json, application/vnd.kubernetes.protobuf ({media}: {why})"
        ),
    )
    .into()
}

/// The kind a write to this path carries.
fn expected_kind(info: &Info) -> &'static str {
    match (info.verb.as_str(), info.subresource.as_str()) {
        ("delete" | "deletecollection", _) => "DeleteOptions",
        (_, "token") => "TokenRequest",
        _ => resources::find(&info.api_group, &info.api_version, &info.resource)
            .map_or("unknown", |def| def.kind),
    }
}

/// The `apiVersion` and kind a successful answer to this request carries (lists are none).
fn answer_kind(info: &Info) -> Option<(String, &'static str)> {
    if matches!(info.verb.as_str(), "list" | "watch" | "deletecollection") {
        return None;
    }
    if info.subresource == "token" {
        return Some(("authentication.k8s.io/v1".into(), "TokenRequest"));
    }
    let def = resources::find(&info.api_group, &info.api_version, &info.resource)?;
    Some((def.api_version(), def.kind))
}

/// Whether the answer to this request is written in protobuf (see the module doc).
pub fn wants_protobuf(info: &Info, accept: Option<&str>) -> bool {
    info.verb != "watch" && accept.is_some_and(wire::prefers_protobuf)
}

/// 406 when no answer this request can get is acceptable: neither JSON nor protobuf, or
/// protobuf only for a list, a watch or a kind the fake cannot write in protobuf.
pub fn check_accept(info: &Info, accept: Option<&str>) -> Result<(), ApiError> {
    let Some(accept) = accept else {
        return Ok(());
    };
    let json_acceptable = accept
        .split(',')
        .any(|clause| wire::negotiate(clause) == Some(Encoding::Json));
    let protobuf_answer = wire::prefers_protobuf(accept)
        && answer_kind(info).is_some_and(|(version, kind)| protobuf::is_supported(&version, kind));
    if json_acceptable || protobuf_answer {
        return Ok(());
    }
    Err(Status::new(
        Reason::NotAcceptable,
        "only the following media types are accepted: application/json, \
         application/vnd.kubernetes.protobuf",
    )
    .into())
}

/// Rewrites a JSON answer in protobuf when its object is of a kind the conversion knows; any
/// other answer (a list, a Table, plain text, a stream) is returned as it was.
pub async fn encode_answer(resp: Response<Body>) -> Response<Body> {
    let is_json = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(wire::is_json);
    if !is_json {
        return resp;
    }
    let (mut parts, body) = resp.into_parts();
    let bytes = match body.collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(_) => return Response::from_parts(parts, reply::full(Bytes::new())),
    };
    let encoded = serde_json::from_slice::<Value>(&bytes)
        .ok()
        .and_then(|object| protobuf::encode_object(&object).ok());
    let Some(encoded) = encoded else {
        return Response::from_parts(parts, reply::full(bytes));
    };
    parts.headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(wire::PROTOBUF),
    );
    parts.headers.remove(header::CONTENT_LENGTH);
    Response::from_parts(parts, reply::full(encoded))
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Method;

    fn info(method: Method, path: &str) -> Info {
        Info::classify(&method, path, "")
    }

    #[test]
    fn accept_is_checked_against_what_the_fake_can_write() {
        let get_node = info(Method::GET, "/api/v1/nodes/n1");
        let list_nodes = info(Method::GET, "/api/v1/nodes");
        let get_pod = info(Method::GET, "/api/v1/namespaces/default/pods/p");
        let token = info(
            Method::POST,
            "/api/v1/namespaces/default/serviceaccounts/sa/token",
        );
        let kubelet = Some("application/vnd.kubernetes.protobuf,application/json");
        let protobuf_only = Some("application/vnd.kubernetes.protobuf");
        for i in [&get_node, &list_nodes, &get_pod, &token] {
            assert!(check_accept(i, None).is_ok());
            assert!(check_accept(i, kubelet).is_ok());
        }
        assert!(check_accept(&get_node, protobuf_only).is_ok());
        assert!(check_accept(&token, protobuf_only).is_ok());
        assert_eq!(
            check_accept(&list_nodes, protobuf_only)
                .unwrap_err()
                .status
                .code,
            406
        );
        assert_eq!(
            check_accept(&get_pod, protobuf_only)
                .unwrap_err()
                .status
                .code,
            406
        );
        assert!(check_accept(&get_node, Some("text/html")).is_err());
    }

    #[test]
    fn watches_are_never_answered_in_protobuf() {
        let kubelet = Some("application/vnd.kubernetes.protobuf,application/json");
        let watch = Info::classify(&Method::GET, "/api/v1/pods", "watch=true");
        assert!(!wants_protobuf(&watch, kubelet));
        assert!(wants_protobuf(
            &info(Method::GET, "/api/v1/nodes/n1"),
            kubelet
        ));
        assert!(!wants_protobuf(
            &info(Method::GET, "/api/v1/nodes/n1"),
            None
        ));
    }
}
