//! Counts the hub's open TCP connections to each apiserver, for
//! `outpost_upstream_connections{server}` (yurthub's `node_yurthub_closable_conns_collector`).
//!
//! [`Counting`] wraps the pool's TCP connector: every connection it makes carries a guard that
//! counts it up when established and down when hyper drops it (closed by either side, idle too
//! long, or its pool replaced on a certificate rotation). A count that keeps growing is a leak;
//! one that stays above zero while a server is unhealthy shows connections still held open.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::Uri;
use hyper::rt::{Read, ReadBufCursor, Write};
use hyper_util::client::legacy::connect::{Connected, Connection, HttpConnector};
use hyper_util::rt::TokioIo;
use prometheus::{IntGauge, IntGaugeVec};
use tokio::net::TcpStream;

/// [`HttpConnector`], with every connection counted under its server's label.
#[derive(Clone)]
pub struct Counting {
    inner: HttpConnector,
    open: IntGaugeVec,
}

impl Counting {
    pub fn new(inner: HttpConnector, open: IntGaugeVec) -> Counting {
        Counting { inner, open }
    }
}

type Connecting = Pin<Box<dyn Future<Output = Result<CountedIo, BoxError>> + Send>>;
type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl tower_service::Service<Uri> for Counting {
    type Response = CountedIo;
    type Error = BoxError;
    type Future = Connecting;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(BoxError::from)
    }

    fn call(&mut self, uri: Uri) -> Connecting {
        // The same `https://host:port` as `Server::label`, so the series lines up with the others.
        let label = format!(
            "https://{}",
            uri.authority().map(|a| a.as_str()).unwrap_or_default()
        );
        let open = self.open.with_label_values(&[label.as_str()]);
        let connecting = self.inner.call(uri);
        Box::pin(async move {
            let io = connecting.await?;
            open.inc();
            Ok(CountedIo { io, open })
        })
    }
}

/// A counted connection; counted down when dropped.
pub struct CountedIo {
    io: TokioIo<TcpStream>,
    open: IntGauge,
}

impl Drop for CountedIo {
    fn drop(&mut self) {
        self.open.dec();
    }
}

impl Connection for CountedIo {
    fn connected(&self) -> Connected {
        self.io.connected()
    }
}

impl Read for CountedIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl Write for CountedIo {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }
}
