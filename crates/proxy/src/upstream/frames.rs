//! Watches the HTTP/2 frames crossing one upstream connection, headers only, to know what the
//! pool must decide on before a stream exists: the server's concurrent-stream limit (its
//! SETTINGS), how many of our streams are open or about to be, whether the server said GOAWAY,
//! and whether it was heard from lately (the keepalive's PING).
//!
//! [`FrameTap`] wraps the TLS stream under the `h2` connection; every byte read or
//! written is fed to a [`FrameReader`] per direction, which follows the 9-byte frame heads
//! and skips payloads (a SETTINGS payload and a GOAWAY's last stream excepted). [`Tally`] is
//! what the pool reads.
//! A stream counts as open from the HEADERS that start it until the server ends it
//! (END_STREAM) or either side resets it: the server's view of an open stream, as far as the
//! limit goes.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use prometheus::IntGauge;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

const FRAME_DATA: u8 = 0x0;
const FRAME_HEADERS: u8 = 0x1;
const FRAME_RST_STREAM: u8 = 0x3;
const FRAME_SETTINGS: u8 = 0x4;
const FRAME_GOAWAY: u8 = 0x7;
const FLAG_END_STREAM: u8 = 0x1;
const FLAG_ACK: u8 = 0x1;
const SETTINGS_MAX_CONCURRENT_STREAMS: u16 = 0x3;
/// The client connection preface (RFC 9113 §3.4) precedes our first frame.
const CLIENT_PREFACE_LEN: usize = 24;
/// SETTINGS payloads larger than this are not kept (a server sends a few dozen bytes).
const MAX_SETTINGS_PAYLOAD: usize = 16 * 1024;
/// What is kept of a GOAWAY payload: its last stream identifier (the debug data is not read).
const GOAWAY_LAST_STREAM_LEN: usize = 4;
/// What Go's transport assumes until the server's SETTINGS arrive.
pub const INITIAL_MAX_STREAMS: u32 = 100;

/// One frame's head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHead {
    pub kind: u8,
    pub flags: u8,
    pub stream: u32,
}

/// Follows the frames of one direction of a connection, across arbitrary read boundaries.
#[derive(Debug, Default)]
pub struct FrameReader {
    preface_left: usize,
    head: [u8; 9],
    head_len: usize,
    /// Payload bytes still to skip (or keep) of the current frame.
    payload_left: usize,
    current: Option<FrameHead>,
    /// What is kept of the current payload, up to `keep_at_most` bytes (none for most frames).
    kept: Vec<u8>,
    keep_at_most: usize,
}

impl FrameReader {
    /// The reader of what the client writes: the preface first, then frames.
    pub fn client_side() -> FrameReader {
        FrameReader {
            preface_left: CLIENT_PREFACE_LEN,
            ..FrameReader::default()
        }
    }

    /// Feeds the next bytes; `on_frame` gets every complete head, with the payload of a
    /// SETTINGS frame and the first four bytes of a GOAWAY's (others get an empty one), once
    /// the payload has passed.
    pub fn feed(&mut self, mut bytes: &[u8], mut on_frame: impl FnMut(FrameHead, &[u8])) {
        let skip = self.preface_left.min(bytes.len());
        self.preface_left -= skip;
        bytes = &bytes[skip..];
        while !bytes.is_empty() {
            if self.current.is_none() {
                let take = (9 - self.head_len).min(bytes.len());
                self.head[self.head_len..self.head_len + take].copy_from_slice(&bytes[..take]);
                self.head_len += take;
                bytes = &bytes[take..];
                if self.head_len < 9 {
                    return;
                }
                self.start_frame();
            }
            let take = self.payload_left.min(bytes.len());
            let room = self.keep_at_most - self.kept.len();
            self.kept.extend_from_slice(&bytes[..take.min(room)]);
            self.payload_left -= take;
            bytes = &bytes[take..];
            if self.payload_left == 0
                && let Some(head) = self.current.take()
            {
                on_frame(head, &std::mem::take(&mut self.kept));
            }
        }
    }

