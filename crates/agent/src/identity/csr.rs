//! CertificateSigningRequests: the object, its submission, and the wait until it is issued, over
//! a [`CsrTransport`]. The running hub sends them as itself ([`Upstream`]): the serving
//! certificate ([`crate::identity::serving_cert`]) and, in token mode, the renewed client certificate; the
//! first client certificate of token mode goes with the bootstrap token ([`crate::identity::bootstrap`]).
//! All of them are obtained through [`request`].

use std::time::{Duration, Instant};

use base64::Engine;
use http::{Method, StatusCode};
use serde_json::{Value, json};
use tracing::{info, warn};

use outpost_proxy::error::BoxError;
use outpost_proxy::upstream::{OwnCall, Upstream};

pub(crate) const CSR_PATH: &str = "/apis/certificates.k8s.io/v1/certificatesigningrequests";
const USER_AGENT: &str = "outpost/certificates";
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
const POLL_INTERVAL: Duration = Duration::from_secs(1);
/// How often a request that nobody approves is mentioned in the log.
const PENDING_REMINDER: Duration = Duration::from_secs(60);

/// A CertificateSigningRequest object for `signer`, named by the apiserver.
pub(crate) fn signing_request(csr_pem: &str, signer: &str, usages: &[&str]) -> Value {
    json!({
        "apiVersion": "certificates.k8s.io/v1",
        "kind": "CertificateSigningRequest",
        "metadata": {"generateName": "csr-"},
        "spec": {
            "request": base64::engine::general_purpose::STANDARD.encode(csr_pem),
            "signerName": signer,
            "usages": usages,
        },
    })
}

/// How CSR calls reach an apiserver.
pub(crate) trait CsrTransport {
    /// One call; the answer's status and body, or why there is none.
    async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<(StatusCode, bytes::Bytes), BoxError>;
}

