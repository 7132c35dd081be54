//! The controllers a real cluster runs for CertificateSigningRequests, as one task:
//! OpenYurt yurt-manager's `csrapprover` (auto-approves node serving certificates and yurthub
//! client certificates, ignores everything else) and kube-controller-manager's `csrsigning`
//! (signs approved requests for the `kubernetes.io/*` signers with the cluster CA after the
//! signer's own checks, or marks them `Failed`).
//!
//! The task wakes on CSR writes, waits [`REACTION`] as an informer-driven controller would, and
//! writes through `Store::mutate`, so watchers see each step (approval, then certificate) as a
//! MODIFIED event with its own resourceVersion. [`CsrSigning`] picks which controllers run.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Value, json};
use tokio::task::JoinHandle;

use crate::csr::{
    self, APPROVED, FAILED, KUBE_APISERVER_CLIENT, KUBE_APISERVER_CLIENT_KUBELET, KUBELET_SERVING,
    Request,
};
use crate::pki::TestPki;
use crate::resources::{ResourceDef, find};
use crate::server::CsrSigning;
use crate::state::Shared;
use crate::store::{EventType, Mutation, Store};

/// How long after a change the controllers act on it.
pub const REACTION: Duration = Duration::from_millis(20);
/// kube-controller-manager's default `--cluster-signing-duration`.
const MAX_VALIDITY: Duration = Duration::from_secs(365 * 24 * 3600);
/// The shortest `expirationSeconds` a signer honours.
const MIN_VALIDITY: Duration = Duration::from_secs(600);

const DIGITAL_SIGNATURE: &str = "digital signature";
const KEY_ENCIPHERMENT: &str = "key encipherment";
const SERVER_AUTH: &str = "server auth";
const CLIENT_AUTH: &str = "client auth";

fn csr_def() -> &'static ResourceDef {
    find(csr::GROUP, "v1", csr::RESOURCE).expect("CSRs are registered")
}

/// Starts the controllers `FakeConfig::csr_signing` asks for; `None` when there are none.
pub fn spawn(shared: Arc<Shared>, pki: Arc<TestPki>) -> Option<JoinHandle<()>> {
    (shared.config.csr_signing != CsrSigning::Off).then(|| tokio::spawn(run(shared, pki)))
}

async fn run(shared: Arc<Shared>, pki: Arc<TestPki>) {
    let def = csr_def();
    let mut changes = shared.store.subscribe();
    let mut seen = 0;
    loop {
        let keys = changed_keys(&shared.store, def, &mut seen);
        if keys.is_empty() {
            if changes.changed().await.is_err() {
                return;
            }
            continue;
        }
        tokio::time::sleep(REACTION).await;
        for key in keys {
            reconcile(&shared, &pki, def, &key);
        }
    }
}

/// Keys of CSRs written since `seen` (all of them if the event log no longer reaches back).
fn changed_keys(store: &Store, def: &'static ResourceDef, seen: &mut u64) -> Vec<String> {
    let mut keys: Vec<String> = match store.events_since(def, *seen) {
        Ok((events, rv)) => {
            *seen = rv;
            events
                .iter()
                .filter(|e| e.kind != EventType::Deleted)
                .map(|e| e.key.clone())
                .collect()
        }
        Err(_) => {
            let (rv, items) = store.list(def, "");
            *seen = rv;
            items.into_iter().map(|(k, _)| k).collect()
        }
    };
    keys.sort();
    keys.dedup();
    keys
}

/// One CSR as the controllers read it.
struct Csr {
    uid: String,
    signer: String,
    usages: Vec<String>,
    expiration: Option<u64>,
    pem: String,
    request: Request,
}

impl Csr {
    fn read(obj: &Value) -> Option<Csr> {
        let pem = csr::bytes_at(obj, "/spec/request").ok()?;
        let request = csr::parse_request(&pem).ok()?;
        Some(Csr {
            uid: csr::str_at(obj, "/metadata/uid").to_owned(),
            signer: csr::str_at(obj, "/spec/signerName").to_owned(),
            usages: csr::strings_at(obj, "/spec/usages"),
            expiration: obj
                .pointer("/spec/expirationSeconds")
                .and_then(Value::as_u64),
            pem: String::from_utf8_lossy(&pem).into_owned(),
            request,
        })
    }

