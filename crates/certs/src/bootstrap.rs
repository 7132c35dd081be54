//! The pure parts of yurthub's `token` bootstrap mode (kubeadm-style TLS bootstrap): the
//! bootstrap token, the CA pin (`--discovery-token-ca-cert-hash`), the detached JWS that signs
//! `kube-public/cluster-info`, and the client certificate request. The proxy crate's
//! `bootstrap` module does the requests; start there for the flow.

use std::fmt;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use rcgen::{KeyPair, PKCS_ECDSA_P256_SHA256, PublicKeyData, SigningKey};
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use yasna::models::ObjectIdentifier;

use crate::CertError;
use crate::serving::CsrDraft;

/// The signer of client certificates for the apiserver; yurt-manager approves the hub's.
pub const KUBE_APISERVER_CLIENT_SIGNER: &str = "kubernetes.io/kube-apiserver-client";

/// The organizations of the hub's client certificate, as yurthub asks for them.
pub const HUB_ORGANIZATIONS: [&str; 2] = ["openyurt:yurthub", "system:nodes"];

/// Why a bootstrap token, its signature of `cluster-info` or a CA pin does not hold.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error("a bootstrap token has the form [a-z0-9]{{6}}.[a-z0-9]{{16}}")]
    Malformed,
    #[error("not a detached compact JWS (header..signature)")]
    NotDetachedJws,
    #[error("the JWS header is not base64url JSON")]
    JwsHeader,
    #[error("the JWS header is {header}, not HS256 for token id {id}")]
    WrongKey {
        header: serde_json::Value,
        id: String,
    },
    #[error("the JWS signature is not base64url")]
    JwsSignature(#[source] base64::DecodeError),
    #[error("the signature does not match this token")]
    Mismatch,
    #[error("bad PEM: {0}")]
    Pem(#[source] rustls::pki_types::pem::Error),
    #[error("not an X.509 certificate: {0}")]
    NotX509(#[source] x509_parser::nom::Err<x509_parser::error::X509Error>),
    #[error("no CERTIFICATE block found")]
    NoCertificate,
}

/// A kubeadm bootstrap token, `<id>.<secret>` (`[a-z0-9]{6}.[a-z0-9]{16}`).
#[derive(Clone, PartialEq, Eq)]
pub struct BootstrapToken {
    pub id: String,
    secret: String,
}

impl BootstrapToken {
    pub fn parse(token: &str) -> Result<BootstrapToken, TokenError> {
        let well_formed = |part: &str, len: usize| {
            part.len() == len
                && part
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        };
        match token.trim().split_once('.') {
            Some((id, secret)) if well_formed(id, 6) && well_formed(secret, 16) => {
                Ok(BootstrapToken {
                    id: id.to_owned(),
                    secret: secret.to_owned(),
                })
            }
            _ => Err(TokenError::Malformed),
        }
    }

    /// The bearer token the apiserver authenticates as `system:bootstrap:<id>`.
    pub fn bearer(&self) -> String {
        format!("{}.{}", self.id, self.secret)
    }

    /// Whether `jws` is this token's detached signature of `payload`, as kubeadm's
    /// bootstrap-signer writes it into `cluster-info` (`jws-kubeconfig-<id>`): compact JWS,
    /// HS256 keyed with the secret, header `kid` = the id, payload left out.
    pub fn verify_detached(&self, jws: &str, payload: &[u8]) -> Result<(), TokenError> {
        let (header_b64, signature_b64) = match jws.split('.').collect::<Vec<_>>()[..] {
            [header, "", signature] => (header, signature),
            _ => return Err(TokenError::NotDetachedJws),
        };
        let header: serde_json::Value = URL_SAFE_NO_PAD
            .decode(header_b64)
            .ok()
            .and_then(|bytes| serde_json::from_slice(&bytes).ok())
            .ok_or(TokenError::JwsHeader)?;
        if header["alg"] != "HS256" || header["kid"] != self.id.as_str() {
            return Err(TokenError::WrongKey {
                header,
                id: self.id.clone(),
            });
        }
        let signature = URL_SAFE_NO_PAD
            .decode(signature_b64)
            .map_err(TokenError::JwsSignature)?;
        let signed = format!("{header_b64}.{}", URL_SAFE_NO_PAD.encode(payload));
        let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, self.secret.as_bytes());
        ring::hmac::verify(&key, signed.as_bytes(), &signature).map_err(|_| TokenError::Mismatch)
    }
}

/// The secret never appears in logs.
impl fmt::Debug for BootstrapToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "BootstrapToken({}.<secret>)", self.id)
    }
}