    fn start_frame(&mut self) {
        let h = self.head;
        let length = u32::from_be_bytes([0, h[0], h[1], h[2]]) as usize;
        let head = FrameHead {
            kind: h[3],
            flags: h[4],
            stream: u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff,
        };
        self.head_len = 0;
        self.payload_left = length;
        self.keep_at_most = match head.kind {
            FRAME_SETTINGS if head.flags & FLAG_ACK == 0 && length <= MAX_SETTINGS_PAYLOAD => {
                length
            }
            FRAME_GOAWAY => GOAWAY_LAST_STREAM_LEN,
            _ => 0,
        };
        // No allocation for a frame of which nothing is kept.
        self.kept = Vec::with_capacity(self.keep_at_most);
        self.current = Some(head);
    }
}

/// The value of SETTINGS_MAX_CONCURRENT_STREAMS in a SETTINGS payload, if it sets one.
fn max_streams_in(settings: &[u8]) -> Option<u32> {
    settings
        .chunks_exact(6)
        .filter(|p| u16::from_be_bytes([p[0], p[1]]) == SETTINGS_MAX_CONCURRENT_STREAMS)
        .map(|p| u32::from_be_bytes([p[2], p[3], p[4], p[5]]))
        .next_back()
}

/// What one connection carries, as the pool needs it.
pub struct Tally {
    streams: Mutex<Streams>,
    max_streams: AtomicU32,
    /// The last limit the server named on any connection (0: none yet), shared by the
    /// connections to one server.
    advertised: Arc<AtomicU32>,
    going_away: AtomicBool,
    /// The lowest last stream identifier of the server's GOAWAYs (`u32::MAX` before any):
    /// the streams above it the server never processed (RFC 9113 §6.8).
    last_processed: AtomicU32,
    /// Reads that brought bytes from the server: the keepalive's sign of life.
    reads: AtomicU64,
    /// `outpost_upstream_streams{server}`.
    gauge: IntGauge,
}

#[derive(Default)]
struct Streams {
    /// Hashed by foldhash, not SipHash: identifiers the connection counts itself, looked up
    /// at every stream's opening and end.
    open: foldhash::HashSet<u32>,
    last_opened: u32,
    /// Taken by a request about to be sent, not yet seen on the wire.
    reserved: usize,
}

impl Tally {
    /// Until the connection's own SETTINGS arrive, the limit is the one the server last
    /// `advertised` on another connection, else [`INITIAL_MAX_STREAMS`]: the server's limit is
    /// its configuration, and a burst on a new connection that took more than it would be
    /// refused.
    pub fn new(gauge: IntGauge, advertised: Arc<AtomicU32>) -> Arc<Tally> {
        let initial = match advertised.load(Ordering::Relaxed) {
            0 => INITIAL_MAX_STREAMS,
            known => known,
        };
        Arc::new(Tally {
            streams: Mutex::new(Streams::default()),
            max_streams: AtomicU32::new(initial),
            advertised,
            going_away: AtomicBool::new(false),
            last_processed: AtomicU32::new(u32::MAX),
            reads: AtomicU64::new(0),
            gauge,
        })
    }

    fn streams(&self) -> std::sync::MutexGuard<'_, Streams> {
        self.streams.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes a stream for one request if the server's limit leaves room for it; the
    /// [`Reservation`] is held until the request's headers are on their way.
    pub fn try_reserve(self: &Arc<Self>) -> Option<Reservation> {
        if self.going_away.load(Ordering::Relaxed) {
            return None;
        }
        let mut streams = self.streams();
        let max = self.max_streams.load(Ordering::Relaxed) as usize;
        (streams.open.len() + streams.reserved < max).then(|| {
            streams.reserved += 1;
            Reservation(self.clone())
        })
    }

    pub fn open_streams(&self) -> usize {
        self.streams().open.len()
    }

    pub fn max_streams(&self) -> u32 {
        self.max_streams.load(Ordering::Relaxed)
    }

    pub fn going_away(&self) -> bool {
        self.going_away.load(Ordering::Relaxed)
    }

