//! The objects the cache writer last found stored exactly as a GET returned them, so that the
//! same answer again is not handed to the writer thread at all (a component that GETs one
//! object in a loop, each answer otherwise a queue send, a thread wake-up and three store
//! reads for nothing).
//!
//! Each entry carries the store's write sequence ([`outpost_cache::Store::write_seq`]) noted
//! *before* the read that confirmed it. Any commit since, by any writer (the cache writer, the
//! offline node status, a compaction's switch), moves the sequence, and the entry no longer
//! counts: no invalidation has to be remembered anywhere else. Start with [`Confirmed::holds`].

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use bytes::Bytes;
use outpost_cache::ObjectKey;

/// Entries kept at most; past that (or [`MAX_BYTES`]) the memo starts over.
const MAX_ENTRIES: usize = 256;
/// Bytes of bodies kept at most.
const MAX_BYTES: usize = 1 << 20;
/// Larger bodies are not kept: comparing them costs more than the trip it saves.
const MAX_BODY: usize = 64 << 10;

#[derive(Default)]
pub struct Confirmed {
    inner: Mutex<Entries>,
}

#[derive(Default)]
struct Entries {
    by_key: HashMap<ObjectKey, (u64, Bytes)>,
    bytes: usize,
}

impl Confirmed {
    /// The writer found `body` stored, pinned, under `key`, reading after the store's write
    /// sequence was `seq`.
    pub fn remember(&self, key: ObjectKey, seq: u64, body: Bytes) {
        if body.len() > MAX_BODY {
            return;
        }
        let mut entries = self.entries();
        if entries.by_key.len() >= MAX_ENTRIES || entries.bytes + body.len() > MAX_BYTES {
            *entries = Entries::default();
        }
        entries.bytes += body.len();
        if let Some((_, old)) = entries.by_key.insert(key, (seq, body)) {
            entries.bytes -= old.len();
        }
    }

    /// Whether the store still holds exactly `pieces` (a body as it arrived) under `key`:
    /// confirmed, and no commit since (`seq_now` is the store's sequence now).
    pub fn holds(&self, key: &ObjectKey, pieces: &[Bytes], seq_now: u64) -> bool {
        let entries = self.entries();
        entries
            .by_key
            .get(key)
            .is_some_and(|(seq, body)| *seq == seq_now && same_bytes(pieces, body))
    }

    fn entries(&self) -> std::sync::MutexGuard<'_, Entries> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Whether `pieces`, joined, equal `whole`.
fn same_bytes(pieces: &[Bytes], whole: &[u8]) -> bool {
    let mut rest = whole;
    for piece in pieces {
        let Some((head, tail)) = rest.split_at_checked(piece.len()) else {
            return false;
        };
        if head != &piece[..] {
            return false;
        }
        rest = tail;
    }
    rest.is_empty()
}

#[cfg(test)]
mod tests {
    use super::*;
    use outpost_cache::Gvr;

    fn key(name: &str) -> ObjectKey {
        ObjectKey::new("kubelet", &Gvr::new("", "v1", "nodes"), "", name)
    }

    fn pieces(parts: &[&'static str]) -> Vec<Bytes> {
        parts
            .iter()
            .map(|p| Bytes::from_static(p.as_bytes()))
            .collect()
    }

    #[test]
    fn the_same_bytes_under_the_same_sequence_are_held() {
        let memo = Confirmed::default();
        memo.remember(key("a"), 7, Bytes::from_static(b"{\"x\":1}"));
        assert!(memo.holds(&key("a"), &pieces(&["{\"x\"", ":1}"]), 7));
        assert!(
            !memo.holds(&key("a"), &pieces(&["{\"x\":2}"]), 7),
            "other bytes"
        );
        assert!(
            !memo.holds(&key("a"), &pieces(&["{\"x\":1}", "!"]), 7),
            "longer"
        );
        assert!(!memo.holds(&key("a"), &pieces(&["{\"x\""]), 7), "shorter");
        assert!(
            !memo.holds(&key("b"), &pieces(&["{\"x\":1}"]), 7),
            "other key"
        );
    }

    #[test]
    fn any_commit_since_the_confirming_read_lets_it_go() {
        let memo = Confirmed::default();
        memo.remember(key("a"), 7, Bytes::from_static(b"{}"));
        assert!(!memo.holds(&key("a"), &pieces(&["{}"]), 8));
    }

    #[test]
    fn the_memo_stays_within_its_bounds() {
        let memo = Confirmed::default();
        for i in 0..MAX_ENTRIES * 2 {
            memo.remember(key(&i.to_string()), 1, Bytes::from(vec![b' '; 8 << 10]));
        }
        let entries = memo.entries();
        assert!(entries.by_key.len() <= MAX_ENTRIES);
        assert!(entries.bytes <= MAX_BYTES);
        assert_eq!(
            entries.bytes,
            entries.by_key.values().map(|(_, b)| b.len()).sum::<usize>()
        );
        drop(entries);
        memo.remember(key("big"), 1, Bytes::from(vec![b' '; MAX_BODY + 1]));
        assert!(!memo.holds(&key("big"), &[Bytes::from(vec![b' '; MAX_BODY + 1])], 1));
    }
}
