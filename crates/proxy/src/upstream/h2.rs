//! HTTP/2 to the apiservers, as client-go speaks it: every request to one server over one
//! connection, a second one only while the first is at the server's concurrent-stream limit.
//!
//! [`H2Client`] holds, per server, the connections it opened with the `h2` crate (hyper-util's
//! pooled client shares a single HTTP/2 connection per host and queues requests beyond the
//! server's limit, which would hold a watch back for ever, and tells nothing about streams).
//! `h2` is spoken directly rather than through hyper's HTTP/2 client: a request's own task
//! opens its stream and is woken by its answer, where hyper's client passes each request
//! through a channel to the connection's task and spawns one more task per request to wait
//! for its answer. Each connection's frames are followed by [`super::frames::FrameTap`], so
//! the pool knows the server's limit and the open streams (`outpost_upstream_streams{server}`).
//!
//! TLS offers ALPN `h2` and `http/1.1`; a server that picks HTTP/1.1 is remembered and its
//! requests go to the HTTP/1.1 client ([`Dispatch::Http1`]), as upgrades always do.
//!
//! A PING is sent after `--http2-read-idle-timeout-seconds` (to within a quarter of it) without
//! a frame from the server (client-go's `ReadIdleTimeout`); unanswered within
//! `--http2-ping-timeout-seconds` the connection is closed, which ends every stream on it at
//! once (watches included), and the server is suspected ([`super::ServerStates::suspect`]):
//! the prober looks at it now. A connection the server closes or resets is only logged, as a
//! lost HTTP/1.1 one is. A stream the server did not process (REFUSED_STREAM, or above a
//! GOAWAY's last stream) is sent again when its body can be (none, or a small one of known
//! length, read whole first), as Go's transport rewinds a body it can; past a few sends it
//! fails with a 503 that asks its client to send it again.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ::h2::client::SendRequest;
use bytes::Bytes;
use http::{Request, Response, Uri};
use http_body::Body as _;
use http_body_util::BodyExt as _;
use hyper_util::rt::TokioIo;
use prometheus::IntGaugeVec;
use rustls::pki_types::ServerName;
use tokio_rustls::TlsConnector;
use tracing::{debug, info, warn};

use super::Server;
use super::answer::{H2Body, UpstreamBody};
use super::frames::{FrameTap, Reservation, Tally};
use super::states::ServerStates;
use crate::body::ProxyBody;
use crate::connections::Counting;
use crate::error::ProxyError;

/// HTTP/2 settings of the upstream side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Http2Config {
    /// false: HTTP/1.1 only (`--disable-http2`, client-go's `DISABLE_HTTP2`).
    pub enabled: bool,
    /// A PING after this long without a frame from the server (client-go's 30 s
    /// `ReadIdleTimeout`); zero sends none.
    pub read_idle_timeout: Duration,
    /// How long a PING may go unanswered before the connection is closed (client-go: 15 s).
    pub ping_timeout: Duration,
}

impl Default for Http2Config {
    fn default() -> Http2Config {
        Http2Config {
            enabled: true,
            read_idle_timeout: Duration::from_secs(30),
            ping_timeout: Duration::from_secs(15),
        }
    }
}

/// Where a request goes.
pub enum Dispatch {
    /// Answered over HTTP/2 (or failed there).
    Http2(Result<Response<UpstreamBody>, ProxyError>),
    /// The server speaks only HTTP/1.1: the request, untouched, for the HTTP/1.1 client.
    Http1(Request<ProxyBody>),
}

/// The HTTP/2 connections of one identity to every server.
pub struct H2Client {
    config: Http2Config,
    tls: TlsConnector,
    tcp: Counting,
    streams: IntGaugeVec,
    states: Arc<ServerStates>,
    /// By the servers' labels (foldhash: looked up for every request, and the hub's own).
    pools: Mutex<foldhash::HashMap<String, Arc<ServerPool>>>,
}

/// The connections to one server.
#[derive(Default)]
struct ServerPool {
    conns: Mutex<Vec<Conn>>,
    /// One dial at a time: requests arriving meanwhile wait for it rather than dial their own.
    dialing: tokio::sync::Mutex<()>,
    /// ALPN chose HTTP/1.1.
    http1_only: AtomicBool,
    /// The stream limit the server last named (see [`Tally::new`]).
    advertised: Arc<AtomicU32>,
}

