//! Go's HTTP/2 server going away, as kube-apiserver's does under `--goaway-chance` and at
//! shutdown: one GOAWAY naming the last stream it took, and the streams the client opened
//! meanwhile (their HEADERS crossed the GOAWAY on the wire) ignored, never answered
//! (RFC 9113 §6.8). hyper's server goes away in two phases, which no stream can cross, so the
//! fake interposes [`GoAwayTap`] between TLS and hyper: it follows the frames both ways and,
//! when armed ([`GoAway::after_streams`]), writes the GOAWAY between two of hyper's frames and
//! drops every later frame of the streams above the last one.
//!
//! A dropped HEADERS block leaves hyper's HPACK table behind the client's; harmless here, as a
//! client opens no stream on a connection after its GOAWAY.

use std::io;
use std::pin::Pin;
use std::sync::Mutex;
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

const FRAME_HEAD_LEN: usize = 9;
const FRAME_HEADERS: u8 = 0x1;
const FRAME_GOAWAY: u8 = 0x7;
const CLIENT_PREFACE_LEN: usize = 24;

/// When the next connections go away: after how many new streams, and on how many
/// connections in turn.
#[derive(Debug, Default)]
pub(crate) struct GoAway {
    armed: Mutex<Option<Armed>>,
}

#[derive(Debug)]
struct Armed {
    streams: u32,
    left: u32,
    connections: u32,
}

impl GoAway {
    /// Each of the next `connections` connections goes away at the `streams`-th new stream
    /// the client opens after the last one went away (on the first, after this call); the
    /// streams it opens after that are ignored.
    pub fn after_streams_on(&self, connections: u32, streams: u32) {
        let streams = streams.max(1);
        *crate::state::lock(&self.armed) = (connections > 0).then_some(Armed {
            streams,
            left: streams,
            connections,
        });
    }

    /// Counts one new stream; whether the connection goes away at it (then armed for the
    /// next connection, or disarmed).
    fn goes_away_at_new_stream(&self) -> bool {
        let mut armed = crate::state::lock(&self.armed);
        let Some(now) = armed.as_mut() else {
            return false;
        };
        now.left -= 1;
        if now.left > 0 {
            return false;
        }
        now.connections -= 1;
        now.left = now.streams;
        if now.connections == 0 {
            *armed = None;
        }
        true
    }
}

/// The plaintext side of one HTTP/2 connection, between TLS and hyper.
pub(crate) struct GoAwayTap<T> {
    inner: T,
    arm: std::sync::Arc<GoAway>,
    /// Client bytes read and not yet judged (a frame is passed or dropped whole).
    unread: Vec<u8>,
    /// Client bytes passed, not yet handed to hyper.
    passed: Vec<u8>,
    preface_left: usize,
    last_opened: u32,
    /// The last stream taken, once the connection went away.
    last_taken: Option<u32>,
    /// The GOAWAY frame still to write, and how much of it is written.
    goaway: Option<(Vec<u8>, usize)>,
    /// What is left of the frame hyper is writing: its head's bytes so far, then its payload.
    written_head: Vec<u8>,
    payload_left: usize,
}

impl<T> GoAwayTap<T> {
    pub fn new(inner: T, arm: std::sync::Arc<GoAway>) -> GoAwayTap<T> {
        GoAwayTap {
            inner,
            arm,
            unread: Vec::new(),
            passed: Vec::new(),
            preface_left: CLIENT_PREFACE_LEN,
            last_opened: 0,
            last_taken: None,
            goaway: None,
            written_head: Vec::with_capacity(FRAME_HEAD_LEN),
            payload_left: 0,
        }
    }

    /// Passes or drops each complete frame of what the client sent.
    fn judge_frames(&mut self) {
        let preface = self.preface_left.min(self.unread.len());
        self.passed.extend(self.unread.drain(..preface));
        self.preface_left -= preface;
        while self.unread.len() >= FRAME_HEAD_LEN {
            let head = &self.unread[..FRAME_HEAD_LEN];
            let length = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
            if self.unread.len() < FRAME_HEAD_LEN + length {
                return;
            }
            let kind = head[3];
            let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
            let frame = self.unread.drain(..FRAME_HEAD_LEN + length);
            if self.last_taken.is_some_and(|last| stream > last) {
                continue;
            }
            self.passed.extend(frame);
            if kind == FRAME_HEADERS && stream > self.last_opened {
                self.last_opened = stream;
                if self.arm.goes_away_at_new_stream() {
                    self.last_taken = Some(stream);
                    self.goaway = Some((goaway_frame(stream), 0));
                }
            }
        }
    }

    /// Follows the frames hyper writes, to know where one ends.
    fn follow_written(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            if self.payload_left > 0 {
                let take = self.payload_left.min(bytes.len());
                self.payload_left -= take;
                bytes = &bytes[take..];
                continue;
            }
            let take = (FRAME_HEAD_LEN - self.written_head.len()).min(bytes.len());
            self.written_head.extend_from_slice(&bytes[..take]);
            bytes = &bytes[take..];
            if self.written_head.len() == FRAME_HEAD_LEN {
                let h = &self.written_head;
                self.payload_left = u32::from_be_bytes([0, h[0], h[1], h[2]]) as usize;
                self.written_head.clear();
            }
        }
    }

    /// How much of hyper's next write may go before the GOAWAY must: all of it with none
    /// pending, else up to the end of the frame being written.
    fn writable(&self, offered: usize) -> usize {
        match (&self.goaway, self.payload_left, self.written_head.len()) {
            (None, _, _) => offered,
            (Some(_), 0, 0) => 0,
            (Some(_), 0, head) => (FRAME_HEAD_LEN - head).min(offered),
            (Some(_), left, _) => left.min(offered),
        }
    }
}

/// GOAWAY, NO_ERROR, naming `last` (RFC 9113 §6.8).
fn goaway_frame(last: u32) -> Vec<u8> {
    let mut frame = vec![0, 0, 8, FRAME_GOAWAY, 0, 0, 0, 0, 0];
    frame.extend(last.to_be_bytes());
    frame.extend(0u32.to_be_bytes());
    frame
}

impl<T: AsyncRead + Unpin> AsyncRead for GoAwayTap<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        while this.passed.is_empty() {
            let mut chunk = [0u8; 16 * 1024];
            let mut read = ReadBuf::new(&mut chunk);
            ready!(Pin::new(&mut this.inner).poll_read(cx, &mut read))?;
            if read.filled().is_empty() {
                return Poll::Ready(Ok(()));
            }
            this.unread.extend_from_slice(read.filled());
            this.judge_frames();
        }
        let n = this.passed.len().min(buf.remaining());
        buf.put_slice(&this.passed[..n]);
        this.passed.drain(..n);
        Poll::Ready(Ok(()))
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for GoAwayTap<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        if this.writable(buf.len()) == 0
            && let Some((frame, written)) = &mut this.goaway
        {
            while *written < frame.len() {
                *written += ready!(Pin::new(&mut this.inner).poll_write(cx, &frame[*written..]))?;
            }
            this.goaway = None;
        }
        let n = this.writable(buf.len());
        let n = ready!(Pin::new(&mut this.inner).poll_write(cx, &buf[..n]))?;
        this.follow_written(&buf[..n]);
        Poll::Ready(Ok(n))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
