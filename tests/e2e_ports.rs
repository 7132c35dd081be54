//! The hub's ports and resources under hostile or broken clients and upstreams, end to end
//! through the real binary: bounded metric labels, private files, client-side body errors,
//! slow and idle connections, the connection cap, and the deadline of a whole exchange.

mod support;

use support::{Cluster, get};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const KUBELET_UA: &str = "kubelet/v1.32.4 (linux/amd64) kubernetes/e2e";

/// One keep-alive connection sending `count` GETs of `path`, each with a User-Agent of its own;
/// returns how many were answered 200.
async fn requests_with_distinct_agents(
    addr: std::net::SocketAddr,
    path: &str,
    count: usize,
) -> usize {
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let mut ok = 0;
    for i in 0..count {
        let req = format!(
            "GET {path} HTTP/1.1\r\nHost: x\r\nUser-Agent: agent-{i}/v1.0\r\nAccept: application/json\r\n\r\n"
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
        ok += usize::from(head.starts_with("HTTP/1.1 200"));
    }
    ok
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