    fn validity(&self) -> Duration {
        self.expiration
            .map_or(MAX_VALIDITY, Duration::from_secs)
            .clamp(MIN_VALIDITY, MAX_VALIDITY)
    }
}

fn reconcile(shared: &Shared, pki: &TestPki, def: &'static ResourceDef, key: &str) {
    let Some(obj) = shared.store.get(def, key) else {
        return;
    };
    let Some(c) = Csr::read(&obj) else {
        return;
    };
    let decided = csr::is_approved(&obj) || csr::is_denied(&obj);
    if !decided {
        if shared.config.csr_signing == CsrSigning::ApproveAndSign
            && let Some(message) = recognize(&c)
        {
            let approval = csr::condition(APPROVED, "AutoApproved", message);
            write_status(&shared.store, def, key, &c.uid, |s| {
                push_condition(s, approval)
            });
        }
        return;
    }
    let signed = obj
        .pointer("/status/certificate")
        .is_some_and(|v| !v.is_null());
    if csr::is_denied(&obj) || csr::is_failed(&obj) || signed {
        return;
    }
    match signer_check(&c) {
        None => {}
        Some(Ok(())) => sign(shared, pki, def, key, &c),
        Some(Err(message)) => {
            let failed = csr::condition(FAILED, "SignerValidationFailure", &message);
            write_status(&shared.store, def, key, &c.uid, |s| {
                push_condition(s, failed)
            });
        }
    }
}

fn sign(shared: &Shared, pki: &TestPki, def: &'static ResourceDef, key: &str, c: &Csr) {
    let usages: Vec<&str> = c.usages.iter().map(String::as_str).collect();
    let result = pki.sign_csr_with_usages(&c.pem, &usages, c.validity());
    write_status(&shared.store, def, key, &c.uid, |status| match result {
        Ok(cert) => status["certificate"] = STANDARD.encode(cert).into(),
        Err(e) => push_condition(
            status,
            csr::condition(FAILED, "SigningError", &e.to_string()),
        ),
    });
}

fn push_condition(status: &mut Value, condition: Value) {
    match status.get_mut("conditions").and_then(Value::as_array_mut) {
        Some(list) => list.push(condition),
        None => status["conditions"] = json!([condition]),
    }
}

/// A status write, as a controller's `UpdateStatus` / `UpdateApproval`: applied only if the CSR
/// is still the one that was read (same uid), so a recreated CSR is not touched.
fn write_status(
    store: &Store,
    def: &'static ResourceDef,
    key: &str,
    uid: &str,
    change: impl FnOnce(&mut Value),
) {
    let _ = store.mutate(def, key, |current, _| {
        let Some(cur) = current.filter(|c| csr::str_at(c, "/metadata/uid") == uid) else {
            return Ok(Mutation::Noop);
        };
        let mut next = cur.clone();
        if !next.get("status").is_some_and(Value::is_object) {
            next["status"] = json!({});
        }
        change(&mut next["status"]);
        Ok(Mutation::Put(next))
    });
}

// ---- yurt-manager's csrapprover ------------------------------------------------------------

/// The approver's recognizers: `Some(message)` approves, `None` leaves the CSR pending.
fn recognize(c: &Csr) -> Option<&'static str> {
    let node_cn = c.request.common_name.starts_with("system:node:");
    let orgs = &c.request.organizations;
    match c.signer.as_str() {
        KUBELET_SERVING
            if node_cn
                && orgs == &["system:nodes"]
                && usages_fit(
                    &c.usages,
                    &[DIGITAL_SIGNATURE, SERVER_AUTH],
                    &[KEY_ENCIPHERMENT],
                ) =>
        {
            Some("Auto approving node serving certificate")
        }
        // `isYurtHubNodeCert`: the usages as a set must be exactly `clientRequiredUsages`.
        KUBE_APISERVER_CLIENT
            if node_cn
                && yurthub_orgs(orgs)
                && usages_fit(
                    &c.usages,
                    &[DIGITAL_SIGNATURE, KEY_ENCIPHERMENT, CLIENT_AUTH],
                    &[],
                ) =>
        {
            Some("Auto approving yurthub client certificate")
        }
        _ => None,
    }
}

