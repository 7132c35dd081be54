//! State shared by the accept loop, every connection and the test's handle: the store, the
//! authenticator, fault switches, the request log and the watch-cut signal.

use std::net::SocketAddr;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::authn::Authenticator;
use crate::connections::ConnectionLog;
use crate::server::FakeConfig;
use crate::store::Store;

/// One answered request, for test assertions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestRecord {
    pub method: String,
    pub path: String,
    /// The raw query string (without `?`), empty if none.
    pub query: String,
    /// The authenticated user name, or `system:anonymous`.
    pub user: String,
    pub groups: Vec<String>,
    pub user_agent: Option<String>,
    pub status: u16,
    /// The Kubernetes verb (`get`, `list`, `watch`, `create`…); the lower-cased method otherwise.
    pub verb: String,
    pub resource: String,
    pub subresource: String,
    pub namespace: String,
    pub name: String,
    /// When the request arrived (before any injected delay).
    pub at: Instant,
    /// The connection it came on ([`crate::ConnectionRecord::id`]).
    pub connection: u64,
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every critical section is a plain read or replace, so a poisoned lock is still consistent.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Switches the fault-injection API flips.
pub(crate) struct Faults {
    latency: Mutex<Duration>,
    fail: Mutex<Option<u16>>,
    /// Requests under this path prefix fail with this code (an aggregated API whose backend
    /// is down); the rest of the server works.
    fail_under: Mutex<Option<(String, u16)>>,
    /// The `Retry-After` seconds of an injected 429 or 503.
    retry_after: Mutex<u32>,
    /// The next so many requests under this path prefix lose their connection once read: no
    /// answer at all.
    hang_up_under: Mutex<Option<(String, usize)>>,
    /// Requests under this path prefix are answered this much later (a slow server for some
    /// requests only: its probes and other reads are answered at once).
    delay_under: Mutex<Option<(String, Duration)>>,
    /// Answers under this path prefix send their headers, then their body at this pace (a few
    /// bytes per tick), or with `None` nothing at all.
    slow_bodies_under: Mutex<Option<(String, Option<Duration>)>>,
    /// The next so many non-watch requests under this path prefix are answered this much late,
    /// with the answer computed on time.
    late_under: Mutex<Option<(String, Duration, usize)>>,
    /// Requests for the first path are answered as if they were for the second: a misrouting
    /// upstream (a proxy in front of the apiserver, an aggregated API) answering for another
    /// object.
    answer_as: Mutex<Vec<(String, String)>>,
    blackhole: watch::Sender<bool>,
}

impl Faults {
    fn new() -> Self {
        Faults {
            latency: Mutex::new(Duration::ZERO),
            fail: Mutex::new(None),
            fail_under: Mutex::new(None),
            retry_after: Mutex::new(1),
            hang_up_under: Mutex::new(None),
            delay_under: Mutex::new(None),
            slow_bodies_under: Mutex::new(None),
            late_under: Mutex::new(None),
            answer_as: Mutex::new(Vec::new()),
            blackhole: watch::channel(false).0,
        }
    }

    pub fn latency(&self) -> Duration {
        *lock(&self.latency)
    }

    pub fn set_latency(&self, d: Duration) {
        *lock(&self.latency) = d;
    }

    /// The code a request for `path` fails with, if any.
    pub fn fail_code(&self, path: &str) -> Option<u16> {
        lock(&self.fail).or_else(|| {
            lock(&self.fail_under)
                .as_ref()
                .filter(|(prefix, _)| path.starts_with(prefix.as_str()))
                .map(|(_, code)| *code)
        })
    }

    pub fn set_fail_under(&self, prefix_and_code: Option<(String, u16)>) {
        *lock(&self.fail_under) = prefix_and_code;
    }

    pub fn set_retry_after(&self, seconds: u32) {
        *lock(&self.retry_after) = seconds;
    }

    pub fn retry_after(&self) -> u32 {
        *lock(&self.retry_after)
    }

    /// Whether a request for `path` is to lose its connection instead of an answer (counted).
    pub fn hangs_up(&self, path: &str) -> bool {
        let mut hang_up = lock(&self.hang_up_under);
        match hang_up.as_mut() {
            Some((prefix, left)) if *left > 0 && path.starts_with(prefix.as_str()) => {
                *left -= 1;
                true
            }
            _ => false,
        }
    }

