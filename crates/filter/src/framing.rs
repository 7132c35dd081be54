//! [`LineFramer`]: splits a JSON watch stream into event lines for [`crate::Chain::filter_event`].
//!
//! kube-apiserver writes one JSON event per line; chunks of the HTTP body cut lines anywhere.

use bytes::{Bytes, BytesMut};

/// Accumulates body chunks and hands out complete lines (each with its `\n`).
#[derive(Debug, Default)]
pub struct LineFramer {
    buf: BytesMut,
    /// Bytes of `buf` already searched for a newline, so a long line is scanned once.
    scanned: usize,
}

impl LineFramer {
    pub fn new() -> LineFramer {
        LineFramer::default()
    }

    pub fn push(&mut self, chunk: &[u8]) {
        self.buf.extend_from_slice(chunk);
    }

    /// The next complete line, newline included; `None` until one has arrived.
    pub fn next_line(&mut self) -> Option<Bytes> {
        let found = self.buf[self.scanned..].iter().position(|b| *b == b'\n');
        match found {
            Some(at) => {
                let end = self.scanned + at + 1;
                self.scanned = 0;
                Some(self.buf.split_to(end).freeze())
            }
            None => {
                self.scanned = self.buf.len();
                None
            }
        }
    }

    /// Whatever follows the last newline, at the end of the stream.
    pub fn finish(&mut self) -> Option<Bytes> {
        self.scanned = 0;
        (!self.buf.is_empty()).then(|| self.buf.split().freeze())
    }

    /// Bytes held back waiting for a newline (a proxy may cap this).
    pub fn buffered(&self) -> usize {
        self.buf.len()
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
        framer.push(b"{\"a\":1}\n{\"b\"");
        assert_eq!(drain(&mut framer), [Bytes::from_static(b"{\"a\":1}\n")]);
        assert_eq!(framer.buffered(), 4);
        framer.push(b":2}");
        assert!(drain(&mut framer).is_empty());
        framer.push(b"\n{\"c\":3}\n{\"d\"");
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
            framer.push(&[*b]);
            lines.extend(drain(&mut framer));
        }
        assert_eq!(lines.concat(), stream);
        assert_eq!(lines.len(), 2);
    }
}
