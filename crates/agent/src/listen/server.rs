//! HTTP/1.1 listeners, plain or TLS, with graceful shutdown.
//!
//! The proxy port (kubelet speaks HTTP/1.1 to a `http://` kubeconfig server) and the admin port
//! use [`serve`]; the secure port for in-cluster clients uses [`serve_tls`]. Both accept until
//! shutdown is signalled, then give open connections a grace period (watches would otherwise hold
//! the process forever) and return. Each port keeps its connections within its [`Slots`]
//! (a cap, header-read and idle timeouts), and failed accepts are logged once per burst. [`bind_freebind`] binds an address this host does not have
//! yet (the dummy interface's).

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;
use tracing::{debug, info, warn};

use super::slots::{Requests, Serving, Slots};
use outpost_certs::peers::PeerCertificates;
use outpost_proxy::body::ProxyBody;

/// How long open connections (watches, tunnels) may run on after shutdown is signalled.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// A client that opens a connection and never finishes the TLS handshake is dropped after this.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Accepts plain connections on `listener`, within `slots`, and serves each with `handler`
/// until `shutdown`.
pub async fn serve<H, F>(
    listener: TcpListener,
    slots: Arc<Slots>,
    handler: H,
    shutdown: watch::Receiver<bool>,
) where
    H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<ProxyBody>> + Send + 'static,
{
    accept_loop(listener, None, slots, handler, shutdown).await
}

/// Like [`serve`], with a TLS handshake on every connection first.
pub async fn serve_tls<H, F>(
    listener: TcpListener,
    slots: Arc<Slots>,
    tls: TlsAcceptor,
    handler: H,
    shutdown: watch::Receiver<bool>,
) where
    H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<ProxyBody>> + Send + 'static,
{
    accept_loop(listener, Some(tls), slots, handler, shutdown).await
}

async fn accept_loop<H, F>(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    slots: Arc<Slots>,
    handler: H,
    shutdown: watch::Receiver<bool>,
) where
    H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<ProxyBody>> + Send + 'static,
{
    let mut connections = JoinSet::new();
    let mut stop = shutdown.clone();
    let mut failures = AcceptFailures::default();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    failures.accepted(slots.port());
                    let Some(slot) = slots.admit() else {
                        refuse(stream, tls.is_none());
                        continue;
                    };
                    let _ = stream.set_nodelay(true);
                    let (stream, requests) = slot.track(stream);
                    let (handler, shutdown) = (handler.clone(), shutdown.clone());
                    match tls.clone() {
                        None => connections.spawn(serve_connection(stream, peer, requests, handler, shutdown)),
                        Some(tls) => connections.spawn(async move {
                            if let Some(stream) = handshake(&tls, stream, peer).await {
                                let handler = with_peer_certificates(&stream, handler);
                                serve_connection(stream, peer, requests, handler, shutdown).await;
                            }
                        }),
                    };
                }
                Err(e) => {
                    failures.failed(&slots, &e);
                    // Out of descriptors: closing an idle connection of this port makes room
                    // at once; otherwise back off instead of spinning.
                    let room = is_out_of_files(&e) && slots.evict_one();
                    let pause = if room { 10 } else { 100 };
                    tokio::time::sleep(Duration::from_millis(pause)).await;
                }
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            _ = stopped(&mut stop) => break,
        }
    }
    drop(listener);
    let drained = tokio::time::timeout(SHUTDOWN_GRACE, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        debug!(
            open = connections.len(),
            "grace period over; closing remaining connections"
        );
    }
    connections.shutdown().await;
}

