//! The secure port end to end: the real `outpost` binary obtains its serving certificate from
//! the (fake) cluster by CSR, and in-cluster clients (kubectl, kube-rs, raw TLS) reach the
//! apiserver through it with their own bearer tokens; offline, the cache answers only tokens the
//! apiserver accepted, also after a restart with the cloud still gone.

mod support;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use outpost_testkit::FakeConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use support::{
    ADMIN_TOKEN, Cluster, HubProcess, NODE, RawResponse, assert_ok, https_get, kubectl, names,
    tls_client, until_certified, until_ready,
};
use tokio::io::AsyncWriteExt;

const COREDNS: &str = "coredns/1.11.3";
/// A valid cluster token that never went through the hub while it was online.
const OTHER_TOKEN: &str = "other-admin-token";

/// The certificate the secure port presents (DER), verified against the cluster CA.
async fn presented_certificate(addr: SocketAddr, ca_pem: &str) -> Result<Vec<u8>, String> {
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let tls = tls_client(ca_pem)
        .connect(ServerName::IpAddress(addr.ip().into()), tcp)
        .await
        .map_err(|e| format!("TLS handshake: {e}"))?;
    let (_, session) = tls.get_ref();
    let chain = session.peer_certificates().ok_or("no certificate")?;
    Ok(chain[0].as_ref().to_vec())
}

/// The first certificate in a PEM file, as DER.
fn first_certificate(path: &Path) -> Vec<u8> {
    let pem = std::fs::read(path).unwrap();
    CertificateDer::pem_slice_iter(&pem)
        .next()
        .expect("a certificate")
        .unwrap()
        .as_ref()
        .to_vec()
}

/// The cluster CA and a hub started against `cluster` whose secure port presents its issued
/// certificate.
async fn certified_hub(cluster: &Cluster) -> (String, HubProcess) {
    let ca = cluster.fake.pki().ca_pem.clone();
    let hub = cluster.start_hub();
    until_certified(&hub, &ca).await;
    (ca, hub)
}

