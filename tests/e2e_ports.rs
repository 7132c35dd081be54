//! The hub's ports and resources under hostile or broken clients and upstreams, end to end
//! through the real binary: bounded metric labels, private files, client-side body errors,
//! slow and idle connections, the connection cap, and the deadline of a whole exchange.

mod support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use support::{Cluster, HubProcess, get};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const KUBELET_UA: &str = "kubelet/v1.32.4 (linux/amd64) kubernetes/e2e";

/// One keep-alive connection sending `count` GETs of `path`, each with a User-Agent of its own;
/// returns how many were answered 200.
async fn requests_with_distinct_agents(
    addr: std::net::SocketAddr,
    path: &str,
    count: usize,
) -> usize {
    let answers = keep_alive_gets(addr, count, |i| {
        (path.to_owned(), format!("agent-{i}/v1.0"))
    });
    answers
        .await
        .iter()
        .filter(|status| **status == 200)
        .count()
}

/// One keep-alive connection sending `count` GETs, the `i`th of `request(i)`'s path with its
/// User-Agent; returns each answer's status code.
async fn keep_alive_gets(
    addr: std::net::SocketAddr,
    count: usize,
    request: impl Fn(usize) -> (String, String),
) -> Vec<u16> {
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let mut statuses = Vec::with_capacity(count);
    for i in 0..count {
        let (path, agent) = request(i);
        let req = format!(
            "GET {path} HTTP/1.1\r\nHost: x\r\nUser-Agent: {agent}\r\nAccept: application/json\r\n\r\n"
        );
        stream.write_all(req.as_bytes()).await.expect("write");
        let head = support::read_head(&mut stream).await;
        let length: usize = head
            .lines()
            .find_map(|l| {
                let (name, value) = l.split_once(':')?;
                name.eq_ignore_ascii_case("content-length")
                    .then(|| value.trim().parse().ok())?
            })
            .unwrap_or_else(|| panic!("no content-length in {head}"));
        let mut body = vec![0; length];
        stream.read_exact(&mut body).await.expect("body");
        let status = head.get(9..12).and_then(|code| code.parse().ok());
        statuses.push(status.unwrap_or_else(|| panic!("no status in {head}")));
    }
    statuses
}

/// Item 10: 2,000 User-Agents add no series: per-request metrics label unknown components
/// `other`, and `/metrics` stays the size it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metric_labels_do_not_grow_with_the_user_agent() {
    let cluster = Cluster::start().await;
    let hub = cluster.start_hub();
    let path = format!("/api/v1/nodes/{}", support::NODE);
    assert_eq!(requests_with_distinct_agents(hub.proxy, &path, 1).await, 1);
    let _ = get(hub.proxy, &path, KUBELET_UA).await;
    let before = support::metrics_text(&hub).await.len();

    assert_eq!(
        requests_with_distinct_agents(hub.proxy, &path, 2_000).await,
        2_000
    );
    let text = support::metrics_text(&hub).await;
    assert!(
        !text.contains("agent-1999"),
        "a User-Agent became a label value"
    );
    let other = support::sample(
        &text,
        r#"outpost_requests_total{code="200",component="other",resource="nodes",verb="get"}"#,
    );
    assert_eq!(other, Some(2_001.0), "{text}");
    assert!(
        text.contains(r#"outpost_requests_total{code="200",component="kubelet",resource="nodes",verb="get"} 1"#),
        "known components keep their label: {text}"
    );
    // Counters change value, not size, beyond a few digits.
    assert!(
        text.len() < before + 1_024,
        "/metrics grew from {before} to {} bytes",
        text.len()
    );
}

