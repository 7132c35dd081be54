//! Kubernetes protobuf on the wire, as a 1.32 kubelet speaks it: protobuf bodies on POST/PUT and
//! `Accept: application/vnd.kubernetes.protobuf,application/json`. The fake decodes the bodies
//! and answers single objects and errors in protobuf, as kube-apiserver does.

mod common;

use common::{Raw, Reply};
use http::Method;
use outpost_core::wire::{self, protobuf};
use serde_json::{Value, json};

const KUBELET_ACCEPT: &str = "application/vnd.kubernetes.protobuf,application/json";
const EDGE: &str = "edge-1";
/// The node the seeded kube-system pods run on.
const FIXTURE_NODE: &str = "v1.32-control-plane";
const LEASE_PATH: &str = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/edge-1";

fn kubelet(fake: &outpost_testkit::FakeApiServer, node: &str) -> Raw {
    let mut raw = Raw::node(fake, node);
    raw.accept = Some(KUBELET_ACCEPT.into());
    raw
}

async fn send_protobuf(raw: &Raw, method: Method, path: &str, object: &Value) -> Reply {
    let body = protobuf::encode_object(object).expect("the object encodes");
    raw.send(method, path, Some(wire::PROTOBUF), body).await
}

/// The answer decoded from protobuf; fails unless it was protobuf.
fn protobuf_answer(reply: &Reply) -> Value {
    assert_eq!(
        reply.headers["content-type"],
        wire::PROTOBUF,
        "{}",
        String::from_utf8_lossy(&reply.body)
    );
    protobuf::decode_object(&reply.body).expect("the answer decodes")
}

#[tokio::test]
async fn kubelet_lease_put_in_protobuf_round_trips() {
    let fake = common::fake().await;
    let node = kubelet(&fake, EDGE);
    let current = protobuf_answer(&node.get(LEASE_PATH).await);
    assert_eq!(current["kind"], "Lease");
    assert_eq!(current["spec"]["holderIdentity"], EDGE);

    let mut renewed = current.clone();
    renewed["spec"]["renewTime"] = "2026-11-23T19:44:21.123456Z".into();
    let put = send_protobuf(&node, Method::PUT, LEASE_PATH, &renewed).await;
    assert_eq!(put.status, 200);
    let answer = protobuf_answer(&put);
    assert_eq!(answer["spec"]["renewTime"], "2026-11-23T19:44:21.123456Z");
    assert_ne!(
        answer["metadata"]["resourceVersion"],
        current["metadata"]["resourceVersion"]
    );

    // A JSON client reads what the protobuf PUT stored, field for field.
    let json_get = Raw::admin(&fake).get(LEASE_PATH).await;
    assert_eq!(json_get.headers["content-type"], "application/json");
    assert_eq!(json_get.json(), answer);

    // A stale resourceVersion is a Conflict, answered as a protobuf Status.
    let stale = send_protobuf(&node, Method::PUT, LEASE_PATH, &renewed).await;
    assert_eq!(stale.status, 409);
    let status = protobuf_answer(&stale);
    assert_eq!(
        (status["kind"].as_str(), status["reason"].as_str()),
        (Some("Status"), Some("Conflict"))
    );
    fake.shutdown().await;
}

#[tokio::test]
async fn token_request_in_protobuf_gets_the_json_answer_in_protobuf() {
    let fake = common::fake().await;
    let node = kubelet(&fake, FIXTURE_NODE);
    let path = "/api/v1/namespaces/kube-system/serviceaccounts/kube-proxy/token";
    // What kubelet's projected kube-api-access volume asks for.
    let request = json!({
        "kind": "TokenRequest", "apiVersion": "authentication.k8s.io/v1",
        "metadata": {"creationTimestamp": null},
        "spec": {"audiences": null, "expirationSeconds": 3607,
                 "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": "kube-proxy-7jrhd",
                                    "uid": "214de4b4-7e3a-42ea-98c3-0899e8d72b83"}},
        "status": {"token": "", "expirationTimestamp": null},
    });
    let in_protobuf = send_protobuf(&node, Method::POST, path, &request).await;
    assert_eq!(in_protobuf.status, 201);
    let answer = protobuf_answer(&in_protobuf);

    let mut json_node = Raw::node(&fake, FIXTURE_NODE);
    json_node.accept = Some("application/json".into());
    let in_json = json_node.post_json(path, &request).await;
    assert_eq!(in_json.status, 201);
    let json_answer = in_json.json();

    // The same object either way; only the token and its expiry are new on every call.
    let without_token = |mut v: Value| {
        let status = v["status"].as_object_mut().unwrap();
        assert!(
            status["token"]
                .as_str()
                .is_some_and(|t| t.split('.').count() == 3)
        );
        assert!(status.remove("token").is_some());
        assert!(status.remove("expirationTimestamp").unwrap().is_string());
        v
    };
    assert_eq!(without_token(answer.clone()), without_token(json_answer));
    assert_eq!(
        answer["spec"]["boundObjectRef"]["uid"],
        "214de4b4-7e3a-42ea-98c3-0899e8d72b83"
    );
    assert_eq!(answer["spec"]["expirationSeconds"], 3607);

    // The issued token authenticates as the service account.
    let mut bearer = Raw::anonymous(&fake);
    bearer.bearer = answer["status"]["token"].as_str().map(str::to_owned);
    let whoami = bearer.get("/api/v1/namespaces/kube-system/pods").await;
    assert_ne!(whoami.status, 401);
    fake.shutdown().await;
}

