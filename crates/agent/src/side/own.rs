//! What the hub's own reads from the cloud share: how they are sent and how a failure is worded
//! ([`OwnGets`]), and whether what they keep has been read yet ([`SyncState`], for readiness).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request};
use http_body_util::BodyExt;
use outpost_core::RequestInfo;
use outpost_core::wire::LineFramer;
use outpost_proxy::error::{BoxError, ProxyError};
use outpost_proxy::upstream::{Identity, Server, Upstream, UpstreamBody};
use outpost_proxy::{body, encoding};
use tokio::sync::watch;

/// How long one of the hub's own watches lasts before it is opened again.
pub const WATCH_TIMEOUT_SECONDS: u64 = 300;
/// The longest wait before a failed read is tried again.
pub const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// The first wait after a failure.
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
/// When the cloud returns, the hub's own reads start within this long, at a random point: a
/// fleet of hubs that saw the same outage end does not list all at once.
pub const RETURN_SPREAD: Duration = Duration::from_secs(10);

/// Waits between the hub's own reads after failures: exponential from 1 s to [`MAX_BACKOFF`],
/// each wait a random point in the upper half of its step (hubs that failed together retry
/// apart), and never shorter than a 429's `Retry-After`.
#[derive(Debug)]
pub struct Backoff {
    step: Duration,
}

impl Default for Backoff {
    fn default() -> Backoff {
        Backoff {
            step: FIRST_BACKOFF,
        }
    }
}

impl Backoff {
    /// A read succeeded: the next failure waits the first step again.
    pub fn reset(&mut self) {
        self.step = FIRST_BACKOFF;
    }

    /// The wait after a failure; `retry_after` is what the apiserver asked for, if it did.
    pub fn failed(&mut self, retry_after: Option<Duration>) -> Duration {
        let wait = self.step / 2 + jitter(self.step / 2);
        self.step = (self.step * 2).min(MAX_BACKOFF);
        match retry_after {
            Some(asked) => asked + jitter(FIRST_BACKOFF),
            None => wait,
        }
    }
}

/// The pace of one of the hub's own reads, round after round until the hub stops: the next
/// round about a second after one that ended well; after a failure, once its [`Backoff`] is
/// waited out (a refusal's `Retry-After` included), or sooner when the cloud returns after an
/// outage, at a random point of [`RETURN_SPREAD`] (a fleet of hubs that saw the same outage
/// end does not read all at once).
pub struct Rounds {
    /// Whether the hub is online (its servers' health).
    online: watch::Receiver<bool>,
    shutdown: watch::Receiver<bool>,
    backoff: Backoff,
}

impl Rounds {
    pub fn new(online: watch::Receiver<bool>, shutdown: watch::Receiver<bool>) -> Rounds {
        Rounds {
            online,
            shutdown,
            backoff: Backoff::default(),
        }
    }

    /// `round`, unless the hub stops first (`None`).
    pub async fn run<T>(&mut self, round: impl Future<Output = T>) -> Option<T> {
        tokio::select! {
            ended = round => Some(ended),
            _ = self.shutdown.changed() => None,
        }
    }

    /// Waits for the next round after one that `ended` (a failure with what its refusal's
    /// `Retry-After` asked for, if any); false when the hub stops meanwhile.
    pub async fn wait_after(&mut self, ended: Result<(), Option<Duration>>) -> bool {
        let wait = match ended {
            Ok(()) => {
                self.backoff.reset();
                jitter(Duration::from_secs(1))
            }
            Err(refused) => self.backoff.failed(refused),
        };
        let offline = !*self.online.borrow_and_update();
        let returned = tokio::select! {
            _ = tokio::time::sleep(wait) => false,
            _ = self.online.wait_for(|up| *up), if offline => true,
            _ = self.shutdown.changed() => return false,
        };
        if returned {
            tokio::select! {
                _ = tokio::time::sleep(jitter(RETURN_SPREAD)) => {}
                _ = self.shutdown.changed() => return false,
            }
        }
        true
    }
}

