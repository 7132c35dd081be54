//! [`LineFramer`]: splits a JSON watch stream into event lines ([`super::watch`]).
//!
//! kube-apiserver writes one JSON event per line; chunks of the HTTP body cut lines anywhere.

use std::collections::VecDeque;

use bytes::{Buf, Bytes, BytesMut};

/// Accumulates body chunks and hands out complete lines (each with its `\n`). A line that
/// arrives whole within one chunk is a slice of that chunk (no copy); only a line cut by a chunk
/// boundary is copied together.
#[derive(Debug, Default)]
pub struct LineFramer {
    /// Complete lines not handed out yet.
    ready: VecDeque<Bytes>,
    /// The start of a line whose newline has not arrived.
    partial: BytesMut,
}

impl LineFramer {
    pub fn new() -> LineFramer {
        LineFramer::default()
    }

    pub fn push(&mut self, chunk: Bytes) {
        let mut rest = chunk;
        if !self.partial.is_empty() {
            let Some(at) = memchr::memchr(b'\n', &rest) else {
                self.partial.extend_from_slice(&rest);
                return;
            };
            self.partial.extend_from_slice(&rest[..=at]);
            self.ready.push_back(self.partial.split().freeze());
            rest.advance(at + 1);
        }
        while let Some(at) = memchr::memchr(b'\n', &rest) {
            self.ready.push_back(rest.split_to(at + 1));
        }
        self.partial.extend_from_slice(&rest);
    }

    /// The next complete line, newline included; `None` until one has arrived.
    pub fn next_line(&mut self) -> Option<Bytes> {
        self.ready.pop_front()
    }

    /// Whatever follows the last newline, at the end of the stream.
    pub fn finish(&mut self) -> Option<Bytes> {
        (!self.partial.is_empty()).then(|| self.partial.split().freeze())
    }

    /// Bytes held back waiting for a newline (a proxy may cap this).
    pub fn buffered(&self) -> usize {
        self.partial.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drain(framer: &mut LineFramer) -> Vec<Bytes> {
        std::iter::from_fn(|| framer.next_line()).collect()
    }

    #[test]
    fn lines_split_across_chunks() {
        let mut framer = LineFramer::new();
        framer.push(Bytes::from_static(b"{\"a\":1}\n{\"b\""));
        assert_eq!(drain(&mut framer), [Bytes::from_static(b"{\"a\":1}\n")]);
        assert_eq!(framer.buffered(), 4);
        framer.push(Bytes::from_static(b":2}"));
        assert!(drain(&mut framer).is_empty());
        framer.push(Bytes::from_static(b"\n{\"c\":3}\n{\"d\""));
        assert_eq!(
            drain(&mut framer),
            [
                Bytes::from_static(b"{\"b\":2}\n"),
                Bytes::from_static(b"{\"c\":3}\n")
            ]
        );
        assert_eq!(framer.finish(), Some(Bytes::from_static(b"{\"d\"")));
        assert_eq!(framer.finish(), None);
    }

    #[test]
    fn one_byte_at_a_time() {
        let stream = b"{\"type\":\"ADDED\"}\n{\"type\":\"BOOKMARK\"}\n";
        let mut framer = LineFramer::new();
        let mut lines = Vec::new();
        for b in stream {
            framer.push(Bytes::copy_from_slice(&[*b]));
            lines.extend(drain(&mut framer));
        }
        assert_eq!(lines.concat(), stream);
        assert_eq!(lines.len(), 2);
    }

    #[test]
    fn a_line_whole_in_its_chunk_is_a_slice_of_it() {
        let chunk = Bytes::from_static(b"{\"a\":1}\n{\"b\":2}\n");
        let mut framer = LineFramer::new();
        framer.push(chunk.clone());
        let lines = drain(&mut framer);
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[1].as_ptr(), chunk[8..].as_ptr(), "not copied");
    }
}
