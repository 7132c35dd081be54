//! The hub's serving certificate for `--proxy-secure-port`, where in-cluster clients arrive.
//!
//! The `masterservice` filter points pods' `KUBERNETES_SERVICE_HOST/PORT` at the hub, so the hub
//! must present a certificate those clients verify against the cluster CA for the address they
//! dial. Like yurthub, it asks the cluster for one: [`draft_csr`] makes a key and a
//! `kubernetes.io/kubelet-serving` request (CN `system:node:<node>`, O `system:nodes`, the
//! `kubernetes.default` names and the hub's addresses); the proxy crate sends it and waits for the
//! signed certificate; [`ServingCert`] checks what came back (key match, SANs, lifetime) and is
//! kept on disk so a node that reboots offline serves at once. [`CertSlot`] is what the TLS
//! listener reads on every handshake, so a renewed certificate takes effect without a restart.

use std::net::IpAddr;
use std::path::Path;
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rcgen::{CertificateParams, DnType, KeyPair, SanType};
use rustls::ServerConfig;
use rustls::pki_types::CertificateDer;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use x509_parser::extensions::GeneralName;

use crate::{CertError, install_ring_provider, load_identity, read};

/// The names `kubernetes.default` answers to inside the cluster; every serving certificate the
/// hub requests carries them, as yurthub's does.
pub const KUBERNETES_DNS_NAMES: [&str; 4] = [
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
];

/// The signer whose certificates chain to the cluster CA that pods trust.
pub const KUBELET_SERVING_SIGNER: &str = "kubernetes.io/kubelet-serving";

/// The subject alternative names a serving certificate must hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Sans {
    pub dns: Vec<String>,
    pub ips: Vec<IpAddr>,
}

impl Sans {
    /// The `kubernetes.default` names plus `ips`, without duplicates.
    pub fn for_hub(ips: impl IntoIterator<Item = IpAddr>) -> Sans {
        let mut sans = Sans {
            dns: KUBERNETES_DNS_NAMES.iter().map(|s| s.to_string()).collect(),
            ips: Vec::new(),
        };
        sans.add_ips(ips);
        sans
    }

    pub fn add_ips(&mut self, ips: impl IntoIterator<Item = IpAddr>) {
        for ip in ips {
            if !self.ips.contains(&ip) {
                self.ips.push(ip);
            }
        }
    }

    /// Whether every name and address of `wanted` is in `self`.
    pub fn covers(&self, wanted: &Sans) -> bool {
        wanted.dns.iter().all(|d| self.dns.contains(d))
            && wanted.ips.iter().all(|ip| self.ips.contains(ip))
    }
}

/// A fresh private key and the PEM certificate request for it.
pub struct CsrDraft {
    pub csr_pem: String,
    pub key_pem: String,
}

/// A new ECDSA P-256 key and a kubelet-serving request for `system:node:<node_name>` with `sans`.
pub fn draft_csr(node_name: &str, sans: &Sans) -> Result<CsrDraft, CertError> {
    let fail = |e: rcgen::Error| CertError::Generate(e.to_string());
    let mut params = CertificateParams::new(Vec::<String>::new()).map_err(fail)?;
    params
        .distinguished_name
        .push(DnType::CommonName, format!("system:node:{node_name}"));
    params
        .distinguished_name
        .push(DnType::OrganizationName, "system:nodes");
    for dns in &sans.dns {
        let name = dns.clone().try_into().map_err(fail)?;
        params.subject_alt_names.push(SanType::DnsName(name));
    }
    params
        .subject_alt_names
        .extend(sans.ips.iter().map(|ip| SanType::IpAddress(*ip)));
    let key = KeyPair::generate().map_err(fail)?;
    let csr_pem = params
        .serialize_request(&key)
        .and_then(|csr| csr.pem())
        .map_err(fail)?;
    Ok(CsrDraft {
        csr_pem,
        key_pem: key.serialize_pem(),
    })
}

/// A serving certificate with its key, checked and ready for the TLS listener.
#[derive(Clone)]
pub struct ServingCert {
    key: Arc<CertifiedKey>,
    pem: String,
    pub sans: Sans,
    pub not_before: SystemTime,
    pub not_after: SystemTime,
}