#[derive(Clone)]
struct Conn {
    tx: SendRequest<Bytes>,
    tally: Arc<Tally>,
    /// Set when the connection's task ends.
    closed: Arc<AtomicBool>,
}

/// What a dial gave.
enum Dialed {
    Http2(Conn),
    Http1,
}

impl H2Client {
    /// `tls` is the identity's configuration (its ALPN is set here); `tcp` the counted connector.
    pub fn new(
        config: Http2Config,
        mut tls: rustls::ClientConfig,
        tcp: Counting,
        streams: IntGaugeVec,
        states: Arc<ServerStates>,
    ) -> H2Client {
        tls.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        H2Client {
            config,
            tls: TlsConnector::from(Arc::new(tls)),
            tcp,
            streams,
            states,
            pools: Mutex::default(),
        }
    }

    fn pool(&self, server: &Server) -> Arc<ServerPool> {
        let mut pools = self.pools.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(pool) = pools.get(server.label()) {
            return pool.clone();
        }
        pools.entry(server.label().to_owned()).or_default().clone()
    }

    /// Sends `req` (its URI absolute) over HTTP/2 to `server`, or hands it back when the server
    /// speaks only HTTP/1.1. A request the server did not process is sent again when it can be,
    /// up to [`UNPROCESSED_SENDS`] sends (see [`Failed::unprocessed`] and [`with_body_copy`]);
    /// one that still was not processed fails as [`ProxyError::NotProcessed`].
    pub async fn dispatch(&self, server: &Server, req: Request<ProxyBody>) -> Dispatch {
        let pool = self.pool(server);
        // Bodiless requests (most) kept in place: no future of its own to move them through.
        let (mut req, kept) = if req.body().is_end_stream() {
            let kept = Kept::of(&req, None);
            (req, Some(kept))
        } else {
            match with_body_copy(req).await {
                Ok(copied) => copied,
                Err(e) => return Dispatch::Http2(Err(e)),
            }
        };
        let mut sends = 0;
        loop {
            if pool.http1_only.load(Ordering::Relaxed) {
                return Dispatch::Http1(req);
            }
            let (tx, reservation) = match self.checkout(server, &pool).await {
                Ok(Some(taken)) => taken,
                Ok(None) => return Dispatch::Http1(req),
                Err(e) => return Dispatch::Http2(Err(e)),
            };
            *req.version_mut() = http::Version::HTTP_2;
            sends += 1;
            let failed = match exchange(tx, req, reservation).await {
                Ok(answer) => return Dispatch::Http2(Ok(answer)),
                Err(failed) if failed.unprocessed => failed,
                Err(failed) => {
                    return Dispatch::Http2(Err(classify_h2_error(server, failed.error)));
                }
            };
            match &kept {
                Some(kept) if sends < UNPROCESSED_SENDS => {
                    info!(
                        server = %server.label(),
                        sends,
                        "the apiserver did not process a request ({}); sending it again",
                        failed.why()
                    );
                    req = kept.copy();
                }
                _ => {
                    return Dispatch::Http2(Err(ProxyError::NotProcessed {
                        server: server.label().to_owned(),
                        why: failed.why(),
                        sends,
                    }));
                }
            }
        }
    }

    /// A connection with room for one more stream, dialled if none has; `None` when the
    /// server answered the dial with HTTP/1.1.
    async fn checkout(
        &self,
        server: &Server,
        pool: &ServerPool,
    ) -> Result<Option<(SendRequest<Bytes>, Reservation)>, ProxyError> {
        if let Some(taken) = pool.reserve() {
            return Ok(Some(taken));
        }
        let _dialing = pool.dialing.lock().await;
        if let Some(taken) = pool.reserve() {
            return Ok(Some(taken));
        }
        // Boxed: the handshake's state is kilobytes, and every request's future would carry it
        // inline (and copy it at each await above) for a step taken once per connection.
        match Box::pin(self.dial(server, pool)).await? {
            Dialed::Http1 => {
                info!(server = %server.label(), "the apiserver offers no HTTP/2; using HTTP/1.1");
                pool.http1_only.store(true, Ordering::Relaxed);
                Ok(None)
            }
            Dialed::Http2(conn) => {
                let reservation = conn.tally.try_reserve();
                let mut conns = pool.conns.lock().unwrap_or_else(|e| e.into_inner());
                conns.push(conn.clone());
                debug!(server = %server.label(), connections = conns.len(), "HTTP/2 connection opened");
                // A fresh connection has room unless the server allows no stream at all.
                Ok(reservation.map(|r| (conn.tx, r)))
            }
        }
    }

