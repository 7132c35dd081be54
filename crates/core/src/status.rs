//! Kubernetes `metav1.Status` bodies.
//!
//! Every error response Outpost (and the test apiserver) produces is one of these, so clients such
//! as kubelet, client-go, kube-rs and kubectl see the same shape a real kube-apiserver sends: a
//! `Failure` status with a machine-readable `reason`, a human `message` and the HTTP `code`.

use serde::Serialize;
use serde_json::json;

/// The `reason` field: a machine-readable cause, as in `k8s.io/apimachinery/pkg/apis/meta/v1`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Reason {
    BadRequest,
    Unauthorized,
    Forbidden,
    NotFound,
    AlreadyExists,
    Conflict,
    Gone,
    Expired,
    Invalid,
    MethodNotAllowed,
    NotAcceptable,
    UnsupportedMediaType,
    RequestEntityTooLarge,
    Timeout,
    ServerTimeout,
    TooManyRequests,
    InternalError,
    ServiceUnavailable,
}

impl Reason {
    /// The HTTP status code kube-apiserver pairs with this reason.
    pub fn default_code(self) -> u16 {
        match self {
            Reason::BadRequest => 400,
            Reason::Unauthorized => 401,
            Reason::Forbidden => 403,
            Reason::NotFound => 404,
            Reason::MethodNotAllowed => 405,
            Reason::NotAcceptable => 406,
            Reason::AlreadyExists | Reason::Conflict => 409,
            Reason::Gone | Reason::Expired => 410,
            Reason::RequestEntityTooLarge => 413,
            Reason::UnsupportedMediaType => 415,
            Reason::Invalid => 422,
            Reason::TooManyRequests => 429,
            Reason::InternalError => 500,
            Reason::ServiceUnavailable => 503,
            Reason::Timeout | Reason::ServerTimeout => 504,
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            Reason::BadRequest => "BadRequest",
            Reason::Unauthorized => "Unauthorized",
            Reason::Forbidden => "Forbidden",
            Reason::NotFound => "NotFound",
            Reason::AlreadyExists => "AlreadyExists",
            Reason::Conflict => "Conflict",
            Reason::Gone => "Gone",
            Reason::Expired => "Expired",
            Reason::Invalid => "Invalid",
            Reason::MethodNotAllowed => "MethodNotAllowed",
            Reason::NotAcceptable => "NotAcceptable",
            Reason::UnsupportedMediaType => "UnsupportedMediaType",
            Reason::RequestEntityTooLarge => "RequestEntityTooLarge",
            Reason::Timeout => "Timeout",
            Reason::ServerTimeout => "ServerTimeout",
            Reason::TooManyRequests => "TooManyRequests",
            Reason::InternalError => "InternalError",
            Reason::ServiceUnavailable => "ServiceUnavailable",
        }
    }
}

/// Which object a Status is about (`details`), when there is one.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Details {
    pub name: String,
    pub group: String,
    /// The resource (plural, lower case), which is what kube-apiserver puts in `details.kind`.
    pub kind: String,
}

/// A `Failure` Status. Build one with the constructors, send it with [`Status::to_json`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    pub code: u16,
    pub reason: Reason,
    pub message: String,
    pub details: Option<Details>,
    /// `Retry-After` in seconds; also emitted as `details.retryAfterSeconds`.
    pub retry_after_seconds: Option<u32>,
}

impl Status {
    pub fn new(reason: Reason, message: impl Into<String>) -> Self {
        Status {
            code: reason.default_code(),
            reason,
            message: message.into(),
            details: None,
            retry_after_seconds: None,
        }
    }

    /// Overrides the HTTP code (e.g. 502 with reason `InternalError`).
    pub fn with_code(mut self, code: u16) -> Self {
        self.code = code;
        self
    }

    pub fn with_details(mut self, group: &str, resource: &str, name: &str) -> Self {
        self.details = Some(Details {
            name: name.to_owned(),
            group: group.to_owned(),
            kind: resource.to_owned(),
        });
        self
    }

    pub fn with_retry_after(mut self, seconds: u32) -> Self {
        self.retry_after_seconds = Some(seconds);
        self
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Status::new(Reason::BadRequest, message)
    }

