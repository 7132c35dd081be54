//! The edge cache under racing clients, hostile answers and storage faults, end to end through
//! the real `outpost` binary (issue 29): a slow LIST never rolls the cached list back, an
//! ADDED or DELETED event is on disk before the client sees it, an answer for another object is
//! not cached, a full file system stops caching without a deadlock and scopes that missed events
//! answer 503, a damaged sled database never keeps the hub from starting, and an oversized object
//! is proxied without being held in memory.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, ListParams, WatchEvent, WatchParams};
use serde_json::{Value, json};
use support::{
    ADMIN_TOKEN, Cluster, HubProcess, KUBELET_UA, NODE, cluster_with_pods, eventually, get,
    kube_client, kubelet_get, metrics_text, outpost_bin, pod, raw_http, sample, served_from_cache,
    until_cached, until_cached_by, until_durable, wait_online,
};

/// kubelet's list of its pods.
fn pod_scope() -> String {
    format!("/api/v1/pods?fieldSelector=spec.nodeName%3D{NODE}")
}

fn item_names(list: &Value) -> Vec<String> {
    let mut names: Vec<String> = list["items"]
        .as_array()
        .unwrap_or_else(|| panic!("not a list: {list}"))
        .iter()
        .map(|i| i["metadata"]["name"].as_str().unwrap_or("").to_owned())
        .collect();
    names.sort();
    names
}

/// Asserts `resp`'s status, showing its body when it is not the expected one.
fn expect_status(resp: &support::RawResponse, code: u16) {
    assert_eq!(resp.status, code, "{}", String::from_utf8_lossy(&resp.body));
}

fn rv_of(object: &Value) -> u64 {
    object["metadata"]["resourceVersion"]
        .as_str()
        .and_then(|rv| rv.parse().ok())
        .unwrap_or_else(|| panic!("no resourceVersion in {object}"))
}

/// The names of the pods upstream on the node, sorted.
fn upstream_pods(cluster: &Cluster) -> Vec<String> {
    let mut names: Vec<String> = cluster
        .fake
        .list("v1/pods", None)
        .iter()
        .filter(|p| p["spec"]["nodeName"] == NODE)
        .map(|p| p["metadata"]["name"].as_str().unwrap_or("").to_owned())
        .collect();
    names.sort();
    names
}

/// kubelet's watch of its pods from `rv`, through the hub.
async fn watch_pods(
    hub: &HubProcess,
    rv: &str,
) -> impl futures_util::Stream<Item = kube::Result<WatchEvent<Pod>>> + Unpin + use<> {
    let pods: Api<Pod> = Api::all(kube_client(hub, KUBELET_UA));
    let params = WatchParams::default().fields(&format!("spec.nodeName={NODE}"));
    pods.watch(&params, rv).await.expect("watch").boxed()
}

/// Reads `stream` until it brings `wanted` (`ADDED`/`DELETED`) of pod `name`, bounded.
async fn until_event<S>(stream: &mut S, wanted: &str, name: &str)
where
    S: futures_util::Stream<Item = kube::Result<WatchEvent<Pod>>> + Unpin,
{
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let event = tokio::time::timeout(left, stream.next())
            .await
            .unwrap_or_else(|_| panic!("no {wanted} of {name} within 20 s"))
            .expect("the watch is open")
            .expect("a decodable event");
        let seen = match &event {
            WatchEvent::Added(p) => ("ADDED", p.name_any()),
            WatchEvent::Deleted(p) => ("DELETED", p.name_any()),
            _ => continue,
        };
        if seen == (wanted, name.to_owned()) {
            return;
        }
    }
}

/// `GET path` as a cache agent other than kubelet, with the admin's token (the node may not
/// read every ConfigMap); the hub caches it under `component`.
async fn admin_get(hub: &HubProcess, component: &str, path: &str) -> support::RawResponse {
    let req = format!(
        "GET {path} HTTP/1.1\r\nHost: x\r\nUser-Agent: {component}/v1.11.1\r\nAccept: application/json\r\nAuthorization: Bearer {ADMIN_TOKEN}\r\nConnection: close\r\n\r\n"
    );
    raw_http(hub.proxy, req.as_bytes()).await
}

