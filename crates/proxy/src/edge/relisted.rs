//! The lists the cache writer last replaced a scope with, so that a LIST repeating one costs a
//! comparison of its bytes and a scope record, not a look at each item. A component's informer
//! relists after its watch breaks, and on a node whose link comes back every component does so
//! at once, mostly for scopes that did not change. Start with [`Relisted::repeated`].
//!
//! Each entry carries the store's write sequence ([`outpost_cache::Store::write_seq`]) as the
//! replace that stored the list left it. The store renews the scope only if no item of its
//! resource has been written since ([`outpost_cache::Store::renew_scope`]), so the items
//! compared here are still what the scope holds.
//!
//! A kept list renews its scope for [`RENEWS_FOR`] at most. A renewal reads no item, so a record
//! that rotted on disk since (a flipped bit the store's checksum catches on a read) would stay
//! unseen while the cloud keeps sending the same list, and be found only offline, when nothing
//! can mend it; a replace reads every stored item and writes again any that fails its checksum.

use std::collections::HashMap;
use std::ops::Range;
use std::time::{Duration, Instant};

use bytes::Bytes;
use outpost_cache::ScopeId;

/// Bytes of list bodies kept at most; past that the memo starts over.
const MAX_BYTES: usize = 4 << 20;
/// Smaller lists are not kept: replacing them costs little (and a small body may be a slice of
/// a larger read buffer, which keeping it would pin).
const MIN_BODY: usize = 16 << 10;
/// How long after the replace that kept it a list may renew its scope.
pub const RENEWS_FOR: Duration = Duration::from_secs(10 * 60);

pub struct Relisted {
    by_scope: HashMap<ScopeId, Kept>,
    bytes: usize,
    renews_for: Duration,
}

impl Default for Relisted {
    fn default() -> Self {
        Relisted::renewing_for(RENEWS_FOR)
    }
}

struct Kept {
    seq: u64,
    kept_at: Instant,
    body: Bytes,
    /// Where the list's `metadata` lies in `body`: the only bytes a repeat may change.
    metadata_at: Range<usize>,
}

impl Relisted {
    /// Lists kept renew their scopes for `renews_for` after the replace that kept them.
    pub fn renewing_for(renews_for: Duration) -> Self {
        Relisted {
            by_scope: HashMap::new(),
            bytes: 0,
            renews_for,
        }
    }

    /// `body` replaced `scope`, and that commit moved the store's write sequence to `seq`.
    pub fn remember(&mut self, scope: ScopeId, seq: u64, body: Bytes, metadata_at: Range<usize>) {
        if body.len() < MIN_BODY || body.len() > MAX_BYTES {
            return;
        }
        if self.bytes + body.len() > MAX_BYTES {
            self.by_scope.clear();
            self.bytes = 0;
        }
        self.bytes += body.len();
        let kept = Kept {
            seq,
            kept_at: Instant::now(),
            body,
            metadata_at,
        };
        if let Some(old) = self.by_scope.insert(scope, kept) {
            self.bytes -= old.body.len();
        }
    }

    /// The write sequence to renew `scope` at, when `body` (its `metadata` at `metadata_at`)
    /// repeats, byte for byte outside its `metadata`, the list kept for it, and that list may
    /// still renew it.
    pub fn repeated(
        &self,
        scope: &ScopeId,
        body: &[u8],
        metadata_at: &Range<usize>,
    ) -> Option<u64> {
        let kept = self
            .by_scope
            .get(scope)
            .filter(|kept| kept.kept_at.elapsed() < self.renews_for)?;
        let (before, after) = (&body[..metadata_at.start], &body[metadata_at.end..]);
        let kept_before = &kept.body[..kept.metadata_at.start];
        let kept_after = &kept.body[kept.metadata_at.end..];
        (before == kept_before && after == kept_after).then_some(kept.seq)
    }

    pub fn forget(&mut self, scope: &ScopeId) {
        if let Some(old) = self.by_scope.remove(scope) {
            self.bytes -= old.body.len();
        }
    }
}