/// 2,000 paths of resources and subresources no one serves add no series either: the apiserver
/// refuses them (the node authorizer, before it would answer 404), and per-request metrics
/// label the names they do not know `other`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metric_labels_do_not_grow_with_the_path() {
    let cluster = Cluster::start().await;
    let hub = cluster.start_hub();
    let pod = "/api/v1/namespaces/default/pods/web";
    let paths = |i: usize| match i % 2 {
        0 => format!("/api/v1/zz{i}"),
        _ => format!("{pod}/zz{i}"),
    };
    let kubelet = |i| (paths(i), KUBELET_UA.to_owned());
    assert_eq!(keep_alive_gets(hub.proxy, 2, kubelet).await, [403, 403]);
    let before = support::metrics_text(&hub).await.len();

    let statuses = keep_alive_gets(hub.proxy, 2_000, |i| (paths(i + 2), KUBELET_UA.to_owned()));
    assert!(statuses.await.iter().all(|status| *status == 403));
    let text = support::metrics_text(&hub).await;
    assert!(!text.contains("zz1999"), "a path became a label value");
    for (resource, subresource) in [("other", ""), ("pods", "other")] {
        let joined = match subresource {
            "" => resource.to_owned(),
            sub => format!("{resource}/{sub}"),
        };
        let requests = format!(
            r#"outpost_requests_total{{code="403",component="kubelet",resource="{joined}",verb="{}"}}"#,
            if subresource.is_empty() {
                "list"
            } else {
                "get"
            }
        );
        assert_eq!(support::sample(&text, &requests), Some(1_001.0), "{text}");
    }
    assert!(
        text.len() < before + 1_024,
        "/metrics grew from {before} to {} bytes",
        text.len()
    );
}

/// Every path under `dir` whose mode lets group or others in, with its mode.
fn readable_by_others(dir: &Path) -> Vec<(PathBuf, u32)> {
    use std::os::unix::fs::PermissionsExt;
    let mut loose = Vec::new();
    let mut pending = vec![dir.to_owned()];
    while let Some(path) = pending.pop() {
        let meta = std::fs::symlink_metadata(&path).expect("metadata");
        let mode = meta.permissions().mode() & 0o7777;
        if mode & 0o077 != 0 {
            loose.push((path.clone(), mode));
        }
        if meta.is_dir() {
            pending.extend(std::fs::read_dir(&path).unwrap().map(|e| e.unwrap().path()));
        }
    }
    loose
}