/// Polls until `check` holds for the hub's metrics text, bounded; returns the text.
async fn until_metrics(hub: &HubProcess, what: &str, check: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let text = metrics_text(hub).await;
        if check(&text) {
            return text;
        }
        assert!(
            Instant::now() < deadline,
            "{what} never seen:\n{text}\n{}",
            hub.log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Cuts the cloud off and waits until the hub answers kubelet's pod list from its cache,
/// whatever that answer is; returns it.
async fn offline_pod_list(cluster: &Cluster, hub: &HubProcess) -> support::RawResponse {
    cluster.fake.refuse_connections();
    cluster.fake.cut_watches();
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let ready = get(hub.admin, "/v1/readyz", "test").await;
        if String::from_utf8_lossy(&ready.body).contains("offline") {
            return kubelet_get(hub.proxy, &pod_scope()).await;
        }
        assert!(Instant::now() < deadline, "never offline");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

// ---- 1: a slow LIST ------------------------------------------------------------------------

/// Two clients of one component (kubelet's User-Agent) list and watch the same pods. The
/// second's LIST is computed upstream at once but arrives 2 s later, after the first one's
/// watch moved the cached scope on (a pod created, one deleted). The late list must not roll
/// the scope back: offline, the list claims a resourceVersion and holds exactly what was alive
/// there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_list_never_rolls_the_cached_list_back() {
    let cluster = cluster_with_pods(&["p0", "p1", "p2"]).await;
    let hub = cluster.start_hub();
    let pods: Api<Pod> = Api::all(kube_client(&hub, KUBELET_UA));
    let fields = format!("spec.nodeName={NODE}");
    let listed = pods
        .list(&ListParams::default().fields(&fields))
        .await
        .unwrap();
    let rv = listed.metadata.resource_version.unwrap();
    let mut watch = watch_pods(&hub, &rv).await;

    cluster
        .fake
        .answer_late_under("/api/v1/pods", Duration::from_secs(2), 1);
    let lists_before = cluster
        .fake
        .requests()
        .iter()
        .filter(|r| r.verb == "list")
        .count();
    let proxy = hub.proxy;
    let slow = tokio::spawn(async move {
        let req = format!(
            "GET {} HTTP/1.1\r\nHost: x\r\nUser-Agent: {KUBELET_UA}\r\nAccept: application/json\r\nConnection: close\r\n\r\n",
            pod_scope()
        );
        raw_http(proxy, req.as_bytes()).await
    });
    assert!(
        eventually(Duration::from_secs(10), || cluster
            .fake
            .requests()
            .iter()
            .filter(|r| r.verb == "list")
            .count()
            > lists_before)
        .await,
        "the slow LIST never reached the apiserver"
    );
    cluster
        .fake
        .create("v1/pods", pod("p3", NODE, "web"))
        .unwrap();
    let deleted = cluster
        .fake
        .delete("v1/pods", Some("default"), "p0")
        .unwrap();
    until_event(&mut watch, "ADDED", "p3").await;
    until_event(&mut watch, "DELETED", "p0").await;

    let slow = slow.await.unwrap();
    assert_eq!(slow.status, 200);
    let slow_list = slow.json();
    assert_eq!(
        item_names(&slow_list),
        ["p0", "p1", "p2"],
        "the late answer is the state it was computed at"
    );
    assert!(rv_of(&slow_list) < rv_of(&deleted));

    let offline = offline_pod_list(&cluster, &hub).await;
    expect_status(&offline, 200);
    let offline = offline.json();
    assert_eq!(
        item_names(&offline),
        upstream_pods(&cluster),
        "every pod alive at the cached version, and only those"
    );
    assert!(
        rv_of(&offline) >= rv_of(&deleted),
        "the cached list claims {} but the delete was at {}",
        rv_of(&offline),
        rv_of(&deleted)
    );
    until_durable(&hub, &["op=\"list\",outcome=\"older_than_cached\""]).await;
    assert!(
        hub.log_text()
            .contains("a LIST older than the cached scope was not cached"),
        "{}",
        hub.log_text()
    );
}

// ---- 2: durable before forwarded -------------------------------------------------------------

/// A ConfigMap list big enough that the cache writer is busy with it for a while.
fn add_ballast(cluster: &Cluster, count: usize) {
    let data = "b".repeat(1024);
    for i in 0..count {
        cluster
            .fake
            .create(
                "v1/configmaps",
                json!({"apiVersion": "v1", "kind": "ConfigMap",
                       "metadata": {"name": format!("ballast-{i:05}"), "namespace": "default"},
                       "data": {"payload": data}}),
            )
            .unwrap();
    }
}

/// kubelet watches its pods while another cache agent's big LIST keeps the cache writer busy;
/// the moment kubelet sees `event` (a pod `ADDED` or `DELETED`) the hub is killed (-9). The
/// restarted hub, offline, must not go behind what kubelet saw: a pod it saw deleted listed
/// again, or one it saw created (and started) missing, which kubelet would kill.
async fn killed_right_after_it_passed_on(event: &str) {
    let cluster = cluster_with_pods(&["p0", "p1"]).await;
    add_ballast(&cluster, 4000);
    let hub = cluster.start_hub();
    let pods: Api<Pod> = Api::all(kube_client(&hub, KUBELET_UA));
    let listed = pods
        .list(&ListParams::default().fields(&format!("spec.nodeName={NODE}")))
        .await
        .unwrap();
    let mut watch = watch_pods(&hub, &listed.metadata.resource_version.unwrap()).await;
    // Once the whole body is here, the hub has queued it for the writer.
    let ballast = admin_get(&hub, "coredns", "/api/v1/configmaps").await;
    assert_eq!(ballast.status, 200);
    let name = match event {
        "DELETED" => {
            cluster
                .fake
                .delete("v1/pods", Some("default"), "p0")
                .unwrap();
            "p0"
        }
        _ => {
            cluster
                .fake
                .create("v1/pods", pod("p9", NODE, "web"))
                .unwrap();
            "p9"
        }
    };
    until_event(&mut watch, event, name).await;
    drop(hub); // SIGKILL: no shutdown path runs.
    let expected = upstream_pods(&cluster);

    cluster.fake.refuse_connections();
    let hub = cluster.start_hub();
    let offline = until_cached(&hub, &pod_scope()).await;
    assert_eq!(
        item_names(&offline.json()),
        expected,
        "after {event} of {name} was passed on and the hub killed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_event_is_on_disk_before_the_client_sees_it() {
    killed_right_after_it_passed_on("DELETED").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_added_event_is_on_disk_before_the_client_sees_it() {
    killed_right_after_it_passed_on("ADDED").await;
}

// ---- 4: an answer for another object ---------------------------------------------------------

/// An upstream that answers a ConfigMap path with a Secret (and the ConfigMap list with the
/// Secret list): the client gets what the upstream said, but the cache keeps none of it, so
/// offline the ConfigMap path never serves the Secret.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_for_another_object_is_not_cached() {
    let cluster = Cluster::start().await;
    for (kind, gvr, name) in [
        ("ConfigMap", "v1/configmaps", "settings"),
        ("Secret", "v1/secrets", "credentials"),
    ] {
        cluster
            .fake
            .create(
                gvr,
                json!({"apiVersion": "v1", "kind": kind,
                       "metadata": {"name": name, "namespace": "default"},
                       "data": {"key": "c2VjcmV0"}}),
            )
            .unwrap();
    }
    let hub = cluster.start_hub();
    let configmap = "/api/v1/namespaces/default/configmaps/settings";
    let configmaps = "/api/v1/namespaces/default/configmaps";
    // A well-behaved answer first: cached.
    assert_eq!(admin_get(&hub, "coredns", configmap).await.status, 200);
    cluster
        .fake
        .answer_as(configmap, "/api/v1/namespaces/default/secrets/credentials");
    cluster
        .fake
        .answer_as(configmaps, "/api/v1/namespaces/default/secrets");
    let wrong = admin_get(&hub, "coredns", configmap).await;
    assert_eq!(wrong.status, 200);
    assert_eq!(
        wrong.json()["kind"],
        "Secret",
        "proxied as upstream answered"
    );
    let wrong_list = admin_get(&hub, "coredns", configmaps).await;
    assert_eq!(wrong_list.json()["kind"], "SecretList");
    // An answer for another ConfigMap under this one's name.
    cluster.fake.restore().await;
    cluster
        .fake
        .answer_as("/api/v1/namespaces/default/configmaps/other", configmap);
    assert_eq!(
        admin_get(
            &hub,
            "coredns",
            "/api/v1/namespaces/default/configmaps/other"
        )
        .await
        .status,
        200
    );
    cluster.fake.refuse_connections();
    let cached = until_cached_as(&hub, "coredns", configmap).await;
    assert_eq!(cached.json()["kind"], "ConfigMap", "never the Secret");
    assert_eq!(cached.json()["metadata"]["name"], "settings");
    let other = admin_get(
        &hub,
        "coredns",
        "/api/v1/namespaces/default/configmaps/other",
    )
    .await;
    assert_ne!(other.status, 200, "nothing was cached under its name");
    // The Secret's name on a ConfigMap path: the Secret must not be there either.
    let secret = admin_get(
        &hub,
        "coredns",
        "/api/v1/namespaces/default/configmaps/credentials",
    )
    .await;
    assert_ne!(
        secret.status,
        200,
        "a ConfigMap path serves a Secret: {}",
        String::from_utf8_lossy(&secret.body)
    );
    let list = admin_get(&hub, "coredns", configmaps).await;
    assert_ne!(
        list.status,
        200,
        "the Secret list was not cached as the ConfigMap list: {}",
        String::from_utf8_lossy(&list.body)
    );
    until_metrics(&hub, "three mismatches", |text| {
        let n = |op: &str| {
            sample(
                text,
                &format!(r#"outpost_cache_writes_total{{op="{op}",outcome="mismatch"}}"#),
            )
            .unwrap_or(0.0)
        };
        n("object") >= 2.0 && n("list") >= 1.0
    })
    .await;
    assert!(
        hub.log_text()
            .contains("upstream answer is not what was asked for"),
        "{}",
        hub.log_text()
    );
}

/// [`until_cached`] for another component, with the admin's token.
async fn until_cached_as(hub: &HubProcess, component: &str, path: &str) -> support::RawResponse {
    until_cached_by(hub, path, || admin_get(hub, component, path)).await
}

// ---- 6: a full file system -------------------------------------------------------------------

/// A tmpfs mounted for the test; unmounted (lazily) on drop.
struct Tmpfs(PathBuf);

impl Tmpfs {
    /// `None` where mounting is not permitted (not root, no CAP_SYS_ADMIN).
    fn mount(path: &Path, mib: u64) -> Option<Tmpfs> {
        std::fs::create_dir_all(path).unwrap();
        let mounted = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={mib}m"), "tmpfs"])
            .arg(path)
            .output()
            .ok()?;
        mounted.status.success().then(|| Tmpfs(path.to_owned()))
    }

    fn free(&self) -> u64 {
        let st = rustix::fs::statvfs(&self.0).expect("statvfs");
        st.f_bavail * st.f_frsize
    }

    /// Writes a file that leaves `left` bytes free.
    fn fill_leaving(&self, left: u64) {
        let filler = self.0.join("filler");
        let mut have = std::fs::metadata(&filler).map_or(0, |m| m.len());
        let free = self.free();
        if free > left {
            have += free - left;
        }
        std::fs::write(&filler, vec![0u8; have as usize]).expect("filler");
    }

    fn clear(&self) {
        std::fs::remove_file(self.0.join("filler")).expect("remove filler");
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// Keeps the pods on the node changing (annotations of a few KiB, and a pod created and deleted
/// now and then) until dropped.
struct Churn(tokio::task::JoinHandle<()>);

impl Churn {
    fn start(cluster: &Arc<Cluster>) -> Churn {
        let cluster = cluster.clone();
        Churn(tokio::spawn(async move {
            let fake = &cluster.fake;
            let padding = "c".repeat(3000);
            for i in 0u64.. {
                let name = format!("p{}", i % 5);
                if let Some(mut p) = fake.get("v1/pods", Some("default"), &name) {
                    p["metadata"]["annotations"] = json!({"churn": format!("{i}{padding}")});
                    let _ = fake.update("v1/pods", p);
                }
                if i % 10 == 0 {
                    let _ = fake.create("v1/pods", pod(&format!("c{i}"), NODE, "churn"));
                    if i >= 20 {
                        let _ = fake.delete("v1/pods", Some("default"), &format!("c{}", i - 20));
                    }
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }))
    }
}

impl Drop for Churn {
    fn drop(&mut self) {
        self.0.abort();
    }
}

async fn readyz(hub: &HubProcess) -> (u16, String) {
    let resp = get(hub.admin, "/v1/readyz?verbose", "test").await;
    (
        resp.status,
        String::from_utf8_lossy(&resp.body).into_owned(),
    )
}

/// The cache on a real small file system that fills up while the hub caches under load: the
/// hub stops caching at its free-space floor (degraded, counted, readyz says why) without a
/// deadlock, healthz stays 200, the scope whose events could not be cached answers 503 offline,
/// also after a crash and restart; once the disk clears, caching resumes and a relist makes
/// the scope whole; SIGTERM ends the hub in time while the disk is full.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_file_system_stops_caching_without_a_deadlock_and_marks_what_was_missed() {
    let cluster = Arc::new(cluster_with_pods(&["p0", "p1", "p2", "p3", "p4"]).await);
    let Some(disk) = Tmpfs::mount(&cluster.dir.path().join("small-disk"), 96) else {
        eprintln!("SKIPPED: mounting a tmpfs is not permitted here (needs root)");
        return;
    };
    let mut args = cluster.hub_args();
    args.retain(|a| !a.starts_with("--disk-cache-path="));
    args.push(format!("--disk-cache-path={}", disk.0.display()));
    args.push("--cache-min-free-bytes=32Mi".into());
    let hub = cluster.start_hub_with(&args);
    let scope = pod_scope();
    let listed = kubelet_get(hub.proxy, &scope).await;
    assert_eq!(listed.status, 200);
    let mut watch = watch_pods(&hub, &rv_of(&listed.json()).to_string()).await;
    let seen = Arc::new(Mutex::new(0usize));
    let counter = seen.clone();
    let reader = tokio::spawn(async move {
        while let Some(Ok(_)) = watch.next().await {
            *counter.lock().unwrap() += 1;
        }
    });
    let churn = Churn::start(&cluster);
    until_durable(&hub, &["op=\"event\",outcome=\"stored\""]).await;

    disk.fill_leaving(16 << 20);
    let text = until_metrics(&hub, "caching stopped at the floor", |t| {
        sample(t, "outpost_cache_degraded") == Some(1.0)
            && sample(t, r#"outpost_cache_missed_total{reason="no_space"}"#).is_some()
            && sample(t, "outpost_cache_missed_scopes").is_some_and(|n| n >= 1.0)
    })
    .await;
    assert!(
        sample(
            &text,
            r#"outpost_cache_writes_total{op="event",outcome="no_space"}"#
        )
        .is_some(),
        "{text}"
    );
    let (code, body) = readyz(&hub).await;
    assert_eq!(code, 200, "degraded is not unready: {body}");
    assert!(body.contains("[+]cache degraded"), "{body}");
    assert!(body.contains("floor"), "readyz says why: {body}");
    assert!(body.contains("missed watch events"), "{body}");
    // No deadlock: proxying, the watch and the admin port all go on.
    let seen_then = *seen.lock().unwrap();
    assert!(
        eventually(Duration::from_secs(10), || *seen.lock().unwrap()
            > seen_then)
        .await,
        "the watch stalled"
    );
    assert_eq!(kubelet_get(hub.proxy, &scope).await.status, 200);
    assert_eq!(get(hub.admin, "/v1/healthz", "test").await.status, 200);
    assert!(disk.free() > 8 << 20, "sled never ate into the floor");

    drop(churn);
    reader.abort();
    let offline = offline_pod_list(&cluster, &hub).await;
    expect_status(&offline, 503);
    let status = offline.json();
    assert!(
        status["message"]
            .as_str()
            .is_some_and(|m| m.contains("missed watch events")),
        "{status}"
    );
    // A crash while the disk is full does not make the scope look whole.
    drop(hub);
    let hub = cluster.start_hub_with(&args);
    let restarted = until_answered_offline(&hub, &scope).await;
    expect_status(&restarted, 503);

    // The disk clears and the cloud comes back: caching resumes, a relist makes it whole.
    disk.clear();
    cluster.fake.restore().await;
    until_metrics(&hub, "caching resumed", |t| {
        sample(t, "outpost_cache_degraded") == Some(0.0)
    })
    .await;
    wait_online(&hub).await;
    let relisted = kubelet_get(hub.proxy, &scope).await;
    assert_eq!(relisted.status, 200);
    assert!(!served_from_cache(&relisted));
    until_metrics(&hub, "the scope relisted", |t| {
        sample(t, "outpost_cache_missed_scopes") == Some(0.0)
    })
    .await;
    let offline = offline_pod_list(&cluster, &hub).await;
    expect_status(&offline, 200);
    assert_eq!(item_names(&offline.json()), upstream_pods(&cluster));

    // Full again, under load: SIGTERM still ends the hub within its grace period.
    cluster.fake.restore().await;
    wait_online(&hub).await;
    let relisted = kubelet_get(hub.proxy, &scope).await;
    let mut watch = watch_pods(&hub, &rv_of(&relisted.json()).to_string()).await;
    let reader = tokio::spawn(async move { while let Some(Ok(_)) = watch.next().await {} });
    let churn = Churn::start(&cluster);
    disk.fill_leaving(16 << 20);
    until_metrics(&hub, "caching stopped again", |t| {
        sample(t, "outpost_cache_degraded") == Some(1.0)
    })
    .await;
    let started = Instant::now();
    let status = hub.terminate_within(Duration::from_secs(20));
    assert!(status.success(), "{status:?}");
    eprintln!("stopped in {:?} with the disk full", started.elapsed());
    drop(churn);
    reader.abort();
}

/// Polls (bounded) until the hub, with the cloud away, answers `path` from its cache: a 200 or
/// a 503 it gave itself (the cache's answer, not the cloud's absence alone).
async fn until_answered_offline(hub: &HubProcess, path: &str) -> support::RawResponse {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let resp = kubelet_get(hub.proxy, path).await;
        let by_cache = String::from_utf8_lossy(&resp.body).contains("missed watch events")
            || served_from_cache(&resp);
        if by_cache {
            return resp;
        }
        assert!(
            Instant::now() < deadline,
            "never answered from the cache: {} {}",
            resp.status,
            String::from_utf8_lossy(&resp.body)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

// ---- 7: a damaged cache ------------------------------------------------------------------------

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// The live sled directory of a cache.
fn live_db(cache: &Path) -> PathBuf {
    let name = std::fs::read_to_string(cache.join("CURRENT")).expect("CURRENT");
    cache.join(name.trim())
}

/// What a power cut or a dying SD card leaves of sled's files.
fn damage(db: &Path, variant: usize) -> String {
    let log = db.join("db");
    let len = std::fs::metadata(&log).map_or(0, |m| m.len());
    let truncate = |to: u64| {
        std::fs::OpenOptions::new()
            .write(true)
            .open(&log)
            .unwrap()
            .set_len(to)
            .unwrap()
    };
    let overwrite = |at: u64, n: usize, byte: u8| {
        let mut bytes = std::fs::read(&log).unwrap();
        let at = at as usize;
        let end = (at + n).min(bytes.len());
        bytes[at..end].iter_mut().for_each(|b| *b = byte);
        std::fs::write(&log, bytes).unwrap();
    };
    let segment = || {
        std::fs::read_dir(db)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .find(|p| {
                p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("snap."))
            })
    };
    match variant {
        0 => truncate(len / 2),
        1 => truncate(len / 3),
        2 => truncate(len * 2 / 3),
        3 => truncate(len / 2 + 777),
        4 => overwrite(len / 2, 4096, 0xff),
        5 => overwrite(len / 2, 64, 0),
        6 => overwrite(len * 3 / 4, 512, 0x5a),
        7 => overwrite(0, 64, 0),
        8 => std::fs::remove_file(&log).unwrap(),
        9 => {
            if let Some(s) = segment() {
                std::fs::remove_file(s).unwrap();
            }
            truncate(len / 2);
        }
        10 => std::fs::write(db.join("conf"), b"segment_size: banana").unwrap(),
        _ => overwrite(len / 4, 8192, 0x00),
    }
    [
        "log truncated to 1/2",
        "log truncated to 1/3",
        "log truncated to 2/3",
        "log truncated past 1/2",
        "4 KiB overwritten in the middle",
        "64 bytes zeroed in the middle",
        "512 bytes overwritten at 3/4",
        "header zeroed",
        "log deleted",
        "snapshot deleted and log halved",
        "config garbled",
        "8 KiB zeroed at 1/4",
    ][variant.min(11)]
    .to_owned()
}

/// A hub-written cache, damaged twelve ways: the hub starts every time (a damaged database is
/// moved aside, named in the log, and a fresh one started), serves online and caches again.
/// `outpost cache verify` names the damage; `--repair` moves it aside by hand.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_cache_never_keeps_the_hub_down() {
    let cluster = Arc::new(Cluster::start().await);
    let padding = "d".repeat(2000);
    let padded = |name: &str, round: usize| {
        let mut p = pod(name, NODE, "web");
        p["metadata"]["annotations"] = json!({"round": format!("{round}{padding}")});
        p
    };
    for i in 0..100 {
        cluster
            .fake
            .create("v1/pods", padded(&format!("p{i:03}"), 0))
            .unwrap();
    }
    let cache = cluster.dir.path().join("cache");
    {
        // A cache as a node leaves it: a relist, then a couple of thousand watch events.
        let hub = cluster.start_hub();
        let listed = kubelet_get(hub.proxy, &pod_scope()).await;
        let mut watch = watch_pods(&hub, &rv_of(&listed.json()).to_string()).await;
        for round in 1..=20 {
            for i in 0..100 {
                let name = format!("p{i:03}");
                let mut p = cluster.fake.get("v1/pods", Some("default"), &name).unwrap();
                p["metadata"]["annotations"] =
                    padded(&name, round)["metadata"]["annotations"].clone();
                cluster.fake.update("v1/pods", p).unwrap();
            }
        }
        let mut events = 0;
        while events < 2000 {
            match tokio::time::timeout(Duration::from_secs(20), watch.next()).await {
                Ok(Some(Ok(_))) => events += 1,
                other => panic!("the watch ended after {events} events: {other:?}"),
            }
        }
        assert!(hub.terminate().success());
    }
    let template = cluster.dir.path().join("template");
    copy_dir(&cache, &template);
    let expected = upstream_pods(&cluster);
    let mut moved = Vec::new();
    for variant in 0..12 {
        let _ = std::fs::remove_dir_all(&cache);
        copy_dir(&template, &cache);
        let what = damage(&live_db(&cache), variant);
        let mut hub = cluster.start_hub();
        let list = kubelet_get(hub.proxy, &pod_scope()).await;
        assert_eq!(list.status, 200, "{what}: {}", hub.log_text());
        assert_eq!(item_names(&list.json()), expected, "{what}");
        assert!(!hub.exited(), "{what}: {}", hub.log_text());
        let (code, body) = readyz(&hub).await;
        assert_eq!(code, 200, "{what}: {body}");
        let log = hub.log_text();
        // The hook keeps sled's caught panics out of stderr: no thread of the hub panicked.
        assert!(!log.contains("' panicked at"), "{what}: {log}");
        if log.contains("moved aside") {
            moved.push(what.clone());
            assert!(log.contains("damaged-"), "the log names where: {log}");
        }
        // It caches again: offline, the list comes from the (fresh or surviving) cache.
        until_durable(&hub, &["op=\"list\",outcome=\"replaced\""]).await;
        assert!(hub.terminate().success(), "{what}");
    }
    eprintln!("moved aside for: {moved:?}");
    assert!(!moved.is_empty(), "sled noticed none of the damage");

    // By hand: `verify` names damage and exits 1; `--repair` moves it aside and exits 0.
    for variant in 0..12 {
        let _ = std::fs::remove_dir_all(&cache);
        copy_dir(&template, &cache);
        let what = damage(&live_db(&cache), variant);
        let verify = cache_verify(&cache, false);
        if verify.status.success() {
            continue;
        }
        let stderr = String::from_utf8_lossy(&verify.stderr);
        assert_eq!(verify.status.code(), Some(1), "{what}: {stderr}");
        if !stderr.contains("damaged") {
            continue;
        }
        assert!(stderr.contains("--repair"), "{stderr}");
        let repaired = cache_verify(&cache, true);
        let out = String::from_utf8_lossy(&repaired.stdout);
        assert!(repaired.status.success(), "{what}: {out}");
        if !out.contains("moved aside") {
            // sled's own recovery at the first open cut the damaged tail off: usable as is.
            assert!(
                cache_verify(&cache, false).status.success(),
                "{what}: {out}"
            );
            continue;
        }
        let kept = std::fs::read_dir(&cache)
            .unwrap()
            .flatten()
            .any(|e| e.file_name().to_string_lossy().starts_with("damaged-"));
        assert!(kept, "kept for inspection");
        assert!(cache_verify(&cache, false).status.success(), "usable after");
        return;
    }
    panic!("`outpost cache verify` found none of the damage");
}

fn cache_verify(cache: &Path, repair: bool) -> std::process::Output {
    let mut command = Command::new(outpost_bin());
    command
        .args(["cache", "verify"])
        .arg(format!("--disk-cache-path={}", cache.display()));
    if repair {
        command.arg("--repair");
    }
    command.output().expect("outpost cache verify runs")
}

// ---- 13: an oversized object -------------------------------------------------------------------

/// `VmHWM` (peak resident set) of a process, in bytes.
fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM");
    kib * 1024
}

/// A 50 MB ConfigMap: proxied whole to the client, never cached, and never held whole in the
/// hub's memory; a LIST holding it is not cached either (the scope would lack an item).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_object_over_the_size_limit_is_proxied_not_cached() {
    let cluster = Cluster::start().await;
    let big = "x".repeat(50 << 20);
    for (name, payload) in [("big", big.as_str()), ("small", "s")] {
        cluster
            .fake
            .create(
                "v1/configmaps",
                json!({"apiVersion": "v1", "kind": "ConfigMap",
                       "metadata": {"name": name, "namespace": "default"},
                       "data": {"payload": payload}}),
            )
            .unwrap();
    }
    drop(big);
    let hub = cluster.start_hub();
    let small = "/api/v1/namespaces/default/configmaps/small";
    let big_path = "/api/v1/namespaces/default/configmaps/big";
    assert_eq!(admin_get(&hub, "coredns", small).await.status, 200);
    let before = peak_rss(hub.pid());
    let answer = admin_get(&hub, "coredns", big_path).await;
    assert_eq!(answer.status, 200);
    assert!(answer.body.len() > 50 << 20, "proxied whole");
    let list = admin_get(&hub, "coredns", "/api/v1/namespaces/default/configmaps").await;
    let names = item_names(&list.json());
    assert!(names.contains(&"big".to_owned()), "{names:?}");
    let grown = peak_rss(hub.pid()).saturating_sub(before);
    until_metrics(&hub, "both left out", |t| {
        sample(
            t,
            r#"outpost_cache_writes_total{op="object",outcome="too_large"}"#,
        ) == Some(1.0)
            && sample(
                t,
                r#"outpost_cache_writes_total{op="list",outcome="too_large"}"#,
            ) == Some(1.0)
    })
    .await;
    assert!(
        grown < 24 << 20,
        "the hub's peak RSS grew by {} MiB for a 50 MB object",
        grown >> 20
    );
    eprintln!(
        "peak RSS grew by {} MiB over a 50 MB GET and a 50 MB LIST",
        grown >> 20
    );

    cluster.fake.refuse_connections();
    let cached = until_cached_as(&hub, "coredns", small).await;
    assert_eq!(cached.json()["metadata"]["name"], "small");
    let offline_big = admin_get(&hub, "coredns", big_path).await;
    assert_ne!(offline_big.status, 200, "not cached");
    let offline_list = admin_get(&hub, "coredns", "/api/v1/namespaces/default/configmaps").await;
    assert_eq!(
        offline_list.status,
        503,
        "never a list that lacks the big item: {}",
        String::from_utf8_lossy(&offline_list.body)
    );
}