    /// `pods "p1" not found`, exactly as kube-apiserver words it.
    pub fn not_found(group: &str, resource: &str, name: &str) -> Self {
        Status::new(
            Reason::NotFound,
            format!("{} \"{name}\" not found", qualified(group, resource)),
        )
        .with_details(group, resource, name)
    }

    pub fn already_exists(group: &str, resource: &str, name: &str) -> Self {
        Status::new(
            Reason::AlreadyExists,
            format!("{} \"{name}\" already exists", qualified(group, resource)),
        )
        .with_details(group, resource, name)
    }

    /// The optimistic-concurrency conflict of an update with a stale resourceVersion.
    pub fn conflict(group: &str, resource: &str, name: &str) -> Self {
        Status::new(
            Reason::Conflict,
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": the object has been modified; \
                 please apply your changes to the latest version and try again",
                qualified(group, resource)
            ),
        )
        .with_details(group, resource, name)
    }

    /// A watch or continue token older than what the server still remembers.
    pub fn expired(message: impl Into<String>) -> Self {
        Status::new(Reason::Expired, message)
    }

    pub fn forbidden(message: impl Into<String>) -> Self {
        Status::new(Reason::Forbidden, message)
    }

    pub fn service_unavailable(message: impl Into<String>) -> Self {
        Status::new(Reason::ServiceUnavailable, message)
    }

    pub fn gateway_timeout(message: impl Into<String>) -> Self {
        Status::new(Reason::Timeout, message)
    }

    /// The upstream answered with something that is not valid HTTP.
    pub fn bad_gateway(message: impl Into<String>) -> Self {
        Status::new(Reason::InternalError, message).with_code(502)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Status::new(Reason::InternalError, message)
    }

    /// The JSON object, for embedding in a watch `ERROR` event.
    pub fn to_value(&self) -> serde_json::Value {
        let mut v = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason.as_str(),
            "code": self.code,
        });
        let mut details = serde_json::Map::new();
        if let Some(d) = &self.details {
            if !d.name.is_empty() {
                details.insert("name".into(), d.name.clone().into());
            }
            if !d.group.is_empty() {
                details.insert("group".into(), d.group.clone().into());
            }
            if !d.kind.is_empty() {
                details.insert("kind".into(), d.kind.clone().into());
            }
        }
        if let Some(s) = self.retry_after_seconds {
            details.insert("retryAfterSeconds".into(), s.into());
        }
        if !details.is_empty() {
            v["details"] = details.into();
        }
        v
    }

    pub fn to_json(&self) -> Vec<u8> {
        // Serialising a Value built from strings and integers cannot fail.
        serde_json::to_vec(&self.to_value()).unwrap_or_default()
    }
}

/// `pods` for the core group, `leases.coordination.k8s.io` otherwise.
fn qualified(group: &str, resource: &str) -> String {
    if group.is_empty() {
        resource.to_owned()
    } else {
        format!("{resource}.{group}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn not_found_matches_apiserver_wording() {
        let s = Status::not_found("", "pods", "p1");
        let v = s.to_value();
        assert_eq!(v["message"], "pods \"p1\" not found");
        assert_eq!(v["reason"], "NotFound");
        assert_eq!(v["code"], 404);
        assert_eq!(v["details"]["kind"], "pods");
        assert_eq!(v["status"], "Failure");
    }

    #[test]
    fn group_qualifies_resource() {
        let s = Status::conflict("coordination.k8s.io", "leases", "n1");
        assert!(
            s.message
                .starts_with("Operation cannot be fulfilled on leases.coordination.k8s.io \"n1\"")
        );
        assert_eq!(s.code, 409);
    }

    #[test]
    fn bad_gateway_is_502_internal_error() {
        let v = Status::bad_gateway("x").to_value();
        assert_eq!(v["code"], 502);
        assert_eq!(v["reason"], "InternalError");
        assert!(v.get("details").is_none());
    }

    #[test]
    fn retry_after_goes_into_details() {
        let v = Status::service_unavailable("x")
            .with_retry_after(1)
            .to_value();
        assert_eq!(v["details"]["retryAfterSeconds"], 1);
    }
}