/// yurthub's client certificate: `openyurt:yurthub`, `system:nodes` and tenant groups only.
fn yurthub_orgs(orgs: &[String]) -> bool {
    orgs.len() >= 2
        && orgs.iter().all(|o| {
            matches!(o.as_str(), "openyurt:yurthub" | "system:nodes")
                || o.starts_with("openyurt:tenant:")
        })
}

/// Every required usage is present and nothing beyond the optional ones.
fn usages_fit(usages: &[String], required: &[&str], optional: &[&str]) -> bool {
    required.iter().all(|r| usages.iter().any(|u| u == r))
        && usages
            .iter()
            .all(|u| required.contains(&u.as_str()) || optional.contains(&u.as_str()))
}

// ---- kube-controller-manager's signers -----------------------------------------------------

/// The signer's own checks: `None` for signers it does not serve (the CSR stays approved and
/// unsigned), else whether it may issue.
fn signer_check(c: &Csr) -> Option<Result<(), String>> {
    match c.signer.as_str() {
        KUBELET_SERVING => Some(kubelet_serving(&c.request, &c.usages)),
        KUBE_APISERVER_CLIENT_KUBELET => Some(kubelet_client(&c.request, &c.usages)),
        KUBE_APISERVER_CLIENT => Some(api_server_client_usages(&c.usages)),
        _ => None,
    }
}

const NOT_SYSTEM_NODES: &str = "subject organization is not system:nodes";
const NOT_A_NODE: &str = "subject common name does not begin with system:node:";

/// `ValidateKubeletServingCSR`.
fn kubelet_serving(r: &Request, usages: &[String]) -> Result<(), String> {
    if r.organizations != ["system:nodes"] {
        return Err(NOT_SYSTEM_NODES.into());
    }
    if r.dns_names.is_empty() && r.ip_addresses.is_empty() {
        return Err("DNS or IP subjectAltName is required".into());
    }
    if !r.emails.is_empty() {
        return Err("Email subjectAltNames are not allowed".into());
    }
    if !r.uris.is_empty() {
        return Err("URI subjectAltNames are not allowed".into());
    }
    if !usages_fit(
        usages,
        &[DIGITAL_SIGNATURE, SERVER_AUTH],
        &[KEY_ENCIPHERMENT],
    ) {
        return Err("usages did not match [digital signature key encipherment server auth]".into());
    }
    if !r.common_name.starts_with("system:node:") {
        return Err(NOT_A_NODE.into());
    }
    Ok(())
}

/// `ValidateKubeletClientCSR`.
fn kubelet_client(r: &Request, usages: &[String]) -> Result<(), String> {
    if r.organizations != ["system:nodes"] {
        return Err(NOT_SYSTEM_NODES.into());
    }
    let sans = [
        (r.dns_names.is_empty(), "DNS"),
        (r.emails.is_empty(), "Email"),
        (r.ip_addresses.is_empty(), "IP"),
        (r.uris.is_empty(), "URI"),
    ];
    if let Some((_, kind)) = sans.iter().find(|(empty, _)| !empty) {
        return Err(format!("{kind} subjectAltNames are not allowed"));
    }
    if !r.common_name.starts_with("system:node:") {
        return Err(NOT_A_NODE.into());
    }
    if !usages_fit(
        usages,
        &[DIGITAL_SIGNATURE, CLIENT_AUTH],
        &[KEY_ENCIPHERMENT],
    ) {
        return Err("usages did not match [client auth digital signature key encipherment]".into());
    }
    Ok(())
}