#[tokio::test]
async fn node_registration_in_protobuf_for_an_existing_node_is_409_in_protobuf() {
    let fake = common::fake().await;
    let node = kubelet(&fake, EDGE);
    let registration = json!({
        "kind": "Node", "apiVersion": "v1",
        "metadata": {"name": EDGE, "creationTimestamp": null,
                     "labels": {"kubernetes.io/hostname": EDGE, "kubernetes.io/os": "linux"}},
        "spec": {},
        "status": {"capacity": {"cpu": "2", "memory": "4012716Ki", "pods": "110"},
                   "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
                   "nodeInfo": {"machineID": "", "systemUUID": "", "bootID": "", "kernelVersion": "",
                                "osImage": "", "containerRuntimeVersion": "", "kubeletVersion": "v1.32.4",
                                "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": "amd64"}},
    });
    let reply = send_protobuf(&node, Method::POST, "/api/v1/nodes", &registration).await;
    assert_eq!(reply.status, 409);
    let status = protobuf_answer(&reply);
    assert_eq!(
        status,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
               "message": "nodes \"edge-1\" already exists", "reason": "AlreadyExists",
               "details": {"name": EDGE, "kind": "nodes"}, "code": 409})
    );
    fake.shutdown().await;
}

#[tokio::test]
async fn event_post_in_protobuf_is_stored() {
    let fake = common::fake().await;
    let node = kubelet(&fake, EDGE);
    let event = json!({
        "kind": "Event", "apiVersion": "v1",
        "metadata": {"name": "edge-1.1867a2b7c8d9e0f1", "namespace": "default", "creationTimestamp": null},
        "involvedObject": {"kind": "Node", "name": EDGE, "uid": EDGE, "apiVersion": "v1"},
        "reason": "Starting", "message": "Starting kubelet.",
        "source": {"component": "kubelet", "host": EDGE},
        "firstTimestamp": "2026-11-23T19:44:21Z", "lastTimestamp": "2026-11-23T19:44:21Z",
        "count": 1, "type": "Normal", "eventTime": null,
        "reportingComponent": "kubelet", "reportingInstance": EDGE,
    });
    let reply = send_protobuf(
        &node,
        Method::POST,
        "/api/v1/namespaces/default/events",
        &event,
    )
    .await;
    assert_eq!(reply.status, 201);
    let created = protobuf_answer(&reply);
    assert!(
        created["metadata"]["uid"]
            .as_str()
            .is_some_and(|u| !u.is_empty())
    );
    for field in [
        "involvedObject",
        "reason",
        "message",
        "source",
        "firstTimestamp",
        "count",
        "type",
    ] {
        assert_eq!(created[field], event[field], "{field}");
    }
    let stored = fake
        .get("v1/events", Some("default"), "edge-1.1867a2b7c8d9e0f1")
        .expect("the event is stored");
    assert_eq!(stored["message"], "Starting kubelet.");
    fake.shutdown().await;
}

#[tokio::test]
async fn undecodable_protobuf_bodies_are_415_and_malformed_ones_400() {
    let fake = common::fake().await;
    let node = kubelet(&fake, EDGE);
    // A well-formed body of a kind the conversion does not know.
    let pod = protobuf::encode_envelope("v1", "Pod", b"\x0a\x04\x0a\x02p1");
    let reply = node
        .send(
            Method::POST,
            "/api/v1/namespaces/default/pods",
            Some(wire::PROTOBUF),
            pod,
        )
        .await;
    assert_eq!(reply.status, 415);
    let status = protobuf_answer(&reply);
    assert_eq!(status["reason"], "UnsupportedMediaType");
    assert_eq!(status["code"], 415);

    // The magic, then a field whose length runs past the end.
    let truncated = b"k8s\0\x0a\x05\x0a\x02v1".to_vec();
    let mut json_client = Raw::node(&fake, EDGE);
    json_client.accept = Some("application/json".into());
    let reply = json_client
        .send(Method::PUT, LEASE_PATH, Some(wire::PROTOBUF), truncated)
        .await;
    assert_eq!(reply.status, 400);
    let status = reply.json();
    assert_eq!(status["reason"], "BadRequest");
    assert!(
        status["message"]
            .as_str()
            .unwrap()
            .starts_with("the object provided is unrecognized (must be of type Lease): malformed protobuf envelope"),
        "{status}"
    );
    // Nothing was written.
    let lease = fake
        .get(
            "coordination.k8s.io/v1/leases",
            Some("kube-node-lease"),
            EDGE,
        )
        .unwrap();
    assert_eq!(
        lease["metadata"]["resourceVersion"],
        protobuf_answer(&node.get(LEASE_PATH).await)["metadata"]["resourceVersion"]
    );
    fake.shutdown().await;
}

#[tokio::test]
async fn lists_stay_json_and_protobuf_only_clients_of_lists_get_406() {
    let fake = common::fake().await;
    let node = kubelet(&fake, EDGE);
    let list = node
        .get("/api/v1/nodes?fieldSelector=metadata.name%3Dedge-1")
        .await;
    assert_eq!(list.status, 200);
    assert_eq!(list.headers["content-type"], "application/json");
    assert_eq!(list.json()["kind"], "NodeList");

    let mut protobuf_only = Raw::node(&fake, EDGE);
    protobuf_only.accept = Some(wire::PROTOBUF.into());
    let refused = protobuf_only
        .get("/api/v1/nodes?fieldSelector=metadata.name%3Dedge-1")
        .await;
    assert_eq!(refused.status, 406);
    assert_eq!(protobuf_answer(&refused)["reason"], "NotAcceptable");
    let single = protobuf_only.get("/api/v1/nodes/edge-1").await;
    assert_eq!(single.status, 200);
    assert_eq!(protobuf_answer(&single)["metadata"]["name"], EDGE);
    fake.shutdown().await;
}
