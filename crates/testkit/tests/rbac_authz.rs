//! RBAC in union with the Node authorizer, end to end: the hub's ClusterRole from
//! `manifests/cluster/rbac.yaml` grants the node identity what the Node authorizer alone refuses,
//! and nothing more.

mod common;

use common::Raw;
use http::Method;
use outpost_testkit::manifest::load_yaml;
use serde_json::{Value, json};

const RBAC_YAML: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../manifests/cluster/rbac.yaml"
);
const HUB_CFG: &str = "/api/v1/namespaces/kube-system/configmaps/yurt-hub-cfg";

fn hub_cfg() -> Value {
    json!({"metadata": {"name": "yurt-hub-cfg", "namespace": "kube-system"},
           "data": {"cache_agents": "*"}})
}

#[tokio::test]
async fn hub_rbac_manifest_grants_the_node_its_extra_permissions() {
    let fake = common::fake().await;
    fake.create("v1/configmaps", hub_cfg()).unwrap();
    let node = Raw::node(&fake, "edge-1");

    let refused = node.get(HUB_CFG).await;
    assert_eq!(refused.status, 403);
    assert_eq!(
        refused.json()["message"],
        "configmaps \"yurt-hub-cfg\" is forbidden: User \"system:node:edge-1\" cannot get resource \"configmaps\" in API group \"\" in the namespace \"kube-system\": no relationship found between node 'edge-1' and this object"
    );
    let logged = fake.requests().pop().unwrap();
    assert_eq!(
        (logged.status, logged.verb.as_str(), logged.name.as_str()),
        (403, "get", "yurt-hub-cfg")
    );

    fake.apply_rbac(&load_yaml(RBAC_YAML).unwrap()).unwrap();
    let role = fake
        .get("rbac.authorization.k8s.io/v1/clusterroles", None, "outpost")
        .unwrap();
    assert_eq!(role["kind"], "ClusterRole");
    // Applying again replaces in place, like `kubectl apply`.
    fake.apply_rbac(&load_yaml(RBAC_YAML).unwrap()).unwrap();

    let granted = node.get(HUB_CFG).await;
    assert_eq!(granted.status, 200);
    assert_eq!(granted.json()["data"]["cache_agents"], "*");
    // The hub's watch of it: by name, through a `metadata.name` field selector.
    let by_name =
        "/api/v1/namespaces/kube-system/configmaps?fieldSelector=metadata.name%3Dyurt-hub-cfg";
    let watch = node
        .open(
            Method::GET,
            &format!("{by_name}&watch=true&timeoutSeconds=2"),
            None,
            Vec::new(),
        )
        .await;
    assert_eq!(watch.status(), 200);
    let mut body = watch.into_body();
    let events = common::read_events(&mut body, &mut Vec::new(), 1).await;
    assert_eq!(events[0]["type"], "ADDED");
    assert_eq!(events[0]["object"]["metadata"]["name"], "yurt-hub-cfg");
    drop(body);
    let log = fake.requests();
    let watched = log.iter().find(|r| r.verb == "watch").unwrap();
    assert_eq!(
        (watched.status, watched.user.as_str(), watched.name.as_str()),
        (200, "system:node:edge-1", "yurt-hub-cfg")
    );
    // Nothing more: one ConfigMap, two verbs.
    assert_eq!(
        node.get(by_name).await.status,
        403,
        "the hub never lists it"
    );
    assert_eq!(node.get("/api/v1/configmaps").await.status, 403);
    assert_eq!(
        node.get("/api/v1/namespaces/kube-system/configmaps/coredns")
            .await
            .status,
        403
    );
    // EndpointSlices are granted (list and watch) for the shared cache; get is not.
    assert_eq!(
        node.get("/apis/discovery.k8s.io/v1/endpointslices")
            .await
            .status,
        200
    );
    assert_eq!(
        node.get("/apis/discovery.k8s.io/v1/namespaces/default/endpointslices/web")
            .await
            .status,
        403
    );
    // NodePools are granted (list and watch) for servicetopology's pool scope; get is not.
    assert_eq!(
        node.get("/apis/apps.openyurt.io/v1beta1/nodepools")
            .await
            .status,
        200
    );
    assert_eq!(
        node.get("/apis/apps.openyurt.io/v1beta1/nodepools/pool-a")
            .await
            .status,
        403
    );

    // What RBAC does not grant is still the Node authorizer's call, with its reason.
    let unscoped = node.get("/api/v1/pods").await;
    assert_eq!(unscoped.status, 403);
    assert_eq!(
        unscoped.json()["message"],
        "pods is forbidden: User \"system:node:edge-1\" cannot list resource \"pods\" in API group \"\" at the cluster scope: can only list/watch pods with spec.nodeName field selector"
    );
    assert_eq!(
        node.get("/api/v1/namespaces/kube-system/secrets/anything")
            .await
            .status,
        403
    );
    assert_eq!(
        node.send(
            Method::PUT,
            HUB_CFG,
            Some("application/json"),
            hub_cfg().to_string().into_bytes()
        )
        .await
        .status,
        403,
        "configmaps are read-only for the hub"
    );
    assert_eq!(node.get("/apis/apps/v1/deployments").await.status, 403);
    // The Node authorizer allows nodes/status patch; NodeRestriction limits it to its own.
    let foreign_status = node
        .send(
            Method::PATCH,
            "/api/v1/nodes/v1.32-control-plane/status",
            Some("application/merge-patch+json"),
            b"{}".to_vec(),
        )
        .await;
    assert_eq!(foreign_status.status, 403);
    // The binding names system:nodes, not anonymous callers.
    assert_eq!(Raw::anonymous(&fake).get(HUB_CFG).await.status, 403);
    fake.shutdown().await;
}

