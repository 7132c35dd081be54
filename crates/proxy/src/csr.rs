//! CertificateSigningRequests the running hub sends as itself: the object, its submission, and
//! the wait until it is issued. The serving certificate ([`crate::serving_cert`]) and, in token
//! mode, the renewed client certificate ([`crate::bootstrap`]) are both obtained through
//! [`request`].

use std::time::{Duration, Instant};

use base64::Engine;
use http::{Method, StatusCode};
use serde_json::{Value, json};
use tracing::{info, warn};

use crate::upstream::{OwnCall, OwnCallError, Upstream};

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

/// Sends `object` and polls it until it carries a certificate, or says it never will; returns
/// the CSR's name and the certificate PEM. `purpose` names the certificate in the log.
pub(crate) async fn request(
    upstream: &Upstream,
    object: Value,
    purpose: &str,
) -> Result<(String, String), String> {
    let name = submit(upstream, object).await?;
    info!(csr = %name, purpose, "certificate requested; waiting for approval");
    let path = format!("{CSR_PATH}/{name}");
    let mut reminded = Instant::now();
    loop {
        // Read failures (the cloud gone for a while) are only reported with the reminder.
        let problem = match call(upstream, Method::GET, &path, None).await {
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
        if reminded.elapsed() >= PENDING_REMINDER {
            warn!(
                csr = name,
                purpose,
                problem,
                "certificate still not issued: approve the CSR (yurt-manager's csrapprover does in OpenYurt clusters)"
            );
            reminded = Instant::now();
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

async fn submit(upstream: &Upstream, object: Value) -> Result<String, String> {
    let (code, reply) = call(upstream, Method::POST, CSR_PATH, Some(object)).await?;
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

/// One request as the hub, to a healthy server.
pub(crate) async fn call(
    upstream: &Upstream,
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
    upstream.own_call_any(call).await.map_err(|e| match e {
        OwnCallError::Offline => "no healthy apiserver".to_owned(),
        OwnCallError::Failed(e) => e,
    })
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
}
