//! Plain-HTTP/1.1 listeners with graceful shutdown.
//!
//! Both the proxy port (kubelet speaks HTTP/1.1 to a `http://` kubeconfig server) and the admin
//! port use [`serve`]: accept until shutdown is signalled, then give open connections a grace
//! period (watches would otherwise hold the process forever) and return.

use std::convert::Infallible;
use std::future::Future;
use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use std::net::SocketAddr;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tracing::{debug, warn};

use crate::body::ProxyBody;

/// How long open connections (watches, tunnels) may run on after shutdown is signalled.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Accepts connections on `listener` and serves each with `handler` until `shutdown` turns true.
pub async fn serve<H, F>(listener: TcpListener, handler: H, shutdown: watch::Receiver<bool>)
where
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
                    connections.spawn(serve_connection(stream, peer, handler.clone(), shutdown.clone()));
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

/// One client connection: HTTP/1.1 with upgrades; finishes its in-flight request on shutdown.
async fn serve_connection<H, F>(
    stream: TcpStream,
    peer: SocketAddr,
    handler: H,
    mut shutdown: watch::Receiver<bool>,
) where
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