    /// TCP, TLS with ALPN, and for `h2` the HTTP/2 handshake, its connection task spawned.
    async fn dial(&self, server: &Server, pool: &ServerPool) -> Result<Dialed, ProxyError> {
        let unreachable =
            |cause: Box<dyn std::error::Error + Send + Sync>| ProxyError::Unreachable {
                server: server.label().to_owned(),
                cause,
            };
        let uri = server
            .uri_for("/")
            .map_err(|e| ProxyError::InvalidRequest(format!("cannot build upstream URI: {e}")))?;
        let name = server_name(&uri).map_err(|e| unreachable(e.into()))?;
        let tcp = connect_tcp(self.tcp.clone(), uri)
            .await
            .map_err(unreachable)?;
        let tls = self
            .tls
            .connect(name, TokioIo::new(tcp))
            .await
            .map_err(|e| unreachable(e.into()))?;
        if tls.get_ref().1.alpn_protocol() != Some(b"h2") {
            return Ok(Dialed::Http1);
        }
        let label = server.label();
        let tally = Tally::new(
            self.streams.with_label_values(&[label]),
            pool.advertised.clone(),
        );
        let io = FrameTap::new(tls, tally.clone());
        let (tx, mut connection) = handshake_builder()
            .handshake::<_, Bytes>(io)
            .await
            .map_err(|e| unreachable(e.into()))?;
        let keepalive = connection
            .ping_pong()
            .filter(|_| !self.config.read_idle_timeout.is_zero())
            .map(|pings| keep_alive(pings, self.config, tally.clone()));
        let closed = Arc::new(AtomicBool::new(false));
        let ended = closed.clone();
        let states = self.states.clone();
        let server = server.clone();
        tokio::spawn(async move {
            let outcome = drive(connection, keepalive).await;
            ended.store(true, Ordering::Relaxed);
            match outcome {
                Ok(()) => {}
                Err(ConnectionEnd::PingUnanswered) => {
                    warn!(server = %server.label(), "HTTP/2 PING unanswered; the connection is closed, its requests and watches end");
                    // A PING unanswered says the link may be dead: the prober looks now.
                    states.suspect(&server, "HTTP/2 PING unanswered");
                }
                // A connection the server closed or reset says no more than a lost HTTP/1.1
                // one did.
                Err(ConnectionEnd::Failed(e)) => {
                    warn!(server = %server.label(), error = %e, "HTTP/2 connection failed; its requests and watches end");
                }
            }
        });
        Ok(Dialed::Http2(Conn { tx, tally, closed }))
    }

    /// Open HTTP/2 connections to `server` and the streams open on each (for tests and
    /// the admin server's state dump).
    pub fn connections(&self, server: &Server) -> Vec<(usize, u32)> {
        let pool = self.pool(server);
        let mut conns = pool.conns.lock().unwrap_or_else(|e| e.into_inner());
        conns.retain(Conn::usable);
        conns
            .iter()
            .map(|c| (c.tally.open_streams(), c.tally.max_streams()))
            .collect()
    }
}

impl ServerPool {
    /// A stream on the first usable connection with room; closed connections are dropped.
    fn reserve(&self) -> Option<(SendRequest<Bytes>, Reservation)> {
        let mut conns = self.conns.lock().unwrap_or_else(|e| e.into_inner());
        conns.retain(Conn::usable);
        conns
            .iter()
            .find_map(|c| c.tally.try_reserve().map(|r| (c.tx.clone(), r)))
    }
}

impl Conn {
    fn usable(&self) -> bool {
        !self.closed.load(Ordering::Relaxed) && !self.tally.going_away()
    }
}

/// hyper's HTTP/2 client settings, which the hub had before it spoke `h2` directly: windows
/// of 2 MiB per stream and 5 MiB per connection (a 1 MB LIST is not held up by window
/// updates), 16 KiB frames and header lists, no server push.
fn handshake_builder() -> ::h2::client::Builder {
    let mut builder = ::h2::client::Builder::new();
    builder
        .initial_max_send_streams(super::frames::INITIAL_MAX_STREAMS as usize)
        .initial_window_size(2 * 1024 * 1024)
        .initial_connection_window_size(5 * 1024 * 1024)
        .max_frame_size(16 * 1024)
        .max_header_list_size(16 * 1024)
        .max_send_buffer_size(1024 * 1024)
        .max_local_error_reset_streams(Some(1024))
        .enable_push(false);
    builder
}

