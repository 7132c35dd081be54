//! Authentication: client certificates (CN = user, O = groups) and bearer tokens, else anonymous.
//!
//! kube-apiserver asks for a client certificate in the TLS handshake but verifies it only in its
//! x509 authenticator, so an expired or foreign certificate yields `401 Unauthorized`, not a
//! failed handshake. [`RequestLevelVerifier`] reproduces that with rustls: the handshake still
//! checks the proof of key possession, while chain validation happens per request in
//! [`Authenticator::authenticate`] (unless `require_client_cert` asks for TLS-level enforcement).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use outpost_core::{Reason, Status};
use rustls::client::danger::HandshakeSignatureValid;
use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{DigitallySignedStruct, DistinguishedName, RootCertStore, SignatureScheme};
use x509_parser::prelude::{FromDer, X509Certificate};

/// An authenticated (or anonymous) caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserInfo {
    pub name: String,
    pub groups: Vec<String>,
}

pub const ANONYMOUS: &str = "system:anonymous";

impl UserInfo {
    pub fn anonymous() -> Self {
        UserInfo {
            name: ANONYMOUS.to_owned(),
            groups: vec!["system:unauthenticated".to_owned()],
        }
    }

    /// The group-adder step of kube-apiserver: every authenticated user is `system:authenticated`.
    fn authenticated(name: String, mut groups: Vec<String>) -> Self {
        if !groups.iter().any(|g| g == "system:authenticated") {
            groups.push("system:authenticated".to_owned());
        }
        UserInfo { name, groups }
    }

    pub fn is_anonymous(&self) -> bool {
        self.name == ANONYMOUS
    }

    pub fn in_group(&self, group: &str) -> bool {
        self.groups.iter().any(|g| g == group)
    }
}

/// Offers client auth, checks handshake signatures, and defers chain validation to requests.
#[derive(Debug)]
pub struct RequestLevelVerifier {
    inner: Arc<dyn ClientCertVerifier>,
    mandatory: bool,
}