/// `validAPIServerClientUsages`.
fn api_server_client_usages(usages: &[String]) -> Result<(), String> {
    if let Some(bad) = usages
        .iter()
        .find(|u| ![DIGITAL_SIGNATURE, KEY_ENCIPHERMENT, CLIENT_AUTH].contains(&u.as_str()))
    {
        return Err(format!("invalid usage for client certificate: {bad}"));
    }
    if !usages.iter().any(|u| u == CLIENT_AUTH) {
        return Err(format!(
            "missing required usage for client certificate: {CLIENT_AUTH}"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(cn: &str, orgs: &[&str], dns: &[&str]) -> Request {
        Request {
            common_name: cn.into(),
            organizations: orgs.iter().map(|s| s.to_string()).collect(),
            dns_names: dns.iter().map(|s| s.to_string()).collect(),
            ip_addresses: Vec::new(),
            emails: Vec::new(),
            uris: Vec::new(),
        }
    }

    fn csr(signer: &str, r: Request, usages: &[&str]) -> Csr {
        Csr {
            uid: String::new(),
            signer: signer.into(),
            usages: usages.iter().map(|s| s.to_string()).collect(),
            expiration: None,
            pem: String::new(),
            request: r,
        }
    }

    #[test]
    fn approver_recognizes_node_serving_and_yurthub_client_requests() {
        let node = |orgs: &[&str]| request("system:node:n", orgs, &["n"]);
        let serving = [DIGITAL_SIGNATURE, SERVER_AUTH];
        assert!(recognize(&csr(KUBELET_SERVING, node(&["system:nodes"]), &serving)).is_some());
        let with_rsa = [KEY_ENCIPHERMENT, DIGITAL_SIGNATURE, SERVER_AUTH];
        assert!(recognize(&csr(KUBELET_SERVING, node(&["system:nodes"]), &with_rsa)).is_some());
        assert!(recognize(&csr(KUBELET_SERVING, node(&["acme"]), &serving)).is_none());
        let client = [DIGITAL_SIGNATURE, CLIENT_AUTH];
        assert!(recognize(&csr(KUBELET_SERVING, node(&["system:nodes"]), &client)).is_none());
        let other = request("alice", &["system:nodes"], &["n"]);
        assert!(recognize(&csr(KUBELET_SERVING, other, &serving)).is_none());
        let hub = node(&["openyurt:yurthub", "system:nodes", "openyurt:tenant:t1"]);
        let hub_client = [KEY_ENCIPHERMENT, DIGITAL_SIGNATURE, CLIENT_AUTH];
        assert!(recognize(&csr(KUBE_APISERVER_CLIENT, hub.clone(), &hub_client)).is_some());
        // yurt-manager wants all three client usages, key encipherment included.
        assert!(recognize(&csr(KUBE_APISERVER_CLIENT, hub.clone(), &client)).is_none());
        let more = [
            DIGITAL_SIGNATURE,
            KEY_ENCIPHERMENT,
            CLIENT_AUTH,
            SERVER_AUTH,
        ];
        assert!(recognize(&csr(KUBE_APISERVER_CLIENT, hub, &more)).is_none());
        let single = node(&["system:nodes"]);
        assert!(recognize(&csr(KUBE_APISERVER_CLIENT, single, &hub_client)).is_none());
        let extra = node(&["openyurt:yurthub", "system:masters"]);
        assert!(recognize(&csr(KUBE_APISERVER_CLIENT, extra, &hub_client)).is_none());
        let not_a_node = request("alice", &["openyurt:yurthub", "system:nodes"], &[]);
        assert!(recognize(&csr(KUBE_APISERVER_CLIENT, not_a_node, &hub_client)).is_none());
        let kubelet = node(&["system:nodes"]);
        assert!(recognize(&csr("example.com/x", kubelet, &serving)).is_none());
    }

    #[test]
    fn signers_check_like_kube_controller_manager() {
        let usages = |u: &[&str]| u.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let serving = usages(&[DIGITAL_SIGNATURE, SERVER_AUTH]);
        let ok = request("system:node:n", &["system:nodes"], &["n"]);
        assert_eq!(kubelet_serving(&ok, &serving), Ok(()));
        let bare = request("system:node:n", &["system:nodes"], &[]);
        assert_eq!(
            kubelet_serving(&bare, &serving).unwrap_err(),
            "DNS or IP subjectAltName is required"
        );
        let client = usages(&[DIGITAL_SIGNATURE, CLIENT_AUTH]);
        assert!(kubelet_serving(&ok, &client).is_err());
        assert_eq!(
            kubelet_client(&ok, &client).unwrap_err(),
            "DNS subjectAltNames are not allowed"
        );
        assert_eq!(kubelet_client(&bare, &client), Ok(()));
        assert!(api_server_client_usages(&client).is_ok());
        assert!(api_server_client_usages(&serving).is_err());
        let c = csr("example.com/x", ok, &[]);
        assert!(signer_check(&c).is_none());
        assert_eq!(c.validity(), MAX_VALIDITY);
    }
}
