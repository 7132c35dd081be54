//! What a listening port allows its clients: how many connections it keeps open, how long a
//! request's head may take, how long a keep-alive connection may sit idle.
//!
//! Start at [`Slots`]: the accept loop ([`super::server`]) asks it for a slot per accepted
//! connection. Below the cap every connection gets one. At the cap the port closes the
//! connection that has waited longest for a request head, preferring one that never completed
//! a request (a slowloris, a port scan) over an idle keep-alive connection of a real client,
//! and admits the newcomer; a connection serving a request (a watch, a LIST) is never closed
//! for another. Only when every connection is busy is the newcomer refused. A client cannot be
//! told apart at accept time (every local caller comes from 127.0.0.1 and names itself only
//! in its head), but kubelet opens a connection and sends its head at once, and keeps the
//! connections that carry its watches busy: so it gets through a flood of connections that
//! never send a whole head, whose only effect is to take each other's slots.
//!
//! [`Tracked`] wraps each socket: it keeps the slot while the socket lives (also after an
//! upgrade to exec / port-forward) and notes when a new request's first byte arrives;
//! [`Slot::watchdog`] closes a connection whose head is late (kube-apiserver's
//! `ReadHeaderTimeout`, 32 s, counted from accepting or from that first byte) or that sat idle
//! between requests too long (kube-apiserver's `IdleTimeout`, 90 s).
//!
//! [`ClientLimits::ports`] sizes the caps from the open-files limit: each proxied connection
//! may hold an upstream connection too, and the hub keeps a reserve for its own files and
//! pooled upstream connections, so the ports reach their caps before the process reaches
//! `EMFILE`. The admin port has a cap of its own: `/v1/healthz` answers however full the
//! proxy port is.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::task::AtomicWaker;
use prometheus::{IntCounter, IntCounterVec, IntGauge};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

/// kube-apiserver's `ReadHeaderTimeout`.
pub const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(32);
/// kube-apiserver's `IdleTimeout` (Go's `http.DefaultTransport` keeps idle connections as long).
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(90);
/// Connections the admin port keeps: probes, Prometheus, an operator's curl.
pub const ADMIN_CONNECTIONS: usize = 32;
/// A port never keeps more, whatever the open-files limit: each connection costs memory too.
pub const MAX_CONNECTIONS: usize = 16_384;

/// The hub's settings for client connections (`--client-header-timeout`,
/// `--client-idle-timeout`, `--max-connections-per-port`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientLimits {
    pub header_timeout: Duration,
    pub idle_timeout: Duration,
    /// The cap of the proxy port and of the secure port; `None`: sized from the open-files
    /// limit ([`ClientLimits::ports`]).
    pub max_per_port: Option<usize>,
}

impl Default for ClientLimits {
    fn default() -> Self {
        ClientLimits {
            header_timeout: DEFAULT_HEADER_TIMEOUT,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            max_per_port: None,
        }
    }
}

/// The limits of one port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortLimits {
    pub header_timeout: Duration,
    pub idle_timeout: Duration,
    pub max_connections: usize,
}

/// The limits of the hub's three ports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortBudget {
    pub proxy: PortLimits,
    pub secure: PortLimits,
    pub admin: PortLimits,
}

impl ClientLimits {
    /// Each port's limits for a process that may open `open_files` descriptors (its
    /// `RLIMIT_NOFILE`). A quarter of them (at least 96, at most 1,024) stays for the hub's
    /// own files and pooled upstream connections; the admin port takes
    /// [`ADMIN_CONNECTIONS`]; the rest is counted two per client connection (it may hold an
    /// upstream connection while its request is under way) and split three to one between
    /// the proxy port (kubelet and the node's agents) and the secure port (any pod).
    pub fn ports(&self, open_files: u64) -> PortBudget {
        let open_files = usize::try_from(open_files).unwrap_or(usize::MAX);
        let reserve = (open_files / 4).clamp(96, 1_024);
        let admin = ADMIN_CONNECTIONS
            .min(open_files.saturating_sub(reserve) / 4)
            .max(4);
        let pairs = open_files.saturating_sub(reserve + admin) / 2;
        let derived_proxy = (pairs * 3 / 4).clamp(16, MAX_CONNECTIONS);
        let derived_secure = (pairs / 4).clamp(4, MAX_CONNECTIONS);
        let port = |max_connections| PortLimits {
            header_timeout: self.header_timeout,
            idle_timeout: self.idle_timeout,
            max_connections,
        };
        PortBudget {
            proxy: port(self.max_per_port.unwrap_or(derived_proxy)),
            secure: port(self.max_per_port.unwrap_or(derived_secure)),
            admin: port(admin),
        }
    }
}

