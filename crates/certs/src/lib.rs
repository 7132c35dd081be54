//! The hub's TLS identities towards the apiserver.
//!
//! In `kubeletcertificate` bootstrap mode the hub borrows kubelet's own client certificate (one PEM
//! file holding certificate and key, `/var/lib/kubelet/pki/kubelet-client-current.pem`) and trusts
//! the cluster CA (`/etc/kubernetes/pki/ca.crt`). [`UpstreamTls::load`] reads both, checks that the
//! key belongs to the certificate, and builds the two rustls client configurations the proxy needs:
//! one presenting the node certificate, and one presenting none, for requests that carry their own
//! `Authorization: Bearer` token (as yurthub does). kubelet rotates that certificate in place;
//! [`UpstreamTls::reload_if_changed`] reads the files again so the hub can follow.
//!
//! [`serving`] is the other direction: the certificate the hub presents on its secure port;
//! [`peers`] checks the client certificates presented on the leader hub's port.
//!
//! Every failure is a [`CertError`] naming the file and the problem in one line.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{ClientConfig, RootCertStore};

pub mod bootstrap;
pub mod peers;
pub mod serving;

/// Why the certificate files could not be used.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {problem}")]
    Invalid { path: PathBuf, problem: String },
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot generate a key or certificate request: {0}")]
    Generate(String),
}

impl CertError {
    fn invalid(path: &Path, problem: impl Into<String>) -> Self {
        CertError::Invalid {
            path: path.to_owned(),
            problem: problem.into(),
        }
    }
}

/// What the hub knows about its client certificate, for logs and readiness.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdentityInfo {
    /// The Kubernetes user name (subject CN), e.g. `system:node:edge-1`.
    pub user: String,
    /// The Kubernetes groups (subject O), e.g. `system:nodes`.
    pub groups: Vec<String>,
    pub not_before: SystemTime,
    pub not_after: SystemTime,
}

impl IdentityInfo {
    pub fn is_expired_at(&self, now: SystemTime) -> bool {
        now >= self.not_after
    }

    /// When a certificate the hub obtained itself is renewed (see [`renewal_time`]).
    pub fn renew_at(&self) -> SystemTime {
        renewal_time(self.not_before, self.not_after)
    }

    /// Seconds since the Unix epoch, for a metric.
    pub fn not_after_unix(&self) -> u64 {
        self.not_after
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs()
    }
}

/// The rustls client configurations for talking to the apiservers.
#[derive(Clone)]
pub struct UpstreamTls {
    /// Presents the node's client certificate.
    pub with_identity: Arc<ClientConfig>,
    /// Presents no certificate: for requests that bring their own bearer token.
    pub without_identity: Arc<ClientConfig>,
    pub identity: IdentityInfo,
    /// The files it was loaded from, and their contents then: kubelet rotates its certificate
    /// in place, and [`UpstreamTls::reload_if_changed`] notices.
    pub source: TlsSource,
}

/// Where an [`UpstreamTls`] came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsSource {
    pub client_pem: PathBuf,
    pub ca_file: PathBuf,
    /// Both files' bytes when loaded (client PEM, then CA).
    contents: (Vec<u8>, Vec<u8>),
}

impl std::fmt::Debug for UpstreamTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamTls")
            .field("identity", &self.identity)
            .finish_non_exhaustive()
    }
}

impl UpstreamTls {
    /// Loads `client_pem` (certificate chain and private key in one file) and the CA bundle.
    pub fn load(client_pem: &Path, ca_file: &Path) -> Result<Self, CertError> {
        Self::from_contents(client_pem, read(client_pem)?, ca_file, read(ca_file)?)
    }

    /// Reads both files again: `Ok(None)` when they are unchanged, the new configuration when
    /// they changed and load, an error when they changed and do not (mid-write, or broken; the
    /// caller keeps what it has).
    pub fn reload_if_changed(&self) -> Result<Option<Self>, CertError> {
        let source = &self.source;
        let client = read(&source.client_pem)?;
        let ca = read(&source.ca_file)?;
        if (&client, &ca) == (&source.contents.0, &source.contents.1) {
            return Ok(None);
        }
        Self::from_contents(&source.client_pem, client, &source.ca_file, ca).map(Some)
    }