impl std::fmt::Debug for ServingCert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServingCert")
            .field("sans", &self.sans)
            .field("not_after", &self.not_after)
            .finish_non_exhaustive()
    }
}

impl ServingCert {
    /// Builds from the signed chain and the key it was requested with; `origin` names where
    /// they came from in errors. Fails if the key does not belong to the certificate.
    pub fn from_pem(cert_pem: &str, key_pem: &str, origin: &Path) -> Result<Self, CertError> {
        Self::parse(&format!("{cert_pem}{key_pem}"), origin)
    }

    /// Reads a file holding the chain and then the key (`yurthub-server-current.pem`).
    pub fn load(path: &Path) -> Result<Self, CertError> {
        let pem = read(path)?;
        let pem = String::from_utf8(pem)
            .map_err(|_| CertError::invalid(path, "not a PEM file (not UTF-8)"))?;
        Self::parse(&pem, path)
    }

    fn parse(pem: &str, origin: &Path) -> Result<Self, CertError> {
        install_ring_provider();
        let (chain, key) = load_identity(pem.as_bytes(), origin)?;
        let (sans, not_before, not_after) = describe(&chain[0], origin)?;
        let provider = rustls::crypto::ring::default_provider();
        let key = CertifiedKey::from_der(chain, key, &provider)
            .map_err(|e| CertError::invalid(origin, format!("unusable certificate/key: {e}")))?;
        Ok(ServingCert {
            key: Arc::new(key),
            pem: pem.to_owned(),
            sans,
            not_before,
            not_after,
        })
    }

    /// Writes chain and key to `path` (mode 0600) through a temporary file, so a crash leaves
    /// the old file or the new one, never half of either.
    pub fn store(&self, path: &Path) -> Result<(), CertError> {
        crate::write_private(path, self.pem.as_bytes())
    }

    /// Usable now: inside its validity period.
    pub fn is_valid_at(&self, now: SystemTime) -> bool {
        self.not_before <= now && now < self.not_after
    }

    /// When to ask for a new one (see [`crate::renewal_time`]).
    pub fn renew_at(&self) -> SystemTime {
        crate::renewal_time(self.not_before, self.not_after)
    }

    /// Seconds since the Unix epoch of `not_after`, for a metric.
    pub fn not_after_unix(&self) -> u64 {
        self.not_after
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs()
    }
}

/// SANs and validity of a leaf certificate.
fn describe(
    leaf: &CertificateDer<'_>,
    origin: &Path,
) -> Result<(Sans, SystemTime, SystemTime), CertError> {
    let (_, cert) = x509_parser::parse_x509_certificate(leaf.as_ref())
        .map_err(|e| CertError::invalid(origin, format!("cannot parse certificate: {e}")))?;
    let mut sans = Sans::default();
    if let Ok(Some(ext)) = cert.subject_alternative_name() {
        for name in &ext.value.general_names {
            match name {
                GeneralName::DNSName(dns) => sans.dns.push((*dns).to_owned()),
                GeneralName::IPAddress(bytes) => sans.ips.extend(ip_from_bytes(bytes)),
                _ => {}
            }
        }
    }
    let at = |t: i64| UNIX_EPOCH + Duration::from_secs(u64::try_from(t).unwrap_or(0));
    let validity = cert.validity();
    Ok((
        sans,
        at(validity.not_before.timestamp()),
        at(validity.not_after.timestamp()),
    ))
}

fn ip_from_bytes(bytes: &[u8]) -> Option<IpAddr> {
    match bytes.len() {
        4 => <[u8; 4]>::try_from(bytes).ok().map(IpAddr::from),
        16 => <[u8; 16]>::try_from(bytes).ok().map(IpAddr::from),
        _ => None,
    }
}

/// The certificate the secure listener presents; empty until one is obtained, swapped on renewal.
#[derive(Debug, Default)]
pub struct CertSlot {
    current: RwLock<Option<ServingCert>>,
}

impl CertSlot {
    pub fn install(&self, cert: ServingCert) {
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = Some(cert);
    }

