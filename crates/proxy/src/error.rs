//! The proxy's error type and the one place errors become responses.
//!
//! Every failure a client can see goes through [`ProxyError::into_status`], so the mapping from
//! cause to HTTP code lives here and nowhere else: malformed request → 400, no upstream reachable →
//! 503, upstream too slow → 504, upstream answered with something that is not HTTP → 502.

use std::time::Duration;

use outpost_core::{ClassifyError, Status};

/// Which side of the proxy failed; decides the status code and whether a retry elsewhere may help.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    /// The client's request is not something kube-apiserver would accept.
    #[error("malformed request: {0}")]
    BadRequest(#[from] ClassifyError),
    /// The request could not be turned into an upstream request (e.g. an unusable path).
    #[error("malformed request: {0}")]
    InvalidRequest(String),
    /// No TCP or TLS connection to any upstream could be made.
    #[error("no apiserver reachable ({server}): {cause}")]
    Unreachable { server: String, cause: String },
    /// The upstream did not answer within the deadline.
    #[error("apiserver {server} did not answer within {after:?}")]
    Timeout { server: String, after: Duration },
    /// The upstream sent something that is not a valid HTTP response.
    #[error("bad reply from apiserver {server}: {cause}")]
    BadReply { server: String, cause: String },
    /// No upstream is configured (cannot happen after flag validation, kept for totality).
    #[error("no apiserver configured")]
    NoUpstream,
}

impl ProxyError {
    /// The Kubernetes Status a client receives for this error.
    pub fn into_status(self) -> Status {
        let message = self.to_string();
        match self {
            ProxyError::BadRequest(_) | ProxyError::InvalidRequest(_) => {
                Status::bad_request(message)
            }
            ProxyError::Unreachable { .. } | ProxyError::NoUpstream => {
                Status::service_unavailable(message)
            }
            ProxyError::Timeout { .. } => Status::gateway_timeout(message),
            ProxyError::BadReply { .. } => Status::bad_gateway(message),
        }
    }

    /// Short label for the `outpost_upstream_errors_total{kind}` metric.
    pub fn kind(&self) -> &'static str {
        match self {
            ProxyError::BadRequest(_) | ProxyError::InvalidRequest(_) => "bad_request",
            ProxyError::Unreachable { .. } | ProxyError::NoUpstream => "unreachable",
            ProxyError::Timeout { .. } => "timeout",
            ProxyError::BadReply { .. } => "bad_reply",
        }
    }

    /// Whether the failure is on the upstream side (as opposed to the client's request).
    pub fn is_upstream(&self) -> bool {
        !matches!(
            self,
            ProxyError::BadRequest(_) | ProxyError::InvalidRequest(_)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_mapped_in_one_place() {
        let cases = [
            (ProxyError::InvalidRequest("x".into()), 400),
            (
                ProxyError::Unreachable {
                    server: "s".into(),
                    cause: "refused".into(),
                },
                503,
            ),
            (
                ProxyError::Timeout {
                    server: "s".into(),
                    after: Duration::from_secs(1),
                },
                504,
            ),
            (
                ProxyError::BadReply {
                    server: "s".into(),
                    cause: "garbage".into(),
                },
                502,
            ),
            (ProxyError::NoUpstream, 503),
        ];
        for (err, code) in cases {
            let status = err.into_status();
            assert_eq!(status.code, code, "{status:?}");
            assert!(!status.message.is_empty());
        }
    }
}
