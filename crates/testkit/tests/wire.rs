//! Wire-level fidelity: bodies, status codes and headers compared with what a real
//! kube-apiserver 1.32 sent (the fixtures) and with its documented error wording.

mod common;

use common::{Raw, fixture_pods, keys, read_events};
use http::Method;
use http_body_util::BodyExt;
use serde_json::{Value, json};

#[tokio::test]
async fn list_matches_the_recorded_pod_list() {
    let fake = common::fake().await;
    let reply = Raw::admin(&fake)
        .get("/api/v1/namespaces/kube-system/pods")
        .await;
    assert_eq!(reply.status, 200);
    assert_eq!(reply.headers["content-type"], "application/json");
    let ours = reply.json();
    let recorded = fixture_pods();
    assert_eq!(keys(&ours), keys(&recorded));
    assert_eq!(ours["kind"], recorded["kind"]);
    assert_eq!(ours["apiVersion"], recorded["apiVersion"]);
    // Items are the recorded objects, untouched (no per-item kind/apiVersion).
    assert_eq!(ours["items"], recorded["items"]);
    let rv: u64 = ours["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(rv, fake.current_resource_version());
    fake.shutdown().await;
}

#[tokio::test]
async fn watch_list_stream_matches_the_recorded_stream() {
    let fake = common::fake().await;
    let path = "/api/v1/namespaces/kube-system/pods?allowWatchBookmarks=true&resourceVersion=0\
                &resourceVersionMatch=NotOlderThan&sendInitialEvents=true&watch=true";
    let resp = Raw::admin(&fake)
        .open(Method::GET, path, None, Vec::new())
        .await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "application/json");
    assert_eq!(resp.headers()["transfer-encoding"], "chunked");
    let mut body = resp.into_body();
    let ours = read_events(&mut body, &mut Vec::new(), 9).await;
    let recorded: Vec<Value> = include_str!("../fixtures/watch-list-pods.jsonl")
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(ours.len(), recorded.len());
    for (o, r) in ours.iter().zip(&recorded).take(8) {
        assert_eq!(o, r, "ADDED events carry the stored objects as recorded");
    }
    let (mut bookmark, recorded_bookmark) = (ours[8].clone(), recorded[8].clone());
    assert_eq!(
        bookmark["object"]["metadata"]["resourceVersion"],
        fake.current_resource_version().to_string()
    );
    bookmark["object"]["metadata"]["resourceVersion"] =
        recorded_bookmark["object"]["metadata"]["resourceVersion"].clone();
    assert_eq!(bookmark, recorded_bookmark);
    fake.shutdown().await;
}