    fn from_contents(
        client_pem: &Path,
        client: Vec<u8>,
        ca_file: &Path,
        ca: Vec<u8>,
    ) -> Result<Self, CertError> {
        install_ring_provider();
        let roots = ca_roots(ca_file, &ca)?;
        let (chain, key) = load_identity(&client, client_pem)?;
        let identity = identity_info(client_pem, &chain[0])?;
        let builder = ClientConfig::builder().with_root_certificates(roots);
        let without_identity = builder.clone().with_no_client_auth();
        let with_identity = builder.with_client_auth_cert(chain, key).map_err(|e| {
            CertError::invalid(client_pem, format!("unusable certificate/key: {e}"))
        })?;
        Ok(UpstreamTls {
            with_identity: Arc::new(with_identity),
            without_identity: Arc::new(without_identity),
            identity,
            source: TlsSource {
                client_pem: client_pem.to_owned(),
                ca_file: ca_file.to_owned(),
                contents: (client, ca),
            },
        })
    }

    /// Time left before the client certificate expires (zero when it already has).
    pub fn remaining_validity(&self, now: SystemTime) -> Duration {
        self.identity
            .not_after
            .duration_since(now)
            .unwrap_or_default()
    }
}

/// rustls needs one process-wide provider; Outpost uses ring only. Installing twice is harmless.
pub fn install_ring_provider() {
    let _already_installed = rustls::crypto::ring::default_provider().install_default();
}

/// When to ask for a new certificate: at 80 % of its lifetime, as client-go's certificate
/// manager does at the latest, so a renewal has a fifth of the lifetime to get through.
pub fn renewal_time(not_before: SystemTime, not_after: SystemTime) -> SystemTime {
    let lifetime = not_after.duration_since(not_before).unwrap_or_default();
    not_before + lifetime.mul_f64(0.8)
}

/// Writes `bytes` to `path` (mode 0600, directories created) through a temporary file, so a
/// crash leaves the old file or the new one, never half of either.
pub fn write_private(path: &Path, bytes: &[u8]) -> Result<(), CertError> {
    use std::io::Write;
    let write_err = |source| CertError::Write {
        path: path.to_owned(),
        source,
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(write_err)?;
    }
    let tmp = path.with_extension("tmp");
    let mut file = open_private(&tmp).map_err(write_err)?;
    file.write_all(bytes).map_err(write_err)?;
    file.sync_all().map_err(write_err)?;
    std::fs::rename(&tmp, path).map_err(write_err)
}

#[cfg(unix)]
fn open_private(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
}

#[cfg(not(unix))]
fn open_private(path: &Path) -> std::io::Result<std::fs::File> {
    std::fs::File::create(path)
}

fn read(path: &Path) -> Result<Vec<u8>, CertError> {
    std::fs::read(path).map_err(|source| CertError::Read {
        path: path.to_owned(),
        source,
    })
}

/// The certificates of a CA bundle as trust roots; `ca_file` names it in errors.
pub fn ca_roots(ca_file: &Path, pem: &[u8]) -> Result<RootCertStore, CertError> {
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(pem) {
        let cert = cert.map_err(|e| CertError::invalid(ca_file, format!("bad PEM: {e}")))?;
        roots.add(cert).map_err(|e| {
            CertError::invalid(ca_file, format!("not a usable CA certificate: {e}"))
        })?;
    }
    if roots.is_empty() {
        return Err(CertError::invalid(ca_file, "no CERTIFICATE block found"));
    }
    Ok(roots)
}

/// A certificate chain and its private key from one PEM text; `pem_path` names it in errors.
fn load_identity(
    pem: &[u8],
    pem_path: &Path,
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), CertError> {
    let chain = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| CertError::invalid(pem_path, format!("bad PEM: {e}")))?;
    if chain.is_empty() {
        return Err(CertError::invalid(pem_path, "no CERTIFICATE block found"));
    }
    let key = PrivateKeyDer::from_pem_slice(pem)
        .map_err(|e| CertError::invalid(pem_path, format!("no usable PRIVATE KEY block: {e}")))?;
    Ok((chain, key))
}

