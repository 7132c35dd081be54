//! Per-connection accounting: what each accepted TCP connection carried, for tests and the
//! fleet simulation that count upstream connections, HTTP versions and WAN bytes per client.
//!
//! [`ConnectionLog::open`] registers a connection as it is accepted; [`Counted`] wraps its
//! socket and counts the bytes the TLS layer reads and writes (records, handshake included: what
//! crosses the wire); the router counts its requests and names its identity. Records outlive
//! their connections, so totals over a run are sums over [`ConnectionLog::snapshot`].

use std::collections::BTreeMap;
use std::io::IoSlice;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll, ready};
use std::time::Instant;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::state::lock;

/// The HTTP version a connection speaks, as its TLS handshake negotiated (ALPN).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum HttpVersion {
    Http1,
    Http2,
}

/// One accepted connection, as it stood when [`crate::FakeApiServer::connections`] was called.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectionRecord {
    /// In accept order, from 1; [`crate::RequestRecord::connection`] refers to it.
    pub id: u64,
    /// Whose connection it is: the user its client certificate names, or without one the user
    /// of its first request (a bearer token's, or `system:anonymous`); empty while unknown (no
    /// handshake or request yet, or a failed handshake).
    pub identity: String,
    /// `None` until the TLS handshake completes (and for ever if it failed).
    pub version: Option<HttpVersion>,
    pub opened_at: Instant,
    pub closed_at: Option<Instant>,
    /// Requests received on it.
    pub requests: u64,
    /// Bytes the fake wrote to the socket: TLS records with the handshake, heads and bodies,
    /// i.e. what the client downloaded.
    pub bytes_written: u64,
    /// Bytes the fake read from the socket.
    pub bytes_read: u64,
}

/// Totals of the connections of one identity.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IdentityTraffic {
    pub connections_accepted: u64,
    pub connections_open: u64,
    pub http1_connections: u64,
    pub http2_connections: u64,
    pub requests: u64,
    pub bytes_written: u64,
    pub bytes_read: u64,
}

impl IdentityTraffic {
    fn add(&mut self, c: &ConnectionRecord) {
        self.connections_accepted += 1;
        self.connections_open += u64::from(c.closed_at.is_none());
        self.http1_connections += u64::from(c.version == Some(HttpVersion::Http1));
        self.http2_connections += u64::from(c.version == Some(HttpVersion::Http2));
        self.requests += c.requests;
        self.bytes_written += c.bytes_written;
        self.bytes_read += c.bytes_read;
    }
}

/// [`IdentityTraffic`] per identity, from connection records.
pub fn traffic_by_identity(records: &[ConnectionRecord]) -> BTreeMap<String, IdentityTraffic> {
    let mut by_identity: BTreeMap<String, IdentityTraffic> = BTreeMap::new();
    for record in records {
        by_identity
            .entry(record.identity.clone())
            .or_default()
            .add(record);
    }
    by_identity
}

/// The live counters of one connection, shared by its socket wrapper, its TLS task and every
/// request served on it.
#[derive(Debug)]
pub struct ConnStats {
    id: u64,
    opened_at: Instant,
    identity: OnceLock<String>,
    version: OnceLock<HttpVersion>,
    closed_at: OnceLock<Instant>,
    requests: AtomicU64,
    written: AtomicU64,
    read: AtomicU64,
}

impl ConnStats {
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Names the connection's identity unless it has one already (the certificate's user wins
    /// over any request's).
    pub fn claim_identity(&self, user: &str) {
        let _ = self.identity.set(user.to_owned());
    }

    pub fn set_version(&self, version: HttpVersion) {
        let _ = self.version.set(version);
    }

    pub fn count_request(&self) {
        self.requests.fetch_add(1, Ordering::Relaxed);
    }