#[tokio::test]
async fn discovery_and_version_documents() {
    let fake = common::fake().await;
    let anon = Raw::anonymous(&fake);
    for path in ["/version", "/version/"] {
        let v = anon.get(path).await;
        assert_eq!(v.status, 200, "{path}");
        assert_eq!(v.json()["minor"], "32");
        assert_eq!(v.json()["gitVersion"], "v1.32.4");
    }
    for path in ["/healthz", "/livez", "/readyz"] {
        let r = anon.get(path).await;
        assert_eq!((r.status, &r.body[..]), (200, &b"ok"[..]), "{path}");
    }
    let admin = Raw::admin(&fake);
    assert_eq!(admin.get("/api").await.json()["versions"], json!(["v1"]));
    let recorded: Value = serde_json::from_str(include_str!("../fixtures/apis.json")).unwrap();
    let apis = admin.get("/apis").await.json();
    assert_eq!(keys(&apis), keys(&recorded));
    let group = admin.get("/apis/coordination.k8s.io").await.json();
    assert_eq!(group["kind"], "APIGroup");
    assert_eq!(
        group["preferredVersion"]["groupVersion"],
        "coordination.k8s.io/v1"
    );
    let core = admin.get("/api/v1").await.json();
    let pods = core["resources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "pods")
        .unwrap();
    assert_eq!(pods["shortNames"], json!(["po"]));
    assert_eq!(pods["namespaced"], true);
    let yurt = admin.get("/apis/apps.openyurt.io/v1beta1").await.json();
    assert_eq!(yurt["resources"][0]["kind"], "NodePool");
    for path in [
        "/openapi/v2",
        "/openapi/v3",
        "/apis/nope.io/v1",
        "/api/v1/widgets",
    ] {
        let r = admin.get(path).await;
        assert_eq!(r.status, 404, "{path}");
        assert_eq!(
            r.json()["message"],
            "the server could not find the requested resource"
        );
    }
    fake.shutdown().await;
}

#[tokio::test]
async fn anonymous_and_bad_credentials() {
    let fake = common::fake().await;
    let anon = Raw::anonymous(&fake)
        .get("/api/v1/namespaces/default/pods")
        .await;
    assert_eq!(anon.status, 403);
    assert_eq!(
        anon.json()["message"],
        "pods is forbidden: User \"system:anonymous\" cannot list resource \"pods\" in API group \"\" in the namespace \"default\""
    );
    assert_eq!(anon.json()["reason"], "Forbidden");
    let mut with_token = Raw::anonymous(&fake);
    with_token.bearer = Some("unknown".into());
    let r = with_token.get("/api/v1/pods").await;
    assert_eq!(
        (r.status, r.json()["reason"].clone()),
        (401, json!("Unauthorized"))
    );
    fake.add_token("s3cret", "ci-bot", &["ci"]);
    with_token.bearer = Some("s3cret".into());
    assert_eq!(with_token.get("/api/v1/pods").await.status, 200);
    let expired = fake.pki().expired_client("alice", &[]).unwrap();
    let r = Raw::with_pem(&fake, expired.cert_pem, expired.key_pem)
        .get("/api/v1/pods")
        .await;
    assert_eq!(
        r.status, 401,
        "expired certs fail authentication, not the handshake"
    );
    let users: Vec<String> = fake.requests().iter().map(|r| r.user.clone()).collect();
    assert!(users.contains(&"system:anonymous".to_owned()));
    assert!(users.contains(&"ci-bot".to_owned()));
    fake.shutdown().await;
}

#[tokio::test]
async fn required_client_certificates_fail_the_handshake() {
    let config = outpost_testkit::FakeConfig {
        require_client_cert: true,
        ..Default::default()
    };
    let fake = common::fake_with(config).await;
    let anon = Raw::anonymous(&fake);
    let handshake = async {
        let mut tls = anon.connect().await?;
        // TLS 1.3 reports client-auth failures on the first read.
        tokio::io::AsyncWriteExt::write_all(&mut tls, b"GET /version HTTP/1.1\r\nhost: x\r\n\r\n")
            .await?;
        let mut buf = [0u8; 16];
        tokio::io::AsyncReadExt::read(&mut tls, &mut buf).await
    };
    assert!(!matches!(handshake.await, Ok(n) if n > 0));
    assert_eq!(Raw::admin(&fake).get("/version").await.status, 200);
    fake.shutdown().await;
}

#[tokio::test]
async fn write_errors_are_status_bodies() {
    let fake = common::fake().await;
    let admin = Raw::admin(&fake);
    let missing = admin.get("/api/v1/namespaces/default/pods/nope").await;
    assert_eq!(missing.status, 404);
    let body = missing.json();
    assert_eq!(body["message"], "pods \"nope\" not found");
    assert_eq!(body["details"], json!({"name": "nope", "kind": "pods"}));
    let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"a": "1"}});
    let created = admin
        .post_json("/api/v1/namespaces/default/configmaps", &cm)
        .await;
    assert_eq!(created.status, 201);
    let again = admin
        .post_json("/api/v1/namespaces/default/configmaps", &cm)
        .await;
    assert_eq!(
        (again.status, again.json()["reason"].clone()),
        (409, json!("AlreadyExists"))
    );
    let apply = admin
        .send(
            Method::PATCH,
            "/api/v1/namespaces/default/configmaps/c",
            Some("application/apply-patch+yaml"),
            b"data: {}".to_vec(),
        )
        .await;
    assert_eq!(apply.status, 415);
    let bad_sel = admin.get("/api/v1/pods?labelSelector=a%20b").await;
    assert_eq!(bad_sel.status, 400);
    assert!(
        bad_sel.json()["message"]
            .as_str()
            .unwrap()
            .contains("found 'b'")
    );
    let field = admin
        .get("/api/v1/configmaps?fieldSelector=data.a%3D1")
        .await;
    assert_eq!(field.status, 400);
    let pod_field = admin
        .get("/api/v1/pods?fieldSelector=spec.containers%3Dx")
        .await;
    assert_eq!(
        pod_field.json()["message"],
        "field label not supported: spec.containers"
    );
    let invalid = admin
        .get("/api/v1/pods?watch=true&sendInitialEvents=true")
        .await;
    assert_eq!(invalid.status, 422);
    assert_eq!(
        invalid.json()["details"]["causes"][0]["field"],
        "resourceVersionMatch"
    );
    let wrong_ns = admin
        .post_json(
            "/api/v1/namespaces/nope/configmaps",
            &json!({"metadata": {"name": "x"}}),
        )
        .await;
    assert_eq!(
        (wrong_ns.status, wrong_ns.json()["message"].clone()),
        (404, json!("namespaces \"nope\" not found"))
    );
    let post_named = admin
        .post_json("/api/v1/namespaces/default/configmaps/c", &cm)
        .await;
    assert_eq!(post_named.status, 405);
    fake.shutdown().await;
}