    /// How long a request for `path` waits before it is answered.
    pub fn delay(&self, path: &str) -> Duration {
        let under = lock(&self.delay_under)
            .as_ref()
            .filter(|(prefix, _)| path.starts_with(prefix.as_str()))
            .map_or(Duration::ZERO, |(_, d)| *d);
        self.latency().max(under)
    }

    pub fn set_delay_under(&self, prefix_and_delay: Option<(String, Duration)>) {
        *lock(&self.delay_under) = prefix_and_delay;
    }

    pub fn set_hang_up_under(&self, prefix_and_times: Option<(String, usize)>) {
        *lock(&self.hang_up_under) = prefix_and_times;
    }

    /// How the body of an answer to `path` is to be sent: `None` as usual, `Some(None)` never,
    /// `Some(Some(pace))` a few bytes per `pace`.
    pub fn body_pace(&self, path: &str) -> Option<Option<Duration>> {
        lock(&self.slow_bodies_under)
            .as_ref()
            .filter(|(prefix, _)| path.starts_with(prefix.as_str()))
            .map(|(_, pace)| *pace)
    }

    pub fn set_slow_bodies_under(&self, prefix_and_pace: Option<(String, Option<Duration>)>) {
        *lock(&self.slow_bodies_under) = prefix_and_pace;
    }

    /// How late the answer to a `verb` request for `path` is to be sent, if at all (counted).
    pub fn lateness(&self, path: &str, verb: &str) -> Option<Duration> {
        let mut late = lock(&self.late_under);
        match late.as_mut() {
            Some((prefix, delay, left))
                if *left > 0 && verb != "watch" && path.starts_with(prefix.as_str()) =>
            {
                *left -= 1;
                Some(*delay)
            }
            _ => None,
        }
    }

    pub fn set_late_under(&self, late: Option<(String, Duration, usize)>) {
        *lock(&self.late_under) = late;
    }

    /// The path a request for `path` is answered for.
    pub fn answered_as(&self, path: &str) -> Option<String> {
        lock(&self.answer_as)
            .iter()
            .find(|(from, _)| from == path)
            .map(|(_, to)| to.clone())
    }

    pub fn add_answer_as(&self, from: &str, to: &str) {
        lock(&self.answer_as).push((from.to_owned(), to.to_owned()));
    }

    pub fn clear_answer_as(&self) {
        lock(&self.answer_as).clear();
    }

    pub fn set_fail(&self, code: Option<u16>) {
        *lock(&self.fail) = code;
    }

    pub fn blackholed(&self) -> bool {
        *self.blackhole.borrow()
    }

    pub fn set_blackhole(&self, on: bool) {
        self.blackhole.send_replace(on);
    }

    pub fn blackhole_signal(&self) -> watch::Receiver<bool> {
        self.blackhole.subscribe()
    }

    /// Parks the caller for as long as the blackhole is on, like packets lost in a partition.
    pub async fn pass_blackhole(&self) {
        let mut rx = self.blackhole.subscribe();
        // The sender lives as long as `self`, so `wait_for` only fails if it is dropped.
        let _ = rx.wait_for(|on| !on).await;
    }
}

pub(crate) struct Shared {
    pub config: FakeConfig,
    pub store: Store,
    pub authn: Authenticator,
    pub faults: Faults,
    pub requests: Mutex<Vec<RequestRecord>>,
    pub connections: ConnectionLog,
    /// Bumped by `cut_watches`; every open watch aborts its stream when it changes.
    pub cut: watch::Sender<u64>,
    pub addr: SocketAddr,
    /// When an HTTP/2 connection goes away as Go's server does ([`crate::goaway`]).
    pub go_away: std::sync::Arc<crate::goaway::GoAway>,
}

impl Shared {
    pub fn new(config: FakeConfig, store: Store, authn: Authenticator, addr: SocketAddr) -> Self {
        Shared {
            config,
            store,
            authn,
            faults: Faults::new(),
            requests: Mutex::new(Vec::new()),
            connections: ConnectionLog::default(),
            cut: watch::channel(0).0,
            addr,
            go_away: Default::default(),
        }
    }

    pub fn record(&self, r: RequestRecord) {
        lock(&self.requests).push(r);
    }
}