fn identity_info(path: &Path, leaf: &CertificateDer<'_>) -> Result<IdentityInfo, CertError> {
    let (_, cert) = x509_parser::parse_x509_certificate(leaf.as_ref())
        .map_err(|e| CertError::invalid(path, format!("cannot parse certificate: {e}")))?;
    let subject = cert.subject();
    let user = subject
        .iter_common_name()
        .filter_map(|cn| cn.as_str().ok())
        .next()
        .unwrap_or_default()
        .to_owned();
    let groups = subject
        .iter_organization()
        .filter_map(|o| o.as_str().ok())
        .map(str::to_owned)
        .collect();
    let unix = |t: x509_parser::time::ASN1Time| {
        UNIX_EPOCH + Duration::from_secs(u64::try_from(t.timestamp()).unwrap_or(0))
    };
    Ok(IdentityInfo {
        user,
        groups,
        not_before: unix(cert.validity().not_before),
        not_after: unix(cert.validity().not_after),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use outpost_testkit::TestPki;

    fn write(dir: &Path, name: &str, content: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, content).unwrap();
        p
    }

    #[test]
    fn loads_node_identity() {
        let pki = TestPki::new().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let files = pki.write_node_files(dir.path(), "edge-1").unwrap();
        let tls = UpstreamTls::load(&files.client_pem, &files.ca_crt).unwrap();
        assert_eq!(tls.identity.user, "system:node:edge-1");
        assert_eq!(tls.identity.groups, vec!["system:nodes".to_owned()]);
        assert!(!tls.identity.is_expired_at(SystemTime::now()));
    }

    #[test]
    fn mismatched_key_is_rejected_naming_the_file() {
        let pki = TestPki::new().unwrap();
        let a = pki.client("a", &[]).unwrap();
        let b = pki.client("b", &[]).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let pem = write(
            dir.path(),
            "client.pem",
            &format!("{}{}", a.cert_pem, b.key_pem),
        );
        let ca = write(dir.path(), "ca.crt", &pki.ca_pem);
        let err = UpstreamTls::load(&pem, &ca).unwrap_err().to_string();
        assert!(err.contains("client.pem"), "{err}");
        assert!(err.contains("unusable certificate/key"), "{err}");
    }

    #[test]
    fn missing_key_missing_file_and_garbage_ca() {
        let pki = TestPki::new().unwrap();
        let a = pki.client("a", &[]).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let ca = write(dir.path(), "ca.crt", &pki.ca_pem);
        let only_cert = write(dir.path(), "cert-only.pem", &a.cert_pem);
        let err = UpstreamTls::load(&only_cert, &ca).unwrap_err().to_string();
        assert!(err.contains("PRIVATE KEY"), "{err}");

        let err = UpstreamTls::load(&dir.path().join("absent.pem"), &ca)
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("cannot read") && err.contains("absent.pem"),
            "{err}"
        );

        let garbage = write(dir.path(), "garbage.crt", "not a pem\n");
        let pem = write(dir.path(), "ok.pem", &a.combined_pem());
        let err = UpstreamTls::load(&pem, &garbage).unwrap_err().to_string();
        assert!(
            err.contains("garbage.crt") && err.contains("no CERTIFICATE"),
            "{err}"
        );
    }

    #[test]
    fn a_rotated_certificate_is_noticed_and_a_half_written_one_is_not_taken() {
        let pki = TestPki::new().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let files = pki.write_node_files(dir.path(), "edge-1").unwrap();
        let tls = UpstreamTls::load(&files.client_pem, &files.ca_crt).unwrap();
        assert!(tls.reload_if_changed().unwrap().is_none());

        let rotated = pki
            .client("system:node:edge-1", &["system:nodes", "rotated"])
            .unwrap();
        std::fs::write(&files.client_pem, &rotated.cert_pem).unwrap();
        let err = tls.reload_if_changed().unwrap_err().to_string();
        assert!(err.contains("PRIVATE KEY"), "{err}");

        std::fs::write(&files.client_pem, rotated.combined_pem()).unwrap();
        let new = tls.reload_if_changed().unwrap().expect("changed");
        assert_eq!(new.identity.groups, ["system:nodes", "rotated"]);
        assert!(new.reload_if_changed().unwrap().is_none());
    }

    #[test]
    fn expired_certificate_is_loaded_but_reported() {
        let pki = TestPki::new().unwrap();
        let old = pki
            .expired_client("system:node:x", &["system:nodes"])
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let pem = write(dir.path(), "old.pem", &old.combined_pem());
        let ca = write(dir.path(), "ca.crt", &pki.ca_pem);
        let tls = UpstreamTls::load(&pem, &ca).unwrap();
        assert!(tls.identity.is_expired_at(SystemTime::now()));
        assert_eq!(tls.remaining_validity(SystemTime::now()), Duration::ZERO);
    }
}