/// One request on a connection: its stream opened, its body sent, its answer's head awaited.
/// A request whose task is dropped resets its stream.
async fn exchange(
    tx: SendRequest<Bytes>,
    req: Request<ProxyBody>,
    reservation: Reservation,
) -> Result<Response<UpstreamBody>, Failed> {
    let (parts, body) = req.into_parts();
    let mut head = Request::from_parts(parts, ());
    let end_of_stream = body.is_end_stream();
    if !end_of_stream
        && let Some(len) = body.size_hint().exact()
        && !head.headers().contains_key(http::header::CONTENT_LENGTH)
    {
        head.headers_mut()
            .insert(http::header::CONTENT_LENGTH, len.into());
    }
    // A connection going away opens no stream: the request never left.
    let unsent = |error: ::h2::Error| Failed {
        unprocessed: error.is_go_away(),
        error,
    };
    let mut tx = tx.ready().await.map_err(unsent)?;
    let (answer, stream) = tx.send_request(head, end_of_stream).map_err(unsent)?;
    let id = u32::from(answer.stream_id());
    if !end_of_stream {
        tokio::spawn(send_body(body, stream));
    }
    let answer = answer.await.map_err(|error| Failed {
        unprocessed: refused(&error) || (error.is_go_away() && reservation.never_processed(id)),
        error,
    });
    // Held until the answer's head: by then the stream's HEADERS are on the wire and the
    // tally counts the stream as open (until then the stream is only queued in `h2`, and
    // a request that found room meanwhile would wait behind the server's limit).
    drop(reservation);
    let (parts, recv) = answer?.into_parts();
    let body = UpstreamBody::Http2(H2Body::new(recv, &parts.headers));
    Ok(Response::from_parts(parts, body))
}

/// Sends a request's body on its stream as the server's window allows; a body that fails
/// resets the stream (the answer then fails, and the pipeline says why).
async fn send_body(mut body: ProxyBody, mut stream: ::h2::SendStream<Bytes>) {
    loop {
        let frame = match body.frame().await {
            None => {
                let _ = stream.send_data(Bytes::new(), true);
                return;
            }
            Some(Ok(frame)) => frame,
            Some(Err(e)) => {
                debug!(error = %e, "request body failed; resetting its HTTP/2 stream");
                stream.send_reset(::h2::Reason::CANCEL);
                return;
            }
        };
        match frame.into_data() {
            Ok(data) => {
                let last = body.is_end_stream();
                if send_data(&mut stream, data, last).await.is_err() || last {
                    return;
                }
            }
            Err(frame) => {
                if let Ok(trailers) = frame.into_trailers() {
                    let _ = stream.send_trailers(trailers);
                    return;
                }
            }
        }
    }
}

/// One chunk of a body, in as many frames as the window grants; `last` ends the stream with it.
async fn send_data(
    stream: &mut ::h2::SendStream<Bytes>,
    mut data: Bytes,
    last: bool,
) -> Result<(), ::h2::Error> {
    if data.is_empty() {
        return stream.send_data(data, last);
    }
    while !data.is_empty() {
        stream.reserve_capacity(data.len());
        let granted = match std::future::poll_fn(|cx| stream.poll_capacity(cx)).await {
            Some(granted) => granted?,
            None => return Err(::h2::Error::from(::h2::Reason::CANCEL)),
        };
        let chunk = data.split_to(granted.min(data.len()));
        stream.send_data(chunk, last && data.is_empty())?;
    }
    Ok(())
}

/// Why a connection's task ended.
enum ConnectionEnd {
    PingUnanswered,
    Failed(::h2::Error),
}

type Connection = ::h2::client::Connection<
    FrameTap<tokio_rustls::client::TlsStream<TokioIo<crate::connections::CountedIo>>>,
    Bytes,
>;

