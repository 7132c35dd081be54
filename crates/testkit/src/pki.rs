//! A throw-away cluster PKI for tests and the demo: one CA, an apiserver serving certificate for
//! the loopback addresses, and client certificates whose subject carries the Kubernetes identity
//! (CN = user, O = groups), exactly how kube-apiserver's x509 authenticator reads them.
//!
//! rcgen keeps one value per attribute type in a subject, but groups are repeated `O`
//! attributes, so subjects with several (and every subject copied from a CSR) are spliced into
//! the rcgen-built certificate as DER, which is then signed again.

use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use rcgen::{
    BasicConstraints, CertificateParams, CertificateSigningRequestParams, DistinguishedName,
    DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose, SanType, SerialNumber,
    SigningKey, date_time_ymd,
};
use x509_parser::certification_request::X509CertificationRequest;
use x509_parser::prelude::FromDer;

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
        let der = if orgs.len() > 1 {
            self.with_subject(cert.der(), &name_der(cn, orgs))?
        } else {
            cert.der().to_vec()
        };
        Ok(CertPair {
            cert_pem: pem("CERTIFICATE", &der),
            key_pem: key.serialize_pem(),
        })
    }
}

/// How far back kube-controller-manager's signer dates `notBefore`, for clock skew.
const BACKDATE: Duration = Duration::from_secs(5 * 60);

impl TestPki {
    /// Signs a PEM `CERTIFICATE REQUEST` as a serving certificate, as kube-controller-manager
    /// signs an approved `kubernetes.io/kubelet-serving` request (`digital signature`,
    /// `key encipherment`, `server auth`); see [`TestPki::sign_csr_with_usages`].
    pub fn sign_csr(&self, csr_pem: &str, validity: Duration) -> Result<String, PkiError> {
        const SERVING: &[&str] = &["digital signature", "key encipherment", "server auth"];
        self.sign_csr_with_usages(csr_pem, SERVING, validity)
    }

    /// Signs a PEM `CERTIFICATE REQUEST` with the CA, as kube-controller-manager's signers do:
    /// the request's subject (verbatim) and DNS / IP SANs, the key usages and extended key
    /// usages named by Kubernetes `usages` (`digital signature`, `server auth`,
    /// `client auth`…; unknown ones are ignored), a random serial, valid from 5 minutes ago for
    /// `validity`. Returns the certificate PEM. Fails if the request does not parse or its
    /// signature is wrong.
    pub fn sign_csr_with_usages(
        &self,
        csr_pem: &str,
        usages: &[&str],
        validity: Duration,
    ) -> Result<String, PkiError> {
        let unparsable = || rcgen::Error::CouldNotParseCertificationRequest;
        let (_, block) =
            x509_parser::pem::parse_x509_pem(csr_pem.as_bytes()).map_err(|_| unparsable())?;
        let (_, parsed) =
            X509CertificationRequest::from_der(&block.contents).map_err(|_| unparsable())?;
        let subject = parsed.certification_request_info.subject.as_raw();
        let mut csr = CertificateSigningRequestParams::from_der(&block.contents.as_slice().into())?;
        let requested = std::mem::take(&mut csr.params);
        let mut params = CertificateParams::default();
        params.distinguished_name = requested.distinguished_name;
        params.subject_alt_names = requested
            .subject_alt_names
            .into_iter()
            .filter(|s| matches!(s, SanType::DnsName(_) | SanType::IpAddress(_)))
            .collect();
        params.key_usages = usages.iter().filter_map(|u| key_usage(u)).collect();
        params.extended_key_usages = usages
            .iter()
            .filter_map(|u| extended_key_usage(u))
            .collect();
        params.serial_number = Some(random_serial());
        params.is_ca = IsCa::ExplicitNoCa;
        params.use_authority_key_identifier_extension = true;
        let now = date_time_ymd(1970, 1, 1) + crate::util::unix_now();
        params.not_before = now - BACKDATE;
        params.not_after = params.not_before + validity;
        csr.params = params;
        let issuer = Issuer::from_params(&self.ca_params, &self.ca_key);
        let der = self.with_subject(csr.signed_by(&issuer)?.der(), subject)?;
        Ok(pem("CERTIFICATE", &der))
    }