fn chmod(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// Item 11: started with umask 000 over directories an earlier run left world-readable, the hub
/// tightens them (one log line) and creates everything else private: the cache (sled's files
/// hold the Secrets kubelet read), the serving certificate and its key, the accepted tokens,
/// the server list and the state dump.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hub_files_are_private_whatever_the_umask() {
    let cluster = Cluster::start().await;
    let root = cluster.dir.path().join("root");
    let cache = cluster.dir.path().join("cache");
    for dir in [&root, &cache] {
        std::fs::create_dir_all(dir).unwrap();
        chmod(dir, 0o755);
    }
    std::fs::write(root.join("servers.json"), "{}").unwrap();
    chmod(&root.join("servers.json"), 0o644);
    std::fs::write(cache.join("left-over"), "x").unwrap();
    chmod(&cache.join("left-over"), 0o666);

    let hub = HubProcess::spawn_wrapped(
        &["sh", "-c", r#"umask 000 && exec "$0" "$@""#],
        &cluster.hub_args(),
    );
    let ca = cluster.fake.pki().ca_pem.clone();
    support::until_certified(&hub, &ca).await;
    let node = format!("/api/v1/nodes/{}", support::NODE);
    assert_eq!(get(hub.proxy, &node, KUBELET_UA).await.status, 200);
    hub.signal("USR1");
    let written = |path: PathBuf| move || path.exists();
    for file in [
        root.join("verified-tokens"),
        root.join("pki/yurthub-server-current.pem"),
        root.join(format!("yurthub.{}.stacks.log", hub.pid())),
    ] {
        assert!(
            support::eventually(Duration::from_secs(10), written(file.clone())).await,
            "{} never written; log:\n{}",
            file.display(),
            hub.log_text()
        );
    }
    let log = hub.log_text();
    hub.terminate();

    let loose: Vec<_> = [&root, &cache]
        .iter()
        .flat_map(|d| readable_by_others(d))
        .collect();
    assert!(loose.is_empty(), "readable by others: {loose:?}");
    let sled_files = paths_under(&cache);
    assert!(sled_files > 3, "the cache holds sled's files: {sled_files}");
    let tightened: Vec<_> = log
        .lines()
        .filter(|l| l.contains("readable by other users"))
        .collect();
    assert_eq!(tightened.len(), 1, "{log}");
    assert!(tightened[0].contains("paths=4"), "{}", tightened[0]);
}

/// How many paths are under `dir` (itself included).
fn paths_under(dir: &Path) -> usize {
    let mut count = 0;
    let mut pending = vec![dir.to_owned()];
    while let Some(path) = pending.pop() {
        count += 1;
        if path.is_dir() {
            pending.extend(std::fs::read_dir(&path).unwrap().map(|e| e.unwrap().path()));
        }
    }
    count
}

/// A component the edge cache does not serve: its failures reach it as they are.
const CLIENT_UA: &str = "e2e-client/v1.0";

/// Writes `head` and `body` on a fresh connection to `addr` and reads the answer (bounded by
/// `within`); the connection stays open on the client's side, as a stalled client's does.
async fn exchange_raw(
    addr: std::net::SocketAddr,
    head: &str,
    body: &[u8],
    within: Duration,
) -> (support::RawResponse, Duration) {
    let started = std::time::Instant::now();
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    stream.write_all(head.as_bytes()).await.expect("head");
    stream.write_all(body).await.expect("body");
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let read = tokio::time::timeout(within, async {
        loop {
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
            if let Some(end) = complete_response(&buf) {
                buf.truncate(end);
                break;
            }
        }
    })
    .await;
    assert!(
        read.is_ok(),
        "no answer within {within:?}: {:?}",
        String::from_utf8_lossy(&buf)
    );
    (support::RawResponse::parse(&buf), started.elapsed())
}

/// The length of the first whole response in `buf` (one with a `Content-Length`), if there is
/// one yet.
fn complete_response(buf: &[u8]) -> Option<usize> {
    let head_end = buf.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))?
        .trim()
        .parse()
        .ok()?;
    (buf.len() >= head_end + length).then_some(head_end + length)
}

fn assert_status(resp: &support::RawResponse, code: u16, reason: &str) -> String {
    assert_eq!(
        resp.status,
        code,
        "{:?}",
        String::from_utf8_lossy(&resp.body)
    );
    let body = resp.json();
    assert_eq!(body["kind"], "Status");
    assert_eq!(body["code"], code);
    assert_eq!(body["reason"], reason, "{body}");
    body["message"].as_str().unwrap_or_default().to_owned()
}

const CONFIGMAP: &[u8] = br#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"cm-e2e"}}"#;

/// The head of a POST of [`CONFIGMAP`] with `framing` (a header line) and `query`.
fn post_head(framing: &str, query: &str) -> String {
    format!(
        "POST /api/v1/namespaces/default/configmaps{query} HTTP/1.1\r\nHost: x\r\n\
         User-Agent: {CLIENT_UA}\r\nAuthorization: Bearer {}\r\n\
         Content-Type: application/json\r\n{framing}\r\n",
        support::ADMIN_TOKEN
    )
}

/// What must hold after a client's body failed an exchange: the apiserver was neither
/// suspected nor counted as failing, and nothing was created.
async fn assert_not_blamed_on_the_apiserver(cluster: &Cluster, hub: &HubProcess) {
    let log = hub.log_text();
    assert!(
        !log.contains("apiserver suspected"),
        "the apiserver was suspected:\n{log}"
    );
    let metrics = support::metrics_text(hub).await;
    assert!(
        !metrics.contains("outpost_upstream_errors_total{"),
        "counted as upstream errors:\n{metrics}"
    );
    assert!(
        cluster
            .fake
            .get("v1/configmaps", Some("default"), "cm-e2e")
            .is_none()
    );
}