/// Runs a connection until it ends, or until a PING goes unanswered (the connection is then
/// dropped, which ends every stream on it).
async fn drive(
    connection: Connection,
    keepalive: Option<impl std::future::Future<Output = ()>>,
) -> Result<(), ConnectionEnd> {
    let keepalive = async move {
        match keepalive {
            Some(unanswered) => unanswered.await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        ended = connection => ended.map_err(ConnectionEnd::Failed),
        () = keepalive => Err(ConnectionEnd::PingUnanswered),
    }
}

/// Resolves when a PING, sent after a read-idle period without a frame from the server, is not
/// answered within the ping timeout; never while the server is heard from. The reads are looked
/// at every quarter of the period, so the PING leaves at most a quarter period late (a clock
/// read per quarter period rather than one per read from the socket).
async fn keep_alive(mut pings: ::h2::PingPong, config: Http2Config, tally: Arc<Tally>) {
    let idle = config.read_idle_timeout;
    let mut heard = tally.reads();
    let mut quiet_since = tokio::time::Instant::now();
    loop {
        tokio::time::sleep(idle / 4).await;
        let reads = tally.reads();
        if reads != heard {
            heard = reads;
            quiet_since = tokio::time::Instant::now();
            continue;
        }
        if quiet_since.elapsed() < idle {
            continue;
        }
        match tokio::time::timeout(config.ping_timeout, pings.ping(::h2::Ping::opaque())).await {
            Ok(Ok(_pong)) => {
                heard = tally.reads();
                quiet_since = tokio::time::Instant::now();
            }
            // The connection itself failed: its own end says why.
            Ok(Err(_)) => return std::future::pending().await,
            Err(_unanswered) => return,
        }
    }
}

async fn connect_tcp(
    mut tcp: Counting,
    uri: Uri,
) -> Result<crate::connections::CountedIo, Box<dyn std::error::Error + Send + Sync>> {
    use tower_service::Service;
    std::future::poll_fn(|cx| tcp.poll_ready(cx)).await?;
    tcp.call(uri).await
}

/// The name the server's certificate must carry: its IP address or DNS name.
fn server_name(uri: &Uri) -> Result<ServerName<'static>, rustls::pki_types::InvalidDnsNameError> {
    let host = uri.host().unwrap_or_default();
    let host = host.trim_start_matches('[').trim_end_matches(']');
    ServerName::try_from(host.to_owned())
}

/// Whether the server reset the request's stream with REFUSED_STREAM: it did not process the
/// request (RFC 9113 §8.7), which may go again. Chiefly a burst on a new connection that left
/// before the server's SETTINGS named its stream limit; by the time the reset is read, the
/// connection's [`Tally`] has that limit, so the second send finds room or dials.
fn refused(err: &::h2::Error) -> bool {
    err.reason() == Some(::h2::Reason::REFUSED_STREAM)
}

/// An exchange that failed before its answer's head.
struct Failed {
    error: ::h2::Error,
    /// The server is known not to have processed the request, which may then go again as it
    /// was: it refused the stream (REFUSED_STREAM), the stream was above the last one a GOAWAY
    /// named (RFC 9113 §6.8: kube-apiserver's `--goaway-chance` and its shutdown send one, and
    /// Go's server ignores the streams that cross it), or it never opened.
    unprocessed: bool,
}

impl Failed {
    /// Why the server did not process the request, for its log line and its Status.
    fn why(&self) -> &'static str {
        if refused(&self.error) {
            "it refused the stream"
        } else {
            "it went away before the stream"
        }
    }
}

/// How many times a request the server did not process is sent in all: Go's transport sends
/// one that crossed a GOAWAY again at once, and then again with a backoff; the hub sends it
/// again at once on a fresh connection, and past this answers 503 with `Retry-After`, which
/// client-go follows with its own backoff.
const UNPROCESSED_SENDS: u32 = 3;

/// The largest request body kept for a second send. kubelet's writes (its Lease, events, pod
/// and node status, TokenRequests, CSRs) are far smaller; a larger or unsized body streams
/// through as it arrives and is not sent again.
const RESENDABLE_BODY: u64 = 64 * 1024;

/// `req`, which has a body, and what to send again if the server does not process it: when
/// the body's length is known and within [`RESENDABLE_BODY`], it is read whole first (as
/// client-go's are: Go's transport rewinds them with `GetBody`). A body the client fails to
/// send fails the request, which the pipeline puts down to the client.
async fn with_body_copy(
    req: Request<ProxyBody>,
) -> Result<(Request<ProxyBody>, Option<Kept>), ProxyError> {
    if req
        .body()
        .size_hint()
        .exact()
        .is_none_or(|len| len > RESENDABLE_BODY)
    {
        return Ok((req, None));
    }
    let (parts, body) = req.into_parts();
    let bytes = body
        .collect()
        .await
        .map_err(|e| ProxyError::ClientBody(crate::error::error_chain(e.as_ref())))?
        .to_bytes();
    let req = Request::from_parts(parts, crate::body::full(bytes.clone()));
    let kept = Kept::of(&req, Some(bytes));
    Ok((req, Some(kept)))
}

