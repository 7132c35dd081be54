//! Client certificates on the leader hub's port (pool sharing): a TLS server configuration that
//! asks every client for a certificate and lets the handshake through either way, and the check
//! the request handler makes of what was presented, so that a missing or foreign certificate is
//! answered `401` as a Kubernetes `Status` (as kube-apiserver answers it) rather than with a TLS
//! alert.
//!
//! The handshake still proves that the client holds the key of the certificate it presented
//! (rustls checks the signature); [`PeerCheck::identity`] checks the chain against the cluster CA.

use std::sync::Arc;
use std::time::SystemTime;

use rustls::client::danger::HandshakeSignatureValid;
use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ResolvesServerCert, WebPkiClientVerifier};
use rustls::{
    DigitallySignedStruct, DistinguishedName, RootCertStore, ServerConfig, SignatureScheme,
};

use crate::{CertError, IdentityInfo, identity_info, install_ring_provider};

/// The certificates a client presented on a TLS connection, leaf first; put into each of its
/// requests' extensions by the listener.
#[derive(Debug, Clone, Default)]
pub struct PeerCertificates(pub Arc<Vec<CertificateDer<'static>>>);

/// Why a peer's certificate names nobody.
#[derive(Debug, thiserror::Error)]
pub enum PeerError {
    #[error("no client certificate")]
    NoCertificate,
    #[error("client certificate not accepted: {0}")]
    NotAccepted(#[source] rustls::Error),
    #[error(transparent)]
    Unreadable(CertError),
}

/// Checks a client's certificate chain against the cluster CA.
#[derive(Debug, Clone)]
pub struct PeerCheck {
    verifier: Arc<dyn ClientCertVerifier>,
}

impl PeerCheck {
    /// Trusts the CAs in `roots` (the cluster CA: the one that signs node certificates).
    pub fn new(roots: RootCertStore) -> Result<PeerCheck, CertError> {
        install_ring_provider();
        let verifier = WebPkiClientVerifier::builder(Arc::new(roots))
            .allow_unauthenticated()
            .build()
            .map_err(|e| CertError::invalid(std::path::Path::new("cluster CA"), e.to_string()))?;
        Ok(PeerCheck { verifier })
    }

    /// Who the chain's leaf names (CN user, O groups), if the cluster CA issued it and it is
    /// valid now; why not otherwise.
    pub fn identity(&self, chain: &[CertificateDer<'_>]) -> Result<IdentityInfo, PeerError> {
        let (leaf, intermediates) = chain.split_first().ok_or(PeerError::NoCertificate)?;
        let now = UnixTime::since_unix_epoch(
            SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .unwrap_or_default(),
        );
        self.verifier
            .verify_client_cert(leaf, intermediates, now)
            .map_err(PeerError::NotAccepted)?;
        identity_info(std::path::Path::new("client certificate"), leaf)
            .map_err(PeerError::Unreadable)
    }

    /// A server configuration presenting `certs` and asking clients for a certificate, which
    /// the handshake does not require (see the module doc); HTTP/1.1 only.
    pub fn server_config(&self, certs: Arc<dyn ResolvesServerCert>) -> Arc<ServerConfig> {
        install_ring_provider();
        let asking = Arc::new(AskForCertificate(self.verifier.clone()));
        let mut config = ServerConfig::builder()
            .with_client_cert_verifier(asking)
            .with_cert_resolver(certs);
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Arc::new(config)
    }
}

/// Asks for a client certificate and accepts any at the handshake (the chain is checked per
/// request, [`PeerCheck::identity`]); the handshake signatures are checked as usual.
#[derive(Debug)]
struct AskForCertificate(Arc<dyn ClientCertVerifier>);

impl ClientCertVerifier for AskForCertificate {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        false
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.0.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use outpost_testkit::TestPki;

    fn der(pem: &str) -> Vec<CertificateDer<'static>> {
        use rustls::pki_types::pem::PemObject;
        CertificateDer::pem_slice_iter(pem.as_bytes())
            .collect::<Result<_, _>>()
            .unwrap()
    }

    #[test]
    fn only_certificates_of_the_cluster_ca_name_an_identity() {
        let cluster = TestPki::new().unwrap();
        let other = TestPki::new().unwrap();
        let roots = crate::ca_roots(std::path::Path::new("ca"), cluster.ca_pem.as_bytes()).unwrap();
        let check = PeerCheck::new(roots).unwrap();
        let node = cluster
            .client("system:node:edge-2", &["system:nodes"])
            .unwrap();
        let who = check.identity(&der(&node.cert_pem)).unwrap();
        assert_eq!(who.user, "system:node:edge-2");
        assert_eq!(who.groups, ["system:nodes"]);
        let foreign = other
            .client("system:node:edge-2", &["system:nodes"])
            .unwrap();
        assert!(check.identity(&der(&foreign.cert_pem)).is_err());
        assert!(check.identity(&[]).is_err());
    }
}