/// Item 12: a request body in broken chunked encoding is the client's fault: 400, and the log
/// says so, instead of a 502 blaming the apiserver.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_chunked_body_is_a_400_put_down_to_the_client() {
    let cluster = Cluster::start().await;
    let hub = cluster.start_hub();
    let mut chunked = format!("{:x}\r\n", 20).into_bytes();
    chunked.extend_from_slice(&CONFIGMAP[..20]);
    chunked.extend_from_slice(b"\r\nnot-a-chunk-size\r\n");
    chunked.extend_from_slice(&CONFIGMAP[20..]);
    chunked.extend_from_slice(b"\r\n0\r\n\r\n");
    let head = post_head("Transfer-Encoding: chunked\r\n", "");
    let (bad, _) = exchange_raw(hub.proxy, &head, &chunked, Duration::from_secs(10)).await;
    let message = assert_status(&bad, 400, "BadRequest");
    assert!(
        message.contains("request body from the client"),
        "{message}"
    );
    let blamed_on_the_client = |l: &str| {
        l.contains("request failed") && l.contains("malformed request body from the client")
    };
    let log = hub
        .log_once(blamed_on_the_client, Duration::from_secs(5))
        .await;
    assert!(log.lines().any(blamed_on_the_client), "{log}");
    assert_not_blamed_on_the_apiserver(&cluster, &hub).await;
}

/// Item 12: a request body the client stops sending is a 408 at the request's deadline, not a
/// 504 blaming the apiserver (which was waiting for the rest of it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_body_that_never_ends_is_a_408() {
    let cluster = Cluster::start().await;
    let hub = cluster.start_hub();
    let length = format!("Content-Length: {}\r\n", CONFIGMAP.len());
    let head = post_head(&length, "?timeout=2s");
    let (stalled, took) =
        exchange_raw(hub.proxy, &head, &CONFIGMAP[..10], Duration::from_secs(10)).await;
    let message = assert_status(&stalled, 408, "Timeout");
    assert!(message.contains("the client did not send"), "{message}");
    assert!(took < Duration::from_secs(5), "{took:?}");
    assert_not_blamed_on_the_apiserver(&cluster, &hub).await;
}

/// A GET as seen on the wire: the response head, when the first body byte came and when the
/// connection ended (both from the start), and the body bytes as sent (framing included).
struct Timed {
    head: String,
    first_byte: Option<Duration>,
    ended: Duration,
    raw_body: Vec<u8>,
}

impl Timed {
    fn status(&self) -> u16 {
        self.head
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or_else(|| panic!("status line in {}", self.head))
    }

    /// Whether the body arrived whole: its declared length, or chunked up to the last chunk.
    fn complete(&self) -> bool {
        let head = self.head.to_ascii_lowercase();
        match head.lines().find_map(|l| l.strip_prefix("content-length:")) {
            Some(length) => length.trim().parse() == Ok(self.raw_body.len()),
            None => self.raw_body.ends_with(b"0\r\n\r\n"),
        }
    }

    fn parsed(&self) -> support::RawResponse {
        let mut whole = self.head.clone().into_bytes();
        whole.extend_from_slice(&self.raw_body);
        support::RawResponse::parse(&whole)
    }
}

/// `GET path` on a fresh connection (`Connection: close`), read until the hub closes it or
/// `within` passes (which fails the test).
async fn timed_get(
    addr: std::net::SocketAddr,
    path: &str,
    user_agent: &str,
    token: Option<&str>,
    within: Duration,
) -> Timed {
    let started = std::time::Instant::now();
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    let req = format!(
        "GET {path} HTTP/1.1\r\nHost: x\r\nUser-Agent: {user_agent}\r\nAccept: application/json\r\n{auth}Connection: close\r\n\r\n"
    );
    stream.write_all(req.as_bytes()).await.expect("write");
    let read = tokio::time::timeout(within, async {
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            let n = stream.read(&mut byte).await.expect("read");
            assert_eq!(n, 1, "closed before the response head");
            head.push(byte[0]);
        }
        let head = String::from_utf8_lossy(&head).into_owned();
        let (mut raw_body, mut first_byte) = (Vec::new(), None);
        let mut chunk = [0u8; 4096];
        while let Ok(n) = stream.read(&mut chunk).await {
            if n == 0 {
                break;
            }
            first_byte.get_or_insert_with(|| started.elapsed());
            raw_body.extend_from_slice(&chunk[..n]);
        }
        Timed {
            head,
            first_byte,
            ended: started.elapsed(),
            raw_body,
        }
    })
    .await;
    read.unwrap_or_else(|_| panic!("GET {path}: not over within {within:?}"))
}