/// The answer of a plain port that is full of connections all serving requests: a 503 Status,
/// then the connection is closed. The client's request is read (and dropped) for up to a
/// second after, so that closing does not reset the connection before the answer is read; at
/// most [`MAX_REFUSING`] refusals linger so at a time, the others are closed at once. A TLS
/// port just closes it: no handshake is spent on a refusal.
fn refuse(stream: tokio::net::TcpStream, plain: bool) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static REFUSING: AtomicUsize = AtomicUsize::new(0);
    static REFUSED: std::sync::LazyLock<Vec<u8>> = std::sync::LazyLock::new(|| {
        let status = outpost_proxy::ProxyError::NoRoom.into_status();
        let body = status.to_json();
        let mut out = format!(
            "HTTP/1.1 {} Service Unavailable\r\nContent-Type: application/json\r\n\
             Retry-After: {}\r\nConnection: close\r\nContent-Length: {}\r\n\r\n",
            status.code,
            status.retry_after_seconds.unwrap_or(1),
            body.len()
        )
        .into_bytes();
        out.extend_from_slice(&body);
        out
    });
    if !plain || REFUSING.fetch_add(1, Ordering::AcqRel) >= MAX_REFUSING {
        REFUSING.fetch_sub(1, Ordering::AcqRel);
        return;
    }
    tokio::spawn(async move {
        let mut stream = stream;
        let linger = async {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            stream.write_all(&REFUSED).await?;
            stream.shutdown().await?;
            let mut sink = [0u8; 1024];
            while stream.read(&mut sink).await? > 0 {}
            Ok::<_, std::io::Error>(())
        };
        let _ = tokio::time::timeout(Duration::from_secs(1), linger).await;
        REFUSING.fetch_sub(1, Ordering::AcqRel);
    });
}

/// Refused connections answered at once (see [`refuse`]); beyond, they are only closed.
const MAX_REFUSING: usize = 16;

fn is_out_of_files(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(code) if code == libc::EMFILE || code == libc::ENFILE)
}

/// Failed accepts (out of descriptors, mostly) logged once per burst, not once per retry: one
/// line when a burst starts, one a minute while it lasts, one with its count at the first
/// accept after [`AcceptFailures::QUIET`] without failures. Accepts that succeed between
/// failures (each made possible by closing an idle connection) do not end the burst.
#[derive(Default)]
struct AcceptFailures {
    /// When the burst began, when its last line was logged, when it last failed.
    since: Option<std::time::Instant>,
    logged: Option<std::time::Instant>,
    last: Option<std::time::Instant>,
    count: u64,
}

impl AcceptFailures {
    const REPEAT: Duration = Duration::from_secs(60);
    const QUIET: Duration = Duration::from_secs(5);

    fn failed(&mut self, slots: &Slots, error: &std::io::Error) {
        slots.count_accept_error();
        let now = std::time::Instant::now();
        if self.last.is_some_and(|at| now - at >= Self::QUIET) {
            self.end(slots.port());
        }
        self.count += 1;
        self.last = Some(now);
        let since = *self.since.get_or_insert(now);
        if self.logged.is_none_or(|at| now - at >= Self::REPEAT) {
            self.logged = Some(now);
            warn!(port = slots.port(), %error, failures = self.count, for_s = (now - since).as_secs(),
                "accept failed; backing off (one line a minute while it lasts)");
        }
    }

    fn accepted(&mut self, port: &'static str) {
        if self.last.is_some_and(|at| at.elapsed() >= Self::QUIET) {
            self.end(port);
        }
    }

    fn end(&mut self, port: &'static str) {
        if let (Some(since), Some(last)) = (self.since, self.last) {
            info!(
                port,
                failures = self.count,
                over_ms = (last - since).as_millis() as u64,
                "accepting connections again"
            );
        }
        *self = AcceptFailures::default();
    }
}

/// The server side of a TLS handshake, bounded in time; failures are the client's business
/// (or the missing certificate's) and are logged at debug level only.
async fn handshake<S>(
    tls: &TlsAcceptor,
    stream: S,
    peer: SocketAddr,
) -> Option<tokio_rustls::server::TlsStream<S>>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, tls.accept(stream)).await {
        Ok(Ok(stream)) => Some(stream),
        Ok(Err(e)) => {
            debug!(%peer, error = %e, "TLS handshake failed");
            None
        }
        Err(_) => {
            debug!(%peer, "TLS handshake timed out");
            None
        }
    }
}

/// `handler`, with the certificates the client presented in every request's extensions (the
/// leader hub's port authenticates by them; a port that asks for none finds them empty).
fn with_peer_certificates<S, H, F>(
    stream: &tokio_rustls::server::TlsStream<S>,
    handler: H,
) -> impl Fn(Request<Incoming>) -> F + Send + Sync + 'static
where
    H: Fn(Request<Incoming>) -> F + Send + Sync + 'static,
{
    let presented = stream.get_ref().1.peer_certificates().unwrap_or_default();
    let peers = PeerCertificates(Arc::new(
        presented.iter().map(|c| c.clone().into_owned()).collect(),
    ));
    move |mut req: Request<Incoming>| {
        req.extensions_mut().insert(peers.clone());
        handler(req)
    }
}

