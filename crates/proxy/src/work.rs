//! How much work the request path has done: the node agent's memory trim
//! (`outpost_agent::host::memory`) waits for a tick in which none was done.

use std::sync::atomic::{AtomicU64, Ordering};

/// Requests answered, response frames sent and cache writes applied by every hub in the
/// process: memory is process-wide, so idleness is too (the benches run two hubs side by side).
static WORK: AtomicU64 = AtomicU64::new(0);

/// Counts one request answered, one response frame sent or one cache write applied.
pub fn note_work() {
    WORK.fetch_add(1, Ordering::Relaxed);
}

/// Work done so far: a tick in which this did not move was idle.
pub fn work_done() -> u64 {
    WORK.load(Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_is_counted_process_wide() {
        let before = work_done();
        note_work();
        note_work();
        assert!(work_done() >= before + 2);
    }
}
