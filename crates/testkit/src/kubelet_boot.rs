//! A Kubernetes 1.32 kubelet's boot, replayed against a hub as kubelet sends it: its
//! User-Agent, `Accept: application/vnd.kubernetes.protobuf,application/json`, protobuf bodies
//! on POST and PUT, strategic-merge JSON on PATCH, `?timeout=10s` on the heartbeat client's
//! requests, in the order of `../shared/reference/kubelet-boot.md` — from process start until
//! every pod on the node has its ConfigMaps, Secrets and service-account token, and reports
//! Running with its new IP.
//!
//! [`Scenario::create`] puts such a node in a [`crate::FakeApiServer`]: pods that mount a
//! ConfigMap, a Secret and a projected service-account token (with `kube-root-ca.crt`), a
//! Service whose EndpointSlice points at them. [`replay`] sends the boot and judges every answer
//! as kubelet would ([`Exchange::usable`]). The e2e tests, the demo and the boot benchmark run
//! it online, and after a reboot with the cloud unreachable.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Method, Request, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use outpost_core::wire;
use serde_json::{Value, json};

use crate::FakeApiServer;

pub const USER_AGENT: &str = "kubelet/v1.32.4 (linux/amd64) kubernetes/a78aa47";
pub const ACCEPT: &str = "application/vnd.kubernetes.protobuf,application/json";
/// The namespace of the scenario's pods.
pub const NAMESPACE: &str = "shop";

/// One request of the boot and what came back.
#[derive(Debug, Clone)]
pub struct Exchange {
    /// What kubelet does with it (`"pods list"`, `"token web-0"`…).
    pub what: String,
    pub method: Method,
    pub path: String,
    pub status: u16,
    pub content_type: Option<String>,
    /// `x-outpost-served-from`: who answered, when the hub did.
    pub served_from: Option<String>,
    pub body: Bytes,
    /// Whether kubelet can go on with this answer.
    pub usable: bool,
}

impl Exchange {
    /// The answer as JSON, whether it came as JSON or as protobuf.
    pub fn object(&self) -> Option<Value> {
        wire::read_body(self.content_type.as_deref(), &self.body).ok()
    }
}

/// Every exchange of one boot, in order.
#[derive(Debug, Default)]
pub struct Report {
    pub exchanges: Vec<Exchange>,
    /// From the first request to the last answer.
    pub elapsed: Duration,
}

impl Report {
    /// The answers kubelet could not go on with.
    pub fn unusable(&self) -> Vec<&Exchange> {
        self.exchanges.iter().filter(|e| !e.usable).collect()
    }