#[tokio::test]
async fn patch_flavours_and_status_subresource() {
    let fake = common::fake().await;
    let admin = Raw::admin(&fake);
    let pod = json!({"metadata": {"name": "p", "labels": {"a": "1"}}, "spec": {"containers": [{"name": "c", "image": "i"}]}});
    let created = admin
        .post_json("/api/v1/namespaces/default/pods", &pod)
        .await
        .json();
    assert_eq!(created["status"], json!({"phase": "Pending"}));
    let path = "/api/v1/namespaces/default/pods/p";
    let send = |ct: &'static str, body: Value| {
        admin.send(Method::PATCH, path, Some(ct), body.to_string().into_bytes())
    };
    let merged = send(
        "application/merge-patch+json",
        json!({"metadata": {"labels": {"b": "2"}}}),
    )
    .await
    .json();
    assert_eq!(merged["metadata"]["labels"], json!({"a": "1", "b": "2"}));
    let smp = send(
        "application/strategic-merge-patch+json",
        json!({"spec": {"containers": [{"name": "c", "image": "j"}]}}),
    )
    .await
    .json();
    assert_eq!(
        smp["spec"]["containers"],
        json!([{"name": "c", "image": "j"}])
    );
    let jp = send(
        "application/json-patch+json",
        json!([{"op": "remove", "path": "/metadata/labels/a"}]),
    )
    .await
    .json();
    assert_eq!(jp["metadata"]["labels"], json!({"b": "2"}));
    // Main-resource writes keep status; /status writes change only status.
    let ignored = send(
        "application/merge-patch+json",
        json!({"status": {"phase": "Running"}}),
    )
    .await
    .json();
    assert_eq!(ignored["status"]["phase"], "Pending");
    let status = admin
        .send(
            Method::PATCH,
            "/api/v1/namespaces/default/pods/p/status",
            Some("application/merge-patch+json"),
            json!({"status": {"phase": "Running"}, "metadata": {"labels": {"x": "y"}}})
                .to_string()
                .into_bytes(),
        )
        .await
        .json();
    assert_eq!(status["status"]["phase"], "Running");
    assert!(status["metadata"]["labels"].get("x").is_none());
    let rvs: Vec<u64> = [&created, &merged, &smp, &jp, &status]
        .iter()
        .map(|o| {
            o["metadata"]["resourceVersion"]
                .as_str()
                .unwrap()
                .parse()
                .unwrap()
        })
        .collect();
    assert!(
        rvs.windows(2).all(|w| w[0] < w[1]),
        "every write bumps the global rv: {rvs:?}"
    );
    fake.shutdown().await;
}

#[tokio::test]
async fn delete_collection_returns_the_deleted_list() {
    let fake = common::fake().await;
    let admin = Raw::admin(&fake);
    for (name, app) in [("a", "web"), ("b", "web"), ("c", "db")] {
        let cm = json!({"metadata": {"name": name, "labels": {"app": app}}});
        assert_eq!(
            admin
                .post_json("/api/v1/namespaces/default/configmaps", &cm)
                .await
                .status,
            201
        );
    }
    let r = admin
        .send(
            Method::DELETE,
            "/api/v1/namespaces/default/configmaps?labelSelector=app%3Dweb",
            None,
            Vec::new(),
        )
        .await;
    assert_eq!(r.status, 200);
    let list = r.json();
    assert_eq!(list["kind"], "ConfigMapList");
    let names: Vec<&str> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["a", "b"]);
    assert!(fake.get("v1/configmaps", Some("default"), "c").is_some());
    assert!(fake.get("v1/configmaps", Some("default"), "a").is_none());
    fake.shutdown().await;
}

