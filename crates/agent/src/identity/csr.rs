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

use outpost_proxy::upstream::{OwnCall, OwnCallError, Upstream};

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
    ) -> Result<(StatusCode, bytes::Bytes), String>;
}

/// The running hub, as itself, to a healthy server.
impl CsrTransport for Upstream {
    async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<(StatusCode, bytes::Bytes), String> {
        let call = OwnCall {
            method,
            path,
            user_agent: USER_AGENT,
            body: body.map(|b| ("application/json", b)),
            timeout: CALL_TIMEOUT,
        };
        self.own_call_any(call).await.map_err(|e| match e {
            OwnCallError::Offline => "no healthy apiserver".to_owned(),
            OwnCallError::Failed(e) => e,
        })
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
) -> Result<(String, String), String> {
    let name = submit(transport, object).await?;
    info!(csr = %name, purpose, "certificate requested; waiting for approval");
    let path = format!("{CSR_PATH}/{name}");
    let mut reminded = Instant::now();
    loop {
        // Read failures (the cloud gone for a while) are only reported with the reminder.
        let problem = match transport.call(Method::GET, &path, None).await {
            Ok((StatusCode::OK, body)) => {
                let csr: Value = serde_json::from_slice(&body)
                    .map_err(|e| format!("{name}: unreadable CSR: {e}"))?;
                if let Some(outcome) = issued(&csr) {
                    return outcome
                        .map(|pem| (name.clone(), pem))
                        .map_err(|why| format!("{name}: {why}"));
                }
                "pending approval".to_owned()
            }
            Ok((StatusCode::NOT_FOUND, _)) => {
                return Err(format!("{name}: the CSR was deleted before it was issued"));
            }
            Ok((code, _)) => format!("reading it answered {code}"),
            Err(e) => format!("cannot read it: {e}"),
        };
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Err(format!(
                "{name} ({problem}) was not issued in time: {APPROVE_IT}"
            ));
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

async fn submit(transport: &impl CsrTransport, object: Value) -> Result<String, String> {
    let (code, reply) = transport.call(Method::POST, CSR_PATH, Some(object)).await?;
    if code != StatusCode::CREATED && code != StatusCode::OK {
        return Err(format!(
            "creating the CSR: {code}: {}",
            String::from_utf8_lossy(&reply)
        ));
    }
    let created: Value = serde_json::from_slice(&reply)
        .map_err(|e| format!("creating the CSR: unreadable answer: {e}"))?;
    created
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .map(str::to_owned)
        .ok_or_else(|| "creating the CSR: the answer has no name".to_owned())
}

/// `None` while pending; the PEM once issued; why not, once denied or failed.
pub(crate) fn issued(csr: &Value) -> Option<Result<String, String>> {
    let conditions = csr
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    for condition in conditions {
        let kind = condition["type"].as_str().unwrap_or_default();
        if matches!(kind, "Denied" | "Failed") && condition["status"] != "False" {
            let message = condition["message"].as_str().unwrap_or_default();
            return Some(Err(format!("{kind}: {message}")));
        }
    }
    let encoded = csr.pointer("/status/certificate")?.as_str()?;
    Some(
        base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .ok()
            .and_then(|pem| String::from_utf8(pem).ok())
            .ok_or_else(|| "status.certificate is not base64 PEM".to_owned()),
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
        assert_eq!(issued(&denied), Some(Err("Denied: not yours".to_owned())));
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
        ) -> Result<(StatusCode, bytes::Bytes), String> {
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
        assert_eq!(issued, Ok(("csr-1".to_owned(), pem.to_owned())));
    }

    #[tokio::test]
    async fn with_a_deadline_the_wait_ends_then_and_says_why() {
        let transport = Scripted::new(vec![pending()]);
        let err = request(&transport, json!({}), "test", Some(Instant::now()))
            .await
            .unwrap_err();
        assert!(err.contains("csr-1"), "{err}");
        assert!(err.contains("pending approval"), "{err}");
        assert!(err.contains("approve the CSR"), "{err}");

        let transport = Scripted::new(vec![Ok((StatusCode::NOT_FOUND, json!({})))]);
        let err = request(&transport, json!({}), "test", None)
            .await
            .unwrap_err();
        assert!(err.contains("deleted before it was issued"), "{err}");
    }
}