/// A request as it can be sent again: its head and its whole body, if it has one (extensions
/// are not carried: nothing below the pipeline reads them).
#[derive(Debug)]
struct Kept {
    head: Request<()>,
    body: Option<Bytes>,
}

impl Kept {
    fn of(req: &Request<ProxyBody>, body: Option<Bytes>) -> Kept {
        Kept {
            head: with_head_of(req, ()),
            body,
        }
    }

    /// One more copy of the request to send.
    fn copy(&self) -> Request<ProxyBody> {
        let body = match &self.body {
            Some(bytes) => crate::body::full(bytes.clone()),
            None => crate::body::empty(),
        };
        with_head_of(&self.head, body)
    }
}

/// A request with `req`'s method, URI and headers, and `body`.
fn with_head_of<A, B>(req: &Request<A>, body: B) -> Request<B> {
    let mut copy = Request::new(body);
    *copy.method_mut() = req.method().clone();
    *copy.uri_mut() = req.uri().clone();
    *copy.headers_mut() = req.headers().clone();
    copy
}

/// A failed HTTP/2 exchange: a request HTTP/2 cannot carry is the request's fault; anything
/// else (the connection closed or reset, the stream refused or reset, GOAWAY, a protocol
/// error in the answer) lost the connection under the request.
fn classify_h2_error(server: &Server, err: ::h2::Error) -> ProxyError {
    // A user error (h2 names no reason and no I/O failure): the request broke HTTP/2's rules.
    if err.reason().is_none() && !err.is_io() {
        return ProxyError::InvalidRequest(format!("the request cannot go over HTTP/2: {err}"));
    }
    ProxyError::ConnectionLost {
        server: server.label().to_owned(),
        cause: Box::new(err),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::body::BoxError;
    use http_body_util::StreamBody;

    fn post(body: ProxyBody) -> Request<ProxyBody> {
        Request::post("https://apiserver/api/v1/namespaces/default/events")
            .header("content-type", "application/vnd.kubernetes.protobuf")
            .body(body)
            .unwrap()
    }

    async fn bytes_of(req: Request<ProxyBody>) -> Bytes {
        req.into_body().collect().await.unwrap().to_bytes()
    }

    #[tokio::test]
    async fn a_small_body_of_known_length_can_be_sent_twice() {
        let (req, copy) = with_body_copy(post(crate::body::full("k8s\0event")))
            .await
            .unwrap();
        let copy = copy.expect("a copy").copy();
        assert_eq!(copy.method(), req.method());
        assert_eq!(copy.uri(), req.uri());
        assert_eq!(copy.headers(), req.headers());
        assert_eq!(bytes_of(req).await, "k8s\0event");
        assert_eq!(bytes_of(copy).await, "k8s\0event");
    }

    #[tokio::test]
    async fn a_large_or_unsized_body_streams_once() {
        let large = vec![b'x'; RESENDABLE_BODY as usize + 1];
        let (req, copy) = with_body_copy(post(crate::body::full(large.clone())))
            .await
            .unwrap();
        assert!(copy.is_none());
        assert_eq!(bytes_of(req).await, large);

        let chunks = futures_util::stream::iter([Ok::<_, BoxError>(http_body::Frame::data(
            Bytes::from_static(b"chunk"),
        ))]);
        let (req, copy) = with_body_copy(post(StreamBody::new(chunks).boxed()))
            .await
            .unwrap();
        assert!(copy.is_none(), "a body of unknown length is not read ahead");
        assert_eq!(bytes_of(req).await, "chunk");
    }

    #[tokio::test]
    async fn a_body_the_client_fails_to_send_fails_the_request() {
        let failing = crate::body::full("part")
            .with_trailers(async { Some(Err::<http::HeaderMap, BoxError>("cut short".into())) })
            .boxed();
        let err = with_body_copy(post(failing)).await.expect_err("fails");
        assert!(
            matches!(err, ProxyError::ClientBody(ref m) if m.contains("cut short")),
            "{err}"
        );
    }
}