    /// One line per exchange, for a failure message or the demo.
    pub fn summary(&self) -> String {
        self.exchanges
            .iter()
            .map(|e| {
                format!(
                    "{} {} {} -> {}{}",
                    if e.usable { "ok  " } else { "FAIL" },
                    e.method,
                    e.path,
                    e.status,
                    e.served_from
                        .as_deref()
                        .map(|s| format!(" ({s})"))
                        .unwrap_or_default()
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    pub fn find(&self, what: &str) -> Option<&Exchange> {
        self.exchanges.iter().rev().find(|e| e.what == what)
    }
}

/// One boot of kubelet on `node`: what changes from boot to boot.
pub struct Boot<'a> {
    pub hub: SocketAddr,
    pub node: &'a str,
    /// `nodeInfo.bootID`.
    pub boot_id: &'a str,
    /// The IP pod `i` (in namespace, name order) gets at this boot.
    pub pod_ip: &'a (dyn Fn(usize) -> String + Sync),
    /// The `lastHeartbeatTime` and transition times this boot reports (RFC 3339).
    pub now: &'a str,
}

/// A node with pods in a fake cluster, as the boot expects it.
pub struct Scenario;

impl Scenario {
    /// The pods `web-0..pods` on `node`, each mounting ConfigMap `web-config`, Secret
    /// `web-secret` and a projected token of ServiceAccount `web`; Service `web` and its
    /// EndpointSlice point at them with `old_ip(i)`.
    pub fn create(
        fake: &FakeApiServer,
        node: &str,
        pods: usize,
        old_ip: impl Fn(usize) -> String,
    ) -> Vec<Value> {
        let create = |gvr: &str, obj: Value| {
            fake.create(gvr, obj)
                .unwrap_or_else(|e| panic!("{gvr}: {}", e.message))
        };
        create(
            "v1/namespaces",
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}),
        );
        create(
            "v1/serviceaccounts",
            json!({"apiVersion": "v1", "kind": "ServiceAccount",
                "metadata": {"name": "web", "namespace": NAMESPACE}}),
        );
        for (name, data) in [
            ("web-config", json!({"greeting": "hello"})),
            (
                "kube-root-ca.crt",
                json!({"ca.crt": "-----BEGIN CERTIFICATE-----\n"}),
            ),
        ] {
            create(
                "v1/configmaps",
                json!({"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": name, "namespace": NAMESPACE}, "data": data}),
            );
        }
        create(
            "v1/secrets",
            json!({"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                "metadata": {"name": "web-secret", "namespace": NAMESPACE},
                "data": {"password": "c2VjcmV0"}}),
        );
        let created: Vec<Value> = (0..pods)
            .map(|i| create("v1/pods", pod(i, node, &old_ip(i))))
            .collect();
        create(
            "v1/services",
            json!({"apiVersion": "v1", "kind": "Service",
                "metadata": {"name": "web", "namespace": NAMESPACE},
                "spec": {"clusterIP": "10.96.0.50", "selector": {"app": "web"},
                         "ports": [{"port": 80, "protocol": "TCP"}]}}),
        );
        let endpoints: Vec<Value> = created
            .iter()
            .enumerate()
            .map(|(i, pod)| {
                json!({"addresses": [old_ip(i)],
                    "conditions": {"ready": true, "serving": true, "terminating": false},
                    "nodeName": node,
                    "targetRef": {"kind": "Pod", "namespace": NAMESPACE,
                        "name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"]}})
            })
            .collect();
        create(
            "discovery.k8s.io/v1/endpointslices",
            json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                "metadata": {"name": "web-abcde", "namespace": NAMESPACE,
                    "labels": {"kubernetes.io/service-name": "web"}},
                "addressType": "IPv4", "endpoints": endpoints,
                "ports": [{"name": "", "port": 80, "protocol": "TCP"}]}),
        );
        created
    }
}

