//! Building HTTP responses: JSON objects, plain text, and `Status` errors with the extras
//! (`details.causes`, `metadata.continue`, `Retry-After`) some real apiserver errors carry.

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use http_body::Body as _;
use http_body_util::{BodyExt, BodyStream, Full, StreamBody, combinators::BoxBody};
use outpost_core::{Reason, Status};
use serde_json::{Value, json};

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
pub type Body = BoxBody<Bytes, BoxError>;

/// A Status plus the optional fields `outpost_core::Status` does not model.
#[derive(Debug, Clone)]
pub struct ApiError {
    /// Boxed: errors travel through many `Result`s and should stay small.
    pub status: Box<Status>,
    /// `details.causes` entries: (reason, message, field).
    pub causes: Vec<(String, String, String)>,
    /// `metadata.continue`, set on a 410 for an expired continue token.
    pub continue_token: Option<String>,
}

impl From<Status> for ApiError {
    fn from(status: Status) -> Self {
        ApiError {
            status: Box::new(status),
            causes: Vec::new(),
            continue_token: None,
        }
    }
}

impl ApiError {
    pub fn with_cause(mut self, reason: &str, message: &str, field: &str) -> Self {
        self.causes
            .push((reason.into(), message.into(), field.into()));
        self
    }

    pub fn to_value(&self) -> Value {
        let mut v = self.status.to_value();
        if !self.causes.is_empty() {
            let causes: Vec<Value> = self
                .causes
                .iter()
                .map(|(reason, message, field)| {
                    let mut c = json!({"reason": reason, "message": message});
                    if !field.is_empty() {
                        c["field"] = field.clone().into();
                    }
                    c
                })
                .collect();
            if !v["details"].is_object() {
                v["details"] = json!({});
            }
            v["details"]["causes"] = causes.into();
        }
        if let Some(token) = &self.continue_token {
            v["metadata"]["continue"] = token.clone().into();
        }
        v
    }
}

pub fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed()
}

/// `resp` framed as kube-apiserver's answers are: net/http declares the length of a body that
/// fits its first buffer and of no larger one (kube-apiserver's `SerializeObject` never sets
/// `Content-Length`), so a large answer goes out chunked over HTTP/1.1, undeclared over HTTP/2.
pub fn framed_as_apiserver(resp: Response<Body>) -> Response<Body> {
    let declared = resp.headers().contains_key(header::CONTENT_LENGTH);
    let large = resp
        .body()
        .size_hint()
        .exact()
        .is_some_and(|len| len > DECLARED_UP_TO);
    if declared || !large {
        return resp;
    }
    // Its frames as they come, with no size to declare.
    resp.map(|body| StreamBody::new(BodyStream::new(body)).boxed())
}

/// net/http's first buffer: HTTP/2's handler chunk (HTTP/1.1's is smaller still, 2 KiB).
const DECLARED_UP_TO: u64 = 4 << 10;

pub fn json_response(code: u16, value: &Value) -> Response<Body> {
    let body = serde_json::to_vec(value).unwrap_or_default();
    with_type(code, "application/json", body)
}

pub fn text_response(code: u16, text: &str) -> Response<Body> {
    with_type(code, "text/plain; charset=utf-8", text.as_bytes().to_vec())
}

fn with_type(code: u16, content_type: &'static str, body: Vec<u8>) -> Response<Body> {
    let mut resp = Response::new(full(body));
    *resp.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let headers = resp.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(
        "X-Content-Type-Options",
        HeaderValue::from_static("nosniff"),
    );
    resp
}

pub fn error_response(err: &ApiError) -> Response<Body> {
    let mut resp = json_response(err.status.code, &err.to_value());
    if let Some(secs) = err.status.retry_after_seconds
        && let Ok(v) = HeaderValue::from_str(&secs.to_string())
    {
        resp.headers_mut().insert(header::RETRY_AFTER, v);
    }
    resp
}

/// The NotFoundHandler's answer for paths nothing serves.
pub fn path_not_found() -> ApiError {
    Status::new(
        Reason::NotFound,
        "the server could not find the requested resource",
    )
    .into()
}

pub fn method_not_allowed() -> ApiError {
    Status::new(
        Reason::MethodNotAllowed,
        "the server does not allow this method on the requested resource",
    )
    .into()
}

/// The Status an injected failure answers with, worded like the apiserver's own; a 429 or 503
/// asks to be retried after `retry_after` seconds.
pub fn injected_failure(code: u16, retry_after: u32) -> ApiError {
    let (reason, message) = match code {
        429 => (
            Reason::TooManyRequests,
            "Too many requests, please try again later.",
        ),
        500 => (
            Reason::InternalError,
            "Internal error occurred: injected failure",
        ),
        503 => (
            Reason::ServiceUnavailable,
            "the server is currently unable to handle the request",
        ),
        504 => (
            Reason::Timeout,
            "the server was unable to return a response in the time allotted, but may still be processing the request",
        ),
        401 => (Reason::Unauthorized, "Unauthorized"),
        403 => (Reason::Forbidden, "forbidden: injected failure"),
        404 => (
            Reason::NotFound,
            "the server could not find the requested resource",
        ),
        409 => (Reason::Conflict, "injected conflict"),
        _ => (Reason::InternalError, "injected failure"),
    };
    let mut status = Status::new(reason, message).with_code(code);
    if matches!(code, 429 | 503) {
        status = status.with_retry_after(retry_after);
    }
    status.into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn causes_and_continue_are_rendered() {
        let err = ApiError::from(Status::expired("old")).with_cause(
            "ResourceVersionTooLarge",
            "Too large resource version",
            "",
        );
        let mut err = err;
        err.continue_token = Some("abc".into());
        let v = err.to_value();
        assert_eq!(
            v["details"]["causes"][0]["reason"],
            "ResourceVersionTooLarge"
        );
        assert!(v["details"]["causes"][0].get("field").is_none());
        assert_eq!(v["metadata"]["continue"], "abc");
    }

    #[test]
    fn injected_503_has_retry_after() {
        let resp = error_response(&injected_failure(503, 1));
        assert_eq!(resp.status(), 503);
        assert_eq!(resp.headers()[header::RETRY_AFTER], "1");
    }
}
