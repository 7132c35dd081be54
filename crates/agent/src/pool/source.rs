//! Where a follower's shared cache lists and watches: a leader hub of its pool first, then the
//! cloud.
//!
//! [`PoolSource::get`] tries the leaders in turn, starting from the next one in round-robin order
//! (so a follower's resources, and the pool's followers, spread over them), skipping those that
//! failed in the last [`COOL_DOWN`]; each is reached over HTTPS with the hub's client certificate,
//! its serving certificate verified against the cluster CA. When none answers, the cloud does,
//! and a watch from the cloud ends after [`RETRY_LEADERS`] to try the leaders again. A watch from a
//! leader that breaks mid-stream ([`PoolSource::failed`]) is resumed at once from its last
//! resourceVersion on the next leader or the cloud: the follower's own readers keep their
//! watches, and miss nothing. A hub that is not a follower lists and watches the cloud, and moves
//! to the leaders as soon as it becomes one.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;
use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use outpost_proxy::body;
use outpost_proxy::error::ProxyError;
use outpost_proxy::upstream::UpstreamBody;
use tokio::sync::watch;
use tracing::{debug, info, warn};

use super::{Leader, PoolSharing, PoolView, Role, port};
use crate::side::reflector::{Cloud, Ends, Opened, Source};

/// How long a feed started with the hub waits for `leader-hub-<pool>` before it decides
/// where to read.
const KNOWN_WITHIN: Duration = Duration::from_secs(5);
/// A leader that failed is not asked again for this long.
pub const COOL_DOWN: Duration = Duration::from_secs(10);
/// A follower watching the cloud because no leader answered tries the leaders again after this.
pub const RETRY_LEADERS: Duration = Duration::from_secs(15);
/// A leader that does not take the connection in this long is taken as down (yurthub's
/// leader health check dials with a 2 s timeout).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a leader may take to answer: it waits up to its own sync before it does.
const HEADER_TIMEOUT: Duration = Duration::from_secs(15);
/// TCP keepalive on a leader's connection: idle this long, then probed every
/// [`KEEPALIVE_INTERVAL`] up to [`KEEPALIVE_PROBES`] times. A leader whose host vanishes without
/// a reset (power, link) would otherwise hold a follower's watch until its timeout; the kernel
/// ends it within seconds, and the watch resumes on another leader.
const KEEPALIVE_IDLE: Duration = Duration::from_secs(2);
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(1);
const KEEPALIVE_PROBES: u32 = 2;
/// While a watch from a leader is open, the leader's `/healthz` is asked this often, and this
/// many answers in a row missing (none within [`PROBE_TIMEOUT`]) end the watch: a leader that
/// hangs with its connections open (its host answering keepalives) is left within seconds.
const PROBE_EVERY: Duration = Duration::from_secs(2);
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
const PROBES_MISSED: u32 = 2;
const USER_AGENT: &str = "outpost/pool-feed";

/// The leaders' recent failures and the round-robin position, shared by a hub's feeds.
#[derive(Default)]
pub struct LeaderHealth {
    next: AtomicUsize,
    failed_at: Mutex<HashMap<String, Instant>>,
}

impl LeaderHealth {
    /// The leaders to try, in order: round-robin, those that failed lately left out.
    fn candidates(&self, leaders: &[Leader]) -> Vec<Leader> {
        if leaders.is_empty() {
            return Vec::new();
        }
        let failed = self.failed_at.lock().unwrap_or_else(|p| p.into_inner());
        let start = self.next.fetch_add(1, Ordering::Relaxed) % leaders.len();
        (0..leaders.len())
            .map(|i| &leaders[(start + i) % leaders.len()])
            .filter(|l| {
                failed
                    .get(&l.node)
                    .is_none_or(|at| at.elapsed() >= COOL_DOWN)
            })
            .cloned()
            .collect()
    }

    fn failed(&self, leader: &Leader, cause: &str) {
        let mut failed = self.failed_at.lock().unwrap_or_else(|p| p.into_inner());
        if failed.insert(leader.node.clone(), Instant::now()).is_none() {
            warn!(leader = %leader.node, ip = %leader.ip, cause, "leader hub failed; trying another leader or the cloud");
        }
    }

    fn answered(&self, leader: &Leader) {
        let mut failed = self.failed_at.lock().unwrap_or_else(|p| p.into_inner());
        if failed.remove(&leader.node).is_some() {
            info!(leader = %leader.node, ip = %leader.ip, "leader hub answers again");
        }
    }
}

