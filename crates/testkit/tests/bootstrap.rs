//! kubeadm-style bootstrap-token discovery and TLS bootstrap against the fake, over real sockets:
//! an anonymous client reads `kube-public/cluster-info` and checks its JWS with the token's
//! secret, then the token authenticates a CSR for the hub's client certificate, which the
//! approver (yurt-manager) and signer (kube-controller-manager) issue.

mod common;

use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use common::Raw;
use outpost_testkit::manifest::parse_yaml;
use outpost_testkit::{FakeApiServer, FakeConfig};
use rcgen::{CertificateParams, DistinguishedName, DnType, KeyPair};
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use serde_json::{Value, json};
use x509_parser::prelude::{FromDer, X509Certificate};

const TOKEN: &str = "abcdef.0123456789abcdef";
const CLUSTER_INFO: &str = "/api/v1/namespaces/kube-public/configmaps/cluster-info";
const CSRS: &str = "/apis/certificates.k8s.io/v1/certificatesigningrequests";
const CLIENT_SIGNER: &str = "kubernetes.io/kube-apiserver-client";
const CLIENT_USAGES: &[&str] = &["digital signature", "key encipherment", "client auth"];
const HUB_ORGS: &[&str] = &["openyurt:yurthub", "system:nodes"];

fn with_token(fake: &FakeApiServer, token: &str) -> Raw {
    let mut raw = Raw::anonymous(fake);
    raw.bearer = Some(token.to_owned());
    raw
}

/// What a joining node does with `jws-kubeconfig-<id>`: recompute the HMAC-SHA256 of
/// `header.payload` with the secret and compare (`jws.DetachedTokenIsValid`).
fn jws_is_valid(jws: &str, payload: &str, id: &str, secret: &str) -> bool {
    let Some((header, signature)) = jws.split_once("..") else {
        return false;
    };
    let header_json: Value = serde_json::from_slice(&URL_SAFE_NO_PAD.decode(header).unwrap())
        .expect("the header is JSON");
    if header_json != json!({"alg": "HS256", "kid": id}) {
        return false;
    }
    let input = format!("{header}.{}", URL_SAFE_NO_PAD.encode(payload));
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret.as_bytes());
    let Ok(signature) = URL_SAFE_NO_PAD.decode(signature) else {
        return false;
    };
    ring::hmac::verify(&key, input.as_bytes(), &signature).is_ok()
}

/// A PEM `CERTIFICATE REQUEST` for `cn` in (at most two) `orgs`, and its key.
fn request(cn: &str, orgs: &[&str]) -> (String, KeyPair) {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.distinguished_name = DistinguishedName::new();
    params.distinguished_name.push(DnType::CommonName, cn);
    // rcgen keeps one value per DnType; a second O needs the same OID under another one.
    let types = [
        DnType::OrganizationName,
        DnType::CustomDnType(vec![2, 5, 4, 10]),
    ];
    assert!(orgs.len() <= 2, "rcgen cannot write more groups");
    for (ty, o) in types.into_iter().zip(orgs) {
        params.distinguished_name.push(ty, *o);
    }
    let key = KeyPair::generate().unwrap();
    (params.serialize_request(&key).unwrap().pem().unwrap(), key)
}

fn csr_body(name: &str, pem: &str, usages: &[&str]) -> Value {
    json!({
        "apiVersion": "certificates.k8s.io/v1",
        "kind": "CertificateSigningRequest",
        "metadata": {"name": name},
        "spec": {"request": STANDARD.encode(pem), "signerName": CLIENT_SIGNER, "usages": usages},
    })
}