/// Polls (bounded) until the cut-off hub answers `path` for `token` from its cache with a 200.
async fn until_answered_offline(
    hub: &HubProcess,
    ca: &str,
    path: &str,
    token: &str,
) -> RawResponse {
    for _ in 0..100 {
        let resp = https_get(hub.secure, ca, path, COREDNS, Some(token))
            .await
            .unwrap();
        if resp.status == 200 {
            return resp;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!(
        "{path} was never answered from the cache; log:\n{}",
        hub.log_text()
    );
}

/// A kubeconfig as an in-cluster client sees it: the hub's secure address, the cluster CA and a
/// bearer token.
fn secure_kubeconfig(dir: &Path, hub: &HubProcess, ca_pem: &str, token: &str) -> PathBuf {
    let ca = dir.join("cluster-ca.crt");
    std::fs::write(&ca, ca_pem).unwrap();
    let path = dir.join(format!("secure-{}.kubeconfig", hub.secure.port()));
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: hub\n  cluster:\n    server: https://{}\n    certificate-authority: {}\n\
         contexts:\n- name: hub\n  context: {{cluster: hub, user: pod, namespace: default}}\n\
         users:\n- name: pod\n  user: {{token: {token}}}\ncurrent-context: hub\n",
        hub.secure,
        ca.display()
    );
    std::fs::write(&path, text).unwrap();
    path
}

/// Where `default/kubernetes` sends pods, as kubelet's Service list through the hub shows it
/// (rewritten by masterservice): kubelet hands it to them as KUBERNETES_SERVICE_HOST/PORT.
async fn kubernetes_service_as_kubelet_sees_it(hub: &HubProcess) -> SocketAddr {
    let resp = support::get(
        hub.proxy,
        "/api/v1/services",
        "kubelet/v1.32.4 (linux/amd64) kubernetes/e2e",
    )
    .await;
    assert_eq!(resp.status, 200);
    let services = resp.json();
    let service = services["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["metadata"]["namespace"] == "default" && s["metadata"]["name"] == "kubernetes")
        .unwrap();
    format!(
        "{}:{}",
        service["spec"]["clusterIP"].as_str().unwrap(),
        service["spec"]["ports"][0]["port"]
    )
    .parse()
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_cluster_clients_reach_the_apiserver_with_their_own_tokens() {
    let cluster = Cluster::start().await;
    let (ca, hub) = certified_hub(&cluster).await;

    // The certificate came from a kubelet-serving CSR the node made, and is kept on disk.
    let csrs = cluster
        .fake
        .list("certificates.k8s.io/v1/certificatesigningrequests", None);
    assert_eq!(csrs.len(), 1, "{csrs:?}");
    let csr = &csrs[0];
    assert_eq!(csr["spec"]["signerName"], "kubernetes.io/kubelet-serving");
    assert_eq!(csr["spec"]["username"], format!("system:node:{NODE}"));
    assert!(csr["status"]["certificate"].is_string(), "{csr}");
    let kept = cluster
        .dir
        .path()
        .join("root/pki/yurthub-server-current.pem");
    assert!(kept.exists(), "{}", kept.display());
    until_ready(&hub, "[+]secure-port ok: serving certificate valid until").await;

    // kubectl, as a pod would run it: the request reaches the apiserver as the token's user.
    cluster.fake.clear_requests();
    let kubeconfig = secure_kubeconfig(cluster.dir.path(), &hub, &ca, ADMIN_TOKEN);
    let out = assert_ok(
        &kubectl(&kubeconfig, &["get", "pods", "-A", "-o", "name"]),
        "kubectl through the secure port",
    );
    let expected: Vec<String> = cluster
        .fake
        .list("v1/pods", None)
        .iter()
        .map(|p| format!("pod/{}", p["metadata"]["name"].as_str().unwrap()))
        .collect();
    assert!(!expected.is_empty());
    for pod in &expected {
        assert!(out.contains(pod.as_str()), "{pod} missing from {out}");
    }
    let seen = cluster.fake.requests();
    let list = seen
        .iter()
        .find(|r| r.resource == "pods" && r.verb == "list")
        .unwrap_or_else(|| panic!("no pod list upstream: {seen:?}"));
    assert_eq!(list.user, "admin", "the node's identity was lent: {list:?}");

    // kube-rs from the same kubeconfig.
    let kubeconfig = kube::config::Kubeconfig::read_from(&kubeconfig).unwrap();
    let config = kube::Config::from_custom_kubeconfig(
        kubeconfig,
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .unwrap();
    let client = kube::Client::try_from(config).unwrap();
    let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(client);
    let node = nodes.get(NODE).await.unwrap();
    assert_eq!(node.metadata.name.as_deref(), Some(NODE));

    // No token: refused here, never sent upstream with the node's certificate.
    cluster.fake.clear_requests();
    let anonymous = https_get(hub.secure, &ca, "/api/v1/pods", "curl/8", None)
        .await
        .unwrap();
    assert_eq!(anonymous.status, 401);
    let status = anonymous.json();
    assert_eq!(status["kind"], "Status");
    assert_eq!(status["reason"], "Unauthorized");
    assert!(
        cluster.fake.requests().iter().all(|r| r.resource != "pods"),
        "an unauthenticated request went upstream"
    );
    // A token the cluster does not know: the apiserver's own 401 comes back.
    let bogus = https_get(hub.secure, &ca, "/api/v1/pods", "curl/8", Some("nope"))
        .await
        .unwrap();
    assert_eq!(bogus.status, 401);
    assert!(hub.terminate().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offline_the_cache_answers_only_tokens_the_apiserver_accepted_even_after_a_restart() {
    let cluster = Cluster::start().await;
    cluster
        .fake
        .add_token(OTHER_TOKEN, "other-admin", &["system:masters"]);
    let (ca, hub) = certified_hub(&cluster).await;

    let services = "/api/v1/services";
    let online = https_get(hub.secure, &ca, services, COREDNS, Some(ADMIN_TOKEN))
        .await
        .unwrap();
    assert_eq!(
        online.status,
        200,
        "{}",
        String::from_utf8_lossy(&online.body)
    );
    let online_names = names(&online.json());
    assert!(online_names.contains(&"default/kubernetes".to_owned()));

    cluster.fake.refuse_connections();
    let offline = until_answered_offline(&hub, &ca, services, ADMIN_TOKEN).await;
    assert_eq!(names(&offline.json()), online_names);

    let stranger = https_get(hub.secure, &ca, services, COREDNS, Some(OTHER_TOKEN))
        .await
        .unwrap();
    assert_eq!(stranger.status, 503);
    let message = stranger.json()["message"].as_str().unwrap().to_owned();
    assert!(
        message.contains("never accepted this bearer token"),
        "{message}"
    );

    // Restarted with the cloud still gone: the kept certificate and the kept verdicts serve.
    assert!(hub.terminate().success());
    let hub = cluster.start_hub();
    let again = https_get(hub.secure, &ca, services, COREDNS, Some(ADMIN_TOKEN))
        .await
        .expect("the kept certificate is presented at once");
    assert_eq!(
        again.status,
        200,
        "{}",
        String::from_utf8_lossy(&again.body)
    );
    assert_eq!(names(&again.json()), online_names);
    let stranger = https_get(hub.secure, &ca, services, COREDNS, Some(OTHER_TOKEN))
        .await
        .unwrap();
    assert_eq!(stranger.status, 503);
    assert!(hub.terminate().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_an_approver_the_secure_port_refuses_handshakes_and_the_rest_works() {
    let cluster = Cluster::start_with(FakeConfig {
        csr_signing: outpost_testkit::CsrSigning::Pending,
        ..FakeConfig::default()
    })
    .await;
    let ca = cluster.fake.pki().ca_pem.clone();
    let hub = cluster.start_hub();
    // The request is made and stays pending.
    let mut pending = Vec::new();
    for _ in 0..100 {
        pending = cluster
            .fake
            .list("certificates.k8s.io/v1/certificatesigningrequests", None);
        if !pending.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        pending.len(),
        1,
        "no CSR was made; log:\n{}",
        hub.log_text()
    );
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let err = https_get(hub.secure, &ca, "/version", "probe", Some(ADMIN_TOKEN))
        .await
        .unwrap_err();
    assert!(err.contains("TLS handshake"), "{err}");
    // The node's own port is unaffected, and readiness says what is missing without failing.
    let version = support::get(hub.proxy, "/version", "kubelet/v1.32.4").await;
    assert_eq!(version.status, 200);
    until_ready(&hub, "[+]secure-port degraded: no serving certificate yet").await;
    assert!(hub.terminate().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_certificate_serves_at_once_and_is_replaced_when_the_cluster_needs_more_names() {
    use outpost_certs::serving::{Sans, ServingCert, draft_csr};
    let cluster = Cluster::start().await;
    let ca = cluster.fake.pki().ca_pem.clone();
    // A valid certificate from an earlier run, naming only the hub's own address and
    // `--node-ip`.
    let loopback: std::net::IpAddr = "127.0.0.1".parse().unwrap();
    let node_ip: std::net::IpAddr = "192.0.2.10".parse().unwrap();
    let draft = draft_csr(NODE, &Sans::for_hub([loopback, node_ip])).unwrap();
    let signed = cluster
        .fake
        .pki()
        .sign_csr(&draft.csr_pem, Duration::from_secs(3600))
        .unwrap();
    let kept_file = cluster
        .dir
        .path()
        .join("root/pki/yurthub-server-current.pem");
    let kept = ServingCert::from_pem(&signed, &draft.key_pem, Path::new("test")).unwrap();
    kept.store(&kept_file).unwrap();
    let kept_der = first_certificate(&kept_file);

    // Offline, the kept certificate is what the port presents.
    cluster.fake.refuse_connections();
    let mut args = cluster.hub_args();
    args.push("--node-ip=192.0.2.10".into());
    let hub = cluster.start_hub_with(&args);
    let presented = presented_certificate(hub.secure, &ca).await.unwrap();
    assert_eq!(presented, kept_der);

    // Back online, the hub learns the ClusterIP of default/kubernetes, which the kept one lacks,
    // and replaces it, on disk and on the port, still naming `--node-ip`.
    cluster.fake.restore().await;
    let mut replaced = None;
    for _ in 0..200 {
        let now = presented_certificate(hub.secure, &ca).await.unwrap();
        if now != kept_der {
            replaced = Some(now);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let replaced = replaced.unwrap_or_else(|| panic!("never replaced; log:\n{}", hub.log_text()));
    assert_eq!(replaced, first_certificate(&kept_file));
    let on_disk = ServingCert::load(&kept_file).unwrap();
    assert!(
        ["10.96.0.1", "192.0.2.10"]
            .iter()
            .all(|ip| on_disk.sans.ips.contains(&ip.parse().unwrap())),
        "{:?}; log:\n{}",
        on_disk.sans,
        hub.log_text()
    );
    assert!(hub.terminate().success());
}

/// What a pod's Python program does: `load_incluster_config()` from the environment kubelet
/// gives it and the mounted token and CA, then a list.
const PYTHON_IN_CLUSTER: &str = r#"
import json, sys
from kubernetes import client
from kubernetes.config.incluster_config import InClusterConfigLoader
host, port, token_file, ca_file = sys.argv[1:5]
InClusterConfigLoader(token_filename=token_file, cert_filename=ca_file,
    environ={"KUBERNETES_SERVICE_HOST": host, "KUBERNETES_SERVICE_PORT": port}).load_and_set()
services = client.CoreV1Api().list_service_for_all_namespaces().items
print(json.dumps(sorted(s.metadata.namespace + "/" + s.metadata.name for s in services)))
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_python_in_cluster_client_follows_the_rewritten_service_to_the_secure_port() {
    let cluster = Cluster::start().await;
    let (ca, hub) = certified_hub(&cluster).await;

    // kubelet's Service informer sees `default/kubernetes` rewritten (masterservice) and kubelet
    // hands it to pods as KUBERNETES_SERVICE_HOST/PORT.
    let target = kubernetes_service_as_kubelet_sees_it(&hub).await;
    assert_eq!(target, hub.secure);
    let (host, port) = (target.ip().to_string(), target.port().to_string());

    // The pod's service-account token and the cluster CA, as mounted in the pod.
    let token = "coredns-service-account-token";
    cluster.fake.add_token(
        token,
        "system:serviceaccount:kube-system:coredns",
        // Bound to cluster-admin for brevity: the point is whose identity reaches the apiserver.
        &["system:serviceaccounts", "system:masters"],
    );
    let token_file = cluster.dir.path().join("token");
    let ca_file = cluster.dir.path().join("ca.crt");
    std::fs::write(&token_file, token).unwrap();
    std::fs::write(&ca_file, &ca).unwrap();
    cluster.fake.clear_requests();
    let out = std::process::Command::new("python3")
        .args(["-c", PYTHON_IN_CLUSTER, &host, &port])
        .arg(&token_file)
        .arg(&ca_file)
        .output()
        .expect("python3 runs (.ci/run installs the kubernetes client)");
    let stdout = assert_ok(&out, "python in-cluster client");
    let listed: Vec<String> = serde_json::from_str(stdout.trim()).unwrap();
    let expected: Vec<String> = {
        let mut all: Vec<String> = cluster
            .fake
            .list("v1/services", None)
            .iter()
            .map(|s| {
                format!(
                    "{}/{}",
                    s["metadata"]["namespace"].as_str().unwrap(),
                    s["metadata"]["name"].as_str().unwrap()
                )
            })
            .collect();
        all.sort();
        all
    };
    assert_eq!(listed, expected);
    let seen = cluster.fake.requests();
    // The caller's own list (the hub's shared cache starts its own list, as the node, on this
    // first read of Services).
    let list = seen
        .iter()
        .filter(|r| {
            !r.user_agent
                .as_deref()
                .is_some_and(|ua| ua.starts_with("outpost"))
        })
        .find(|r| r.resource == "services" && r.verb == "list")
        .unwrap_or_else(|| panic!("no service list upstream: {seen:?}"));
    assert_eq!(list.user, "system:serviceaccount:kube-system:coredns");
    assert!(hub.terminate().success());
}

/// `kubectl exec` from inside a pod: the upgrade crosses the hub's TLS and is spliced both ways.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_is_tunnelled_through_the_secure_port() {
    let cluster = Cluster::start().await;
    let pod = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "default"},
        "spec": {"nodeName": NODE, "containers": [{"name": "c", "image": "busybox"}]}
    });
    cluster.fake.create("v1/pods", pod).unwrap();
    let (ca, hub) = certified_hub(&cluster).await;
    let tcp = tokio::net::TcpStream::connect(hub.secure).await.unwrap();
    let mut tls = tls_client(&ca)
        .connect(ServerName::IpAddress(hub.secure.ip().into()), tcp)
        .await
        .unwrap();
    let req = format!(
        "POST /api/v1/namespaces/default/pods/p/exec?command=cat&stdin=true&stdout=true HTTP/1.1\r\n\
         Host: x\r\nUser-Agent: kubectl/v1.32.4\r\nAuthorization: Bearer {ADMIN_TOKEN}\r\n\
         Connection: Upgrade\r\nUpgrade: SPDY/3.1\r\n\
         X-Stream-Protocol-Version: v4.channel.k8s.io\r\nContent-Length: 0\r\n\r\n"
    );
    tls.write_all(req.as_bytes()).await.unwrap();
    let head = support::read_head(&mut tls).await;
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    support::assert_echoes(&mut tls).await;
    let exec = cluster
        .fake
        .requests()
        .into_iter()
        .find(|r| r.path.ends_with("/exec"))
        .expect("exec reached upstream");
    assert_eq!(exec.user, "admin");
    assert!(hub.terminate().success());
}

/// A pod's token, however valid, never reads offline what the node's kubelet cached (its pods,
/// its Secrets) by claiming kubelet's User-Agent, nor what another account cached.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offline_a_caller_reads_only_its_own_cache_partition() {
    let cluster = Cluster::start().await;
    cluster
        .fake
        .add_token(OTHER_TOKEN, "other-admin", &["system:masters"]);
    let (ca, hub) = certified_hub(&cluster).await;
    let kubelet = "kubelet/v1.32.4 (linux/amd64) kubernetes/e2e";
    let node_pods = format!("/api/v1/pods?fieldSelector=spec.nodeName%3D{NODE}");
    let services = "/api/v1/services";

    // Online: kubelet caches its pods (plain port, node identity); the admin token caches a
    // Service list as coredns; the other token is verified on an uncached request.
    assert_eq!(
        support::get(hub.proxy, &node_pods, kubelet).await.status,
        200
    );
    let listed = https_get(hub.secure, &ca, services, COREDNS, Some(ADMIN_TOKEN))
        .await
        .unwrap();
    assert_eq!(listed.status, 200);
    let other = https_get(
        hub.secure,
        &ca,
        "/api/v1/namespaces",
        "curl/8",
        Some(OTHER_TOKEN),
    )
    .await
    .unwrap();
    assert_eq!(other.status, 200);

    cluster.fake.refuse_connections();
    let own = until_answered_offline(&hub, &ca, services, ADMIN_TOKEN).await;
    assert_eq!(names(&own.json()), names(&listed.json()));
    // The same User-Agent with another verified token: not the first caller's list.
    let foreign = https_get(hub.secure, &ca, services, COREDNS, Some(OTHER_TOKEN))
        .await
        .unwrap();
    assert_eq!(
        foreign.status,
        503,
        "{}",
        String::from_utf8_lossy(&foreign.body)
    );
    // kubelet's User-Agent on the secure port: not kubelet's cache.
    let posing = https_get(hub.secure, &ca, &node_pods, kubelet, Some(ADMIN_TOKEN))
        .await
        .unwrap();
    assert_eq!(
        posing.status,
        503,
        "{}",
        String::from_utf8_lossy(&posing.body)
    );
    // kubelet itself still gets its pods.
    assert_eq!(
        support::get(hub.proxy, &node_pods, kubelet).await.status,
        200
    );

    // Watches follow the same partitions: from the list's resourceVersion, the caller's own
    // watch is served by the cache (a stream that ends at timeoutSeconds); another's is not.
    let rv = listed.json()["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_owned();
    let watch = format!("{services}?watch=true&resourceVersion={rv}&timeoutSeconds=1");
    let own_watch = https_get(hub.secure, &ca, &watch, COREDNS, Some(ADMIN_TOKEN))
        .await
        .unwrap();
    assert_eq!(
        own_watch.status,
        200,
        "{}",
        String::from_utf8_lossy(&own_watch.body)
    );
    let foreign_watch = https_get(hub.secure, &ca, &watch, COREDNS, Some(OTHER_TOKEN))
        .await
        .unwrap();
    // As kube-apiserver does for a version it cannot serve: 200 and a 410 ERROR event, which
    // sends the client to relist (and the relist gets the 503 above).
    assert_eq!(foreign_watch.status, 200);
    let event: serde_json::Value =
        serde_json::from_slice(foreign_watch.body.split(|b| *b == b'\n').next().unwrap()).unwrap();
    assert_eq!(event["type"], "ERROR", "{event}");
    assert_eq!(event["object"]["code"], 410);
    let message = event["object"]["message"].as_str().unwrap();
    assert!(
        message.contains("no cached list covers this watch"),
        "{message}"
    );
    // The caller's own watch replays nothing it does not hold and carries no such error.
    assert!(
        !String::from_utf8_lossy(&own_watch.body).contains("\"ERROR\""),
        "{}",
        String::from_utf8_lossy(&own_watch.body)
    );
    assert!(hub.terminate().success());
}

/// yurthub's default `--dummy-if-ip`.
const DUMMY_IP: &str = "169.254.2.1";

/// A network namespace of the test's own (`ip netns add`), deleted on drop. Needs root and
/// iproute2's `ip` (`.ci/run` installs it).
struct NetNamespace(String);

impl NetNamespace {
    fn create(tag: &str) -> NetNamespace {
        let ns = NetNamespace(format!("outpost-{tag}-{}", std::process::id()));
        ip(&["netns", "add", &ns.0]);
        ip(&["-n", &ns.0, "link", "set", "lo", "up"]);
        ns
    }

    /// Moves the calling thread into the namespace; the threads and processes it starts from
    /// then on are in it too.
    fn enter(&self) {
        let file = std::fs::File::open(format!("/run/netns/{}", self.0)).unwrap();
        rustix::thread::move_into_link_name_space(
            std::os::fd::AsFd::as_fd(&file),
            Some(rustix::thread::LinkNameSpaceType::Network),
        )
        .expect("setns into the test's network namespace");
    }

    /// `(interface, address/prefix)` of every IPv4 address in the namespace.
    fn addresses(&self) -> Vec<(String, String)> {
        let links: serde_json::Value =
            serde_json::from_str(&ip(&["-n", &self.0, "-j", "-4", "addr", "show"])).unwrap();
        let mut found = Vec::new();
        for link in links.as_array().unwrap() {
            for addr in link["addr_info"].as_array().into_iter().flatten() {
                found.push((
                    link["ifname"].as_str().unwrap().to_owned(),
                    format!("{}/{}", addr["local"].as_str().unwrap(), addr["prefixlen"]),
                ));
            }
        }
        found
    }

    fn has_link(&self, name: &str) -> bool {
        let links: serde_json::Value =
            serde_json::from_str(&ip(&["-n", &self.0, "-j", "link", "show"])).unwrap();
        links
            .as_array()
            .unwrap()
            .iter()
            .any(|l| l["ifname"] == name)
    }

    fn has_address(&self, interface: &str) -> bool {
        let wanted = (interface.to_owned(), format!("{DUMMY_IP}/32"));
        self.addresses().contains(&wanted)
    }
}

impl Drop for NetNamespace {
    fn drop(&mut self) {
        let _ = std::process::Command::new("ip")
            .args(["netns", "del", &self.0])
            .status();
    }
}

fn ip(args: &[&str]) -> String {
    let out = std::process::Command::new("ip")
        .args(args)
        .output()
        .expect("iproute2's ip is installed (.ci/run installs it)");
    assert!(
        out.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// yurthub's default, `--enable-dummy-if`: the rewritten `default/kubernetes` sends pods to the
/// dummy IP, and the hub makes that address the node's own (a dummy link, or `lo` on a kernel
/// without them, as here), so an in-cluster client reaches the apiserver there. It is removed
/// when the hub stops, unless it was there before; without `CAP_NET_ADMIN` the hub serves on.
/// All of it in a network namespace of the test's own: the hub's address never reaches the
/// host's network.
#[test]
fn in_cluster_clients_reach_the_hub_on_the_dummy_interface() {
    if !rustix::process::geteuid().is_root() {
        eprintln!("skipped: a network namespace of the test's own needs root");
        return;
    }
    let ns = NetNamespace::create("dummy-if");
    std::thread::scope(|scope| {
        let scenario = scope.spawn(|| {
            ns.enter();
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap()
                .block_on(dummy_interface_scenario(&ns));
        });
        if let Err(panic) = scenario.join() {
            std::panic::resume_unwind(panic);
        }
    });
}

async fn dummy_interface_scenario(ns: &NetNamespace) {
    let cluster = Cluster::start().await;
    let ca = cluster.fake.pki().ca_pem.clone();
    let args: Vec<String> = cluster
        .hub_args()
        .into_iter()
        .map(|a| match a.as_str() {
            "--enable-dummy-if=false" => "--enable-dummy-if=true".to_owned(),
            _ => a,
        })
        .collect();
    let hub = cluster.start_hub_with(&args);
    assert_eq!(hub.secure.ip().to_string(), DUMMY_IP);
    let holder = if ns.has_link("hub-dummy0") {
        "hub-dummy0"
    } else {
        "lo"
    };
    assert!(ns.has_address(holder), "{:?}", ns.addresses());
    let ready = format!("outpost_dummy_interface_ready{{interface=\"{holder}\"}}");
    let metrics = support::metrics_text(&hub).await;
    assert_eq!(support::sample(&metrics, &ready), Some(1.0), "{metrics}");

    // kubelet's Services show `default/kubernetes` at the dummy IP (masterservice); a pod's
    // client follows it to the apiserver.
    let target = kubernetes_service_as_kubelet_sees_it(&hub).await;
    assert_eq!(target, hub.secure);
    until_certified(&hub, &ca).await;
    let listed = https_get(
        target,
        &ca,
        "/api/v1/namespaces/default/services",
        COREDNS,
        Some(ADMIN_TOKEN),
    )
    .await
    .unwrap();
    assert_eq!(
        listed.status,
        200,
        "{}",
        String::from_utf8_lossy(&listed.body)
    );
    assert!(names(&listed.json()).contains(&"default/kubernetes".to_owned()));

    assert!(hub.terminate().success());
    assert!(
        !ns.has_address(holder),
        "removed at stop: {:?}",
        ns.addresses()
    );
    assert!(!ns.has_link("hub-dummy0"));

    // An address an operator put there before the hub started stays when it stops.
    ip(&[
        "-n",
        &ns.0,
        "addr",
        "add",
        &format!("{DUMMY_IP}/32"),
        "dev",
        "lo",
    ]);
    let hub = cluster.start_hub_with(&args);
    let metrics = support::metrics_text(&hub).await;
    assert!(
        metrics.contains("outpost_dummy_interface_ready{interface="),
        "{metrics}"
    );
    assert!(hub.terminate().success());
    assert!(ns.has_address("lo"), "{:?}", ns.addresses());
    ip(&[
        "-n",
        &ns.0,
        "addr",
        "del",
        &format!("{DUMMY_IP}/32"),
        "dev",
        "lo",
    ]);

    // Without CAP_NET_ADMIN nothing can be configured: yurthub exits, the hub says so and serves.
    let unprivileged = [
        "setpriv",
        "--bounding-set=-net_admin",
        "--inh-caps=-net_admin",
    ];
    let hub = HubProcess::spawn_wrapped(&unprivileged, &args);
    let node = support::get(hub.proxy, "/api/v1/nodes/edge-1", "kubelet/v1.32.4").await;
    assert_eq!(node.status, 200);
    let metrics = support::metrics_text(&hub).await;
    let not_ready = "outpost_dummy_interface_ready{interface=\"hub-dummy0\"}";
    assert_eq!(support::sample(&metrics, not_ready), Some(0.0), "{metrics}");
    assert!(
        hub.log_text()
            .contains("cannot configure the dummy interface"),
        "{}",
        hub.log_text()
    );
    assert!(ns.addresses().iter().all(|(_, a)| !a.starts_with(DUMMY_IP)));
    assert!(hub.terminate().success());
}