fn pod(name: &str) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"nodeName": support::NODE, "containers": [{"name": "c", "image": "busybox"}]}
    })
}

/// Item 8: an apiserver that sends the headers of kubelet's GET and then nothing no longer
/// holds kubelet: at the request's `?timeout=` a body held for kubelet's filters is a 504, and
/// a streamed one is cut off, unfinished (kube-apiserver does the same past its deadline).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_that_stalls_after_its_headers_ends_at_the_deadline() {
    let cluster = Cluster::start().await;
    cluster.fake.create("v1/pods", pod("stalled")).unwrap();
    let hub = cluster.start_hub();
    cluster.fake.slow_bodies_under("/api/v1/", None);

    let held = "/api/v1/namespaces/default/pods/stalled?timeout=3s";
    let held = timed_get(hub.proxy, held, KUBELET_UA, None, Duration::from_secs(20)).await;
    let message = assert_status(&held.parsed(), 504, "Timeout");
    assert!(message.contains("within 3s"), "{message}");
    assert!(
        (Duration::from_millis(2_500)..Duration::from_secs(6)).contains(&held.ended),
        "{:?}",
        held.ended
    );

    let streamed = format!("/api/v1/nodes/{}?timeout=3s", support::NODE);
    let streamed = timed_get(
        hub.proxy,
        &streamed,
        KUBELET_UA,
        None,
        Duration::from_secs(20),
    )
    .await;
    assert_eq!(streamed.status(), 200);
    assert!(
        !streamed.complete(),
        "{:?}",
        String::from_utf8_lossy(&streamed.raw_body)
    );
    assert!(
        (Duration::from_millis(2_500)..Duration::from_secs(6)).contains(&streamed.ended),
        "{:?}",
        streamed.ended
    );
    let log = hub.log_text();
    assert!(log.contains("cut off"), "{log}");
}

/// Item 8: a cached read whose answer stalls after its headers is answered from the cache
/// once the cloud is judged unreachable (here it goes silent meanwhile), at the deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_cached_read_is_answered_from_the_cache_once_the_cloud_is_gone() {
    let cluster = Cluster::start().await;
    cluster.fake.create("v1/pods", pod("cached")).unwrap();
    let hub = cluster.start_hub();
    let path = "/api/v1/namespaces/default/pods/cached";
    let fresh = timed_get(hub.proxy, path, KUBELET_UA, None, Duration::from_secs(10)).await;
    assert_eq!(fresh.status(), 200);

    cluster.fake.slow_bodies_under("/api/v1/", None);
    let addr = hub.proxy;
    let stalled = tokio::spawn(async move {
        let path = "/api/v1/namespaces/default/pods/cached?timeout=15s";
        timed_get(addr, path, KUBELET_UA, None, Duration::from_secs(30)).await
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    cluster.fake.blackhole();
    let answer = stalled.await.unwrap();
    cluster.fake.restore().await;
    let resp = answer.parsed();
    assert_eq!(
        resp.status,
        200,
        "{:?}\n{}",
        String::from_utf8_lossy(&resp.body),
        hub.log_text()
    );
    assert_eq!(resp.json()["metadata"]["name"], "cached");
    assert!(answer.ended > Duration::from_secs(10), "{:?}", answer.ended);
}

/// Item 8: what no filter can change streams through: kubelet's GET of a ConfigMap other than
/// `kube-system/kube-proxy` (the only one `inclusterconfig` rewrites) gets its first bytes as
/// they come, not after the last.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trickling_answer_no_filter_changes_streams_through() {
    let cluster = Cluster::start().await;
    let configmap = serde_json::json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "app", "namespace": "default"},
        "data": {"settings": "x".repeat(600)}
    });
    cluster.fake.create("v1/configmaps", configmap).unwrap();
    let hub = cluster.start_hub();
    cluster.fake.slow_bodies_under(
        "/api/v1/namespaces/default/configmaps",
        Some(Duration::from_millis(100)),
    );
    let path = "/api/v1/namespaces/default/configmaps/app";
    let token = Some(support::ADMIN_TOKEN);
    let got = timed_get(hub.proxy, path, KUBELET_UA, token, Duration::from_secs(30)).await;
    assert_eq!(got.status(), 200);
    assert!(got.complete());
    assert_eq!(got.parsed().json()["data"]["settings"], "x".repeat(600));
    let first = got.first_byte.expect("a body");
    assert!(
        got.ended > Duration::from_secs(3),
        "the trickle took {:?}",
        got.ended
    );
    assert!(
        first < Duration::from_millis(1_500),
        "first byte after {first:?}"
    );
}