    pub fn current(&self) -> Option<ServingCert> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// A rustls server configuration presenting whatever this slot holds at handshake time;
    /// HTTP/1.1 only (as yurthub's secure port) and no client certificates: callers on this port
    /// authenticate with bearer tokens.
    pub fn server_config(self: &Arc<Self>) -> Arc<ServerConfig> {
        install_ring_provider();
        let mut config = ServerConfig::builder()
            .with_no_client_auth()
            .with_cert_resolver(self.clone());
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Arc::new(config)
    }
}

impl ResolvesServerCert for CertSlot {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        // None fails the handshake with an alert: there is no certificate to present yet.
        self.current().map(|cert| cert.key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use outpost_testkit::TestPki;

    fn hub_sans() -> Sans {
        Sans::for_hub(["169.254.2.1".parse().unwrap(), "127.0.0.1".parse().unwrap()])
    }

    #[test]
    fn a_draft_asks_for_the_node_identity_and_every_name() {
        let draft = draft_csr("edge-1", &hub_sans()).unwrap();
        assert!(
            draft
                .csr_pem
                .starts_with("-----BEGIN CERTIFICATE REQUEST-----")
        );
        let csr = rcgen::CertificateSigningRequestParams::from_pem(&draft.csr_pem).unwrap();
        let dn = &csr.params.distinguished_name;
        assert_eq!(
            dn.get(&DnType::CommonName),
            Some(&rcgen::DnValue::Utf8String("system:node:edge-1".into()))
        );
        assert_eq!(
            dn.get(&DnType::OrganizationName),
            Some(&rcgen::DnValue::Utf8String("system:nodes".into()))
        );
        let names = &csr.params.subject_alt_names;
        assert_eq!(names.len(), 6, "{names:?}");
        assert!(names.contains(&SanType::IpAddress("169.254.2.1".parse().unwrap())));
        assert!(names.contains(&SanType::DnsName(
            "kubernetes.default.svc".try_into().unwrap()
        )));
    }

    #[test]
    fn a_signed_draft_round_trips_through_the_file() {
        let pki = TestPki::new().unwrap();
        let draft = draft_csr("edge-1", &hub_sans()).unwrap();
        let cert_pem = pki
            .sign_csr(&draft.csr_pem, Duration::from_secs(3600))
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pki/yurthub-server-current.pem");
        let cert = ServingCert::from_pem(&cert_pem, &draft.key_pem, Path::new("csr")).unwrap();
        assert!(cert.sans.covers(&hub_sans()));
        assert!(cert.is_valid_at(SystemTime::now()));
        assert!(cert.renew_at() < cert.not_after && cert.renew_at() > cert.not_before);
        cert.store(&path).unwrap();
        let loaded = ServingCert::load(&path).unwrap();
        assert_eq!(loaded.sans, cert.sans);
        assert_eq!(loaded.not_after, cert.not_after);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
    }

    #[test]
    fn a_certificate_with_someone_elses_key_is_refused() {
        let pki = TestPki::new().unwrap();
        let draft = draft_csr("edge-1", &hub_sans()).unwrap();
        let other = draft_csr("edge-1", &hub_sans()).unwrap();
        let cert_pem = pki
            .sign_csr(&draft.csr_pem, Duration::from_secs(3600))
            .unwrap();
        let err = ServingCert::from_pem(&cert_pem, &other.key_pem, Path::new("csr-x"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("csr-x") && err.contains("unusable"), "{err}");
    }

    #[test]
    fn coverage_needs_every_name() {
        let have = hub_sans();
        let mut wanted = hub_sans();
        assert!(have.covers(&wanted));
        wanted.add_ips(["10.96.0.1".parse().unwrap()]);
        assert!(!have.covers(&wanted));
    }

    #[test]
    fn an_empty_slot_fails_the_handshake_and_a_filled_one_serves() {
        let slot = Arc::new(CertSlot::default());
        let _config = slot.server_config();
        assert!(slot.current().is_none());
        let pki = TestPki::new().unwrap();
        let draft = draft_csr("edge-1", &hub_sans()).unwrap();
        let cert_pem = pki
            .sign_csr(&draft.csr_pem, Duration::from_secs(3600))
            .unwrap();
        slot.install(ServingCert::from_pem(&cert_pem, &draft.key_pem, Path::new("csr")).unwrap());
        assert!(slot.current().is_some());
    }
}
