//! Obtaining and renewing the secure port's certificate from the cluster, as yurthub does.
//!
//! [`ServingCertManager::run`] is the whole story: install the certificate kept on disk if it is
//! still valid (a node rebooted offline serves at once); then, whenever the cloud is reachable,
//! work out the names the certificate needs (the `kubernetes.default` names, the hub's addresses,
//! the `default/kubernetes` ClusterIPs and the node's addresses), and if the current certificate
//! lacks one or has used 80 % of its life, ask for a new one: a `kubernetes.io/kubelet-serving`
//! CertificateSigningRequest sent as the node, then polled until it is issued. An approver
//! (yurt-manager's csrapprover in an OpenYurt cluster) must approve it; until then the secure
//! port has no certificate and handshakes fail, which the log says every minute.

use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use http::{Method, StatusCode};
use outpost_certs::serving::{CertSlot, KUBELET_SERVING_SIGNER, Sans, ServingCert, draft_csr};
use serde_json::Value;
use tokio::sync::watch;
use tracing::{info, warn};

use crate::identity::csr::{self, CsrTransport};
use outpost_proxy::Metrics;
use outpost_proxy::upstream::Upstream;

/// How long to wait after a failed attempt (denied, refused, unreachable) before the next; it
/// doubles with every further failure, up to [`MAX_RETRY_AFTER`], so a cluster that denies the
/// request does not collect a new CSR every half minute.
const RETRY_AFTER: Duration = Duration::from_secs(30);
const MAX_RETRY_AFTER: Duration = Duration::from_secs(16 * 60);

/// What the manager needs to know about the node.
#[derive(Debug, Clone)]
pub struct ServingCertConfig {
    pub node_name: String,
    /// Addresses the certificate must always name: the secure listener's (dummy IP or bind
    /// proxy address). Names learnt from the cluster are added when it is reachable.
    pub ips: Vec<IpAddr>,
    /// Where the certificate and key are kept (`<root-dir>/pki/yurthub-server-current.pem`).
    pub file: PathBuf,
}

pub struct ServingCertManager {
    config: ServingCertConfig,
    upstream: Arc<Upstream>,
    slot: Arc<CertSlot>,
    metrics: Metrics,
}

impl ServingCertManager {
    pub fn new(
        config: ServingCertConfig,
        upstream: Arc<Upstream>,
        slot: Arc<CertSlot>,
        metrics: Metrics,
    ) -> Self {
        ServingCertManager {
            config,
            upstream,
            slot,
            metrics,
        }
    }