/// Connections that send a request head a few bytes at a time and never finish it.
async fn slowloris(addr: std::net::SocketAddr, count: usize) -> Vec<tokio::net::TcpStream> {
    let mut sockets = Vec::with_capacity(count);
    for _ in 0..count {
        let mut socket = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let _ = socket
            .write_all(b"GET /api/v1/pods HTTP/1.1\r\nHost: x\r\n")
            .await;
        sockets.push(socket);
    }
    sockets
}

/// One more header line on every socket still open.
async fn trickle(sockets: &mut [tokio::net::TcpStream]) {
    for socket in sockets.iter_mut() {
        let _ = socket.write_all(b"X-Slow: 1\r\n").await;
    }
}

/// How many of `sockets` the hub has closed (a read ends or fails at once).
async fn closed_by_the_hub(sockets: &mut [tokio::net::TcpStream]) -> usize {
    let mut closed = 0;
    let mut buf = [0u8; 512];
    for socket in sockets.iter_mut() {
        let read = tokio::time::timeout(Duration::from_millis(20), socket.read(&mut buf)).await;
        closed += usize::from(matches!(read, Ok(Ok(0) | Err(_))));
    }
    closed
}

/// Item 9: 300 slowloris connections against a hub limited to 256 open files. Before, they
/// held the port (and every descriptor): kubelet's LIST and `/v1/healthz` failed and each
/// failed accept was logged. Now the proxy port keeps within its cap (each newcomer takes the
/// slot of the connection that waited longest for a head), kubelet's LIST and the admin port
/// answer meanwhile, every slowloris connection is closed by the header-read timeout, and
/// nothing runs out of descriptors.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slowloris_connections_are_cut_and_kubelet_gets_through_under_a_low_fd_limit() {
    let cluster = Cluster::start().await;
    let mut args = cluster.hub_args();
    args.push("--client-header-timeout=3s".into());
    let hub = HubProcess::spawn_wrapped(&["prlimit", "--nofile=256:256", "--"], &args);
    let list = format!(
        "/api/v1/pods?fieldSelector=spec.nodeName%3D{}",
        support::NODE
    );
    assert_eq!(get(hub.proxy, &list, KUBELET_UA).await.status, 200);

    let mut attackers = slowloris(hub.proxy, 300).await;
    trickle(&mut attackers).await;
    let listed = get(hub.proxy, &list, KUBELET_UA).await;
    assert_eq!(listed.status, 200, "{}", hub.log_text());
    let health = get(hub.admin, "/v1/healthz", "probe").await;
    assert_eq!(health.status, 200);
    let metrics = support::metrics_text(&hub).await;
    let open_fds = support::sample(&metrics, "process_open_fds").unwrap_or_default();
    assert!(open_fds < 256.0, "{open_fds} descriptors open");
    eprintln!("with 300 slowloris connections: {open_fds} descriptors open");

    // They keep trickling, but a head must be whole within the header-read timeout.
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        trickle(&mut attackers).await;
    }
    assert_eq!(closed_by_the_hub(&mut attackers).await, 300);
    let metrics = support::metrics_text(&hub).await;
    let closed = |reason: &str| {
        support::sample(
            &metrics,
            &format!(
                r#"outpost_client_connections_closed_total{{port="proxy",reason="{reason}"}}"#
            ),
        )
        .unwrap_or_default()
    };
    assert!(closed("evicted") > 200.0, "{metrics}");
    assert!(closed("header_timeout") > 0.0, "{metrics}");
    let log = hub.log_text();
    assert!(
        !log.contains("Too many open files"),
        "the hub ran out of descriptors:\n{log}"
    );
}