/// `sha256:<hex>` of each certificate's Subject Public Key Info, as kubeadm prints it for
/// `--discovery-token-ca-cert-hash`.
pub fn ca_cert_hashes(ca_pem: &[u8]) -> Result<Vec<String>, TokenError> {
    let mut hashes = Vec::new();
    for cert in CertificateDer::pem_slice_iter(ca_pem) {
        let cert = cert.map_err(TokenError::Pem)?;
        let (_, parsed) =
            x509_parser::parse_x509_certificate(cert.as_ref()).map_err(TokenError::NotX509)?;
        let digest = ring::digest::digest(&ring::digest::SHA256, parsed.public_key().raw);
        let hex: String = digest.as_ref().iter().map(|b| format!("{b:02x}")).collect();
        hashes.push(format!("sha256:{hex}"));
    }
    if hashes.is_empty() {
        return Err(TokenError::NoCertificate);
    }
    Ok(hashes)
}

/// Whether one of the CA's certificates has one of the pinned hashes (case-insensitive hex).
pub fn ca_is_pinned(ca_pem: &[u8], pins: &[String]) -> Result<bool, TokenError> {
    let hashes = ca_cert_hashes(ca_pem)?;
    Ok(hashes
        .iter()
        .any(|hash| pins.iter().any(|pin| pin.trim().eq_ignore_ascii_case(hash))))
}

const OID_COMMON_NAME: &[u64] = &[2, 5, 4, 3];
const OID_ORGANIZATION: &[u64] = &[2, 5, 4, 10];
const OID_ECDSA_WITH_SHA256: &[u64] = &[1, 2, 840, 10045, 4, 3, 2];

/// A new ECDSA P-256 key and a client request for `system:node:<node_name>` in the hub's
/// organizations and `extra_organizations` (`--hub-cert-organizations`).
///
/// kube-apiserver makes a group of every O= of a client certificate, but rcgen's
/// distinguished name holds one value per attribute type, so this request (RFC 2986) is
/// written here with yasna, the DER writer rcgen uses, and signed with an rcgen key.
pub fn draft_client_csr(
    node_name: &str,
    extra_organizations: &[String],
) -> Result<CsrDraft, CertError> {
    let fail = |e: rcgen::Error| CertError::Generate(e.to_string());
    let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).map_err(fail)?;
    let mut organizations: Vec<&str> = HUB_ORGANIZATIONS.to_vec();
    for extra in extra_organizations {
        if !organizations.contains(&extra.as_str()) {
            organizations.push(extra);
        }
    }
    let common_name = format!("system:node:{node_name}");
    let info = yasna::construct_der(|w| {
        w.write_sequence(|w| {
            w.next().write_u8(0);
            w.next().write_sequence(|w| {
                attribute(w.next(), OID_COMMON_NAME, &common_name);
                for org in &organizations {
                    attribute(w.next(), OID_ORGANIZATION, org);
                }
            });
            w.next().write_der(&key.subject_public_key_info());
            w.next()
                .write_tagged_implicit(yasna::Tag::context(0), |w| w.write_set(|_| {}));
        });
    });
    let signature = key.sign(&info).map_err(fail)?;
    let request = yasna::construct_der(|w| {
        w.write_sequence(|w| {
            w.next().write_der(&info);
            w.next().write_sequence(|w| {
                w.next()
                    .write_oid(&ObjectIdentifier::from_slice(OID_ECDSA_WITH_SHA256));
            });
            w.next().write_bitvec_bytes(&signature, signature.len() * 8);
        });
    });
    Ok(CsrDraft {
        csr_pem: pem::encode(&pem::Pem::new("CERTIFICATE REQUEST", request)),
        key_pem: key.serialize_pem(),
    })
}

