//! A throw-away cluster PKI for tests and the demo: one CA, an apiserver serving certificate for
//! the loopback addresses, and client certificates whose subject carries the Kubernetes identity
//! (CN = user, O = groups), exactly how kube-apiserver's x509 authenticator reads them.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, date_time_ymd,
};

/// A certificate and its private key, both PEM.
#[derive(Clone, Debug)]
pub struct CertPair {
    pub cert_pem: String,
    pub key_pem: String,
}

impl CertPair {
    /// The single-file form kubelet writes to `kubelet-client-current.pem` (cert, then key).
    pub fn combined_pem(&self) -> String {
        format!("{}{}", self.cert_pem, self.key_pem)
    }
}

/// The CA and the certificates a test cluster needs.
pub struct TestPki {
    ca_params: CertificateParams,
    ca_key: KeyPair,
    pub ca_pem: String,
    pub server: CertPair,
}

/// Errors from certificate generation (rcgen), which only fail on invalid parameters.
pub type PkiError = rcgen::Error;

impl TestPki {
    /// A fresh CA plus a serving certificate valid for `127.0.0.1`, `::1` and `localhost`.
    pub fn new() -> Result<Self, PkiError> {
        let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
        ca_params.distinguished_name = dn("outpost-test-ca", &[]);
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_key = KeyPair::generate()?;
        let ca_pem = ca_params.self_signed(&ca_key)?.pem();
        let mut pki = TestPki {
            ca_params,
            ca_key,
            ca_pem,
            server: CertPair {
                cert_pem: String::new(),
                key_pem: String::new(),
            },
        };
        pki.server = pki.issue(
            "kube-apiserver",
            &[],
            &["127.0.0.1", "::1", "localhost", "kubernetes.default.svc"],
            ExtendedKeyUsagePurpose::ServerAuth,
            false,
        )?;
        Ok(pki)
    }

    /// A client certificate for `user` in `groups`, e.g. `system:node:edge-1` in `system:nodes`.
    pub fn client(&self, user: &str, groups: &[&str]) -> Result<CertPair, PkiError> {
        self.issue(
            user,
            groups,
            &[],
            ExtendedKeyUsagePurpose::ClientAuth,
            false,
        )
    }

    /// Like [`TestPki::client`], but already expired (for "certificate expired" checks).
    pub fn expired_client(&self, user: &str, groups: &[&str]) -> Result<CertPair, PkiError> {
        self.issue(user, groups, &[], ExtendedKeyUsagePurpose::ClientAuth, true)
    }

    fn issue(
        &self,
        cn: &str,
        orgs: &[&str],
        sans: &[&str],
        usage: ExtendedKeyUsagePurpose,
        expired: bool,
    ) -> Result<CertPair, PkiError> {
        let mut params =
            CertificateParams::new(sans.iter().map(|s| s.to_string()).collect::<Vec<_>>())?;
        params.distinguished_name = dn(cn, orgs);
        params.extended_key_usages = vec![usage];
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        if expired {
            params.not_before = date_time_ymd(2000, 1, 1);
            params.not_after = date_time_ymd(2001, 1, 1);
        }
        let key = KeyPair::generate()?;
        let issuer = Issuer::from_params(&self.ca_params, &self.ca_key);
        let cert = params.signed_by(&key, &issuer)?;
        Ok(CertPair {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}

fn dn(cn: &str, orgs: &[&str]) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, cn);
    for o in orgs {
        dn.push(DnType::OrganizationName, *o);
    }
    dn
}

/// Files laid out the way a kubeadm node has them, for `--kubelet-client-certificate` and
/// `--kubelet-ca-file`.
#[derive(Clone, Debug)]
pub struct NodeCertFiles {
    /// cert + key in one PEM, like `/var/lib/kubelet/pki/kubelet-client-current.pem`.
    pub client_pem: PathBuf,
    /// the cluster CA, like `/etc/kubernetes/pki/ca.crt`.
    pub ca_crt: PathBuf,
}

impl TestPki {
    /// Writes the node's client certificate (for `system:node:<node>`) and the CA into `dir`.
    pub fn write_node_files(&self, dir: &Path, node: &str) -> std::io::Result<NodeCertFiles> {
        let pair = self
            .client(&format!("system:node:{node}"), &["system:nodes"])
            .map_err(std::io::Error::other)?;
        std::fs::create_dir_all(dir)?;
        let files = NodeCertFiles {
            client_pem: dir.join("kubelet-client-current.pem"),
            ca_crt: dir.join("ca.crt"),
        };
        std::fs::write(&files.client_pem, pair.combined_pem())?;
        std::fs::write(&files.ca_crt, &self.ca_pem)?;
        Ok(files)
    }
}