/// The soft `RLIMIT_NOFILE` of this process.
pub fn open_files_limit() -> u64 {
    rustix::process::getrlimit(rustix::process::Resource::Nofile)
        .current
        .unwrap_or(u64::MAX)
}

/// The metrics of one port's connections.
#[derive(Clone)]
pub struct PortMetrics {
    pub open: IntGauge,
    /// By port and reason: `header_timeout`, `idle_timeout`, `evicted`, `refused`.
    pub closed: IntCounterVec,
    pub accept_errors: IntCounter,
}

/// Why the hub closed a client connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Closed {
    HeaderTimeout,
    IdleTimeout,
    /// Its slot went to a newer connection.
    Evicted,
}

impl Closed {
    pub fn label(self) -> &'static str {
        match self {
            Closed::HeaderTimeout => "header_timeout",
            Closed::IdleTimeout => "idle_timeout",
            Closed::Evicted => "evicted",
        }
    }
}

/// The connections of one port.
pub struct Slots {
    port: &'static str,
    limits: PortLimits,
    metrics: PortMetrics,
    epoch: Instant,
    next_id: AtomicU64,
    open: Mutex<HashMap<u64, Arc<ConnState>>>,
}

impl Slots {
    pub fn new(port: &'static str, limits: PortLimits, metrics: PortMetrics) -> Arc<Slots> {
        Arc::new(Slots {
            port,
            limits,
            metrics,
            epoch: Instant::now(),
            next_id: AtomicU64::new(0),
            open: Mutex::default(),
        })
    }

    pub fn port(&self) -> &'static str {
        self.port
    }

    pub fn limits(&self) -> PortLimits {
        self.limits
    }

    /// A slot for a connection just accepted, closing the one that waited longest for a head
    /// if the port is full; `None` when every connection is serving a request.
    pub fn admit(self: &Arc<Self>) -> Option<Slot> {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        if open.len() >= self.limits.max_connections && !self.evict(&open) {
            drop(open);
            self.count_closed("refused");
            return None;
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let state = Arc::new(ConnState::new(self.now_ms()));
        open.insert(id, state.clone());
        self.metrics.open.set(open.len() as i64);
        Some(Slot {
            slots: self.clone(),
            id,
            state,
        })
    }

    /// Asks one connection waiting for a head to close: the longest waiting among those that
    /// never completed a request, else among the idle keep-alive ones. False if none is.
    pub fn evict_one(&self) -> bool {
        let open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        self.evict(&open)
    }

    fn evict(&self, open: &HashMap<u64, Arc<ConnState>>) -> bool {
        let victim = open
            .values()
            .filter(|c| !c.busy.load(Ordering::Acquire) && !c.close.load(Ordering::Acquire))
            .min_by_key(|c| {
                (
                    c.served.load(Ordering::Acquire),
                    c.since.load(Ordering::Acquire),
                )
            });
        match victim {
            Some(victim) => {
                victim.close.store(true, Ordering::Release);
                victim.evicted.wake();
                true
            }
            None => false,
        }
    }

    fn leave(&self, id: u64) {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        open.remove(&id);
        self.metrics.open.set(open.len() as i64);
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    pub fn count_accept_error(&self) {
        self.metrics.accept_errors.inc();
    }

    pub fn count_closed(&self, reason: &str) {
        self.metrics
            .closed
            .with_label_values(&[self.port, reason])
            .inc();
    }
}

/// One connection's state, shared by its socket ([`Tracked`]), its requests and the port.
struct ConnState {
    /// A request is being served: from its head to the end of its response.
    busy: AtomicBool,
    /// [`WAITING_HEAD`] or [`IDLE`], while not busy.
    phase: AtomicU8,
    /// When the current wait began, in ms since the port's epoch.
    since: AtomicU64,
    /// Whether a request was ever served on this connection.
    served: AtomicBool,
    /// The port asked this connection to close (its slot went to a newer one).
    close: AtomicBool,
    /// The watchdog, woken when `close` is set. Nothing else wakes it: it reads the state
    /// above when its timer fires ([`Requests::due`]), so that a request costs no wake-up.
    evicted: AtomicWaker,
}

/// Waiting for a request head: since the connection was accepted, or since the first byte
/// after an idle period.
const WAITING_HEAD: u8 = 0;
/// Between requests on a keep-alive connection, nothing received yet.
const IDLE: u8 = 1;

impl ConnState {
    fn new(now_ms: u64) -> ConnState {
        ConnState {
            busy: AtomicBool::new(false),
            phase: AtomicU8::new(WAITING_HEAD),
            since: AtomicU64::new(now_ms),
            served: AtomicBool::new(false),
            close: AtomicBool::new(false),
            evicted: AtomicWaker::new(),
        }
    }
}

/// A connection's place on its port, released when the socket is dropped.
pub struct Slot {
    slots: Arc<Slots>,
    id: u64,
    state: Arc<ConnState>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.slots.leave(self.id);
    }
}