/// One feed's source: leaders first for a follower, the cloud otherwise.
pub struct PoolSource {
    pool: Arc<PoolSharing>,
    cloud: Cloud,
    /// The leader the last answer came from; `None` when it came from the cloud.
    current: Mutex<Option<Leader>>,
}

impl PoolSource {
    pub fn new(pool: Arc<PoolSharing>) -> PoolSource {
        let cloud = Cloud(pool.upstream.clone());
        PoolSource {
            pool,
            cloud,
            current: Mutex::new(None),
        }
    }

    fn set_current(&self, leader: Option<Leader>) {
        *self.current.lock().unwrap_or_else(|p| p.into_inner()) = leader;
    }

    /// The first leader that answers `path`, if any.
    async fn ask_leaders(&self, view: &PoolView, path: &str) -> Option<Opened> {
        let health = &self.pool.leaders;
        for leader in health.candidates(&view.leaders) {
            match self.send(&leader, path).await {
                // 410: the leader's window does not reach back that far; the feed relists.
                Ok(resp) if resp.status().is_success() || resp.status() == StatusCode::GONE => {
                    health.answered(&leader);
                    self.count("leader", "ok");
                    debug!(leader = %leader.node, path, "pool-scope feed from a leader hub");
                    let moved = leader_ends(
                        self.pool.view(),
                        self.pool.settings.node.clone(),
                        leader.clone(),
                    );
                    let hung = self.until_hung(leader.clone());
                    let ends = Box::pin(async move {
                        tokio::select! {
                            ends = moved => ends,
                            ends = hung => ends,
                        }
                    });
                    // A watch it answered 410 is relisted, not resumed elsewhere.
                    let resumable = resp.status().is_success();
                    self.set_current(Some(leader).filter(|_| resumable));
                    return Some(Opened {
                        resp: resp.map(UpstreamBody::Http1),
                        ends,
                        wan: false,
                    });
                }
                Ok(resp) => {
                    self.count("leader", "failed");
                    health.failed(&leader, &format!("answered {}", resp.status()));
                }
                Err(e) => {
                    self.count("leader", "failed");
                    health.failed(&leader, &e.to_string());
                }
            }
        }
        None
    }

    /// Resolves once `leader` has missed [`PROBES_MISSED`] probes in a row.
    fn until_hung(&self, leader: Leader) -> BoxFuture<'static, Ends> {
        let client = leader_client(&self.pool.upstream.tls().with_identity);
        let uri = leader_uri(&leader, self.pool.settings.port, port::HEALTH_PATH);
        Box::pin(async move {
            let mut missed = 0;
            while missed < PROBES_MISSED {
                tokio::time::sleep(PROBE_EVERY).await;
                let answered = tokio::time::timeout(PROBE_TIMEOUT, probe(&client, &uri)).await;
                missed = if answered == Ok(true) { 0 } else { missed + 1 };
            }
            warn!(leader = %leader.node, ip = %leader.ip, "leader hub stopped answering its probes; watching elsewhere");
            Ends::Unhealthy
        })
    }

    /// One GET of `path` to `leader`'s port, as this node.
    async fn send(&self, leader: &Leader, path: &str) -> Result<Response<Incoming>, ProxyError> {
        let uri = leader_uri(leader, self.pool.settings.port, path);
        let req = get(&uri).ok_or_else(|| ProxyError::InvalidRequest(format!("GET {uri}")))?;
        let client = leader_client(&self.pool.upstream.tls().with_identity);
        let server = format!("leader hub {}", leader.node);
        match tokio::time::timeout(HEADER_TIMEOUT, client.request(req)).await {
            Ok(Ok(resp)) => Ok(resp),
            Ok(Err(e)) => Err(ProxyError::Unreachable {
                server,
                cause: Box::new(e),
            }),
            Err(_) => Err(ProxyError::Timeout {
                server,
                after: HEADER_TIMEOUT,
            }),
        }
    }

    fn count(&self, source: &str, outcome: &str) {
        self.pool
            .metrics
            .pool_feed_requests
            .with_label_values(&[source, outcome])
            .inc();
    }
}