    /// Installs the kept certificate when it is valid and names the hub's own addresses.
    pub fn install_kept(&self) {
        match ServingCert::load(&self.config.file) {
            Ok(cert)
                if cert.is_valid_at(SystemTime::now()) && cert.sans.covers(&self.static_sans()) =>
            {
                info!(path = %self.config.file.display(), sans = ?cert.sans, "serving certificate loaded");
                self.install(cert);
            }
            Ok(cert) => {
                info!(path = %self.config.file.display(), sans = ?cert.sans, "kept serving certificate is expired or lacks an address; a new one will be requested")
            }
            Err(outpost_certs::CertError::Read { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                warn!(error = %e, "kept serving certificate is unusable; a new one will be requested")
            }
        }
    }

    /// Keeps a current certificate in the slot until shutdown.
    pub async fn run(self, mut shutdown: watch::Receiver<bool>) {
        let mut online = self.upstream.states().subscribe();
        let mut failures = 0u32;
        let mut unread = 0u32;
        loop {
            // Names and requests need the cloud; wait for it.
            let reachable = async {
                let _ = online.wait_for(|up| *up).await;
            };
            if !run_until_shutdown(reachable, &mut shutdown).await {
                return;
            }
            let Some((wanted, complete)) =
                run_until_shutdown_with(self.wanted_sans(), &mut shutdown).await
            else {
                return;
            };
            unread = if complete {
                0
            } else {
                unread.saturating_add(1)
            };
            let current = self.slot.current();
            let pause = match next_step(current.as_ref(), &wanted, complete, SystemTime::now()) {
                Next::Obtain => Duration::ZERO,
                Next::WaitForRenewal(renewal) => renewal,
                Next::ReadNamesAgain(renewal) => renewal.min(names_retry_delay(unread)),
            };
            if !pause.is_zero() {
                // A reconnect is a reason to look again: the names may have been unreadable.
                let woken = async {
                    tokio::select! {
                        () = tokio::time::sleep(pause) => {}
                        Ok(()) = online.changed() => {}
                    }
                };
                if !run_until_shutdown(woken, &mut shutdown).await {
                    return;
                }
                continue;
            }
            match run_until_shutdown_with(self.obtain(&wanted), &mut shutdown).await {
                None => return,
                Some(Ok(cert)) => {
                    failures = 0;
                    self.install(cert);
                }
                Some(Err(e)) => {
                    let delay = retry_delay(failures);
                    failures = failures.saturating_add(1);
                    warn!(error = %e, retry_in_s = delay.as_secs(), "cannot obtain a serving certificate");
                    if !run_until_shutdown(tokio::time::sleep(delay), &mut shutdown).await {
                        return;
                    }
                }
            }
        }
    }

    fn install(&self, cert: ServingCert) {
        self.metrics
            .serving_cert_expiry
            .set(i64::try_from(cert.not_after_unix()).unwrap_or(i64::MAX));
        self.slot.install(cert);
    }

    fn static_sans(&self) -> Sans {
        Sans::for_hub(self.config.ips.iter().copied())
    }

    /// The static names plus what the cluster says: `default/kubernetes`'s ClusterIPs (pods
    /// that dial the service IP reach the hub through kube-proxy's rewrite) and the node's
    /// addresses; and whether both could be read (what cannot be read now is not asked for).
    async fn wanted_sans(&self) -> (Sans, bool) {
        let mut sans = self.static_sans();
        let service = self
            .get_json("/api/v1/namespaces/default/services/kubernetes")
            .await;
        if let Some(svc) = &service {
            sans.add_ips(cluster_ips(svc));
        }
        let node_path = format!("/api/v1/nodes/{}", self.config.node_name);
        let node = self.get_json(&node_path).await;
        if let Some(node) = &node {
            sans.add_ips(node_ips(node));
        }
        (sans, service.is_some() && node.is_some())
    }

    async fn get_json(&self, path: &str) -> Option<Value> {
        match self.upstream.call(Method::GET, path, None).await {
            Ok((StatusCode::OK, body)) => serde_json::from_slice(&body).ok(),
            Ok((code, _)) => {
                warn!(path, %code, "cannot read what the serving certificate should name");
                None
            }
            Err(e) => {
                warn!(path, error = %e, "cannot read what the serving certificate should name");
                None
            }
        }
    }

    /// One CSR, sent and waited for; the certificate is checked against its key and the names
    /// asked for, and kept on disk before it is used.
    async fn obtain(&self, wanted: &Sans) -> Result<ServingCert, ObtainError> {
        let draft = draft_csr(&self.config.node_name, wanted)?;
        let (name, cert_pem) =
            csr::request(&*self.upstream, csr_object(&draft.csr_pem), "serving", None).await?;
        let origin = PathBuf::from(format!("certificatesigningrequest/{name}"));
        let cert = ServingCert::from_pem(&cert_pem, &draft.key_pem, &origin)?;
        if !cert.sans.covers(wanted) {
            return Err(ObtainError::Uncovered {
                name,
                sans: format!("{:?}", cert.sans),
            });
        }
        if let Err(e) = cert.store(&self.config.file) {
            warn!(error = %e, "serving certificate is used but not kept; the next start asks again");
        }
        info!(csr = %name, not_after_unix = cert.not_after_unix(), "serving certificate issued");
        Ok(cert)
    }
}

/// Why no serving certificate was obtained this time.
#[derive(Debug, thiserror::Error)]
enum ObtainError {
    #[error(transparent)]
    Cert(#[from] outpost_certs::CertError),
    #[error(transparent)]
    Csr(#[from] csr::CsrError),
    #[error("{name}: the issued certificate names {sans}, not everything asked for")]
    Uncovered { name: String, sans: String },
}

/// The CertificateSigningRequest object for a serving certificate (kubelet's usages).
fn csr_object(csr_pem: &str) -> Value {
    csr::signing_request(
        csr_pem,
        KUBELET_SERVING_SIGNER,
        &["digital signature", "key encipherment", "server auth"],
    )
}

fn cluster_ips(service: &Value) -> Vec<IpAddr> {
    let spec = &service["spec"];
    let listed = spec["clusterIPs"].as_array().map(Vec::as_slice);
    listed
        .unwrap_or(std::slice::from_ref(&spec["clusterIP"]))
        .iter()
        .filter_map(|ip| ip.as_str()?.parse().ok())
        .collect()
}

fn node_ips(node: &Value) -> Vec<IpAddr> {
    node.pointer("/status/addresses")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .filter(|a| matches!(a["type"].as_str(), Some("InternalIP" | "ExternalIP")))
        .filter_map(|a| a["address"].as_str()?.parse().ok())
        .collect()
}

/// What the manager does next.
#[derive(Debug, PartialEq, Eq)]
enum Next {
    /// Ask for a new certificate now.
    Obtain,
    /// The certificate is right; look again when it is due for renewal (after this long).
    WaitForRenewal(Duration),
    /// Some names could not be read: do not churn certificates on a partial list while the
    /// current one serves; read them again soon (at the latest at renewal, after this long).
    ReadNamesAgain(Duration),
}

/// Decides from the current certificate (if any), the names wanted, and whether they are all
/// known. Without a valid certificate, or when it is due, the hub asks with what it knows.
fn next_step(
    current: Option<&ServingCert>,
    wanted: &Sans,
    complete: bool,
    now: SystemTime,
) -> Next {
    let Some(cert) = current.filter(|c| c.is_valid_at(now)) else {
        return Next::Obtain;
    };
    let renewal = cert.renew_at().duration_since(now).unwrap_or_default();
    match (renewal.is_zero(), complete, cert.sans.covers(wanted)) {
        (true, _, _) | (false, true, false) => Next::Obtain,
        (false, true, true) => Next::WaitForRenewal(renewal),
        (false, false, _) => Next::ReadNamesAgain(renewal),
    }
}

/// The pause before reading the names again after `unread` partial reads in a row: 2 s,
/// doubling up to [`RETRY_AFTER`].
fn names_retry_delay(unread: u32) -> Duration {
    Duration::from_secs(2)
        .saturating_mul(1 << unread.saturating_sub(1).min(4))
        .min(RETRY_AFTER)
}

/// The pause after `failures` earlier failures in a row.
fn retry_delay(failures: u32) -> Duration {
    RETRY_AFTER
        .saturating_mul(1 << failures.min(6))
        .min(MAX_RETRY_AFTER)
}

/// Runs `work` unless shutdown comes first; false on shutdown.
async fn run_until_shutdown(
    work: impl std::future::Future<Output = ()>,
    shutdown: &mut watch::Receiver<bool>,
) -> bool {
    run_until_shutdown_with(work, shutdown).await.is_some()
}

async fn run_until_shutdown_with<T>(
    work: impl std::future::Future<Output = T>,
    shutdown: &mut watch::Receiver<bool>,
) -> Option<T> {
    tokio::select! {
        out = work => Some(out),
        _ = shutdown.wait_for(|stop| *stop) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn cert(pki: &outpost_testkit::TestPki, sans: &Sans, valid_for: Duration) -> ServingCert {
        let draft = draft_csr("edge-1", sans).unwrap();
        let pem = pki.sign_csr(&draft.csr_pem, valid_for).unwrap();
        ServingCert::from_pem(&pem, &draft.key_pem, std::path::Path::new("t")).unwrap()
    }

    #[test]
    fn partial_names_never_replace_a_serving_certificate_before_it_is_due() {
        let pki = outpost_testkit::TestPki::new().unwrap();
        let own = Sans::for_hub(["127.0.0.1".parse().unwrap()]);
        let mut more = own.clone();
        more.add_ips(["10.96.0.1".parse().unwrap()]);
        let now = SystemTime::now();
        // Nothing yet: ask with what is known, complete or not.
        assert_eq!(next_step(None, &own, false, now), Next::Obtain);
        let current = cert(&pki, &own, Duration::from_secs(3600));
        // The cluster names an address the certificate lacks: ask again.
        assert_eq!(next_step(Some(&current), &more, true, now), Next::Obtain);
        // A partial read, covered or not: keep serving, read again.
        assert!(matches!(
            next_step(Some(&current), &own, false, now),
            Next::ReadNamesAgain(_)
        ));
        let partial_not_covered = {
            let mut s = own.clone();
            s.add_ips(["192.168.1.7".parse().unwrap()]);
            s
        };
        assert!(matches!(
            next_step(Some(&current), &partial_not_covered, false, now),
            Next::ReadNamesAgain(_)
        ));
        // All known and covered: wait for renewal; once due, ask.
        assert!(
            matches!(next_step(Some(&current), &own, true, now), Next::WaitForRenewal(d) if d > Duration::ZERO)
        );
        let due = current.renew_at() + Duration::from_secs(1);
        assert_eq!(next_step(Some(&current), &own, false, due), Next::Obtain);
        // Expired: ask.
        let expired = current.not_after + Duration::from_secs(1);
        assert_eq!(next_step(Some(&current), &own, true, expired), Next::Obtain);
    }

    #[test]
    fn unreadable_names_are_read_again_sooner_than_a_failed_request() {
        assert_eq!(names_retry_delay(1), Duration::from_secs(2));
        assert_eq!(names_retry_delay(2), Duration::from_secs(4));
        assert_eq!(names_retry_delay(5), Duration::from_secs(30));
        assert_eq!(names_retry_delay(u32::MAX), RETRY_AFTER);
    }

    #[test]
    fn retries_back_off_to_a_ceiling() {
        assert_eq!(retry_delay(0), RETRY_AFTER);
        assert_eq!(retry_delay(1), RETRY_AFTER * 2);
        assert_eq!(retry_delay(4), Duration::from_secs(8 * 60));
        assert_eq!(retry_delay(5), MAX_RETRY_AFTER);
        assert_eq!(retry_delay(u32::MAX), MAX_RETRY_AFTER);
    }

    #[test]
    fn names_come_from_the_service_and_the_node() {
        let svc =
            json!({"spec": {"clusterIP": "10.96.0.1", "clusterIPs": ["10.96.0.1", "fd00::1"]}});
        assert_eq!(
            cluster_ips(&svc),
            vec![
                "10.96.0.1".parse::<IpAddr>().unwrap(),
                "fd00::1".parse().unwrap()
            ]
        );
        let old_svc = json!({"spec": {"clusterIP": "10.0.0.1"}});
        assert_eq!(
            cluster_ips(&old_svc),
            vec!["10.0.0.1".parse::<IpAddr>().unwrap()]
        );
        let node = json!({"status": {"addresses": [
            {"type": "InternalIP", "address": "192.168.1.7"},
            {"type": "Hostname", "address": "edge-1"}
        ]}});
        assert_eq!(
            node_ips(&node),
            vec!["192.168.1.7".parse::<IpAddr>().unwrap()]
        );
    }

    #[test]
    fn the_request_asks_the_kubelet_serving_signer_for_server_usages() {
        let csr = csr_object("PEM");
        assert_eq!(csr["spec"]["signerName"], KUBELET_SERVING_SIGNER);
        assert_eq!(csr["spec"]["request"], "UEVN");
        assert!(
            csr["spec"]["usages"]
                .as_array()
                .unwrap()
                .contains(&json!("server auth"))
        );
    }
}