impl Slot {
    /// `stream`, holding this slot for as long as the socket lives.
    pub fn track<S>(self, stream: S) -> (Tracked<S>, Requests) {
        let requests = Requests {
            state: self.state.clone(),
            slots: self.slots.clone(),
        };
        (
            Tracked {
                inner: stream,
                slot: self,
            },
            requests,
        )
    }
}

/// A socket whose reads tell its slot when a new request begins to arrive.
pub struct Tracked<S> {
    inner: S,
    slot: Slot,
}

impl<S: AsyncRead + Unpin> AsyncRead for Tracked<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            let state = &self.slot.state;
            if !state.busy.load(Ordering::Acquire) && state.phase.load(Ordering::Acquire) == IDLE {
                state
                    .since
                    .store(self.slot.slots.now_ms(), Ordering::Release);
                state.phase.store(WAITING_HEAD, Ordering::Release);
            }
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Tracked<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// The requests of one connection: marks it busy while one is served, and watches its
/// timeouts ([`Requests::watchdog`]).
#[derive(Clone)]
pub struct Requests {
    state: Arc<ConnState>,
    slots: Arc<Slots>,
}

impl Requests {
    /// A request's head arrived; the returned guard marks the end of its response (dropped
    /// with the response body, when hyper has written it or given up).
    pub fn begin(&self) -> Serving {
        self.state.busy.store(true, Ordering::Release);
        Serving {
            requests: self.clone(),
        }
    }

    /// Counts a connection the hub closes.
    pub fn closed(&self, why: Closed) {
        self.slots.count_closed(why.label());
    }

    /// Resolves when the connection should close: its head is late, it sat idle too long, or
    /// its slot went to a newer connection. Never while a request is being served.
    ///
    /// One timer per connection, never moved by a request: when it fires, [`Requests::due`]
    /// reads the connection's state and closes it or sets the timer again. It is always set no
    /// later than the earliest deadline the connection could have by then, so it never closes
    /// late; only an eviction wakes it otherwise.
    pub async fn watchdog(&self) -> Closed {
        let first = match self.due(Instant::now()) {
            Ok(at) => at,
            Err(reason) => return reason,
        };
        let mut timer = std::pin::pin!(tokio::time::sleep_until(first));
        std::future::poll_fn(|cx| {
            self.state.evicted.register(cx.waker());
            if self.state.close.load(Ordering::Acquire) {
                if !self.state.busy.load(Ordering::Acquire) {
                    return Poll::Ready(Closed::Evicted);
                }
                // A newer connection got this one's slot while it took a request: it stays.
                self.state.close.store(false, Ordering::Release);
            }
            while timer.as_mut().poll(cx).is_ready() {
                match self.due(Instant::now()) {
                    Ok(at) => timer.as_mut().reset(at),
                    Err(reason) => return Poll::Ready(reason),
                }
            }
            Poll::Pending
        })
        .await
    }

