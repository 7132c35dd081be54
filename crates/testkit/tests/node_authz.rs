//! The Node authorizer end to end, with node client certificates as kubelet / yurthub use them.

mod common;

use common::Raw;
use http::Method;
use serde_json::json;

#[tokio::test]
async fn node_pod_access_is_scoped_to_its_own_pods() {
    let fake = common::fake().await;
    let node = Raw::node(&fake, "edge-1");
    let scoped = node
        .get("/api/v1/pods?fieldSelector=spec.nodeName%3Dedge-1")
        .await;
    assert_eq!(scoped.status, 200);
    assert_eq!(scoped.json()["items"], json!([]));
    let unscoped = node.get("/api/v1/pods").await;
    assert_eq!(unscoped.status, 403);
    assert_eq!(
        unscoped.json()["message"],
        "pods is forbidden: User \"system:node:edge-1\" cannot list resource \"pods\" in API group \"\" at the cluster scope: can only list/watch pods with spec.nodeName field selector"
    );
    let watch = node
        .get("/api/v1/pods?watch=true&fieldSelector=spec.nodeName%3Dedge-2")
        .await;
    assert_eq!(watch.status, 403);
    let foreign = node
        .get("/api/v1/namespaces/kube-system/pods/etcd-v1.32-control-plane")
        .await;
    assert_eq!(foreign.status, 403);
    assert_eq!(
        Raw::node(&fake, "v1.32-control-plane")
            .get("/api/v1/namespaces/kube-system/pods/etcd-v1.32-control-plane")
            .await
            .status,
        200
    );
    fake.shutdown().await;
}

#[tokio::test]
async fn node_objects_and_leases_are_its_own_only() {
    let fake = common::fake().await;
    let node = Raw::node(&fake, "edge-1");
    assert_eq!(node.get("/api/v1/nodes/edge-1").await.status, 200);
    assert_eq!(
        node.get("/api/v1/nodes?fieldSelector=metadata.name%3Dedge-1")
            .await
            .status,
        200
    );
    assert_eq!(
        node.get("/api/v1/nodes/v1.32-control-plane").await.status,
        403
    );
    assert_eq!(node.get("/api/v1/nodes").await.status, 403);
    let status = node
        .send(
            Method::PATCH,
            "/api/v1/nodes/edge-1/status",
            Some("application/strategic-merge-patch+json"),
            json!({"status": {"conditions": [{"type": "Ready", "status": "True"}]}})
                .to_string()
                .into_bytes(),
        )
        .await;
    assert_eq!(status.status, 200);
    let other = node
        .send(
            Method::PATCH,
            "/api/v1/nodes/v1.32-control-plane/status",
            Some("application/merge-patch+json"),
            b"{}".to_vec(),
        )
        .await;
    assert_eq!(other.status, 403, "NodeRestriction");
    let leases = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases";
    assert_eq!(node.get(&format!("{leases}/edge-1")).await.status, 200);
    let foreign = node.get(&format!("{leases}/v1.32-control-plane")).await;
    assert_eq!(foreign.status, 403);
    assert!(
        foreign.json()["message"]
            .as_str()
            .unwrap()
            .ends_with("can only access node lease with the same name as the requesting node")
    );
    assert_eq!(
        node.get(leases).await.status,
        403,
        "nodes cannot list leases"
    );
    let create_other = node
        .post_json(leases, &json!({"metadata": {"name": "edge-2"}, "spec": {}}))
        .await;
    assert_eq!(create_other.status, 403);
    fake.shutdown().await;
}

#[tokio::test]
async fn node_reads_configmaps_and_secrets_only_through_its_pods() {
    let fake = common::fake().await;
    let node = Raw::node(&fake, "edge-1");
    let cm_path = "/api/v1/namespaces/default/configmaps";
    fake.create(
        "v1/configmaps",
        json!({"metadata": {"name": "app-config"}, "data": {"a": "1"}}),
    )
    .unwrap();
    fake.create(
        "v1/secrets",
        json!({"metadata": {"name": "app-secret"}, "type": "Opaque"}),
    )
    .unwrap();
    assert_eq!(node.get(&format!("{cm_path}/app-config")).await.status, 403);
    fake.create(
        "v1/pods",
        json!({
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {"nodeName": "edge-1", "containers": [{"name": "c", "image": "i",
                      "envFrom": [{"secretRef": {"name": "app-secret"}}]}],
                     "volumes": [{"name": "cfg", "configMap": {"name": "app-config"}}]}
        }),
    )
    .unwrap();
    assert_eq!(node.get(&format!("{cm_path}/app-config")).await.status, 200);
    let per_object = node
        .get(&format!(
            "{cm_path}?fieldSelector=metadata.name%3Dapp-config&resourceVersion=0"
        ))
        .await;
    assert_eq!(per_object.status, 200);
    assert_eq!(per_object.json()["items"].as_array().unwrap().len(), 1);
    assert_eq!(node.get(cm_path).await.status, 403);
    assert_eq!(
        node.get(&format!("{cm_path}/kube-root-ca.crt"))
            .await
            .status,
        403
    );
    assert_eq!(
        node.get("/api/v1/namespaces/default/secrets/app-secret")
            .await
            .status,
        200
    );
    assert_eq!(
        node.get("/api/v1/namespaces/default/pods/web").await.status,
        200
    );
    let pods = node
        .get("/api/v1/pods?fieldSelector=spec.nodeName%3Dedge-1")
        .await
        .json();
    assert_eq!(pods["items"][0]["metadata"]["name"], "web");
    let status = node
        .send(
            Method::PATCH,
            "/api/v1/namespaces/default/pods/web/status",
            Some("application/merge-patch+json"),
            json!({"status": {"phase": "Running"}})
                .to_string()
                .into_bytes(),
        )
        .await;
    assert_eq!(status.status, 200);
    assert_eq!(
        fake.get("v1/pods", Some("default"), "web").unwrap()["status"]["phase"],
        "Running"
    );
    assert_eq!(
        Raw::node(&fake, "edge-2")
            .get(&format!("{cm_path}/app-config"))
            .await
            .status,
        403
    );
    fake.shutdown().await;
}

#[tokio::test]
async fn node_static_permissions() {
    let fake = common::fake().await;
    let node = Raw::node(&fake, "edge-1");
    assert_eq!(node.get("/api/v1/services").await.status, 200);
    assert_eq!(
        node.get("/api/v1/namespaces/default/endpoints/kubernetes")
            .await
            .status,
        200
    );
    assert_eq!(
        node.get("/apis/storage.k8s.io/v1/csidrivers").await.status,
        200
    );
    assert_eq!(
        node.get("/apis/node.k8s.io/v1/runtimeclasses").await.status,
        200
    );
    assert_eq!(node.get("/api/v1/namespaces").await.status, 403);
    assert_eq!(node.get("/apis/apps/v1/deployments").await.status, 403);
    let event = json!({"metadata": {"name": "e1"}, "involvedObject": {"kind": "Node", "name": "edge-1"}, "reason": "Starting"});
    assert_eq!(
        node.post_json("/api/v1/namespaces/default/events", &event)
            .await
            .status,
        201
    );
    assert_eq!(
        node.get("/apis").await.status,
        200,
        "discovery is open to authenticated users"
    );
    fake.shutdown().await;
}
