//! The hub's side of the wire to the apiserver: HTTP/2 (every request over one connection, a
//! second only at the server's stream limit, HTTP/1.1 when the server offers nothing else or
//! `--disable-http2` says so), the PING that finds a dead connection under quiet watches, and
//! gzip on the WAN with decoded bytes for the cache.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use outpost_testkit::{FakeConfig, HttpVersion};
use support::{Cluster, HubProcess, NODE, eventually, metrics_text, pod, read_head, sample};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

const KUBELET_UA: &str = "kubelet/v1.32.4 (linux/amd64) kubernetes/e2e";

/// A watch of the node's pods through the hub, kept open: its socket after the response head.
async fn open_pod_watch(hub: &HubProcess) -> TcpStream {
    let mut stream = TcpStream::connect(hub.proxy).await.expect("connect");
    let req = format!(
        "GET /api/v1/pods?fieldSelector=spec.nodeName%3D{NODE}&watch=true HTTP/1.1\r\nHost: {}\r\nUser-Agent: {KUBELET_UA}\r\nAccept: application/json\r\n\r\n",
        hub.proxy
    );
    stream.write_all(req.as_bytes()).await.expect("write");
    let head = read_head(&mut stream).await;
    assert!(head.starts_with("HTTP/1.1 200"), "watch refused: {head}");
    stream
}

/// Reads `stream` until `needle` shows, within `within`.
async fn sees(stream: &mut TcpStream, needle: &str, within: Duration) -> bool {
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    tokio::time::timeout(within, async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return false,
                Ok(n) => seen.extend_from_slice(&buf[..n]),
            }
            if String::from_utf8_lossy(&seen).contains(needle) {
                return true;
            }
        }
    })
    .await
    .unwrap_or(false)
}

/// Whether `stream` reaches its end (EOF, the last chunk, or a reset) within `within`.
async fn ends(stream: &mut TcpStream, within: Duration) -> bool {
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    tokio::time::timeout(within, async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => seen.extend_from_slice(&buf[..n]),
            }
            if seen.ends_with(b"0\r\n\r\n") {
                return;
            }
        }
    })
    .await
    .is_ok()
}

/// The node's connections the fake has open, per HTTP version.
fn node_connections(cluster: &Cluster) -> (usize, usize) {
    let user = format!("system:node:{NODE}");
    let open: Vec<_> = cluster
        .fake
        .connections()
        .into_iter()
        .filter(|c| c.identity == user && c.closed_at.is_none())
        .collect();
    let count = |v| open.iter().filter(|c| c.version == Some(v)).count();
    (count(HttpVersion::Http2), count(HttpVersion::Http1))
}

async fn upstream_streams(hub: &HubProcess, cluster: &Cluster) -> f64 {
    let series = format!(
        "outpost_upstream_streams{{server=\"{}\"}}",
        cluster.fake.url().trim_end_matches('/')
    );
    sample(&metrics_text(hub).await, &series).unwrap_or(0.0)
}

/// A fake apiserver that allows 4 concurrent streams per HTTP/2 connection.
async fn four_streams_per_connection() -> Cluster {
    Cluster::start_with(FakeConfig {
        http2_max_streams: 4,
        ..FakeConfig::default()
    })
    .await
}