#[tokio::test]
async fn rbac_objects_created_over_rest_take_effect() {
    let fake = common::fake().await;
    let admin = Raw::admin(&fake);
    let node = Raw::node(&fake, "edge-1");
    let roles = "/apis/rbac.authorization.k8s.io/v1/clusterroles";
    let bindings = "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings";
    let kube_proxy_cm = "/api/v1/namespaces/kube-system/configmaps/kube-proxy";
    assert_eq!(node.get(kube_proxy_cm).await.status, 403);

    let role = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "kube-proxy-reader"},
        "rules": [{"apiGroups": [""], "resources": ["configmaps"],
                   "resourceNames": ["kube-proxy"], "verbs": ["get"]}]});
    assert_eq!(admin.post_json(roles, &role).await.status, 201);
    let binding = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "edge-1-kube-proxy"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "kube-proxy-reader"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "system:node:edge-1"}]});
    assert_eq!(admin.post_json(bindings, &binding).await.status, 201);

    assert_eq!(node.get(kube_proxy_cm).await.status, 200);
    assert_eq!(
        node.get("/api/v1/namespaces/kube-system/configmaps/coredns")
            .await
            .status,
        403,
        "resourceNames limit the grant"
    );
    assert_eq!(
        Raw::node(&fake, "edge-2").get(kube_proxy_cm).await.status,
        403,
        "bound to edge-1 only"
    );
    let listed = admin.get(bindings).await.json();
    assert_eq!(listed["items"][0]["metadata"]["name"], "edge-1-kube-proxy");

    // A binding whose role is gone grants nothing, and says why.
    let deleted = admin
        .send(
            Method::DELETE,
            &format!("{roles}/kube-proxy-reader"),
            None,
            Vec::new(),
        )
        .await;
    assert_eq!(deleted.status, 200);
    let refused = node.get(kube_proxy_cm).await;
    assert_eq!(refused.status, 403);
    assert!(
        refused.json()["message"].as_str().unwrap().ends_with(
            "no relationship found between node 'edge-1' and this object\nRBAC: clusterrole.rbac.authorization.k8s.io \"kube-proxy-reader\" not found"
        ),
        "{}",
        refused.json()["message"]
    );

    // SubjectAccessReview answers with the same union.
    let review = json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
        "spec": {"user": "system:node:edge-1", "groups": ["system:nodes"],
                 "resourceAttributes": {"verb": "watch", "resource": "configmaps",
                                        "namespace": "kube-system", "name": "yurt-hub-cfg"}}});
    let sar = "/apis/authorization.k8s.io/v1/subjectaccessreviews";
    assert_eq!(
        admin.post_json(sar, &review).await.json()["status"]["allowed"],
        false
    );
    fake.apply_rbac(&load_yaml(RBAC_YAML).unwrap()).unwrap();
    assert_eq!(
        admin.post_json(sar, &review).await.json()["status"]["allowed"],
        true
    );
    fake.shutdown().await;
}

#[tokio::test]
async fn apply_rbac_refuses_what_the_apiserver_would() {
    let fake = common::fake().await;
    let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}});
    let role = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "fine"}, "rules": []});
    let err = fake.apply_rbac(&[role, cm]).unwrap_err();
    assert_eq!(err.code, 400);
    assert!(
        fake.get("rbac.authorization.k8s.io/v1/clusterroles", None, "fine")
            .is_none(),
        "nothing is stored unless everything is valid"
    );
    let role_binding = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": "cm", "namespace": "kube-system"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "cm-reader"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:nodes"}]});
    let cm_reader = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": "cm-reader", "namespace": "kube-system"},
        "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list"]}]});
    fake.apply_rbac(&[cm_reader, role_binding]).unwrap();
    let node = Raw::node(&fake, "edge-1");
    assert_eq!(
        node.get("/api/v1/namespaces/kube-system/configmaps")
            .await
            .status,
        200
    );
    assert_eq!(
        node.get("/api/v1/namespaces/default/configmaps")
            .await
            .status,
        403,
        "a Role grants only in its namespace"
    );
    fake.shutdown().await;
}