fn pod(i: usize, node: &str, ip: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": format!("web-{i}"), "namespace": NAMESPACE, "labels": {"app": "web"}},
        "spec": {
            "nodeName": node,
            "serviceAccountName": "web",
            "containers": [{"name": "web", "image": "nginx:1.27",
                "envFrom": [{"configMapRef": {"name": "web-config"}}],
                "volumeMounts": [{"name": "config", "mountPath": "/etc/web"}]}],
            "volumes": [
                {"name": "config", "configMap": {"name": "web-config"}},
                {"name": "secret", "secret": {"secretName": "web-secret"}},
                {"name": "kube-api-access", "projected": {"sources": [
                    {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                    {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                    {"downwardAPI": {"items": [{"path": "namespace",
                        "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}]}}]},
        "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}], "hostIP": "192.168.1.10",
            "conditions": [{"type": "Ready", "status": "True"}, {"type": "PodScheduled", "status": "True"}]}})
}

/// kubelet's requests from start to Running pods, against `boot.hub`.
pub async fn replay(boot: &Boot<'_>) -> Report {
    let started = Instant::now();
    let mut r = Replay {
        boot,
        report: Report::default(),
    };
    r.informers().await;
    r.registration_and_lease().await;
    let pods = r.pods().await;
    for (i, pod) in pods.iter().enumerate() {
        r.start_pod(i, pod).await;
    }
    r.report.elapsed = started.elapsed();
    r.report
}

struct Replay<'a> {
    boot: &'a Boot<'a>,
    report: Report,
}

/// How an answer is judged.
#[derive(Clone, Copy)]
enum Expect {
    /// 200 with a list (an object list kubelet can sync from).
    List,
    /// A watch stream opened (200).
    Watch,
    /// One of these codes.
    Codes(&'static [u16]),
}

impl Replay<'_> {
    async fn informers(&mut self) {
        let node = self.boot.node;
        let name_selector = format!("fieldSelector=metadata.name%3D{node}");
        self.list_and_watch("node informer", &format!("/api/v1/nodes?{name_selector}"))
            .await;
        self.list_and_watch(
            "service informer",
            "/api/v1/services?fieldSelector=spec.clusterIP%21%3DNone",
        )
        .await;
        self.list_and_watch(
            "runtimeclass informer",
            "/apis/node.k8s.io/v1/runtimeclasses?",
        )
        .await;
        self.list_and_watch("csidriver informer", "/apis/storage.k8s.io/v1/csidrivers?")
            .await;
        let csinode = self
            .send(
                "csinode",
                Method::GET,
                &format!("/apis/storage.k8s.io/v1/csinodes/{node}?resourceVersion=0"),
                None,
                Expect::Codes(&[200, 404]),
            )
            .await;
        if csinode.status == 404 {
            // kubelet creates a missing CSINode; repeated failures make it exit.
            let object = json!({"apiVersion": "storage.k8s.io/v1", "kind": "CSINode",
                "metadata": {"name": node, "annotations":
                    {"storage.alpha.kubernetes.io/migrated-plugins": "kubernetes.io/aws-ebs"}},
                "spec": {"drivers": []}});
            self.send(
                "csinode create",
                Method::POST,
                "/apis/storage.k8s.io/v1/csinodes",
                Some(Body::Protobuf(object)),
                Expect::Codes(&[201, 409]),
            )
            .await;
        }
    }

    async fn registration_and_lease(&mut self) {
        let node = self.boot.node;
        let lease_path =
            format!("/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{node}");
        let got = self
            .send(
                "lease get",
                Method::GET,
                &format!("{lease_path}?timeout=10s"),
                None,
                Expect::Codes(&[200, 404]),
            )
            .await;
        let mut lease = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": node, "namespace": "kube-node-lease"},
            "spec": {"holderIdentity": node, "leaseDurationSeconds": 40,
                     "renewTime": micro(self.boot.now)}});
        if got.status == 404 {
            self.send(
                "lease create",
                Method::POST,
                "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases?timeout=10s",
                Some(Body::Protobuf(lease.clone())),
                Expect::Codes(&[201]),
            )
            .await;
        } else if let Some(current) = got.object() {
            lease["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"].clone();
            self.send(
                "lease renew",
                Method::PUT,
                &format!("{lease_path}?timeout=10s"),
                Some(Body::Protobuf(lease)),
                Expect::Codes(&[200]),
            )
            .await;
        }
        let registered = self
            .send(
                "registration",
                Method::POST,
                "/api/v1/nodes",
                Some(Body::Protobuf(self.node_object())),
                Expect::Codes(&[201, 409]),
            )
            .await;
        if registered.status == 409 {
            self.send(
                "registered node",
                Method::GET,
                &format!("/api/v1/nodes/{node}"),
                None,
                Expect::Codes(&[200]),
            )
            .await;
        }
        let status = json!({"status": {
            "$setElementOrder/conditions": [{"type": "MemoryPressure"}, {"type": "DiskPressure"},
                {"type": "PIDPressure"}, {"type": "Ready"}],
            "conditions": [
                {"type": "MemoryPressure", "status": "False", "reason": "KubeletHasSufficientMemory",
                 "lastHeartbeatTime": self.boot.now},
                {"type": "DiskPressure", "status": "False", "reason": "KubeletHasNoDiskPressure",
                 "lastHeartbeatTime": self.boot.now},
                {"type": "PIDPressure", "status": "False", "reason": "KubeletHasSufficientPID",
                 "lastHeartbeatTime": self.boot.now},
                {"type": "Ready", "status": "True", "reason": "KubeletReady",
                 "message": "kubelet is posting ready status", "lastHeartbeatTime": self.boot.now,
                 "lastTransitionTime": self.boot.now}],
            "nodeInfo": {"bootID": self.boot.boot_id}}});
        self.send(
            "node status",
            Method::PATCH,
            &format!("/api/v1/nodes/{node}/status?timeout=10s"),
            Some(Body::StrategicMerge(status)),
            Expect::Codes(&[200]),
        )
        .await;
    }

    fn node_object(&self) -> Value {
        let node = self.boot.node;
        json!({"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": node, "labels": {"kubernetes.io/hostname": node,
                "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64"},
                "annotations": {"volumes.kubernetes.io/controller-managed-attach-detach": "true"}},
            "spec": {},
            "status": {"capacity": {"cpu": "2", "memory": "4030584Ki", "pods": "110"},
                "allocatable": {"cpu": "2", "memory": "3928184Ki", "pods": "110"},
                "nodeInfo": {"bootID": self.boot.boot_id, "kubeletVersion": "v1.32.4",
                    "operatingSystem": "linux", "architecture": "amd64",
                    "containerRuntimeVersion": "containerd://1.7.24", "kubeProxyVersion": "",
                    "machineID": "", "systemUUID": "", "kernelVersion": "6.1.0",
                    "osImage": "Debian GNU/Linux 12 (bookworm)"}}})
    }

    /// The node's pods, from kubelet's pod informer.
    async fn pods(&mut self) -> Vec<Value> {
        let node = self.boot.node;
        let list = self
            .list_and_watch(
                "pod informer",
                &format!("/api/v1/pods?fieldSelector=spec.nodeName%3D{node}"),
            )
            .await;
        let mut pods: Vec<Value> = list
            .and_then(|l| l["items"].as_array().cloned())
            .unwrap_or_default();
        pods.sort_by_key(|p| {
            let meta = &p["metadata"];
            let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
            (text(&meta["namespace"]), text(&meta["name"]))
        });
        pods
    }

    /// What kubelet does to start one pod: its ConfigMaps and Secrets (one reflector per
    /// name), its service-account token, then its status, and an event.
    async fn start_pod(&mut self, i: usize, pod: &Value) {
        let namespace = pod["metadata"]["namespace"].as_str().unwrap_or_default();
        let name = pod["metadata"]["name"].as_str().unwrap_or_default();
        let uid = pod["metadata"]["uid"].as_str().unwrap_or_default();
        let (config_maps, secrets, token) = references(pod);
        for (resource, names) in [("configmaps", config_maps), ("secrets", secrets)] {
            for object in names {
                let path = format!(
                    "/api/v1/namespaces/{namespace}/{resource}?fieldSelector=metadata.name%3D{object}"
                );
                self.list_and_watch(&format!("{resource} {object}"), &path)
                    .await;
            }
        }
        if let Some(seconds) = token {
            let sa = pod["spec"]["serviceAccountName"]
                .as_str()
                .unwrap_or("default");
            let request = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                "spec": {"audiences": ["https://kubernetes.default.svc.cluster.local"],
                         "expirationSeconds": seconds,
                         "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": name, "uid": uid}}});
            let answer = self
                .send(
                    &format!("token {name}"),
                    Method::POST,
                    &format!("/api/v1/namespaces/{namespace}/serviceaccounts/{sa}/token"),
                    Some(Body::Protobuf(request)),
                    Expect::Codes(&[201]),
                )
                .await;
            let has_token = answer
                .object()
                .is_some_and(|t| t["status"]["token"].as_str().is_some_and(|t| !t.is_empty()));
            if !has_token {
                self.last().usable = false;
            }
        }
        let pod_path = format!("/api/v1/namespaces/{namespace}/pods/{name}");
        let current = self
            .send(
                &format!("pod {name}"),
                Method::GET,
                &pod_path,
                None,
                Expect::Codes(&[200]),
            )
            .await
            .object()
            .unwrap_or_default();
        let ip = (self.boot.pod_ip)(i);
        // kubelet's patch is a two-way strategic merge from the status it read: IPs the pod no
        // longer has are deleted from the list.
        let mut pod_ips = vec![json!({"ip": ip})];
        pod_ips.extend(
            current["status"]["podIPs"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|old| old["ip"] != ip.as_str())
                .map(|old| json!({"ip": old["ip"], "$patch": "delete"})),
        );
        let status = json!({"metadata": {"uid": uid}, "status": {
            "$setElementOrder/conditions": [{"type": "PodReadyToStartContainers"}, {"type": "Initialized"},
                {"type": "Ready"}, {"type": "ContainersReady"}, {"type": "PodScheduled"}],
            "$setElementOrder/podIPs": [{"ip": ip}],
            "conditions": [
                {"type": "PodReadyToStartContainers", "status": "True", "lastTransitionTime": self.boot.now},
                {"type": "Ready", "status": "True", "lastTransitionTime": self.boot.now},
                {"type": "ContainersReady", "status": "True", "lastTransitionTime": self.boot.now}],
            "containerStatuses": [{"name": "web", "ready": true, "restartCount": 1, "started": true,
                "image": "nginx:1.27", "imageID": "", "containerID": "containerd://boot",
                "state": {"running": {"startedAt": self.boot.now}}}],
            "phase": "Running", "podIP": ip, "podIPs": pod_ips}});
        self.send(
            &format!("pod status {name}"),
            Method::PATCH,
            &format!("{pod_path}/status"),
            Some(Body::StrategicMerge(status)),
            Expect::Codes(&[200]),
        )
        .await;
        let event = json!({"apiVersion": "v1", "kind": "Event",
            "metadata": {"name": format!("{name}.boot-{}", self.boot.boot_id), "namespace": namespace},
            "involvedObject": {"kind": "Pod", "namespace": namespace, "name": name, "uid": uid,
                               "apiVersion": "v1", "fieldPath": "spec.containers{web}"},
            "reason": "Started", "message": "Started container web", "type": "Normal",
            "source": {"component": "kubelet", "host": self.boot.node},
            "firstTimestamp": self.boot.now, "lastTimestamp": self.boot.now, "count": 1,
            "reportingComponent": "kubelet", "reportingInstance": self.boot.node});
        self.send(
            &format!("event {name}"),
            Method::POST,
            &format!("/api/v1/namespaces/{namespace}/events"),
            Some(Body::Protobuf(event)),
            Expect::Codes(&[201]),
        )
        .await;
    }

    /// A reflector's LIST (`limit=500&resourceVersion=0`) and its WATCH from the list's version.
    async fn list_and_watch(&mut self, what: &str, path: &str) -> Option<Value> {
        let join = if path.ends_with('?') { "" } else { "&" };
        let listed = self
            .send(
                &format!("{what} list"),
                Method::GET,
                &format!("{path}{join}limit=500&resourceVersion=0"),
                None,
                Expect::List,
            )
            .await;
        let list = listed.object()?;
        let rv = list["metadata"]["resourceVersion"].as_str().unwrap_or("0");
        self.send(
            &format!("{what} watch"),
            Method::GET,
            &format!("{path}{join}allowWatchBookmarks=true&resourceVersion={rv}&timeoutSeconds=300&watch=true"),
            None,
            Expect::Watch,
        )
        .await;
        Some(list)
    }

    fn last(&mut self) -> &mut Exchange {
        self.report
            .exchanges
            .last_mut()
            .expect("an exchange was sent")
    }

    async fn send(
        &mut self,
        what: &str,
        method: Method,
        path: &str,
        body: Option<Body>,
        expect: Expect,
    ) -> Exchange {
        let exchange = exchange(self.boot.hub, what, method, path, body, expect).await;
        self.report.exchanges.push(exchange.clone());
        exchange
    }
}

/// The ConfigMaps, Secrets and projected token (its `expirationSeconds`) a pod needs.
fn references(pod: &Value) -> (Vec<String>, Vec<String>, Option<i64>) {
    let (mut config_maps, mut secrets, mut token) = (Vec::new(), Vec::new(), None);
    let add = |list: &mut Vec<String>, name: Option<&str>| {
        if let Some(name) = name.filter(|n| !n.is_empty())
            && !list.iter().any(|n| n == name)
        {
            list.push(name.to_owned());
        }
    };
    for volume in pod["spec"]["volumes"].as_array().into_iter().flatten() {
        add(&mut config_maps, volume["configMap"]["name"].as_str());
        add(&mut secrets, volume["secret"]["secretName"].as_str());
        for source in volume["projected"]["sources"]
            .as_array()
            .into_iter()
            .flatten()
        {
            add(&mut config_maps, source["configMap"]["name"].as_str());
            add(&mut secrets, source["secret"]["name"].as_str());
            if let Some(seconds) = source["serviceAccountToken"]["expirationSeconds"].as_i64() {
                token = Some(seconds);
            }
        }
    }
    for container in pod["spec"]["containers"].as_array().into_iter().flatten() {
        for from in container["envFrom"].as_array().into_iter().flatten() {
            add(&mut config_maps, from["configMapRef"]["name"].as_str());
            add(&mut secrets, from["secretRef"]["name"].as_str());
        }
    }
    (config_maps, secrets, token)
}

enum Body {
    Protobuf(Value),
    StrategicMerge(Value),
}

async fn exchange(
    hub: SocketAddr,
    what: &str,
    method: Method,
    path: &str,
    body: Option<Body>,
    expect: Expect,
) -> Exchange {
    let mut builder = Request::builder()
        .method(method.clone())
        .uri(path)
        .header(header::HOST, hub.to_string())
        .header(header::USER_AGENT, USER_AGENT)
        .header(header::ACCEPT, ACCEPT);
    let bytes = match body {
        None => Bytes::new(),
        Some(Body::Protobuf(object)) => {
            builder = builder.header(header::CONTENT_TYPE, wire::PROTOBUF);
            Bytes::from(wire::protobuf::encode_object(&object).expect("a kind kubelet writes"))
        }
        Some(Body::StrategicMerge(patch)) => {
            builder = builder.header(
                header::CONTENT_TYPE,
                "application/strategic-merge-patch+json",
            );
            Bytes::from(patch.to_string())
        }
    };
    let request = builder.body(Full::new(bytes)).expect("a valid request");
    let mut exchange = Exchange {
        what: what.to_owned(),
        method,
        path: path.to_owned(),
        status: 0,
        content_type: None,
        served_from: None,
        body: Bytes::new(),
        usable: false,
    };
    let Ok(Ok(resp)) = tokio::time::timeout(Duration::from_secs(15), send(hub, request)).await
    else {
        return exchange;
    };
    exchange.status = resp.status().as_u16();
    let header_text = |name: &str| {
        resp.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    exchange.content_type = header_text("content-type");
    exchange.served_from = header_text("x-outpost-served-from");
    let is_watch = matches!(expect, Expect::Watch);
    if !is_watch || resp.status() != StatusCode::OK {
        // A watch stays open; kubelet keeps it, the replay only needs it opened.
        if let Ok(Ok(body)) =
            tokio::time::timeout(Duration::from_secs(15), resp.into_body().collect()).await
        {
            exchange.body = body.to_bytes();
        }
    }
    exchange.usable = match expect {
        Expect::Watch => exchange.status == 200,
        Expect::List => {
            exchange.status == 200
                && exchange
                    .object()
                    .is_some_and(|list| list["items"].is_array())
        }
        Expect::Codes(codes) => codes.contains(&exchange.status),
    };
    exchange
}

async fn send(
    hub: SocketAddr,
    request: Request<Full<Bytes>>,
) -> Result<http::Response<hyper::body::Incoming>, Box<dyn std::error::Error + Send + Sync>> {
    let stream = tokio::net::TcpStream::connect(hub).await?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(sender.send_request(request).await?)
}

/// A `MicroTime` from an RFC 3339 time in seconds.
fn micro(rfc3339: &str) -> String {
    rfc3339.replace('Z', ".000000Z")
}
