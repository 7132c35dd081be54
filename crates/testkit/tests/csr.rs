//! CertificateSigningRequests end to end: a node asks for a kubelet-serving certificate, the
//! fake's approver (yurt-manager) and signer (kube-controller-manager) issue it, and what a real
//! cluster refuses is refused.

mod common;

use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use common::Raw;
use futures_util::{StreamExt, TryStreamExt};
use http::Method;
use k8s_openapi::ByteString;
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestSpec,
};
use kube::api::{Api, ObjectMeta, PostParams, WatchEvent, WatchParams};
use outpost_testkit::{CsrSigning, FakeApiServer, FakeConfig};
use rcgen::{CertificateParams, DistinguishedName, DnType, KeyPair};
use rustls::client::danger::ServerCertVerifier;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use serde_json::{Value, json};
use x509_parser::prelude::{FromDer, X509Certificate};

const CSRS: &str = "/apis/certificates.k8s.io/v1/certificatesigningrequests";
const KUBELET_SERVING: &str = "kubernetes.io/kubelet-serving";
const SERVING: &[&str] = &["digital signature", "server auth"];
const SANS: &[&str] = &["169.254.2.1", "kubernetes.default.svc"];
const NODE: &str = "system:node:edge-1";

/// A PEM `CERTIFICATE REQUEST` (rcgen turns IP-looking names into IP SANs) and its key.
fn request(cn: &str, orgs: &[&str], sans: &[&str]) -> (String, KeyPair) {
    let mut params =
        CertificateParams::new(sans.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap();
    params.distinguished_name = DistinguishedName::new();
    params.distinguished_name.push(DnType::CommonName, cn);
    // rcgen keeps one value per DnType; a second O needs the same OID under another one.
    let types = [
        DnType::OrganizationName,
        DnType::CustomDnType(vec![2, 5, 4, 10]),
    ];
    for (ty, o) in types.into_iter().zip(orgs) {
        params.distinguished_name.push(ty, *o);
    }
    assert!(orgs.len() <= 2, "rcgen cannot write more groups");
    let key = KeyPair::generate().unwrap();
    (params.serialize_request(&key).unwrap().pem().unwrap(), key)
}

fn csr_body(name: &str, pem: &str, signer: &str, usages: &[&str]) -> Value {
    json!({
        "apiVersion": "certificates.k8s.io/v1",
        "kind": "CertificateSigningRequest",
        "metadata": {"name": name},
        "spec": {"request": STANDARD.encode(pem), "signerName": signer, "usages": usages},
    })
}

/// Polls the store until `done` holds for the CSR (5 s at most).
async fn wait_for(fake: &FakeApiServer, name: &str, done: impl Fn(&Value) -> bool) -> Value {
    let gvr = "certificates.k8s.io/v1/certificatesigningrequests";
    for _ in 0..500 {
        if let Some(csr) = fake.get(gvr, None, name).filter(&done) {
            return csr;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!(
        "CSR {name} never got there: {:?}",
        fake.get(gvr, None, name)
    );
}

fn certificate_pem(csr: &Value) -> Option<String> {
    let b64 = csr.pointer("/status/certificate")?.as_str()?;
    Some(String::from_utf8(STANDARD.decode(b64).unwrap()).unwrap())
}

fn condition_types(csr: &Value) -> Vec<String> {
    csr.pointer("/status/conditions")
        .and_then(Value::as_array)
        .map(|c| {
            c.iter()
                .map(|c| c["type"].as_str().unwrap().to_owned())
                .collect()
        })
        .unwrap_or_default()
}

fn der(pem: &str) -> CertificateDer<'static> {
    CertificateDer::from_pem_slice(pem.as_bytes()).unwrap()
}

/// Verifies the serving certificate as a TLS client of the hub would: chain to the cluster CA,
/// server-auth usage, and each name.
fn verify_serving(ca_pem: &str, cert_pem: &str, names: &[&str]) -> Result<(), rustls::Error> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(der(ca_pem)).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier =
        rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
            .build()
            .unwrap();
    let leaf = der(cert_pem);
    for name in names {
        let name = ServerName::try_from(*name).unwrap();
        verifier.verify_server_cert(&leaf, &[], &name, &[], UnixTime::now())?;
    }
    Ok(())
}

#[tokio::test]
async fn node_watches_its_serving_certificate_get_approved_and_signed() {
    let fake = common::fake().await;
    let dir = tempfile::tempdir().unwrap();
    let client = common::kube_client(&fake, dir.path(), NODE, &["system:nodes"]).await;
    let api: Api<CertificateSigningRequest> = Api::all(client);
    let (pem, _key) = request(NODE, &["system:nodes"], SANS);
    let csr = CertificateSigningRequest {
        metadata: ObjectMeta {
            name: Some("csr-edge-1".into()),
            ..Default::default()
        },
        spec: CertificateSigningRequestSpec {
            request: ByteString(pem.into_bytes()),
            signer_name: KUBELET_SERVING.into(),
            usages: Some(SERVING.iter().map(|s| s.to_string()).collect()),
            // Claims the server must ignore.
            username: Some("kubernetes-admin".into()),
            groups: Some(vec!["system:masters".into()]),
            ..Default::default()
        },
        status: None,
    };
    let created = api.create(&PostParams::default(), &csr).await.unwrap();
    assert_eq!(created.spec.username.as_deref(), Some(NODE));
    assert_eq!(
        created.spec.groups.unwrap(),
        ["system:nodes", "system:authenticated"]
    );
    let status = created.status.unwrap_or_default();
    assert!(status.conditions.is_none() && status.certificate.is_none());

    let rv = created.metadata.resource_version.unwrap();
    let params = WatchParams::default().fields("metadata.name=csr-edge-1");
    let mut events = api.watch(&params, &rv).await.unwrap().boxed();
    let mut seen = Vec::new();
    while seen.len() < 2 {
        let next = tokio::time::timeout(Duration::from_secs(5), events.try_next());
        match next.await.unwrap().unwrap() {
            Some(WatchEvent::Modified(obj)) => seen.push(obj),
            other => panic!("unexpected watch event {other:?}"),
        }
    }
    let [approved, signed] = &seen[..] else {
        unreachable!()
    };
    let rvs: Vec<u64> = [&rv, approved.metadata.resource_version.as_ref().unwrap()]
        .into_iter()
        .chain(signed.metadata.resource_version.as_ref())
        .map(|v| v.parse().unwrap())
        .collect();
    assert!(rvs.is_sorted() && rvs[0] < rvs[2], "{rvs:?}");
    let status = approved.status.clone().unwrap();
    let condition = &status.conditions.unwrap()[0];
    assert_eq!(
        (
            condition.type_.as_str(),
            condition.status.as_str(),
            condition.reason.as_deref()
        ),
        ("Approved", "True", Some("AutoApproved"))
    );
    assert!(condition.last_update_time.is_some() && condition.last_transition_time.is_some());
    assert!(status.certificate.is_none());

    let cert = signed.status.clone().unwrap().certificate.unwrap();
    let cert_pem = String::from_utf8(cert.0).unwrap();
    verify_serving(&fake.pki().ca_pem, &cert_pem, SANS).unwrap();
    assert!(verify_serving(&fake.pki().ca_pem, &cert_pem, &["edge-2.example"]).is_err());
    let leaf = der(&cert_pem);
    let (_, parsed) = X509Certificate::from_der(leaf.as_ref()).unwrap();
    let subject = parsed.subject();
    let cn = subject.iter_common_name().next().unwrap().as_str().unwrap();
    let orgs: Vec<&str> = subject
        .iter_organization()
        .map(|o| o.as_str().unwrap())
        .collect();
    assert_eq!((cn, orgs), (NODE, vec!["system:nodes"]));
    let validity = parsed.validity().time_to_expiration().unwrap();
    assert!(validity.whole_days() >= 364, "{validity}");
    fake.shutdown().await;
}

#[tokio::test]
async fn requests_the_approver_does_not_recognise_stay_pending() {
    let fake = common::fake().await;
    let node = Raw::node(&fake, "edge-1");
    let (wrong_org, _) = request(NODE, &["acme"], SANS);
    let body = csr_body("wrong-org", &wrong_org, KUBELET_SERVING, SERVING);
    assert_eq!(node.post_json(CSRS, &body).await.status, 201);
    let (client_usages, _) = request(NODE, &["system:nodes"], SANS);
    let body = csr_body(
        "client-usages",
        &client_usages,
        KUBELET_SERVING,
        &["digital signature", "client auth"],
    );
    assert_eq!(node.post_json(CSRS, &body).await.status, 201);
    tokio::time::sleep(Duration::from_millis(300)).await;
    for name in ["wrong-org", "client-usages"] {
        let csr = node.get(&format!("{CSRS}/{name}")).await.json();
        assert_eq!(csr["status"], json!({}), "{name}");
    }
    fake.shutdown().await;
}

#[tokio::test]
async fn without_an_approver_requests_wait_for_an_admin_and_nodes_cannot_approve() {
    let fake = common::fake_with(FakeConfig {
        csr_signing: CsrSigning::Pending,
        ..FakeConfig::default()
    })
    .await;
    let node = Raw::node(&fake, "edge-1");
    let (pem, _) = request(NODE, &["system:nodes"], SANS);
    let body = csr_body("csr-edge-1", &pem, KUBELET_SERVING, SERVING);
    assert_eq!(node.post_json(CSRS, &body).await.status, 201);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut csr = node.get(&format!("{CSRS}/csr-edge-1")).await.json();
    assert_eq!(csr["status"], json!({}));

    // What `kubectl certificate approve` sends.
    csr["status"]["conditions"] = json!([{
        "type": "Approved", "status": "True", "reason": "KubectlApprove", "message": "ok",
    }]);
    let approval = format!("{CSRS}/csr-edge-1/approval");
    let put = |raw: Raw, body: Value| {
        let path = approval.clone();
        async move {
            raw.send(
                Method::PUT,
                &path,
                Some("application/json"),
                body.to_string().into_bytes(),
            )
            .await
        }
    };
    let denied = put(Raw::node(&fake, "edge-1"), csr.clone()).await;
    assert_eq!(denied.status, 403);
    assert_eq!(
        denied.json()["message"],
        "certificatesigningrequests.certificates.k8s.io \"csr-edge-1\" is forbidden: User \"system:node:edge-1\" cannot update resource \"certificatesigningrequests/approval\" in API group \"certificates.k8s.io\" at the cluster scope"
    );
    let approved = put(Raw::admin(&fake), csr).await;
    assert_eq!(approved.status, 200);
    assert_eq!(condition_types(&approved.json()), ["Approved"]);

    let signed = wait_for(&fake, "csr-edge-1", |c| certificate_pem(c).is_some()).await;
    verify_serving(&fake.pki().ca_pem, &certificate_pem(&signed).unwrap(), SANS).unwrap();
    assert_eq!(
        signed["status"]["conditions"][0]["reason"],
        "KubectlApprove"
    );
    fake.shutdown().await;
}

#[tokio::test]
async fn invalid_requests_are_rejected_like_kube_apiserver() {
    let fake = common::fake().await;
    let node = Raw::node(&fake, "edge-1");
    let garbage = csr_body("garbage", "garbage", KUBELET_SERVING, SERVING);
    let reply = node.post_json(CSRS, &garbage).await;
    assert_eq!(reply.status, 422);
    let status = reply.json();
    assert_eq!(status["reason"], "Invalid");
    assert_eq!(
        status["message"],
        "CertificateSigningRequest.certificates.k8s.io \"garbage\" is invalid: spec.request: Invalid value: []byte{0x67, 0x61, 0x72, 0x62, 0x61, 0x67, 0x65}: PEM block type must be CERTIFICATE REQUEST"
    );
    let (pem, _) = request(NODE, &["system:nodes"], SANS);
    let incomplete = json!({
        "metadata": {"name": "incomplete"},
        "spec": {"request": STANDARD.encode(&pem)},
    });
    let message = node.post_json(CSRS, &incomplete).await.json()["message"].clone();
    assert_eq!(
        message,
        "CertificateSigningRequest.certificates.k8s.io \"incomplete\" is invalid: [spec.usages: Required value: usages must be provided, spec.signerName: Required value]"
    );
    let mut not_base64 = csr_body("not-base64", &pem, KUBELET_SERVING, SERVING);
    not_base64["spec"]["request"] = "not base64!".into();
    assert_eq!(node.post_json(CSRS, &not_base64).await.status, 400);
    let (masters, _) = request("mallory", &["system:masters"], &[]);
    let escalation = csr_body(
        "masters",
        &masters,
        "kubernetes.io/kube-apiserver-client",
        &["client auth"],
    );
    assert_eq!(node.post_json(CSRS, &escalation).await.status, 403);
    assert!(
        fake.list("certificates.k8s.io/v1/certificatesigningrequests", None)
            .is_empty()
    );
    fake.shutdown().await;
}

#[tokio::test]
async fn the_signer_fails_requests_it_must_not_sign() {
    let fake = common::fake().await;
    let node = Raw::node(&fake, "edge-1");
    // The approver does not look at SANs; kube-controller-manager's signer needs one.
    let (pem, _) = request(NODE, &["system:nodes"], &[]);
    let body = csr_body("no-sans", &pem, KUBELET_SERVING, SERVING);
    assert_eq!(node.post_json(CSRS, &body).await.status, 201);
    let failed = wait_for(&fake, "no-sans", |c| condition_types(c).len() == 2).await;
    assert_eq!(condition_types(&failed), ["Approved", "Failed"]);
    let condition = &failed["status"]["conditions"][1];
    assert_eq!(condition["reason"], "SignerValidationFailure");
    assert_eq!(condition["message"], "DNS or IP subjectAltName is required");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        certificate_pem(
            &fake
                .get(
                    "certificates.k8s.io/v1/certificatesigningrequests",
                    None,
                    "no-sans"
                )
                .unwrap()
        )
        .is_none()
    );
    fake.shutdown().await;
}

#[tokio::test]
async fn yurthub_client_certificates_authenticate_against_the_cluster() {
    let fake = common::fake().await;
    let node = Raw::node(&fake, "edge-1");
    let (pem, key) = request(NODE, &["openyurt:yurthub", "system:nodes"], &[]);
    let body = csr_body(
        "yurthub-edge-1",
        &pem,
        "kubernetes.io/kube-apiserver-client",
        &["digital signature", "key encipherment", "client auth"],
    );
    assert_eq!(node.post_json(CSRS, &body).await.status, 201);
    let signed = wait_for(&fake, "yurthub-edge-1", |c| certificate_pem(c).is_some()).await;
    let hub = Raw::with_pem(
        &fake,
        certificate_pem(&signed).unwrap(),
        key.serialize_pem(),
    );
    assert_eq!(hub.get("/api/v1/nodes/edge-1").await.status, 200);
    let last = fake.requests().pop().unwrap();
    assert_eq!(last.user, NODE);
    assert_eq!(
        last.groups,
        ["openyurt:yurthub", "system:nodes", "system:authenticated"]
    );
    fake.shutdown().await;
}