    /// At `now`: why the connection closes, or when to look again. Idle, a request's head may
    /// begin at any moment and its (shorter) header timeout counts from then, so the next look
    /// is no later than one header timeout away; while a request is served, nothing times out
    /// and the next look is as far.
    fn due(&self, now: Instant) -> Result<Instant, Closed> {
        let limits = self.slots.limits;
        let step = limits.header_timeout.max(MIN_STEP);
        if self.state.busy.load(Ordering::Acquire) {
            return Ok(now + step);
        }
        let since =
            self.slots.epoch + Duration::from_millis(self.state.since.load(Ordering::Acquire));
        let idle = self.state.phase.load(Ordering::Acquire) == IDLE;
        let (deadline, reason) = match idle {
            true => (since + limits.idle_timeout, Closed::IdleTimeout),
            false => (since + limits.header_timeout, Closed::HeaderTimeout),
        };
        match (now >= deadline, idle) {
            (true, _) => Err(reason),
            (false, true) => Ok(deadline.min(now + step)),
            (false, false) => Ok(deadline),
        }
    }
}

/// The watchdog's shortest step between looks, whatever the timeouts.
const MIN_STEP: Duration = Duration::from_millis(1);

/// A request being served; see [`Requests::begin`].
pub struct Serving {
    requests: Requests,
}

impl Drop for Serving {
    fn drop(&mut self) {
        let state = &self.requests.state;
        state
            .since
            .store(self.requests.slots.now_ms(), Ordering::Release);
        state.phase.store(IDLE, Ordering::Release);
        state.served.store(true, Ordering::Release);
        state.busy.store(false, Ordering::Release);
    }
}