    /// Whether a GOAWAY of the server said that it never processed `stream` (its identifier
    /// is above the GOAWAY's last stream): a request on it may be sent again as it was.
    pub fn never_processed(&self, stream: u32) -> bool {
        stream > self.last_processed.load(Ordering::Relaxed)
    }

    /// How many reads brought bytes from the server so far.
    pub fn reads(&self) -> u64 {
        self.reads.load(Ordering::Relaxed)
    }

    fn sent(&self, head: FrameHead) {
        match head.kind {
            FRAME_HEADERS => {
                let mut streams = self.streams();
                if head.stream > streams.last_opened {
                    streams.last_opened = head.stream;
                    streams.open.insert(head.stream);
                    self.gauge.inc();
                }
            }
            FRAME_RST_STREAM => self.closed(head.stream),
            _ => {}
        }
    }

    fn received(&self, head: FrameHead, payload: &[u8]) {
        match head.kind {
            FRAME_DATA | FRAME_HEADERS if head.flags & FLAG_END_STREAM != 0 => {
                self.closed(head.stream)
            }
            FRAME_RST_STREAM => self.closed(head.stream),
            FRAME_SETTINGS if head.flags & FLAG_ACK == 0 => {
                if let Some(max) = max_streams_in(payload) {
                    self.max_streams.store(max, Ordering::Relaxed);
                    self.advertised.store(max, Ordering::Relaxed);
                }
            }
            FRAME_GOAWAY => {
                if let Some(last) = payload.first_chunk::<GOAWAY_LAST_STREAM_LEN>() {
                    let last = u32::from_be_bytes(*last) & 0x7fff_ffff;
                    self.last_processed.fetch_min(last, Ordering::Relaxed);
                }
                self.going_away.store(true, Ordering::Relaxed);
            }
            _ => {}
        }
    }

    fn closed(&self, stream: u32) {
        if self.streams().open.remove(&stream) {
            self.gauge.dec();
        }
    }
}

impl Drop for Tally {
    fn drop(&mut self) {
        let open = self.streams().open.len();
        self.gauge.sub(open as i64);
    }
}

/// A stream taken on a connection (see [`Tally::try_reserve`]).
pub struct Reservation(Arc<Tally>);

impl Reservation {
    /// [`Tally::never_processed`] of the connection the stream was taken on.
    pub fn never_processed(&self, stream: u32) -> bool {
        self.0.never_processed(stream)
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        let mut streams = self.0.streams();
        streams.reserved = streams.reserved.saturating_sub(1);
    }
}

/// An I/O stream whose frames feed a [`Tally`].
pub struct FrameTap<T> {
    inner: T,
    tally: Arc<Tally>,
    reads: FrameReader,
    writes: FrameReader,
}

impl<T> FrameTap<T> {
    pub fn new(inner: T, tally: Arc<Tally>) -> FrameTap<T> {
        FrameTap {
            inner,
            tally,
            reads: FrameReader::default(),
            writes: FrameReader::client_side(),
        }
    }