    /// The certificate with its subject replaced by `subject` (a DER `Name`), signed again.
    fn with_subject(&self, cert: &[u8], subject: &[u8]) -> Result<Vec<u8>, PkiError> {
        let malformed = || rcgen::Error::CouldNotParseCertificate;
        let outer = der_content(cert)
            .and_then(der_split)
            .ok_or_else(malformed)?;
        let [tbs, algorithm, _signature] = outer[..] else {
            return Err(malformed());
        };
        let mut fields = der_content(tbs).and_then(der_split).ok_or_else(malformed)?;
        // version, serialNumber, signature, issuer, validity, subject, ...
        *fields.get_mut(5).ok_or_else(malformed)? = subject;
        let tbs = der(0x30, &fields.concat());
        let signature = [&[0u8][..], &self.ca_key.sign(&tbs)?].concat();
        Ok(der(
            0x30,
            &[&tbs[..], algorithm, &der(0x03, &signature)].concat(),
        ))
    }
}

/// A DER `Name`: the CN, then one `O` per group, each its own RDN (as Go writes them).
fn name_der(cn: &str, orgs: &[&str]) -> Vec<u8> {
    const COMMON_NAME: &[u8] = &[0x06, 0x03, 0x55, 0x04, 0x03];
    const ORGANIZATION: &[u8] = &[0x06, 0x03, 0x55, 0x04, 0x0a];
    let rdn = |oid: &[u8], value: &str| {
        let attribute = der(0x30, &[oid, &der(0x0c, value.as_bytes())].concat());
        der(0x31, &attribute)
    };
    let rdns: Vec<Vec<u8>> = std::iter::once(rdn(COMMON_NAME, cn))
        .chain(orgs.iter().map(|o| rdn(ORGANIZATION, o)))
        .collect();
    der(0x30, &rdns.concat())
}

/// One DER TLV.
fn der(tag: u8, content: &[u8]) -> Vec<u8> {
    let mut out = vec![tag];
    match content.len() {
        n if n < 0x80 => out.push(n as u8),
        n => {
            let bytes: Vec<u8> = n
                .to_be_bytes()
                .into_iter()
                .skip_while(|b| *b == 0)
                .collect();
            out.push(0x80 | bytes.len() as u8);
            out.extend(bytes);
        }
    }
    out.extend_from_slice(content);
    out
}

/// (header length, content length) of the TLV at the start of `der`.
fn der_header(der: &[u8]) -> Option<(usize, usize)> {
    let first = *der.get(1)?;
    if first < 0x80 {
        return Some((2, first.into()));
    }
    let n = usize::from(first & 0x7f);
    let bytes = der.get(2..2 + n).filter(|_| (1..=4).contains(&n))?;
    Some((
        2 + n,
        bytes.iter().fold(0, |acc, b| acc << 8 | usize::from(*b)),
    ))
}

/// The content of the TLV at the start of `der`.
fn der_content(der: &[u8]) -> Option<&[u8]> {
    let (header, len) = der_header(der)?;
    der.get(header..header + len)
}

/// Consecutive TLVs, each with its header.
fn der_split(mut der: &[u8]) -> Option<Vec<&[u8]>> {
    let mut out = Vec::new();
    while !der.is_empty() {
        let (header, len) = der_header(der)?;
        let (tlv, rest) = der.split_at_checked(header + len)?;
        out.push(tlv);
        der = rest;
    }
    Some(out)
}

fn pem(label: &str, der: &[u8]) -> String {
    let b64 = STANDARD.encode(der);
    let lines: Vec<&str> = b64
        .as_bytes()
        .chunks(64)
        .map(|c| std::str::from_utf8(c).unwrap_or_default())
        .collect();
    format!(
        "-----BEGIN {label}-----\n{}\n-----END {label}-----\n",
        lines.join("\n")
    )
}