/// One relative distinguished name holding one attribute.
fn attribute(w: yasna::DERWriter, oid: &[u64], value: &str) {
    w.write_set(|w| {
        w.next().write_sequence(|w| {
            w.next().write_oid(&ObjectIdentifier::from_slice(oid));
            w.next().write_utf8_string(value);
        });
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token() -> BootstrapToken {
        BootstrapToken::parse("abcdef.0123456789abcdef").expect("valid")
    }

    /// What kubeadm's bootstrap-signer computes (k8s.io/cluster-bootstrap/token/jws).
    fn sign(token: &str, secret: &str, payload: &[u8]) -> String {
        let header = URL_SAFE_NO_PAD.encode(format!(r#"{{"alg":"HS256","kid":"{token}"}}"#));
        let signed = format!("{header}.{}", URL_SAFE_NO_PAD.encode(payload));
        let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret.as_bytes());
        let tag = ring::hmac::sign(&key, signed.as_bytes());
        format!("{header}..{}", URL_SAFE_NO_PAD.encode(tag.as_ref()))
    }

    #[test]
    fn tokens_have_the_kubeadm_shape_and_hide_their_secret() {
        assert_eq!(token().bearer(), "abcdef.0123456789abcdef");
        for bad in [
            "abcdef",
            "abcde.0123456789abcdef",
            "ABCDEF.0123456789abcdef",
            "abcdef.0123",
        ] {
            assert!(BootstrapToken::parse(bad).is_err(), "{bad}");
        }
        assert!(!format!("{:?}", token()).contains("0123456789abcdef"));
    }

    #[test]
    fn a_detached_signature_verifies_only_for_its_token_and_payload() {
        let payload = b"apiVersion: v1\nkind: Config\n";
        let jws = sign("abcdef", "0123456789abcdef", payload);
        token().verify_detached(&jws, payload).expect("verifies");
        assert!(token().verify_detached(&jws, b"other").is_err());
        let other_secret = sign("abcdef", "0123456789abcdeg", payload);
        assert!(token().verify_detached(&other_secret, payload).is_err());
        let other_kid = sign("zzzzzz", "0123456789abcdef", payload);
        assert!(token().verify_detached(&other_kid, payload).is_err());
        assert!(token().verify_detached("a.b.c", payload).is_err());
    }

    #[test]
    fn the_ca_hash_is_the_sha256_of_the_public_key_info() {
        let pki = outpost_testkit::TestPki::new().expect("pki");
        let ca_pem = &pki.ca_pem;
        let hashes = ca_cert_hashes(ca_pem.as_bytes()).expect("hash");
        assert_eq!(hashes.len(), 1);
        assert!(hashes[0].starts_with("sha256:") && hashes[0].len() == 7 + 64);
        assert!(
            ca_is_pinned(
                ca_pem.as_bytes(),
                &[hashes[0].to_uppercase().replace("SHA256", "sha256")]
            )
            .unwrap()
        );
        let other = outpost_testkit::TestPki::new().expect("pki");
        assert!(!ca_is_pinned(other.ca_pem.as_bytes(), &hashes).unwrap());
        assert!(ca_cert_hashes(b"hello").is_err());
    }

    #[test]
    fn the_client_request_names_the_node_and_the_hub_organizations() {
        let extra = ["openyurt:tenant:ns1".to_owned(), "system:nodes".to_owned()];
        let draft = draft_client_csr("edge-1", &extra).expect("csr");
        let der = rustls::pki_types::CertificateSigningRequestDer::from_pem_slice(
            draft.csr_pem.as_bytes(),
        )
        .expect("pem");
        use x509_parser::prelude::FromDer;
        let (_, csr) =
            x509_parser::certification_request::X509CertificationRequest::from_der(der.as_ref())
                .expect("der");
        let subject = &csr.certification_request_info.subject;
        let cn: Vec<&str> = subject
            .iter_common_name()
            .filter_map(|a| a.as_str().ok())
            .collect();
        assert_eq!(cn, ["system:node:edge-1"]);
        let organizations: Vec<&str> = subject
            .iter_organization()
            .filter_map(|a| a.as_str().ok())
            .collect();
        assert_eq!(
            organizations,
            ["openyurt:yurthub", "system:nodes", "openyurt:tenant:ns1"]
        );
        // A CA (rcgen's parser checks the signature) accepts it.
        let pki = outpost_testkit::TestPki::new().expect("pki");
        let usages = ["digital signature", "key encipherment", "client auth"];
        let cert = pki
            .sign_csr_with_usages(&draft.csr_pem, &usages, std::time::Duration::from_secs(60))
            .expect("signed");
        let tls_pem = format!("{cert}{}", draft.key_pem);
        assert!(tls_pem.contains("PRIVATE KEY"));
    }
}