/// A random duration in `[0, up_to)`.
pub fn jitter(up_to: Duration) -> Duration {
    use std::hash::{BuildHasher, Hasher};
    let nanos = u64::try_from(up_to.as_nanos()).unwrap_or(u64::MAX);
    if nanos == 0 {
        return Duration::ZERO;
    }
    // Every RandomState is seeded from the OS's randomness; one hash is one random number.
    let random = std::hash::RandomState::new().build_hasher().finish();
    Duration::from_nanos(random % nanos)
}

/// How long one of the hub's own lists may stand in for another reflector's list of the same
/// collection: longer than [`RETURN_SPREAD`], so that reflectors relisting after an outage share one.
pub const LIST_SHARED_FOR: Duration = Duration::from_secs(15);

/// The answer to one of the hub's own lists.
#[derive(Debug, Clone)]
pub enum Listed {
    /// The list, decoded.
    Items(Bytes),
    /// 404: the resource is not served (no such CRD).
    NotServed,
}

/// Lists of the same collection (path and selector) by several of the hub's reflectors (the
/// filters' Services and the shared cache's, say) share one upstream LIST: one in flight is
/// waited for, and one started within [`LIST_SHARED_FOR`] is reused, provided it started after
/// the reflector's own reason to list (the failure or the 410 that ended its watch; a new
/// reflector takes any): such a list is at least as new as anything the reflector saw, and the reflector
/// then watches from its resourceVersion, which brings every later change, as an informer's
/// list does.
#[derive(Default)]
pub struct SharedLists {
    recent: std::sync::Mutex<std::collections::HashMap<String, SharedList>>,
}

struct SharedList {
    started: std::time::Instant,
    answer: Arc<tokio::sync::OnceCell<Listed>>,
}

impl SharedLists {
    /// The list of `path`: shared when one started at or after `since` and within
    /// [`LIST_SHARED_FOR`], else `fetch`ed (and offered to the others). A failed fetch is not
    /// kept.
    pub async fn list<F, Fut>(
        &self,
        path: &str,
        since: std::time::Instant,
        fetch: F,
    ) -> Result<Listed, ProxyError>
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Result<Listed, ProxyError>>,
    {
        let answer = {
            let mut recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
            recent.retain(|_, l| l.started.elapsed() < LIST_SHARED_FOR);
            match recent.get(path) {
                Some(shared) if shared.started >= since => shared.answer.clone(),
                _ => {
                    let answer = Arc::new(tokio::sync::OnceCell::new());
                    let started = std::time::Instant::now();
                    let entry = SharedList {
                        started,
                        answer: answer.clone(),
                    };
                    recent.insert(path.to_owned(), entry);
                    answer
                }
            }
        };
        let listed = answer.get_or_try_init(fetch).await.cloned();
        if listed.is_err() {
            // Not kept: the next reader lists afresh, and its start is what counts.
            let mut recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
            if recent
                .get(path)
                .is_some_and(|l| Arc::ptr_eq(&l.answer, &answer))
            {
                recent.remove(path);
            }
        }
        listed
    }
}

/// The `Retry-After` of a 429 (or 503) answer, in seconds as kube-apiserver sends it.
pub fn retry_after(resp: &http::Response<UpstreamBody>) -> Option<Duration> {
    let status = resp.status();
    if status != http::StatusCode::TOO_MANY_REQUESTS
        && status != http::StatusCode::SERVICE_UNAVAILABLE
    {
        return None;
    }
    let seconds: u64 = resp
        .headers()
        .get(http::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Some(Duration::from_secs(seconds.min(MAX_BACKOFF.as_secs() * 10)))
}

/// Whether the configuration has been read, for readiness.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SyncState {
    /// Nothing read yet, and no error either.
    Pending,
    /// Read from the cloud or from the cached copy.
    Synced { source: String },
    /// Never read, and the last attempt failed (an RBAC 403, say).
    Failing { cause: String },
}