impl ClientCertVerifier for RequestLevelVerifier {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        self.mandatory
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        if self.mandatory {
            self.inner
                .verify_client_cert(end_entity, intermediates, now)
        } else {
            Ok(ClientCertVerified::assertion())
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// Turns credentials into a [`UserInfo`].
pub struct Authenticator {
    chain_verifier: Arc<dyn ClientCertVerifier>,
    tokens: Mutex<HashMap<String, UserInfo>>,
}

impl Authenticator {
    pub fn new(roots: RootCertStore) -> Result<Self, rustls::server::VerifierBuilderError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let chain_verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
            .allow_unauthenticated()
            .build()?;
        Ok(Authenticator {
            chain_verifier,
            tokens: Mutex::new(HashMap::new()),
        })
    }

    /// The verifier to put in the TLS server config.
    pub fn tls_verifier(&self, mandatory: bool) -> Arc<dyn ClientCertVerifier> {
        Arc::new(RequestLevelVerifier {
            inner: self.chain_verifier.clone(),
            mandatory,
        })
    }

    pub fn add_token(&self, token: &str, user: &str, groups: &[&str]) {
        let info = UserInfo::authenticated(
            user.to_owned(),
            groups.iter().map(|g| g.to_string()).collect(),
        );
        self.lock_tokens().insert(token.to_owned(), info);
    }

    pub fn token_user(&self, token: &str) -> Option<UserInfo> {
        self.lock_tokens().get(token).cloned()
    }

    fn lock_tokens(&self) -> std::sync::MutexGuard<'_, HashMap<String, UserInfo>> {
        self.tokens.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// x509 first, then bearer token, then anonymous; a credential that fails is a 401.
    pub fn authenticate(
        &self,
        peer_certs: Option<&[CertificateDer<'static>]>,
        authorization: Option<&str>,
    ) -> Result<UserInfo, Status> {
        if let Some(user) = peer_certs.and_then(|certs| self.certificate_user(certs)) {
            return Ok(user);
        }
        if let Some(token) = authorization.and_then(bearer_token) {
            return self.token_user(token).ok_or_else(unauthorized);
        }
        if peer_certs.is_some_and(|c| !c.is_empty()) {
            return Err(unauthorized());
        }
        Ok(UserInfo::anonymous())
    }

    fn certificate_user(&self, certs: &[CertificateDer<'static>]) -> Option<UserInfo> {
        let (leaf, intermediates) = certs.split_first()?;
        self.chain_verifier
            .verify_client_cert(leaf, intermediates, UnixTime::now())
            .ok()?;
        identity_of(leaf)
    }
}

/// CN is the user name, each O a group, as the x509 authenticator's `CommonNameUserConversion`.
pub fn identity_of(cert: &CertificateDer<'_>) -> Option<UserInfo> {
    let (_, parsed) = X509Certificate::from_der(cert.as_ref()).ok()?;
    let subject = parsed.subject();
    let name = subject.iter_common_name().next()?.as_str().ok()?.to_owned();
    let groups = subject
        .iter_organization()
        .filter_map(|o| o.as_str().ok().map(str::to_owned))
        .collect();
    Some(UserInfo::authenticated(name, groups))
}

fn bearer_token(header: &str) -> Option<&str> {
    let (scheme, token) = header.trim().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

pub fn unauthorized() -> Status {
    Status::new(Reason::Unauthorized, "Unauthorized")
}

#[cfg(test)]
mod tests {
    use rustls::pki_types::pem::PemObject;

    use super::*;
    use crate::pki::TestPki;

    fn der(pem: &str) -> Vec<CertificateDer<'static>> {
        CertificateDer::pem_slice_iter(pem.as_bytes())
            .collect::<Result<_, _>>()
            .unwrap()
    }

    fn authenticator(pki: &TestPki) -> Authenticator {
        let mut roots = RootCertStore::empty();
        for c in der(&pki.ca_pem) {
            roots.add(c).unwrap();
        }
        Authenticator::new(roots).unwrap()
    }

    #[test]
    fn client_certificate_identity() {
        let pki = TestPki::new().unwrap();
        let auth = authenticator(&pki);
        let pair = pki.client("system:node:edge-1", &["system:nodes"]).unwrap();
        let user = auth.authenticate(Some(&der(&pair.cert_pem)), None).unwrap();
        assert_eq!(user.name, "system:node:edge-1");
        assert_eq!(user.groups, ["system:nodes", "system:authenticated"]);
    }

    #[test]
    fn expired_or_foreign_certificates_are_401() {
        let pki = TestPki::new().unwrap();
        let auth = authenticator(&pki);
        let expired = pki.expired_client("alice", &[]).unwrap();
        let err = auth
            .authenticate(Some(&der(&expired.cert_pem)), None)
            .unwrap_err();
        assert_eq!(err.code, 401);
        let other = TestPki::new().unwrap().client("mallory", &[]).unwrap();
        assert!(
            auth.authenticate(Some(&der(&other.cert_pem)), None)
                .is_err()
        );
    }

    #[test]
    fn tokens_and_anonymous() {
        let pki = TestPki::new().unwrap();
        let auth = authenticator(&pki);
        auth.add_token("t0k", "bob", &["devs"]);
        let bob = auth.authenticate(None, Some("Bearer t0k")).unwrap();
        assert_eq!(bob.name, "bob");
        assert!(bob.in_group("system:authenticated"));
        assert_eq!(
            auth.authenticate(None, Some("bearer nope"))
                .unwrap_err()
                .code,
            401
        );
        assert!(auth.authenticate(None, None).unwrap().is_anonymous());
        assert!(
            auth.authenticate(None, Some("Basic Zm9vOmJhcg=="))
                .unwrap()
                .is_anonymous()
        );
    }
}