/// Why a certificate was not obtained.
#[derive(Debug, thiserror::Error)]
pub enum CsrError {
    /// The call that submits the request failed.
    #[error("{0}")]
    Call(#[source] BoxError),
    #[error("creating the CSR: {code}: {reply}")]
    Create { code: StatusCode, reply: String },
    #[error("creating the CSR: unreadable answer: {0}")]
    CreateUnreadable(#[source] serde_json::Error),
    #[error("creating the CSR: the answer has no name")]
    NoName,
    #[error("{name}: unreadable CSR: {source}")]
    Unreadable {
        name: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("{name}: {why}")]
    NotIssued {
        name: String,
        #[source]
        why: NotIssued,
    },
    #[error("{name}: the CSR was deleted before it was issued")]
    Deleted { name: String },
    #[error("{name} ({problem}) was not issued in time: {APPROVE_IT}")]
    NotInTime { name: String, problem: String },
}

/// Why a CSR that is no longer pending carries no certificate.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotIssued {
    /// `Denied` or `Failed`, with the condition's message.
    #[error("{kind}: {message}")]
    Refused { kind: String, message: String },
    #[error("status.certificate is not base64 PEM")]
    NotPem,
}

/// The running hub, as itself, to a healthy server.
impl CsrTransport for Upstream {
    async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<(StatusCode, bytes::Bytes), BoxError> {
        let call = OwnCall {
            method,
            path,
            user_agent: USER_AGENT,
            body: body.map(|b| ("application/json", b)),
            timeout: CALL_TIMEOUT,
        };
        Ok(self.own_call_any(call).await?)
    }
}

/// Sends `object` and polls it until it carries a certificate, or says it never will; returns
/// the CSR's name and the certificate PEM. `purpose` names the certificate in the log. Without
/// a `deadline` it waits as long as it takes (the hub runs meanwhile); with one it gives up then.
pub(crate) async fn request(
    transport: &impl CsrTransport,
    object: Value,
    purpose: &str,
    deadline: Option<Instant>,
) -> Result<(String, String), CsrError> {
    let name = submit(transport, object).await?;
    info!(csr = %name, purpose, "certificate requested; waiting for approval");
    let path = format!("{CSR_PATH}/{name}");
    let mut reminded = Instant::now();
    loop {
        // Read failures (the cloud gone for a while) are only reported with the reminder.
        let problem = match transport.call(Method::GET, &path, None).await {
            Ok((StatusCode::OK, body)) => {
                let csr: Value =
                    serde_json::from_slice(&body).map_err(|source| CsrError::Unreadable {
                        name: name.clone(),
                        source,
                    })?;
                if let Some(outcome) = issued(&csr) {
                    return outcome.map(|pem| (name.clone(), pem)).map_err(|why| {
                        CsrError::NotIssued {
                            name: name.clone(),
                            why,
                        }
                    });
                }
                "pending approval".to_owned()
            }
            Ok((StatusCode::NOT_FOUND, _)) => {
                return Err(CsrError::Deleted { name });
            }
            Ok((code, _)) => format!("reading it answered {code}"),
            Err(e) => format!("cannot read it: {e}"),
        };
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Err(CsrError::NotInTime { name, problem });
        }
        if reminded.elapsed() >= PENDING_REMINDER {
            warn!(
                csr = name,
                purpose, problem, "certificate still not issued: {APPROVE_IT}"
            );
            reminded = Instant::now();
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

const APPROVE_IT: &str = "approve the CSR (yurt-manager's csrapprover does in OpenYurt clusters)";

async fn submit(transport: &impl CsrTransport, object: Value) -> Result<String, CsrError> {
    let (code, reply) = transport
        .call(Method::POST, CSR_PATH, Some(object))
        .await
        .map_err(CsrError::Call)?;
    if code != StatusCode::CREATED && code != StatusCode::OK {
        return Err(CsrError::Create {
            code,
            reply: String::from_utf8_lossy(&reply).into_owned(),
        });
    }
    let created: Value = serde_json::from_slice(&reply).map_err(CsrError::CreateUnreadable)?;
    created
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .map(str::to_owned)
        .ok_or(CsrError::NoName)
}

/// `None` while pending; the PEM once issued; why not, once denied or failed.
pub(crate) fn issued(csr: &Value) -> Option<Result<String, NotIssued>> {
    let conditions = csr
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    for condition in conditions {
        let kind = condition["type"].as_str().unwrap_or_default();
        if matches!(kind, "Denied" | "Failed") && condition["status"] != "False" {
            let message = condition["message"].as_str().unwrap_or_default();
            return Some(Err(NotIssued::Refused {
                kind: kind.to_owned(),
                message: message.to_owned(),
            }));
        }
    }
    let encoded = csr.pointer("/status/certificate")?.as_str()?;
    Some(
        base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .ok()
            .and_then(|pem| String::from_utf8(pem).ok())
            .ok_or(NotIssued::NotPem),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pending_csr_is_waited_for() {
        assert!(issued(&json!({"status": {}})).is_none());
        let approved = json!({"status": {"conditions": [{"type": "Approved", "status": "True"}]}});
        assert!(issued(&approved).is_none());
    }

    #[test]
    fn an_issued_csr_yields_its_pem_and_a_denied_one_its_reason() {
        let pem = "-----BEGIN CERTIFICATE-----\nAA==\n-----END CERTIFICATE-----\n";
        let encoded = base64::engine::general_purpose::STANDARD.encode(pem);
        let done = json!({"status": {"certificate": encoded, "conditions": [{"type": "Approved", "status": "True"}]}});
        assert_eq!(issued(&done), Some(Ok(pem.to_owned())));
        let denied = json!({"status": {"conditions": [{"type": "Denied", "status": "True", "message": "not yours"}]}});
        assert_eq!(
            issued(&denied).map(|r| r.map_err(|e| e.to_string())),
            Some(Err("Denied: not yours".to_owned()))
        );
        let garbled = json!({"status": {"certificate": "%%%"}});
        assert!(matches!(issued(&garbled), Some(Err(_))));
    }
    /// Answers the POST with a name, then each GET with the next scripted answer (the last
    /// repeats).
    struct Scripted {
        reads: std::sync::Mutex<Vec<Result<(StatusCode, Value), String>>>,
    }

    impl Scripted {
        fn new(reads: Vec<Result<(StatusCode, Value), String>>) -> Scripted {
            Scripted {
                reads: std::sync::Mutex::new(reads),
            }
        }
    }

    impl CsrTransport for Scripted {
        async fn call(
            &self,
            method: Method,
            path: &str,
            _body: Option<Value>,
        ) -> Result<(StatusCode, bytes::Bytes), BoxError> {
            if method == Method::POST {
                assert_eq!(path, CSR_PATH);
                let created = json!({"metadata": {"name": "csr-1"}});
                return Ok((StatusCode::CREATED, created.to_string().into()));
            }
            assert_eq!(path, format!("{CSR_PATH}/csr-1"));
            let mut reads = self.reads.lock().unwrap();
            let next = if reads.len() > 1 {
                reads.remove(0)
            } else {
                reads[0].clone()
            };
            next.map(|(code, body)| (code, body.to_string().into()))
                .map_err(Into::into)
        }
    }

    fn pending() -> Result<(StatusCode, Value), String> {
        Ok((StatusCode::OK, json!({"status": {}})))
    }

    #[tokio::test]
    async fn a_failed_read_is_tried_again_until_the_certificate_is_issued() {
        let pem = "-----BEGIN CERTIFICATE-----\nAA==\n-----END CERTIFICATE-----\n";
        let encoded = base64::engine::general_purpose::STANDARD.encode(pem);
        let done = json!({"status": {"certificate": encoded}});
        let transport = Scripted::new(vec![
            Err("connection refused".into()),
            Ok((StatusCode::OK, done)),
        ]);
        let issued = request(&transport, json!({}), "test", None).await;
        assert_eq!(
            issued.map_err(|e| e.to_string()),
            Ok(("csr-1".to_owned(), pem.to_owned()))
        );
    }

    #[tokio::test]
    async fn with_a_deadline_the_wait_ends_then_and_says_why() {
        let transport = Scripted::new(vec![pending()]);
        let err = request(&transport, json!({}), "test", Some(Instant::now()))
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("csr-1"), "{err}");
        assert!(err.contains("pending approval"), "{err}");
        assert!(err.contains("approve the CSR"), "{err}");

        let transport = Scripted::new(vec![Ok((StatusCode::NOT_FOUND, json!({})))]);
        let err = request(&transport, json!({}), "test", None)
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("deleted before it was issued"), "{err}");
    }
}