    fn record(&self) -> ConnectionRecord {
        ConnectionRecord {
            id: self.id,
            identity: self.identity.get().cloned().unwrap_or_default(),
            version: self.version.get().copied(),
            opened_at: self.opened_at,
            closed_at: self.closed_at.get().copied(),
            requests: self.requests.load(Ordering::Relaxed),
            bytes_written: self.written.load(Ordering::Relaxed),
            bytes_read: self.read.load(Ordering::Relaxed),
        }
    }
}

/// Every connection the fake accepted, open or closed.
#[derive(Default)]
pub struct ConnectionLog {
    next_id: AtomicU64,
    all: Mutex<Vec<Arc<ConnStats>>>,
}

impl ConnectionLog {
    /// Registers a connection accepted now; it counts as open until the guard is dropped.
    pub fn open(&self) -> OpenConnection {
        let stats = Arc::new(ConnStats {
            id: self.next_id.fetch_add(1, Ordering::Relaxed) + 1,
            opened_at: Instant::now(),
            identity: OnceLock::new(),
            version: OnceLock::new(),
            closed_at: OnceLock::new(),
            requests: AtomicU64::new(0),
            written: AtomicU64::new(0),
            read: AtomicU64::new(0),
        });
        lock(&self.all).push(stats.clone());
        OpenConnection(stats)
    }

    pub fn snapshot(&self) -> Vec<ConnectionRecord> {
        lock(&self.all).iter().map(|c| c.record()).collect()
    }

    /// Forgets closed connections (open ones stay, with their counts so far).
    pub fn clear_closed(&self) {
        lock(&self.all).retain(|c| c.closed_at.get().is_none());
    }
}

/// A registered connection; dropping it (the connection task ended or was aborted) marks the
/// connection closed.
pub struct OpenConnection(Arc<ConnStats>);

impl OpenConnection {
    pub fn stats(&self) -> &Arc<ConnStats> {
        &self.0
    }
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        let _ = self.0.closed_at.set(Instant::now());
    }
}

/// A socket whose reads and writes are counted in its connection's [`ConnStats`].
pub struct Counted<T> {
    inner: T,
    stats: Arc<ConnStats>,
}

impl<T> Counted<T> {
    pub fn new(inner: T, stats: Arc<ConnStats>) -> Self {
        Counted { inner, stats }
    }

    pub fn get_ref(&self) -> &T {
        &self.inner
    }

    fn wrote(&self, polled: Poll<std::io::Result<usize>>) -> Poll<std::io::Result<usize>> {
        if let Poll::Ready(Ok(n)) = &polled {
            self.stats.written.fetch_add(*n as u64, Ordering::Relaxed);
        }
        polled
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Counted<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        ready!(Pin::new(&mut self.inner).poll_read(cx, buf))?;
        let n = buf.filled().len() - before;
        self.stats.read.fetch_add(n as u64, Ordering::Relaxed);
        Poll::Ready(Ok(()))
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Counted<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.wrote(polled)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.wrote(polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totals_per_identity_count_open_and_closed_connections() {
        let log = ConnectionLog::default();
        let a = log.open();
        a.stats().claim_identity("system:node:a");
        a.stats().claim_identity("someone-else");
        a.stats().set_version(HttpVersion::Http2);
        a.stats().count_request();
        a.stats().count_request();
        let b = log.open();
        b.stats().claim_identity("system:node:a");
        b.stats().set_version(HttpVersion::Http1);
        drop(b);
        let _unknown = log.open();
        let records = log.snapshot();
        assert_eq!(records.iter().map(|r| r.id).collect::<Vec<_>>(), [1, 2, 3]);
        let totals = traffic_by_identity(&records);
        let a_totals = &totals["system:node:a"];
        assert_eq!(
            (
                a_totals.connections_accepted,
                a_totals.connections_open,
                a_totals.http1_connections,
                a_totals.http2_connections,
                a_totals.requests
            ),
            (2, 1, 1, 1, 2)
        );
        assert_eq!(totals[""].connections_open, 1);
        log.clear_closed();
        assert_eq!(log.snapshot().len(), 2);
        drop(a);
    }
}
