//! HTTP/1.1 listeners, plain or TLS, with graceful shutdown.
//!
//! The proxy port (kubelet speaks HTTP/1.1 to a `http://` kubeconfig server) and the admin port
//! use [`serve`]; the secure port for in-cluster clients uses [`serve_tls`]. Both accept until
//! shutdown is signalled, then give open connections a grace period (watches would otherwise hold
//! the process forever) and return. [`bind_freebind`] binds an address this host does not have
//! yet (the dummy interface's).

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
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
use tracing::{debug, warn};

use crate::body::ProxyBody;

/// How long open connections (watches, tunnels) may run on after shutdown is signalled.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// A client that opens a connection and never finishes the TLS handshake is dropped after this.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Accepts plain connections on `listener` and serves each with `handler` until `shutdown`.
pub async fn serve<H, F>(listener: TcpListener, handler: H, shutdown: watch::Receiver<bool>)
where
    H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<ProxyBody>> + Send + 'static,
{
    accept_loop(listener, None, handler, shutdown).await
}

/// Like [`serve`], with a TLS handshake on every connection first.
pub async fn serve_tls<H, F>(
    listener: TcpListener,
    tls: TlsAcceptor,
    handler: H,
    shutdown: watch::Receiver<bool>,
) where
    H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<ProxyBody>> + Send + 'static,
{
    accept_loop(listener, Some(tls), handler, shutdown).await
}

async fn accept_loop<H, F>(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    handler: H,
    shutdown: watch::Receiver<bool>,
) where
    H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<ProxyBody>> + Send + 'static,
{
    let mut connections = JoinSet::new();
    let mut stop = shutdown.clone();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    let _ = stream.set_nodelay(true);
                    let (handler, shutdown) = (handler.clone(), shutdown.clone());
                    match tls.clone() {
                        None => connections.spawn(serve_connection(stream, peer, handler, shutdown)),
                        Some(tls) => connections.spawn(async move {
                            if let Some(stream) = handshake(&tls, stream, peer).await {
                                serve_connection(stream, peer, handler, shutdown).await;
                            }
                        }),
                    };
                }
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning.
                    warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
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

/// The server side of a TLS handshake, bounded in time; failures are the client's business
/// (or the missing certificate's) and are logged at debug level only.
async fn handshake(
    tls: &TlsAcceptor,
    stream: tokio::net::TcpStream,
    peer: SocketAddr,
) -> Option<tokio_rustls::server::TlsStream<tokio::net::TcpStream>> {
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

/// One client connection: HTTP/1.1 with upgrades; finishes its in-flight request on shutdown.
async fn serve_connection<I, H, F>(
    stream: I,
    peer: SocketAddr,
    handler: H,
    mut shutdown: watch::Receiver<bool>,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    H: Fn(Request<Incoming>) -> F + Send + Sync + 'static,
    F: Future<Output = Response<ProxyBody>> + Send + 'static,
{
    let service = service_fn(move |req| {
        let fut = handler(req);
        async move { Ok::<_, Infallible>(fut.await) }
    });
    let conn = http1::Builder::new()
        .serve_connection(TokioIo::new(stream), service)
        .with_upgrades();
    tokio::pin!(conn);
    let result = tokio::select! {
        result = conn.as_mut() => result,
        _ = stopped(&mut shutdown) => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    };
    if let Err(e) = result {
        debug!(%peer, error = %e, "client connection ended with an error");
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