#[tokio::test]
async fn service_account_tokens_authenticate() {
    let fake = common::fake().await;
    let admin = Raw::admin(&fake);
    let req = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"audiences": ["api"], "expirationSeconds": 600}});
    let r = admin
        .post_json(
            "/api/v1/namespaces/kube-system/serviceaccounts/coredns/token",
            &req,
        )
        .await;
    assert_eq!(r.status, 201);
    let tr = r.json();
    assert_eq!(tr["kind"], "TokenRequest");
    assert_eq!(tr["spec"]["expirationSeconds"], 600);
    let token = tr["status"]["token"].as_str().unwrap().to_owned();
    assert_eq!(token.split('.').count(), 3);
    let review = admin
        .post_json(
            "/apis/authentication.k8s.io/v1/tokenreviews",
            &json!({"spec": {"token": token}}),
        )
        .await
        .json();
    assert_eq!(
        review["status"]["user"]["username"],
        "system:serviceaccount:kube-system:coredns"
    );
    let mut sa = Raw::anonymous(&fake);
    sa.bearer = Some(token);
    sa.get("/api/v1/namespaces/kube-system/pods").await;
    assert_eq!(
        fake.requests().last().unwrap().user,
        "system:serviceaccount:kube-system:coredns"
    );
    let missing = admin
        .post_json(
            "/api/v1/namespaces/default/serviceaccounts/ghost/token",
            &req,
        )
        .await;
    assert_eq!(missing.status, 404);
    let sar = json!({"spec": {"user": "system:node:edge-1", "groups": ["system:nodes"],
                              "resourceAttributes": {"verb": "list", "resource": "pods"}}});
    let decision = admin
        .post_json("/apis/authorization.k8s.io/v1/subjectaccessreviews", &sar)
        .await
        .json();
    assert_eq!(decision["status"]["allowed"], false);
    fake.shutdown().await;
}

#[tokio::test]
async fn request_log_records_the_classification() {
    let fake = common::fake().await;
    fake.clear_requests();
    Raw::admin(&fake)
        .get("/api/v1/namespaces/default/configmaps?fieldSelector=metadata.name%3Dkube-root-ca.crt")
        .await;
    let log = fake.requests();
    assert_eq!(log.len(), 1);
    let r = &log[0];
    assert_eq!(
        (r.method.as_str(), r.verb.as_str(), r.resource.as_str()),
        ("GET", "list", "configmaps")
    );
    assert_eq!(
        (r.namespace.as_str(), r.name.as_str(), r.status),
        ("default", "kube-root-ca.crt", 200)
    );
    assert_eq!(r.user, common::ADMIN);
    assert!(r.groups.contains(&"system:masters".to_owned()));
    assert_eq!(r.user_agent.as_deref(), Some(common::USER_AGENT));
    assert_eq!(r.query, "fieldSelector=metadata.name%3Dkube-root-ca.crt");
    fake.shutdown().await;
}

#[tokio::test]
async fn watch_ends_cleanly_at_timeout_seconds() {
    let fake = common::fake().await;
    let resp = Raw::admin(&fake)
        .open(Method::GET, "/api/v1/namespaces/default/configmaps?watch=true&resourceVersion=1000000&timeoutSeconds=1", None, Vec::new())
        .await;
    // A future resourceVersion is waited for, then refused.
    assert_eq!(resp.status(), 504);
    let rv = fake.current_resource_version();
    let started = std::time::Instant::now();
    let resp = Raw::admin(&fake)
        .open(Method::GET, &format!("/api/v1/namespaces/default/configmaps?watch=true&resourceVersion={rv}&timeoutSeconds=1"), None, Vec::new())
        .await;
    let collected = resp.into_body().collect().await;
    assert!(
        collected.is_ok(),
        "a timed-out watch ends with the final chunk"
    );
    assert!(started.elapsed() >= std::time::Duration::from_millis(900));
    fake.shutdown().await;
}

#[tokio::test]
async fn table_responses_for_server_side_printing() {
    let fake = common::fake().await;
    let accept = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json";
    let tls = Raw::admin(&fake).connect().await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
            .await
            .unwrap();
    tokio::spawn(conn);
    let req = http::Request::get("/api/v1/nodes")
        .header("host", "127.0.0.1")
        .header("accept", accept)
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .unwrap();
    let body = sender
        .send_request(req)
        .await
        .unwrap()
        .into_body()
        .collect()
        .await
        .unwrap()
        .to_bytes();
    let table: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(table["kind"], "Table");
    assert_eq!(table["apiVersion"], "meta.k8s.io/v1");
    let columns: Vec<&str> = table["columnDefinitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(columns, ["Name", "Status", "Roles", "Age", "Version"]);
    let edge = table["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["cells"][0] == "edge-1")
        .unwrap();
    assert_eq!(edge["cells"][1], "Ready");
    assert_eq!(edge["object"]["kind"], "PartialObjectMetadata");
    fake.shutdown().await;
}