    fn wrote(&mut self, bytes: &[u8]) {
        let tally = &self.tally;
        self.writes.feed(bytes, |head, _| tally.sent(head));
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for FrameTap<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let this = &mut *self;
        let polled = Pin::new(&mut this.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = &polled
            && buf.filled().len() > before
        {
            let tally = &this.tally;
            tally.reads.fetch_add(1, Ordering::Relaxed);
            this.reads.feed(&buf.filled()[before..], |head, payload| {
                tally.received(head, payload)
            });
        }
        polled
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for FrameTap<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = &polled {
            self.wrote(&buf[..*n]);
        }
        polled
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if let Poll::Ready(Ok(n)) = &polled {
            let mut left = *n;
            for buf in bufs {
                let take = left.min(buf.len());
                self.wrote(&buf[..take]);
                left -= take;
                if left == 0 {
                    break;
                }
            }
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let len = payload.len() as u32;
        let mut out = len.to_be_bytes()[1..].to_vec();
        out.extend([kind, flags]);
        out.extend(stream.to_be_bytes());
        out.extend(payload);
        out
    }

    #[test]
    fn frames_are_followed_across_any_split() {
        let mut wire = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        wire.extend(frame(FRAME_SETTINGS, 0, 0, &[0, 3, 0, 0, 0, 7]));
        wire.extend(frame(FRAME_HEADERS, 0x4, 1, &[1, 2, 3]));
        wire.extend(frame(FRAME_DATA, FLAG_END_STREAM, 1, &[9; 40]));
        for split in 1..wire.len() {
            let mut reader = FrameReader::client_side();
            let mut seen = Vec::new();
            for chunk in wire.chunks(split) {
                reader.feed(chunk, |h, p| seen.push((h, max_streams_in(p))));
            }
            let kinds: Vec<_> = seen.iter().map(|(h, m)| (h.kind, h.stream, *m)).collect();
            assert_eq!(
                kinds,
                [
                    (FRAME_SETTINGS, 0, Some(7)),
                    (FRAME_HEADERS, 1, None),
                    (FRAME_DATA, 1, None)
                ],
                "split every {split} bytes"
            );
        }
    }

    /// A GOAWAY's last stream is read across any split, whatever debug data follows it; the
    /// streams above it are the ones the server never processed.
    #[test]
    fn a_goaway_names_the_streams_the_server_never_processed() {
        let mut payload = 5u32.to_be_bytes().to_vec();
        payload.extend(0u32.to_be_bytes());
        payload.extend(b"graceful shutdown, debug data");
        let wire = frame(FRAME_GOAWAY, 0, 0, &payload);
        for split in 1..wire.len() {
            let tally = Tally::new(IntGauge::new("t", "t").unwrap(), Arc::default());
            assert!(!tally.never_processed(7), "before any GOAWAY");
            let mut reader = FrameReader::default();
            for chunk in wire.chunks(split) {
                reader.feed(chunk, |h, p| tally.received(h, p));
            }
            assert!(tally.going_away());
            assert!(!tally.never_processed(5), "split every {split} bytes");
            assert!(tally.never_processed(7), "split every {split} bytes");
        }
    }

    #[test]
    fn a_new_connection_starts_at_the_limit_the_server_last_named() {
        let gauge = IntGauge::new("t", "t").unwrap();
        let advertised = Arc::new(AtomicU32::new(0));
        let first = Tally::new(gauge.clone(), advertised.clone());
        assert_eq!(first.max_streams(), INITIAL_MAX_STREAMS);
        let settings = FrameHead {
            kind: FRAME_SETTINGS,
            flags: 0,
            stream: 0,
        };
        first.received(settings, &[0, 3, 0, 0, 0, 4]);
        let second = Tally::new(gauge, advertised);
        assert_eq!(second.max_streams(), 4, "before its own SETTINGS");
    }

    #[test]
    fn streams_open_on_headers_and_close_when_the_server_ends_or_resets_them() {
        let gauge = IntGauge::new("t", "t").unwrap();
        let tally = Tally::new(gauge.clone(), Arc::default());
        let head = |kind, flags, stream| FrameHead {
            kind,
            flags,
            stream,
        };
        tally.received(head(FRAME_SETTINGS, 0, 0), &[0, 3, 0, 0, 0, 2]);
        assert_eq!(tally.max_streams(), 2);
        let r1 = tally.try_reserve().expect("room for one");
        tally.sent(head(FRAME_HEADERS, 0x5, 1));
        drop(r1);
        tally.sent(head(FRAME_HEADERS, 0x5, 3));
        assert_eq!((tally.open_streams(), gauge.get()), (2, 2));
        assert!(
            tally.try_reserve().is_none(),
            "the server's limit is reached"
        );
        tally.received(head(FRAME_DATA, FLAG_END_STREAM, 1), &[]);
        tally.sent(head(FRAME_RST_STREAM, 0, 3));
        assert_eq!((tally.open_streams(), gauge.get()), (0, 0));
        tally.sent(head(FRAME_HEADERS, 0x5, 5));
        tally.received(head(FRAME_GOAWAY, 0, 0), &[]);
        assert!(tally.try_reserve().is_none(), "no new stream after GOAWAY");
        drop(tally);
        assert_eq!(
            gauge.get(),
            0,
            "a dropped connection's streams are counted down"
        );
    }
}