/// One client connection: HTTP/1.1 with upgrades; finishes its in-flight request on shutdown.
/// Closed when its head is late, it sits idle too long, or its slot goes to a newer
/// connection ([`Requests::watchdog`]); never in the middle of a request.
async fn serve_connection<I, H, F>(
    stream: I,
    peer: SocketAddr,
    requests: Requests,
    handler: H,
    mut shutdown: watch::Receiver<bool>,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    H: Fn(Request<Incoming>) -> F + Send + Sync + 'static,
    F: Future<Output = Response<ProxyBody>> + Send + 'static,
{
    let serving = requests.clone();
    let service = service_fn(move |req| {
        let guard = serving.begin();
        let fut = built_in_place(|| handler(req));
        async move {
            let resp = fut.await;
            Ok::<_, Infallible>(resp.map(|body| Served {
                body,
                _guard: guard,
            }))
        }
    });
    let conn = http1::Builder::new()
        .serve_connection(TokioIo::new(stream), service)
        .with_upgrades();
    tokio::pin!(conn);
    let result = tokio::select! {
        result = conn.as_mut() => result,
        closed = requests.watchdog() => {
            requests.closed(closed);
            debug!(%peer, reason = closed.label(), "client connection closed by the hub");
            return;
        }
        _ = stopped(&mut shutdown) => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    };
    if let Err(e) = result {
        debug!(%peer, error = %e, "client connection ended with an error");
    }
}

/// A request's future, built in the heap where it stays. hyper moves each service future into
/// its connection's slot, and the pipeline's is kilobytes: moved by value, it was copied whole
/// for every request; allocated first, it is written once, in place, and only its box moves.
fn built_in_place<F: Future>(make: impl FnOnce() -> F) -> Pin<Box<F>> {
    Box::into_pin(Box::write(Box::new_uninit(), make()))
}

/// A response body, and the request it answers still being served until it is dropped.
struct Served {
    body: ProxyBody,
    /// Held for its drop: the end of the response.
    _guard: Serving,
}

impl http_body::Body for Served {
    type Data = bytes::Bytes;
    type Error = outpost_proxy::body::BoxError;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, Self::Error>>> {
        std::pin::Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// Resolves once shutdown is signalled (or the sender is gone).
async fn stopped(shutdown: &mut watch::Receiver<bool>) {
    // The guard wait_for returns is not Send; drop it before the caller awaits anything else.
    let _ = shutdown.wait_for(|stop| *stop).await.map(|_| ());
}

/// Binds `addr`; when the host does not have that address (yet), binds it anyway with
/// `IP_FREEBIND`, so the listener works as soon as the address is configured (the dummy
/// interface, created by whoever manages it). Returns whether the address was present.
pub fn bind_freebind(addr: SocketAddr) -> std::io::Result<(TcpListener, bool)> {
    let std_listener = match std::net::TcpListener::bind(addr) {
        Ok(listener) => (listener, true),
        Err(e) if e.kind() == std::io::ErrorKind::AddrNotAvailable => {
            (bind_absent_address(addr)?, false)
        }
        Err(e) => return Err(e),
    };
    std_listener.0.set_nonblocking(true)?;
    Ok((TcpListener::from_std(std_listener.0)?, std_listener.1))
}

fn bind_absent_address(addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    #[cfg(target_os = "linux")]
    match addr {
        SocketAddr::V4(_) => socket.set_freebind_v4(true)?,
        SocketAddr::V6(_) => socket.set_freebind_v6(true)?,
    }
    socket.bind(&addr.into())?;
    socket.listen(1024)?;
    Ok(socket.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What hyper moves per request is a pointer, however much the request's future weighs.
    #[tokio::test]
    async fn a_request_future_is_built_in_the_heap_and_moves_as_a_pointer() {
        let weight = [7u8; 16 * 1024];
        let fut =
            built_in_place(|| async move { weight.iter().map(|b| usize::from(*b)).sum::<usize>() });
        assert_eq!(std::mem::size_of_val(&fut), std::mem::size_of::<usize>());
        assert_eq!(fut.await, 7 * 16 * 1024);
    }
}