/// Go's `keyUsageDict`.
fn key_usage(usage: &str) -> Option<KeyUsagePurpose> {
    Some(match usage {
        "signing" | "digital signature" => KeyUsagePurpose::DigitalSignature,
        "content commitment" => KeyUsagePurpose::ContentCommitment,
        "key encipherment" => KeyUsagePurpose::KeyEncipherment,
        "key agreement" => KeyUsagePurpose::KeyAgreement,
        "data encipherment" => KeyUsagePurpose::DataEncipherment,
        "cert sign" => KeyUsagePurpose::KeyCertSign,
        "crl sign" => KeyUsagePurpose::CrlSign,
        "encipher only" => KeyUsagePurpose::EncipherOnly,
        "decipher only" => KeyUsagePurpose::DecipherOnly,
        _ => return None,
    })
}

/// Go's `extKeyUsageDict`, for the purposes rcgen names.
fn extended_key_usage(usage: &str) -> Option<ExtendedKeyUsagePurpose> {
    Some(match usage {
        "any" => ExtendedKeyUsagePurpose::Any,
        "server auth" => ExtendedKeyUsagePurpose::ServerAuth,
        "client auth" => ExtendedKeyUsagePurpose::ClientAuth,
        "code signing" => ExtendedKeyUsagePurpose::CodeSigning,
        "email protection" | "s/mime" => ExtendedKeyUsagePurpose::EmailProtection,
        "timestamping" => ExtendedKeyUsagePurpose::TimeStamping,
        "ocsp signing" => ExtendedKeyUsagePurpose::OcspSigning,
        _ => return None,
    })
}

/// A positive 128-bit serial, as Go's signer draws one.
fn random_serial() -> SerialNumber {
    let (a, b) = (crate::util::random_u64(), crate::util::random_u64());
    let mut bytes = [a.to_be_bytes(), b.to_be_bytes()].concat();
    bytes[0] = (bytes[0] & 0x7f) | 0x01;
    SerialNumber::from(bytes)
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

#[cfg(test)]
mod tests {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;

    use super::*;
    use crate::authn::identity_of;

    fn identity(cert_pem: &str) -> (String, Vec<String>) {
        let der = CertificateDer::from_pem_slice(cert_pem.as_bytes()).unwrap();
        let user = identity_of(&der).unwrap();
        (user.name, user.groups)
    }

    #[test]
    fn client_certificates_carry_every_group() {
        let pki = TestPki::new().unwrap();
        let pair = pki
            .client("system:node:n", &["openyurt:yurthub", "system:nodes"])
            .unwrap();
        let (name, groups) = identity(&pair.cert_pem);
        assert_eq!(name, "system:node:n");
        assert_eq!(
            groups,
            ["openyurt:yurthub", "system:nodes", "system:authenticated"]
        );
    }

    #[test]
    fn signing_copies_the_requested_subject_and_names() {
        let pki = TestPki::new().unwrap();
        let mut params =
            CertificateParams::new(vec!["10.0.0.1".to_owned(), "node.example".to_owned()]).unwrap();
        params.distinguished_name = dn("system:node:n", &["a"]);
        // rcgen's only way to a second O: the same OID under another DnType.
        params
            .distinguished_name
            .push(DnType::CustomDnType(vec![2, 5, 4, 10]), "b");
        let key = KeyPair::generate().unwrap();
        let csr = params.serialize_request(&key).unwrap().pem().unwrap();
        let cert = pki
            .sign_csr_with_usages(&csr, &["client auth"], Duration::from_secs(600))
            .unwrap();
        let (name, groups) = identity(&cert);
        assert_eq!(name, "system:node:n");
        assert_eq!(groups, ["a", "b", "system:authenticated"]);
        let der = CertificateDer::from_pem_slice(cert.as_bytes()).unwrap();
        let (_, parsed) = x509_parser::parse_x509_certificate(der.as_ref()).unwrap();
        let sans = parsed.subject_alternative_name().unwrap().unwrap();
        assert_eq!(sans.value.general_names.len(), 2);
        let validity = parsed.validity();
        let lifetime = validity.not_after.timestamp() - validity.not_before.timestamp();
        assert_eq!(lifetime, 600);
        assert!(pki.sign_csr("junk", Duration::from_secs(600)).is_err());
    }
}