impl SyncState {
    /// A read failed: what was never read is now failing, with `cause`; what was read stays
    /// read.
    pub fn note_failure(state: &watch::Sender<SyncState>, cause: impl FnOnce() -> String) {
        state.send_if_modified(|state| match state {
            SyncState::Synced { .. } => false,
            _ => {
                *state = SyncState::Failing { cause: cause() };
                true
            }
        });
    }
}

/// The hub's own GETs (get, list, watch) to the cloud, as the node: who asks, and how a failure
/// is worded. Shared by the reflectors and the `yurt-hub-cfg` watch.
#[derive(Debug, Clone, Copy)]
pub struct OwnGets {
    /// For errors and logs (`side-data watch`).
    pub label: &'static str,
    pub user_agent: &'static str,
}

impl OwnGets {
    /// One GET to a healthy server, JSON asked for; long enough for a watch.
    pub async fn send(
        self,
        upstream: &Upstream,
        path: &str,
    ) -> Result<http::Response<UpstreamBody>, ProxyError> {
        let server = upstream.pick().ok_or(ProxyError::NoUpstream)?;
        self.send_to(upstream, server, path).await
    }

    /// [`Self::send`] to a given server.
    pub async fn send_to(
        self,
        upstream: &Upstream,
        server: &Server,
        path: &str,
    ) -> Result<http::Response<UpstreamBody>, ProxyError> {
        let mut req = Request::builder()
            .method(Method::GET)
            .uri(path)
            .header(http::header::USER_AGENT, self.user_agent)
            .header(http::header::ACCEPT, "application/json")
            .body(body::empty())
            .map_err(|e| ProxyError::InvalidRequest(e.to_string()))?;
        let info = RequestInfo::classify(&Method::GET, path, Some(self.user_agent))
            .map_err(|e| ProxyError::InvalidRequest(e.to_string()))?;
        encoding::ask_for_gzip(&Method::GET, info.verb, req.headers_mut());
        let deadline = Duration::from_secs(WATCH_TIMEOUT_SECONDS + 30);
        upstream.send(server, Identity::Node, req, deadline).await
    }

    /// A failed read of the cloud's answer, `cause` being why (a message, or the error itself).
    pub fn bad_reply(self, cause: impl Into<BoxError>) -> ProxyError {
        ProxyError::BadReply {
            server: self.label.into(),
            cause: cause.into(),
        }
    }

    /// The whole body of the answer to [`Self::send`] of `path`, decoded if it came compressed;
    /// its bytes counted as the cloud's (`outpost_upstream_received_bytes_total`) when `upstream`
    /// sent it (`None`: a leader hub of the pool did).
    pub async fn collect(
        self,
        upstream: Option<&Upstream>,
        path: &str,
        resp: http::Response<UpstreamBody>,
    ) -> Result<Bytes, ProxyError> {
        let resource = RequestInfo::classify(&Method::GET, path, Some(self.user_agent))
            .map(|info| outpost_proxy::metrics::resource_labels(&info).joined())
            .unwrap_or_default();
        let (parts, body) = resp.into_parts();
        let bytes = body
            .collect()
            .await
            .map(|c| c.to_bytes())
            .map_err(|e| self.bad_reply(e))?;
        if let Some(upstream) = upstream {
            encoding::received_counter(upstream.received_bytes(), &resource, &parts.headers)
                .inc_by(bytes.len() as u64);
        }
        encoding::decoded_bytes(&parts.headers, bytes).map_err(|e| self.bad_reply(e))
    }