/// The connection metrics of `port` (proxy, secure, admin).
pub fn port_metrics(metrics: &outpost_proxy::Metrics, port: &'static str) -> PortMetrics {
    PortMetrics {
        open: metrics.client_connections.with_label_values(&[port]),
        closed: metrics.client_connections_closed.clone(),
        accept_errors: metrics.accept_errors.with_label_values(&[port]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metrics() -> PortMetrics {
        PortMetrics {
            open: IntGauge::new("open", "test").unwrap(),
            closed: IntCounterVec::new(
                prometheus::Opts::new("closed", "test"),
                &["port", "reason"],
            )
            .unwrap(),
            accept_errors: IntCounter::new("errors", "test").unwrap(),
        }
    }

    fn slots(max_connections: usize, header: u64, idle: u64) -> Arc<Slots> {
        let limits = PortLimits {
            header_timeout: Duration::from_millis(header),
            idle_timeout: Duration::from_millis(idle),
            max_connections,
        };
        Slots::new("proxy", limits, metrics())
    }

    #[test]
    fn caps_follow_the_open_files_limit_and_keep_a_reserve() {
        let limits = ClientLimits::default();
        let small = limits.ports(1_024);
        assert_eq!(small.admin.max_connections, ADMIN_CONNECTIONS);
        let used = 2 * (small.proxy.max_connections + small.secure.max_connections)
            + small.admin.max_connections;
        assert!(used <= 1_024 - 256, "{small:?}");
        assert!(small.proxy.max_connections > 2 * small.secure.max_connections);
        let tiny = limits.ports(256);
        assert!(
            2 * (tiny.proxy.max_connections + tiny.secure.max_connections)
                + tiny.admin.max_connections
                <= 256 - 96,
            "{tiny:?}"
        );
        let huge = limits.ports(1 << 20);
        assert_eq!(huge.proxy.max_connections, MAX_CONNECTIONS);
        let set = ClientLimits {
            max_per_port: Some(500),
            ..limits
        }
        .ports(1_024);
        assert_eq!(
            (set.proxy.max_connections, set.secure.max_connections),
            (500, 500)
        );
    }

    #[tokio::test]
    async fn a_full_port_evicts_the_longest_waiting_connection_that_never_served() {
        let port = slots(2, 60_000, 60_000);
        let (_first, first_requests) = port.admit().unwrap().track(());
        tokio::time::sleep(Duration::from_millis(5)).await;
        let (_kept, kept_requests) = port.admit().unwrap().track(());
        // A served, now idle, connection goes after every one that never served.
        drop(kept_requests.begin());

        let third = port.admit().expect("a slot, by evicting one");
        assert_eq!(first_requests.watchdog().await, Closed::Evicted);
        assert!(!kept_requests.state.close.load(Ordering::Acquire));
        drop(third);
    }

    #[tokio::test]
    async fn busy_connections_are_never_evicted_and_a_full_busy_port_refuses() {
        let port = slots(1, 60_000, 60_000);
        let (_socket, requests) = port.admit().unwrap().track(());
        let serving = requests.begin();
        assert!(
            port.admit().is_none(),
            "refused: the only connection is busy"
        );
        drop(serving);
        assert!(port.admit().is_some(), "idle now: evicted for the newcomer");
    }

    #[tokio::test]
    async fn a_slot_is_released_with_its_socket() {
        let port = slots(1, 60_000, 60_000);
        let (socket, _requests) = port.admit().unwrap().track(());
        assert_eq!(port.open.lock().unwrap().len(), 1);
        drop(socket);
        assert_eq!(port.open.lock().unwrap().len(), 0);
    }

    #[tokio::test]
    async fn a_late_head_and_a_long_idle_close_the_connection_but_a_request_does_not() {
        let port = slots(4, 50, 150);
        let (_first, requests) = port.admit().unwrap().track(());
        let started = Instant::now();
        assert_eq!(requests.watchdog().await, Closed::HeaderTimeout);
        assert!(started.elapsed() >= Duration::from_millis(50));

        let (_second, requests) = port.admit().unwrap().track(());
        let serving = requests.begin();
        let busy = tokio::time::timeout(Duration::from_millis(300), requests.watchdog()).await;
        assert!(busy.is_err(), "no timeout while a request is served");
        let idle_since = Instant::now();
        drop(serving);
        assert_eq!(requests.watchdog().await, Closed::IdleTimeout);
        assert!(idle_since.elapsed() >= Duration::from_millis(150));
    }

    /// One watchdog for a connection's whole life, as the server runs it: a request longer
    /// than the header timeout keeps the connection, its end starts the idle timeout, and a
    /// head that starts while idle is timed from its first byte, not from the idle deadline.
    #[tokio::test]
    async fn a_running_watchdog_follows_requests_and_times_a_head_from_its_first_byte() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let port = slots(4, 100, 600);
        let (ours, mut theirs) = tokio::io::duplex(64);
        let (mut socket, requests) = port.admit().unwrap().track(ours);
        let watchdog = requests.watchdog();
        tokio::pin!(watchdog);

        let serving = requests.begin();
        let busy = tokio::time::timeout(Duration::from_millis(250), &mut watchdog).await;
        assert!(busy.is_err(), "no timeout while a request is served");
        drop(serving);
        let idle = tokio::time::timeout(Duration::from_millis(100), &mut watchdog).await;
        assert!(idle.is_err(), "idle for less than the idle timeout");
        theirs.write_all(b"GET /").await.unwrap();
        let mut first = [0u8; 5];
        socket.read_exact(&mut first).await.unwrap();
        let first_byte = Instant::now();
        assert_eq!(watchdog.await, Closed::HeaderTimeout);
        let waited = first_byte.elapsed();
        assert!(waited >= Duration::from_millis(100), "{waited:?}");
        assert!(
            waited < Duration::from_millis(300),
            "timed from the idle deadline: {waited:?}"
        );

        let (_other, other) = port.admit().unwrap().track(());
        let watchdog = other.watchdog();
        tokio::pin!(watchdog);
        let serving = other.begin();
        let busy = tokio::time::timeout(Duration::from_millis(250), &mut watchdog).await;
        assert!(busy.is_err(), "no timeout while a request is served");
        let idle_since = Instant::now();
        drop(serving);
        assert_eq!(watchdog.await, Closed::IdleTimeout);
        assert!(idle_since.elapsed() >= Duration::from_millis(600));
    }

    #[tokio::test]
    async fn a_waiting_watchdog_wakes_when_its_slot_is_taken() {
        let port = slots(1, 60_000, 60_000);
        let (_socket, requests) = port.admit().unwrap().track(());
        // A task of its own, polled only when woken, as in the connection's task.
        let watchdog = tokio::spawn(async move { requests.watchdog().await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!watchdog.is_finished(), "nothing to close yet");
        let _newer = port.admit().expect("a slot, by evicting the idle one");
        let closed = tokio::time::timeout(Duration::from_secs(5), watchdog).await;
        assert_eq!(closed.ok().map(Result::unwrap), Some(Closed::Evicted));
    }
}