/// Item 9: a keep-alive connection idle past `--client-idle-timeout` is closed; one serving a
/// request (a watch) is not, however long; and on the secure port a client that completes the
/// TLS handshake but sends no head is cut at the header-read timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_and_headless_connections_are_closed_but_busy_ones_are_not() {
    let cluster = Cluster::start().await;
    let hub =
        cluster.start_hub_with_flags(&["--client-header-timeout=2s", "--client-idle-timeout=2s"]);
    let ca = cluster.fake.pki().ca_pem.clone();
    support::until_certified(&hub, &ca).await;

    let mut idle = tokio::net::TcpStream::connect(hub.proxy).await.unwrap();
    let req = format!(
        "GET /api/v1/nodes/{} HTTP/1.1\r\nHost: x\r\nUser-Agent: {KUBELET_UA}\r\n\r\n",
        support::NODE
    );
    idle.write_all(req.as_bytes()).await.unwrap();
    let head = support::read_head(&mut idle).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let mut watch = tokio::net::TcpStream::connect(hub.proxy).await.unwrap();
    let req = format!(
        "GET /api/v1/pods?watch=true&timeoutSeconds=30&fieldSelector=spec.nodeName%3D{} HTTP/1.1\r\nHost: x\r\nUser-Agent: {KUBELET_UA}\r\n\r\n",
        support::NODE
    );
    watch.write_all(req.as_bytes()).await.unwrap();
    let head = support::read_head(&mut watch).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let tcp = tokio::net::TcpStream::connect(hub.secure).await.unwrap();
    let name = rustls::pki_types::ServerName::IpAddress(hub.secure.ip().into());
    let mut headless = support::tls_client(&ca).connect(name, tcp).await.unwrap();

    tokio::time::sleep(Duration::from_secs(4)).await;
    let mut buf = vec![0u8; 64 << 10];
    let ended = |read: Result<std::io::Result<usize>, _>| matches!(read, Ok(Ok(0) | Err(_)));
    // What the first GET left unread is read first; then the end.
    let mut idle_ended = false;
    for _ in 0..4 {
        let read = tokio::time::timeout(Duration::from_millis(500), idle.read(&mut buf)).await;
        if ended(read) {
            idle_ended = true;
            break;
        }
    }
    assert!(idle_ended, "the idle keep-alive connection is still open");
    let read = tokio::time::timeout(Duration::from_millis(500), headless.read(&mut buf)).await;
    assert!(
        ended(read),
        "the secure connection without a head is still open"
    );
    let read = tokio::time::timeout(Duration::from_millis(500), watch.read(&mut buf)).await;
    assert!(!ended(read), "the watch was closed");
    let metrics = support::metrics_text(&hub).await;
    let closed = |port: &str, reason: &str| {
        support::sample(
            &metrics,
            &format!(
                r#"outpost_client_connections_closed_total{{port="{port}",reason="{reason}"}}"#
            ),
        )
        .unwrap_or_default()
    };
    assert!(closed("proxy", "idle_timeout") >= 1.0, "{metrics}");
    assert!(closed("secure", "header_timeout") >= 1.0, "{metrics}");
}