/// Polls the CSR through the API until it carries a certificate (5 s at most).
async fn wait_for_certificate(client: &Raw, name: &str) -> Value {
    let path = format!("{CSRS}/{name}");
    for _ in 0..500 {
        let csr = client.get(&path).await.json();
        if csr.pointer("/status/certificate").is_some() {
            return csr;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!(
        "CSR {name} never got a certificate: {}",
        client.get(&path).await.json()
    );
}

#[tokio::test]
async fn anonymous_discovery_reads_cluster_info_signed_with_the_token() {
    let fake = common::fake().await;
    let anonymous = Raw::anonymous(&fake);
    assert_eq!(anonymous.get(CLUSTER_INFO).await.status, 403);

    fake.add_bootstrap_token(TOKEN).unwrap();
    let reply = anonymous.get(CLUSTER_INFO).await;
    assert_eq!(reply.status, 200);
    let last = fake.requests().pop().unwrap();
    assert_eq!((last.user.as_str(), last.status), ("system:anonymous", 200));
    let cm = reply.json();
    let data = cm["data"].as_object().unwrap();
    let keys: Vec<&String> = data.keys().collect();
    assert_eq!(keys, ["jws-kubeconfig-abcdef", "kubeconfig"]);

    let kubeconfig = data["kubeconfig"].as_str().unwrap();
    let ca_b64 = STANDARD.encode(&fake.pki().ca_pem);
    assert_eq!(
        kubeconfig,
        format!(
            "apiVersion: v1\nclusters:\n- cluster:\n    certificate-authority-data: {ca_b64}\n    server: {}\n  name: \"\"\ncontexts: null\ncurrent-context: \"\"\nkind: Config\npreferences: {{}}\nusers: null\n",
            fake.url()
        )
    );
    // And as a YAML reader sees it.
    let parsed = &parse_yaml(kubeconfig).unwrap()[0];
    assert_eq!(
        (&parsed["apiVersion"], &parsed["kind"]),
        (&json!("v1"), &json!("Config"))
    );
    let cluster = &parsed["clusters"][0];
    assert_eq!(cluster["name"], "");
    assert_eq!(cluster["cluster"]["server"], fake.url());
    let ca = STANDARD
        .decode(
            cluster["cluster"]["certificate-authority-data"]
                .as_str()
                .unwrap(),
        )
        .unwrap();
    assert_eq!(ca, fake.pki().ca_pem.as_bytes());
    assert!(parsed["users"].is_null() && parsed["contexts"].is_null());

    let jws = data["jws-kubeconfig-abcdef"].as_str().unwrap();
    assert!(
        jws.starts_with("eyJhbGciOiJIUzI1NiIsImtpZCI6ImFiY2RlZiJ9.."),
        "{jws}"
    );
    assert!(jws_is_valid(jws, kubeconfig, "abcdef", "0123456789abcdef"));
    assert!(!jws_is_valid(jws, kubeconfig, "abcdef", "0123456789abcdeg"));
    let tampered = kubeconfig.replace("127.0.0.1", "127.0.0.2");
    assert!(!jws_is_valid(jws, &tampered, "abcdef", "0123456789abcdef"));
    fake.shutdown().await;
}

#[tokio::test]
async fn anonymous_gets_cluster_info_and_nothing_else() {
    let fake = common::fake().await;
    fake.add_bootstrap_token(TOKEN).unwrap();
    let anonymous = Raw::anonymous(&fake);
    assert_eq!(anonymous.get(CLUSTER_INFO).await.status, 200);

    let other = anonymous
        .get("/api/v1/namespaces/kube-public/configmaps/kube-root-ca.crt")
        .await;
    assert_eq!(other.status, 403);
    assert_eq!(
        other.json()["message"],
        "configmaps \"kube-root-ca.crt\" is forbidden: User \"system:anonymous\" cannot get resource \"configmaps\" in API group \"\" in the namespace \"kube-public\""
    );
    let list = anonymous
        .get("/api/v1/namespaces/kube-public/configmaps")
        .await;
    assert_eq!(list.status, 403);
    let by_name =
        "/api/v1/namespaces/kube-public/configmaps?fieldSelector=metadata.name%3Dcluster-info";
    assert_eq!(
        anonymous.get(by_name).await.status,
        403,
        "get only, no list"
    );
    let elsewhere = anonymous
        .get("/api/v1/namespaces/kube-system/configmaps/cluster-info")
        .await;
    assert_eq!(elsewhere.status, 403);

    let role = fake
        .get(
            "rbac.authorization.k8s.io/v1/roles",
            Some("kube-public"),
            "kubeadm:bootstrap-signer-clusterinfo",
        )
        .unwrap();
    assert_eq!(
        role["rules"],
        json!([{"verbs": ["get"], "apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["cluster-info"]}])
    );
    let binding = fake
        .get(
            "rbac.authorization.k8s.io/v1/rolebindings",
            Some("kube-public"),
            "kubeadm:bootstrap-signer-clusterinfo",
        )
        .unwrap();
    assert_eq!(
        binding["subjects"],
        json!([{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "system:anonymous"}])
    );
    assert_eq!(binding["roleRef"]["kind"], "Role");
    fake.shutdown().await;
}

#[tokio::test]
async fn every_token_adds_its_signature_and_bad_tokens_change_nothing() {
    // Unseeded: even kube-public is missing, as in no real cluster; it gets created.
    let fake = common::fake_with(FakeConfig {
        seed: false,
        ..FakeConfig::default()
    })
    .await;
    for bad in [
        "abcdef",
        "ABCDEF.0123456789abcdef",
        "abcdef.0123456789abcde",
    ] {
        let err = fake.add_bootstrap_token(bad).unwrap_err();
        assert_eq!(err.code, 400, "{bad}");
    }
    assert!(fake.get("v1/namespaces", None, "kube-public").is_none());
    assert_eq!(
        with_token(&fake, "abcdef.0123456789abcde")
            .get("/api")
            .await
            .status,
        401
    );

    fake.add_bootstrap_token(TOKEN).unwrap();
    fake.add_bootstrap_token("zyx987.fedcba9876543210").unwrap();
    // Adding one again only signs again (the same bytes).
    fake.add_bootstrap_token(TOKEN).unwrap();
    assert!(fake.get("v1/namespaces", None, "kube-public").is_some());
    let cm = Raw::anonymous(&fake).get(CLUSTER_INFO).await.json();
    let data = cm["data"].as_object().unwrap();
    let keys: Vec<&String> = data.keys().collect();
    assert_eq!(
        keys,
        [
            "jws-kubeconfig-abcdef",
            "jws-kubeconfig-zyx987",
            "kubeconfig"
        ]
    );
    let kubeconfig = data["kubeconfig"].as_str().unwrap();
    let abcdef = data["jws-kubeconfig-abcdef"].as_str().unwrap();
    let zyx987 = data["jws-kubeconfig-zyx987"].as_str().unwrap();
    assert!(jws_is_valid(
        abcdef,
        kubeconfig,
        "abcdef",
        "0123456789abcdef"
    ));
    assert!(jws_is_valid(
        zyx987,
        kubeconfig,
        "zyx987",
        "fedcba9876543210"
    ));
    assert!(!jws_is_valid(
        zyx987,
        kubeconfig,
        "abcdef",
        "0123456789abcdef"
    ));
    for token in [TOKEN, "zyx987.fedcba9876543210"] {
        assert_eq!(with_token(&fake, token).get("/api").await.status, 200);
    }
    fake.shutdown().await;
}

#[tokio::test]
async fn the_token_bootstraps_the_hub_client_certificate() {
    let fake = common::fake().await;
    fake.add_bootstrap_token(TOKEN).unwrap();
    let node = "system:node:edge-7";
    let (pem, key) = request(node, HUB_ORGS);

    let wrong = with_token(&fake, "abcdef.0123456789abcdeg");
    let refused = wrong
        .post_json(CSRS, &csr_body("hub-edge-7", &pem, CLIENT_USAGES))
        .await;
    assert_eq!(refused.status, 401);
    assert_eq!(refused.json()["reason"], "Unauthorized");

    let bootstrap = with_token(&fake, TOKEN);
    let created = bootstrap
        .post_json(CSRS, &csr_body("hub-edge-7", &pem, CLIENT_USAGES))
        .await;
    assert_eq!(created.status, 201);
    let created = created.json();
    assert_eq!(created["spec"]["username"], "system:bootstrap:abcdef");
    assert_eq!(
        created["spec"]["groups"],
        json!(["system:bootstrappers", "system:authenticated"])
    );

    let signed = wait_for_certificate(&bootstrap, "hub-edge-7").await;
    let condition = &signed["status"]["conditions"][0];
    assert_eq!(
        (&condition["type"], &condition["reason"]),
        (&json!("Approved"), &json!("AutoApproved"))
    );
    let cert_pem = String::from_utf8(
        STANDARD
            .decode(signed["status"]["certificate"].as_str().unwrap())
            .unwrap(),
    )
    .unwrap();
    let der = CertificateDer::from_pem_slice(cert_pem.as_bytes()).unwrap();
    let (_, cert) = X509Certificate::from_der(der.as_ref()).unwrap();
    assert_eq!(
        cert.subject().to_string(),
        format!("CN={node}, O=openyurt:yurthub, O=system:nodes")
    );
    let cn = cert.subject().iter_common_name().next().unwrap();
    assert_eq!(cn.as_str().unwrap(), node);

    // The issued certificate is the node's identity from now on.
    let hub = Raw::with_pem(&fake, cert_pem, key.serialize_pem());
    assert_eq!(hub.get("/api/v1/nodes/edge-7").await.status, 404);
    let last = fake.requests().pop().unwrap();
    assert_eq!(
        (last.user.as_str(), last.groups.clone()),
        (
            node,
            vec![
                "openyurt:yurthub".to_owned(),
                "system:nodes".to_owned(),
                "system:authenticated".to_owned()
            ]
        )
    );
    fake.shutdown().await;
}

#[tokio::test]
async fn the_approver_leaves_other_client_requests_pending() {
    let fake = common::fake().await;
    fake.add_bootstrap_token(TOKEN).unwrap();
    let bootstrap = with_token(&fake, TOKEN);
    let cases: [(&str, &str, &[&str], &[&str]); 3] = [
        // yurt-manager wants all three usages, key encipherment too.
        (
            "no-key-encipherment",
            "system:node:edge-7",
            HUB_ORGS,
            &["digital signature", "client auth"],
        ),
        (
            "one-org",
            "system:node:edge-7",
            &["system:nodes"],
            CLIENT_USAGES,
        ),
        ("not-a-node", "edge-7", HUB_ORGS, CLIENT_USAGES),
    ];
    for (name, cn, orgs, usages) in cases {
        let (pem, _) = request(cn, orgs);
        let reply = bootstrap
            .post_json(CSRS, &csr_body(name, &pem, usages))
            .await;
        assert_eq!(reply.status, 201, "{name}");
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    for (name, ..) in cases {
        let csr = bootstrap.get(&format!("{CSRS}/{name}")).await.json();
        assert_eq!(csr["status"], json!({}), "{name}");
    }
    fake.shutdown().await;
}