/// Creates pod `web-1` and checks that every one of `watches` sees it (`why` if one does not).
async fn every_watch_sees_a_new_pod(cluster: &Cluster, watches: &mut [TcpStream], why: &str) {
    cluster
        .fake
        .create("v1/pods", pod("web-1", NODE, "web"))
        .unwrap();
    for w in watches {
        assert!(sees(w, "web-1", Duration::from_secs(10)).await, "{why}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_carries_every_request_and_watch_over_one_connection() {
    let cluster = Cluster::start().await;
    let hub = cluster.start_hub();
    support::wait_online(&hub).await;
    let mut watches = Vec::new();
    for _ in 0..8 {
        watches.push(open_pod_watch(&hub).await);
    }
    for i in 0..5 {
        let resp = support::get(
            hub.proxy,
            &format!(
                "/api/v1/pods?fieldSelector=spec.nodeName%3D{NODE}&limit={}",
                i + 1
            ),
            KUBELET_UA,
        )
        .await;
        assert_eq!(resp.status, 200);
    }
    let streams = upstream_streams(&hub, &cluster).await;
    assert!(
        streams >= 8.0,
        "the 8 watches are open HTTP/2 streams ({streams})"
    );
    assert_eq!(
        node_connections(&cluster),
        (1, 0),
        "one HTTP/2 connection carries the node's requests, none over HTTP/1.1"
    );
    every_watch_sees_a_new_pod(&cluster, &mut watches, "a watch over HTTP/2").await;
}

/// A request body larger than the server's HTTP/2 window (the fake's is hyper's, 1 MiB) goes
/// out as the server opens the window, whole, on the node's one connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_body_beyond_the_servers_window_crosses_whole_over_http2() {
    let cluster = Cluster::start().await;
    let hub = cluster.start_hub();
    support::wait_online(&hub).await;
    let message: String = (0..1_500_000u32)
        .map(|i| char::from(b'a' + (i % 26) as u8))
        .collect();
    let event = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": "big", "namespace": "default"},
        "involvedObject": {"kind": "Node", "name": NODE},
        "reason": "Big",
        "message": message,
    });
    let resp = support::send_json(
        hub.proxy,
        "POST",
        "/api/v1/namespaces/default/events",
        &event.to_string(),
    )
    .await;
    let stored = created_event(&cluster, &resp, "big");
    assert!(
        stored["message"] == message.as_str(),
        "the whole body arrived"
    );
    assert_eq!(
        node_connections(&cluster),
        (1, 0),
        "over HTTP/2, on the node's one connection"
    );
}