/// Item 9: a proxy port whose every connection serves a request (here watches) answers a new
/// one with a 503 Status instead of taking more descriptors, and the admin port still answers
/// `/v1/healthz`; once a watch ends, requests get through again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_port_full_of_busy_connections_refuses_more_and_the_admin_port_answers() {
    let cluster = Cluster::start().await;
    let hub = cluster.start_hub_with_flags(&["--max-connections-per-port=4"]);
    let mut watches = Vec::new();
    for _ in 0..4 {
        let mut watch = tokio::net::TcpStream::connect(hub.proxy).await.unwrap();
        let req = format!(
            "GET /api/v1/pods?watch=true&timeoutSeconds=60&fieldSelector=spec.nodeName%3D{} HTTP/1.1\r\nHost: x\r\nUser-Agent: {KUBELET_UA}\r\n\r\n",
            support::NODE
        );
        watch.write_all(req.as_bytes()).await.unwrap();
        let head = support::read_head(&mut watch).await;
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        watches.push(watch);
    }
    let node = format!("/api/v1/nodes/{}", support::NODE);
    let refused = get(hub.proxy, &node, KUBELET_UA).await;
    let message = assert_status(&refused, 503, "ServiceUnavailable");
    assert!(message.contains("no room"), "{message}");
    assert_eq!(refused.header("retry-after"), Some("1"));
    assert_eq!(get(hub.admin, "/v1/healthz", "probe").await.status, 200);

    drop(watches.pop());
    let mut answered = false;
    for _ in 0..50 {
        if get(hub.proxy, &node, KUBELET_UA).await.status == 200 {
            answered = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(answered, "{}", hub.log_text());
}

/// Item 9, out of descriptors anyway (a cap set above the open-files limit): failed accepts
/// are logged once for the burst, not once per retry; the proxy port closes idle connections to
/// make room, so kubelet's LIST still gets through; accepting resumes once the slowloris
/// connections are cut.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn running_out_of_descriptors_is_logged_once_and_idle_connections_make_room() {
    let cluster = Cluster::start().await;
    let mut args = cluster.hub_args();
    args.push("--client-header-timeout=3s".into());
    args.push("--max-connections-per-port=1000".into());
    let hub = HubProcess::spawn_wrapped(&["prlimit", "--nofile=128:128", "--"], &args);
    let mut attackers = slowloris(hub.proxy, 200).await;
    let list = format!(
        "/api/v1/pods?fieldSelector=spec.nodeName%3D{}",
        support::NODE
    );
    let listed = get(hub.proxy, &list, KUBELET_UA).await;
    assert_eq!(listed.status, 200, "{}", hub.log_text());
    for _ in 0..6 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        trickle(&mut attackers).await;
    }
    assert_eq!(closed_by_the_hub(&mut attackers).await, 200);
    // The first accept after a quiet spell closes the burst with its count.
    assert_eq!(get(hub.proxy, &list, KUBELET_UA).await.status, 200);
    let log = hub.log_text();
    let lines = |what: &str| log.lines().filter(|l| l.contains(what)).count();
    assert_eq!(lines("accept failed"), 1, "{log}");
    assert_eq!(lines("accepting connections again"), 1, "{log}");
    assert_eq!(get(hub.admin, "/v1/healthz", "probe").await.status, 200);
    let metrics = support::metrics_text(&hub).await;
    let errors = support::sample(&metrics, r#"outpost_accept_errors_total{port="proxy"}"#);
    assert!(errors.unwrap_or_default() >= 1.0, "{metrics}");
}

/// A probe whose `/readyz` answer stalls after its headers fails (at the probe timeout) instead
/// of holding the prober, and every later probe, for good: the server is found unhealthy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_probe_whose_answer_stalls_finds_the_server_unhealthy() {
    let cluster = Cluster::start().await;
    let hub = cluster.start_hub();
    support::until_ready(&hub, "").await;
    cluster.fake.slow_bodies_under("/readyz", None);
    let server = cluster.fake.url().trim_end_matches('/').to_owned();
    let healthy = format!(r#"outpost_server_healthy{{server="{server}"}}"#);
    let mut unhealthy = false;
    for _ in 0..100 {
        let text = support::metrics_text(&hub).await;
        if support::sample(&text, &healthy) == Some(0.0) {
            unhealthy = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(unhealthy, "{}", hub.log_text());
    cluster.fake.restore().await;
}