    pub async fn next_line(
        self,
        body: &mut UpstreamBody,
        framer: &mut LineFramer,
    ) -> Result<Option<Bytes>, ProxyError> {
        body::next_line(body, framer)
            .await
            .map_err(|e| self.bad_reply(e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// After failures while the cloud was away, the next round starts when it returns, within
    /// the return spread, not when the grown backoff would have ended.
    #[tokio::test(start_paused = true)]
    async fn after_an_outage_the_next_round_comes_with_the_cloud() {
        let (online_tx, online) = watch::channel(false);
        let (_stop, shutdown) = watch::channel(false);
        let mut rounds = Rounds::new(online, shutdown);
        for _ in 0..8 {
            rounds.backoff.failed(None);
        }
        let started = tokio::time::Instant::now();
        let next = tokio::spawn(async move { rounds.wait_after(Err(None)).await });
        tokio::time::sleep(Duration::from_secs(2)).await;
        online_tx.send(true).unwrap();
        assert!(next.await.unwrap(), "a next round");
        let waited = started.elapsed();
        assert!(
            waited <= Duration::from_secs(2) + RETURN_SPREAD && MAX_BACKOFF / 2 > waited,
            "{waited:?}: the backoff alone waits {:?} or more",
            MAX_BACKOFF / 2
        );
    }

    /// Online, a failure's wait is its backoff or its refusal's `Retry-After`; a stop ends the
    /// rounds at once.
    #[tokio::test(start_paused = true)]
    async fn online_a_refusal_is_waited_out_and_a_stop_ends_the_rounds() {
        let (_online_tx, online) = watch::channel(true);
        let (stop, shutdown) = watch::channel(false);
        let mut rounds = Rounds::new(online, shutdown);
        let started = tokio::time::Instant::now();
        assert!(rounds.wait_after(Err(Some(Duration::from_secs(7)))).await);
        assert!(started.elapsed() >= Duration::from_secs(7));
        let next = tokio::spawn(async move { rounds.wait_after(Err(None)).await });
        stop.send(true).unwrap();
        assert!(!next.await.unwrap(), "no next round after a stop");
    }

    #[test]
    fn backoff_doubles_with_jitter_up_to_the_cap_and_retry_after_wins() {
        let mut b = Backoff::default();
        let waits: Vec<Duration> = (0..8).map(|_| b.failed(None)).collect();
        let mut step = FIRST_BACKOFF;
        for wait in &waits {
            assert!(
                *wait >= step / 2 && *wait < step,
                "{wait:?} in the upper half of {step:?}"
            );
            step = (step * 2).min(MAX_BACKOFF);
        }
        let asked = b.failed(Some(Duration::from_secs(7)));
        assert!(asked >= Duration::from_secs(7) && asked < Duration::from_secs(8));
        b.reset();
        assert!(b.failed(None) < FIRST_BACKOFF);
        let spread: std::collections::BTreeSet<_> =
            (0..20).map(|_| jitter(RETURN_SPREAD)).collect();
        assert!(spread.len() > 10, "jitter is random: {spread:?}");
        assert!(spread.iter().all(|d| *d < RETURN_SPREAD));
    }

    #[tokio::test]
    async fn a_list_of_the_same_collection_started_since_is_shared() {
        let lists = SharedLists::default();
        let fetches = std::sync::atomic::AtomicUsize::new(0);
        let fetch = || async {
            fetches.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Ok(Listed::Items(Bytes::from_static(b"{}")))
        };
        let start = std::time::Instant::now();
        let (a, b) = tokio::join!(
            lists.list("/api/v1/services", start, fetch),
            lists.list("/api/v1/services", start, fetch)
        );
        assert!(matches!(
            (a, b),
            (Ok(Listed::Items(_)), Ok(Listed::Items(_)))
        ));
        assert_eq!(fetches.load(std::sync::atomic::Ordering::Relaxed), 1);
        let later = std::time::Instant::now();
        let other_selector = "/api/v1/services?labelSelector=a";
        lists.list(other_selector, start, fetch).await.unwrap();
        lists.list("/api/v1/services", later, fetch).await.unwrap();
        assert_eq!(
            fetches.load(std::sync::atomic::Ordering::Relaxed),
            3,
            "a list older than the reason to list is not shared"
        );
        let failed = lists
            .list("/api/v1/nodes", start, || async {
                Err(ProxyError::NoUpstream)
            })
            .await;
        assert!(failed.is_err());
        lists.list("/api/v1/nodes", start, fetch).await.unwrap();
        assert_eq!(
            fetches.load(std::sync::atomic::Ordering::Relaxed),
            4,
            "a failure is not shared"
        );
    }
}