impl Source for PoolSource {
    fn get<'a>(&'a self, path: &'a str) -> BoxFuture<'a, Result<Opened, ProxyError>> {
        Box::pin(async move {
            self.pool.until_known(KNOWN_WITHIN).await;
            let view = self.pool.view.borrow().clone();
            let follower = view.role(&self.pool.settings.node) == Role::Follower;
            if follower && let Some(opened) = self.ask_leaders(&view, path).await {
                return Ok(opened);
            }
            self.set_current(None);
            let sent = self.cloud.get(path).await;
            if follower {
                self.count("cloud", if sent.is_ok() { "ok" } else { "failed" });
            }
            let Opened { resp, ends, wan } = sent?;
            let node = self.pool.settings.node.clone();
            let moved = cloud_ends(self.pool.view(), node, follower);
            let ends = Box::pin(async move {
                tokio::select! {
                    ends = ends => ends,
                    ends = moved => ends,
                }
            });
            Ok(Opened { resp, ends, wan })
        })
    }

    fn failed(&self, error: &ProxyError) -> bool {
        let leader = self
            .current
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        match leader {
            Some(leader) => {
                self.pool.leaders.failed(&leader, &error.to_string());
                true
            }
            None => false,
        }
    }
}

/// Ends a watch from `leader` when it is no longer a leader or this hub no longer a follower.
fn leader_ends(
    mut view: watch::Receiver<Arc<PoolView>>,
    node: String,
    leader: Leader,
) -> BoxFuture<'static, Ends> {
    Box::pin(async move {
        let _ = view
            .wait_for(|v| v.role(&node) != Role::Follower || !v.leaders.contains(&leader))
            .await;
        debug!(leader = %leader.node, "the pool's leaders changed; watching again");
        Ends::Moved
    })
}

/// Ends a watch from the cloud when the leaders should be tried again: at once when this hub
/// becomes a follower, or after [`RETRY_LEADERS`] when it was one and no leader answered.
fn cloud_ends(
    mut view: watch::Receiver<Arc<PoolView>>,
    node: String,
    follower: bool,
) -> BoxFuture<'static, Ends> {
    Box::pin(async move {
        if follower {
            tokio::time::sleep(RETRY_LEADERS).await;
        } else {
            let _ = view.wait_for(|v| v.role(&node) == Role::Follower).await;
        }
        Ends::Moved
    })
}

/// Whether the leader answers `uri` (its `/healthz`) with success; the answer read whole, so
/// that the connection serves the next probe.
async fn probe(client: &LeaderClient, uri: &str) -> bool {
    let Some(req) = get(uri) else { return false };
    match client.request(req).await {
        Ok(resp) => resp.status().is_success() && resp.into_body().collect().await.is_ok(),
        Err(_) => false,
    }
}

fn leader_uri(leader: &Leader, port: u16, path: &str) -> String {
    format!(
        "https://{}{path}",
        std::net::SocketAddr::new(leader.ip, port)
    )
}

/// A GET of `uri` as a follower's feed sends it; `None` when `uri` is not one.
fn get(uri: &str) -> Option<Request<body::ProxyBody>> {
    Request::get(uri)
        .header(http::header::USER_AGENT, USER_AGENT)
        .header(http::header::ACCEPT, "application/json")
        .body(body::empty())
        .ok()
}

type LeaderClient = Client<hyper_rustls::HttpsConnector<HttpConnector>, body::ProxyBody>;

/// A client for one exchange with a leader (or one watch's probes): the hub's client
/// certificate, the cluster CA.
fn leader_client(tls: &rustls::ClientConfig) -> LeaderClient {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(Some(CONNECT_TIMEOUT));
    http.set_keepalive(Some(KEEPALIVE_IDLE));
    http.set_keepalive_interval(Some(KEEPALIVE_INTERVAL));
    http.set_keepalive_retries(Some(KEEPALIVE_PROBES));
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls.clone())
        .https_only()
        .enable_http1()
        .wrap_connector(http);
    Client::builder(TokioExecutor::new()).build(connector)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leader(node: &str) -> Leader {
        Leader {
            node: node.into(),
            ip: "10.0.0.1".parse().unwrap(),
        }
    }

    #[test]
    fn candidates_go_round_and_leave_out_failed_leaders() {
        let health = LeaderHealth::default();
        let leaders = [leader("a"), leader("b"), leader("c")];
        let first = |h: &LeaderHealth| h.candidates(&leaders)[0].node.clone();
        let firsts: Vec<String> = (0..3).map(|_| first(&health)).collect();
        assert_eq!(firsts, ["a", "b", "c"], "spread over the leaders");
        health.failed(&leaders[1], "test");
        let names: Vec<String> = health
            .candidates(&leaders)
            .into_iter()
            .map(|l| l.node)
            .collect();
        assert_eq!(names, ["a", "c"], "b cools down");
        health.answered(&leaders[1]);
        assert_eq!(health.candidates(&leaders).len(), 3);
        assert!(health.candidates(&[]).is_empty());
    }
}