/// The event `name` as the apiserver stored it, after `resp` said it was created.
fn created_event(cluster: &Cluster, resp: &support::RawResponse, name: &str) -> serde_json::Value {
    assert_eq!(
        resp.status,
        201,
        "{name} created: {}",
        String::from_utf8_lossy(&resp.body)
    );
    cluster
        .fake
        .get("v1/events", Some("default"), name)
        .expect("the event reached the apiserver")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_connection_opens_only_at_the_servers_stream_limit() {
    let cluster = four_streams_per_connection().await;
    let hub = cluster.start_hub();
    support::wait_online(&hub).await;
    let mut watches = Vec::new();
    for _ in 0..10 {
        watches.push(open_pod_watch(&hub).await);
    }
    // No watch waits for a stream: every one of them sees the change.
    let why = "a watch beyond the limit got its own stream";
    every_watch_sees_a_new_pod(&cluster, &mut watches, why).await;
    let streams = upstream_streams(&hub, &cluster).await;
    let (http2, http1) = node_connections(&cluster);
    let needed = (streams as usize).div_ceil(4);
    assert_eq!(http1, 0);
    assert!(
        (needed.max(3)..=needed + 1).contains(&http2),
        "{http2} HTTP/2 connections for {streams} streams at 4 per connection"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http1_when_the_server_offers_no_http2_or_the_flag_says_so() {
    let cluster = Cluster::start_with(FakeConfig {
        http2: false,
        ..FakeConfig::default()
    })
    .await;
    let hub = cluster.start_hub();
    assert_one_http1_connection_per_watch(&cluster, &hub, "no h2 offered").await;
    drop(hub);

    let cluster = Cluster::start().await;
    let hub = cluster.start_hub_with_flags(&["--disable-http2"]);
    assert_one_http1_connection_per_watch(&cluster, &hub, "--disable-http2").await;
}

async fn assert_one_http1_connection_per_watch(cluster: &Cluster, hub: &HubProcess, why: &str) {
    support::wait_online(hub).await;
    let _w1 = open_pod_watch(hub).await;
    let _w2 = open_pod_watch(hub).await;
    let (http2, http1) = node_connections(cluster);
    assert_eq!(http2, 0, "{why}: no HTTP/2");
    assert!(
        http1 >= 2,
        "{why}: one HTTP/1.1 connection per watch ({http1})"
    );
}

/// A TCP relay between the hub and the fake that can go silent on the connections it has
/// (bytes no longer forwarded, sockets kept open: a link that died without a FIN), while new
/// connections pass; every byte crosses it `latency` late, each way.
struct Relay {
    addr: std::net::SocketAddr,
    silences: Arc<Mutex<Vec<watch::Sender<bool>>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Relay {
    async fn start(to: std::net::SocketAddr) -> Relay {
        Relay::with_latency(to, Duration::ZERO).await
    }

    async fn with_latency(to: std::net::SocketAddr, latency: Duration) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let silences = Arc::new(Mutex::new(Vec::new()));
        let registry = silences.clone();
        let task = tokio::spawn(async move {
            let mut conns = tokio::task::JoinSet::new();
            while let Ok((client, _)) = listener.accept().await {
                let (silence, silenced) = watch::channel(false);
                registry.lock().unwrap().push(silence);
                conns.spawn(relay(client, to, latency, silenced));
            }
        });
        Relay {
            addr,
            silences,
            task,
        }
    }

    fn silence_open_connections(&self) {
        for s in self.silences.lock().unwrap().drain(..) {
            s.send_replace(true);
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn relay(
    client: TcpStream,
    to: std::net::SocketAddr,
    latency: Duration,
    mut silenced: watch::Receiver<bool>,
) {
    let Ok(server) = TcpStream::connect(to).await else {
        return;
    };
    // Borrowed, not moved: silenced, the relay keeps both sockets open.
    let (mut cr, mut cw) = client.into_split();
    let (mut sr, mut sw) = server.into_split();
    let forward = async {
        tokio::select! {
            _ = late_copy(&mut cr, &mut sw, latency) => {}
            _ = late_copy(&mut sr, &mut cw, latency) => {}
        }
    };
    let silence = async {
        let _ = silenced.wait_for(|s| *s).await;
    };
    tokio::select! {
        _ = forward => {}
        _ = silence => {
            // Hold both sockets open, forwarding nothing, until the relay is dropped.
            std::future::pending::<()>().await;
        }
    }
}

/// Copies `from` to `to`, each read written `latency` after it was read (in order, never
/// sooner): a link's delay, not its bandwidth.
async fn late_copy(
    from: &mut tokio::net::tcp::OwnedReadHalf,
    to: &mut tokio::net::tcp::OwnedWriteHalf,
    latency: Duration,
) {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let read = async move {
        let mut buf = vec![0u8; 16 * 1024];
        while let Ok(n @ 1..) = from.read(&mut buf).await {
            if tx
                .send((tokio::time::Instant::now() + latency, buf[..n].to_vec()))
                .is_err()
            {
                break;
            }
        }
    };
    let write = async move {
        while let Some((due, bytes)) = rx.recv().await {
            tokio::time::sleep_until(due).await;
            if to.write_all(&bytes).await.is_err() {
                break;
            }
        }
    };
    tokio::join!(read, write);
}

/// Behind a slow link, a burst of requests on a new connection leaves before the server's
/// SETTINGS name its stream limit, and the server refuses the streams beyond it
/// (REFUSED_STREAM: not processed). Each refused one is sent again, on a connection with room,
/// instead of failing the client: every watch of the burst opens and sees the change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_refused_on_a_new_connection_are_sent_again() {
    let cluster = four_streams_per_connection().await;
    let log = burst_of_watches_over_a_slow_link(&cluster, 12, || {}).await;
    assert!(
        log.contains("(it refused the stream); sending it again"),
        "the burst outran the server's SETTINGS (else this test shows nothing)"
    );
}

/// A hub behind a link with 100 ms of latency opens `watches` pod watches at once, after `arm`;
/// every one of them must open and see a new pod. Returns the hub's log.
async fn burst_of_watches_over_a_slow_link(
    cluster: &Cluster,
    watches: usize,
    arm: impl FnOnce(),
) -> String {
    let (_relay, hub) = hub_over_a_slow_link(cluster).await;
    arm();
    let burst = (0..watches).map(|_| open_pod_watch(&hub));
    let mut watches = futures_util::future::join_all(burst).await;
    every_watch_sees_a_new_pod(cluster, &mut watches, "a watch of the burst").await;
    hub.log_text()
}

/// A hub online through a relay that delays each way by 100 ms, for bursts whose streams are
/// on the wire together.
async fn hub_over_a_slow_link(cluster: &Cluster) -> (Relay, HubProcess) {
    let relay = Relay::with_latency(cluster.fake.addr(), Duration::from_millis(100)).await;
    let hub = cluster.start_hub_with_flags(&[&format!("--server-addr=https://{}", relay.addr)]);
    support::wait_online(&hub).await;
    (relay, hub)
}

/// kube-apiserver's `--goaway-chance`, and its shutdown, have Go's HTTP/2 server send one
/// GOAWAY naming the last stream it took; the streams whose HEADERS crossed it on the wire are
/// never answered (RFC 9113 §6.8: not processed). Each is sent again on a new connection
/// instead of failing the client: every watch of a burst that crossed a GOAWAY opens and sees
/// the change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_that_crossed_a_goaway_are_sent_again() {
    let cluster = Cluster::start().await;
    let log = burst_of_watches_over_a_slow_link(&cluster, 8, || {
        cluster.fake.go_away_after_streams(1);
    })
    .await;
    assert!(
        log.contains("(it went away before the stream); sending it again"),
        "the burst crossed the GOAWAY (else this test shows nothing)"
    );
}

/// The same for writes, whose bodies kubelet's client can send twice: a burst of kubelet's
/// event POSTs (protobuf, as kubelet sends them) crossing a GOAWAY all succeed, each event
/// created once (a stream the server did process is never sent again: that would answer 409).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_that_crossed_a_goaway_are_sent_again_with_their_bodies() {
    let cluster = Cluster::start().await;
    let burst = events_crossing_goaways(&cluster, 1, "goaway").await;
    for (name, resp) in burst.names.iter().zip(&burst.answers) {
        let stored = created_event(&cluster, resp, name);
        assert_eq!(stored["message"], format!("{name} crossed a GOAWAY"));
    }
    assert!(
        burst
            .hub
            .log_text()
            .contains("(it went away before the stream); sending it again"),
        "the burst crossed the GOAWAY (else this test shows nothing)"
    );
}

/// A server whose every new connection goes away soon (a high `--goaway-chance` under a
/// burst): the writes that crossed one GOAWAY, sent again, cross the next one too, and go a
/// third time rather than fail their client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_that_crossed_two_goaways_are_sent_a_third_time() {
    let cluster = Cluster::start().await;
    let burst = events_crossing_goaways(&cluster, 2, "goaway-twice").await;
    for (name, resp) in burst.names.iter().zip(&burst.answers) {
        created_event(&cluster, resp, name);
    }
    assert!(
        burst.hub.log_text().contains("sends=2"),
        "a write crossed the second GOAWAY (else this test shows nothing)"
    );
}

/// Past the hub's sends, a write the server never processed fails with what kube-apiserver
/// says when it asks for a request again (503, `Retry-After`), which client-go's rest client
/// follows: sent again, each event is created, and none twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_never_processed_is_answered_with_a_retry_after() {
    let cluster = Cluster::start().await;
    let burst = events_crossing_goaways(&cluster, 3, "goaway-thrice").await;
    let mut refused = Vec::new();
    for (name, resp) in burst.names.iter().zip(&burst.answers) {
        if resp.status == 201 {
            created_event(&cluster, resp, name);
            continue;
        }
        assert_eq!(resp.status, 503, "{}", String::from_utf8_lossy(&resp.body));
        assert_eq!(resp.header("retry-after"), Some("1"), "{name}: asked again");
        let status: serde_json::Value = serde_json::from_slice(&resp.body).expect("a Status");
        assert!(
            status["message"]
                .as_str()
                .is_some_and(|m| m.contains("did not process")),
            "{status}"
        );
        assert!(
            cluster
                .fake
                .get("v1/events", Some("default"), name)
                .is_none(),
            "{name} was not processed"
        );
        refused.push(name.clone());
    }
    assert!(
        !refused.is_empty(),
        "a write crossed all three GOAWAYs (else this test shows nothing)"
    );
    // What client-go does after the Retry-After: each goes once more, and is created once.
    for (name, resp) in refused.iter().zip(post_events(&burst.hub, &refused).await) {
        created_event(&cluster, &resp, name);
    }
}

/// A burst of 8 event POSTs from kubelet through a hub on a slow link, while each of the
/// apiserver's next `goaways` connections goes away after its first stream.
async fn events_crossing_goaways(cluster: &Cluster, goaways: u32, tag: &str) -> Burst {
    let (relay, hub) = hub_over_a_slow_link(cluster).await;
    cluster.fake.go_away_after_streams_on(goaways, 1);
    let names: Vec<String> = (0..8).map(|i| format!("{NODE}.{tag}-{i}")).collect();
    let answers = post_events(&hub, &names).await;
    Burst {
        hub,
        names,
        answers,
        _relay: relay,
    }
}

struct Burst {
    hub: HubProcess,
    names: Vec<String>,
    answers: Vec<support::RawResponse>,
    _relay: Relay,
}

/// kubelet's event POSTs, all at once.
async fn post_events(hub: &HubProcess, names: &[String]) -> Vec<support::RawResponse> {
    let burst = names.iter().map(|name| {
        let event = serde_json::json!({
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": "default"},
            "involvedObject": {"kind": "Node", "name": NODE},
            "reason": "Starting",
            "message": format!("{name} crossed a GOAWAY"),
        });
        async move {
            support::kubelet_send(
                hub.proxy,
                "POST",
                "/api/v1/namespaces/default/events",
                &event,
            )
            .await
        }
    });
    futures_util::future::join_all(burst).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ping_unanswered_ends_the_watches_of_a_dead_connection_at_once() {
    let cluster = Cluster::start().await;
    let relay = Relay::start(cluster.fake.addr()).await;
    // Probes far apart: only the PING can notice the dead connection within the test's bound.
    let hub = cluster.start_hub_with_flags(&[
        &format!("--server-addr=https://{}", relay.addr),
        "--heartbeat-interval-seconds=60",
        "--http2-read-idle-timeout-seconds=1",
        "--http2-ping-timeout-seconds=1",
    ]);
    support::wait_online(&hub).await;
    let mut watch = open_pod_watch(&hub).await;
    cluster
        .fake
        .create("v1/pods", pod("web-1", NODE, "web"))
        .unwrap();
    assert!(sees(&mut watch, "web-1", Duration::from_secs(10)).await);
    relay.silence_open_connections();
    assert!(
        ends(&mut watch, Duration::from_secs(8)).await,
        "the watch on the dead connection ends after one unanswered PING"
    );
    // The server was only suspected: a probe on a new connection finds it well, and a new
    // watch works.
    let mut again = open_pod_watch(&hub).await;
    cluster
        .fake
        .create("v1/pods", pod("web-2", NODE, "web"))
        .unwrap();
    assert!(sees(&mut again, "web-2", Duration::from_secs(10)).await);
    assert!(
        eventually(Duration::from_secs(5), || hub
            .log_text()
            .contains("HTTP/2 PING unanswered"))
        .await,
        "the failed connection was reported to the health checker"
    );
}

/// Reads a whole gzip body.
fn gunzip(bytes: &[u8]) -> Vec<u8> {
    use std::io::Read;
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(bytes)
        .read_to_end(&mut out)
        .expect("a gzip body");
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lists_cross_the_wan_compressed_and_the_cache_and_clients_get_what_they_asked_for() {
    let cluster = Cluster::start_with(FakeConfig {
        gzip: true,
        ..FakeConfig::default()
    })
    .await;
    // Over the apiserver's 128 KiB threshold, so that it compresses the list.
    for i in 0..300 {
        let mut p = pod(&format!("pod-{i:03}"), NODE, "web");
        p["metadata"]["annotations"] =
            serde_json::json!({"note": format!("{i} {}", "x".repeat(400))});
        cluster.fake.create("v1/pods", p).unwrap();
    }
    let hub = cluster.start_hub();
    support::wait_online(&hub).await;
    let path = format!("/api/v1/pods?fieldSelector=spec.nodeName%3D{NODE}");

    // kubelet accepts gzip: it gets gzip.
    let zipped = support::kubelet_get(hub.proxy, &path).await;
    assert_eq!(zipped.status, 200);
    assert_eq!(zipped.header("content-encoding"), Some("gzip"));
    let decoded = gunzip(&zipped.body);
    let list: serde_json::Value = serde_json::from_slice(&decoded).expect("a JSON list");
    assert_eq!(support::names(&list).len(), 300);

    // A client that did not ask for gzip gets plain JSON.
    let plain = support::get(hub.proxy, &path, KUBELET_UA).await;
    assert_eq!(
        (plain.status, plain.header("content-encoding")),
        (200, None)
    );
    assert_eq!(support::names(&plain.json()).len(), 300);

    // Only the compressed bytes crossed the WAN.
    let text = metrics_text(&hub).await;
    let gzip_bytes = sample(
        &text,
        "outpost_upstream_received_bytes_total{encoding=\"gzip\",resource=\"pods\"}",
    )
    .unwrap_or(0.0);
    assert!(
        gzip_bytes > 0.0 && gzip_bytes * 4.0 < 2.0 * decoded.len() as f64,
        "two lists of {} bytes took {gzip_bytes} bytes on the WAN",
        decoded.len()
    );

    // The cache holds the decoded list: offline, it answers it.
    cluster.fake.refuse_connections();
    let cached = support::until_cached(&hub, &path).await;
    let cached = match cached.header("content-encoding") {
        Some("gzip") => gunzip(&cached.body),
        _ => cached.body.clone(),
    };
    let cached: serde_json::Value = serde_json::from_slice(&cached).expect("a JSON list");
    assert_eq!(support::names(&cached).len(), 300);
    cluster.fake.restore().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hubs_own_lists_wait_out_a_429s_retry_after() {
    let cluster = Cluster::start().await;
    cluster.fake.set_retry_after(3);
    cluster
        .fake
        .fail_requests_under("/api/v1/services", Some(429));
    let hub = cluster.start_hub();
    // Long enough for a 1 s, 2 s backoff to have listed three times.
    tokio::time::sleep(Duration::from_secs(7)).await;
    let lists = own_refused_reads(&cluster, |path| path == "/api/v1/services");
    assert!(!lists.is_empty(), "the hub lists Services for itself");
    assert_waited_out(&lists, Duration::from_secs(3));
    drop(hub);
}

/// The same for the hub's config (`yurt-hub-cfg`, pool sharing's ConfigMap): their GETs too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hubs_config_reads_wait_out_a_429s_retry_after() {
    let cluster = Cluster::start().await;
    cluster.fake.set_retry_after(3);
    let config_maps = "/api/v1/namespaces/kube-system/configmaps";
    cluster.fake.fail_requests_under(config_maps, Some(429));
    let hub = cluster.start_hub();
    tokio::time::sleep(Duration::from_secs(7)).await;
    let reads = own_refused_reads(&cluster, |path| path.starts_with(config_maps));
    assert!(
        reads.keys().any(|who| who.contains("yurt-hub-cfg")),
        "the hub reads its config: {reads:?}"
    );
    assert_waited_out(&reads, Duration::from_secs(3));
    drop(hub);
}

/// The hub's own GETs (not watches) answered 429, by caller and path: when each was sent.
fn own_refused_reads(
    cluster: &Cluster,
    path: impl Fn(&str) -> bool,
) -> std::collections::BTreeMap<String, Vec<std::time::Instant>> {
    let mut reads: std::collections::BTreeMap<String, Vec<std::time::Instant>> = Default::default();
    for r in cluster.fake.requests() {
        let own = r
            .user_agent
            .as_deref()
            .is_some_and(|ua| ua == "outpost" || ua.starts_with("outpost/"));
        if own && path(&r.path) && r.status == 429 && !r.query.contains("watch") {
            let who = format!(
                "{} {} {}",
                r.user_agent.unwrap_or_default(),
                r.path,
                r.query
            );
            reads.entry(who).or_default().push(r.at);
        }
    }
    reads
}

/// No read was sent again sooner than `asked` after a refusal, and some were sent again.
fn assert_waited_out(
    reads: &std::collections::BTreeMap<String, Vec<std::time::Instant>>,
    asked: Duration,
) {
    for (who, at) in reads {
        for pair in at.windows(2) {
            let gap = pair[1] - pair[0];
            assert!(
                gap >= asked,
                "{who}: read again {gap:?} after a 429 asking for {asked:?}"
            );
        }
    }
    assert!(
        reads.values().any(|at| at.len() >= 2),
        "the reads were retried: {reads:?}"
    );
}

/// The hub's own LISTs of `/api/v1/services` (the filters' and the shared cache's reflectors).
fn own_service_lists(cluster: &Cluster) -> usize {
    cluster
        .fake
        .requests()
        .iter()
        .filter(|r| {
            r.user_agent.as_deref() == Some("outpost/side-data")
                && r.path == "/api/v1/services"
                && !r.query.contains("watch")
        })
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hubs_reflectors_of_one_collection_share_one_list_also_after_an_outage() {
    let cluster = Cluster::start().await;
    let hub = cluster.start_hub();
    support::wait_online(&hub).await;
    // kube-proxy's read starts the shared cache's Services feed beside the filters' reflector.
    let resp = support::get(hub.proxy, "/api/v1/services", "kube-proxy/v1.32.4").await;
    assert_eq!(resp.status, 200);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(own_service_lists(&cluster), 1, "one LIST at start-up");

    cluster.fake.refuse_connections();
    let offline = eventually(Duration::from_secs(15), || {
        hub.log_text().contains("no apiserver healthy")
    })
    .await;
    assert!(offline, "the hub saw the outage");
    cluster.fake.clear_requests();
    cluster.fake.restore().await;
    // Back within a few probes, then the relists within the return spread (10 s).
    let relisted = eventually(Duration::from_secs(25), || own_service_lists(&cluster) >= 1).await;
    let seen: Vec<String> = cluster
        .fake
        .requests()
        .iter()
        .map(|r| format!("{:?} {} {}?{}", r.user_agent, r.verb, r.path, r.query))
        .collect();
    assert!(
        relisted,
        "the hub relisted its Services after the outage: {seen:#?}\n{}",
        hub.log_text()
    );
    tokio::time::sleep(Duration::from_secs(12)).await;
    assert_eq!(
        own_service_lists(&cluster),
        1,
        "one LIST of the collection after the outage, however many reflectors keep it\n{}",
        hub.log_text()
    );
}
