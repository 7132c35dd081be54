//! Gives the memory a burst of work freed back to the kernel (glibc only).
//!
//! glibc's malloc returns memory to the kernel only from the top of each heap. What a burst frees
//! below a chunk that is still in use stays resident for the life of the process. The hub's bursts
//! are large and come at start-up and after every reconnect: relisting a full node (1,000 Services
//! and EndpointSlices, 110 pods) and writing it to sled allocates and frees tens of MiB, and a
//! warmed hub holds a third of its RSS as free memory glibc kept (`examples/coldboot.rs`;
//! figures in `docs/benchmarks-journal.md`). jemalloc and Go's runtime give such memory back on
//! a timer; glibc has to be asked.
//!
//! [`trim_after_bursts`] reads the process's anonymous resident memory every [`TICK`]. When it has
//! grown by [`GROWTH`] since the last trim, then held (nearly) still for a tick in which no hub
//! in the process answered a request, sent a frame of a response body (a watch streams for
//! minutes) or applied a cache write ([`BurstWatch`], `outpost_proxy::work::note_work`),
//! the burst is over and a trim runs on the blocking pool. A trim holds each arena's lock while
//! it walks that arena, and the memory it returns is faulted in again by the next burst:
//! trimming while the cache writer was busy cost a watch with the cache on some of its
//! throughput (`benches/edge.rs`), so a busy hub is never trimmed.
//!
//! Rejected, measured: fixing glibc's mmap threshold so that large buffers always get their own
//! mapping (returned on free). Warmed RSS fell, but every large buffer then costs a fresh
//! mapping and its page faults: in `benches/edge.rs` (hub and client in one process) the
//! offline LIST of 110 pods became markedly slower.

use std::time::Duration;

use tokio::sync::watch;
use tracing::debug;

use outpost_proxy::Metrics;
use outpost_proxy::work::work_done;

/// How often the resident memory is read.
pub const TICK: Duration = Duration::from_secs(1);
/// Growth of the anonymous resident memory, since the last trim, that makes a burst worth trimming.
pub const GROWTH: u64 = 4 << 20;
/// Growth within one tick under which memory holds still, whatever the burst's size.
pub const STILL: u64 = 256 << 10;
/// Memory also holds still when a tick adds less than this fraction of the burst's growth: after
/// a full node's relists it goes on growing for seconds, at ≈0.6 MiB/s against the burst's
/// ≈26 MiB, and that tail should not put the trim off.
pub const STILL_FRACTION: u64 = 8;

/// Decides, from one reading per tick, when a burst has ended that is worth a trim.
#[derive(Debug)]
pub struct BurstWatch {
    /// The lowest reading since the last trim: where growth is measured from.
    baseline: u64,
    previous: u64,
}

impl BurstWatch {
    pub fn new(first_reading: u64) -> Self {
        BurstWatch {
            baseline: first_reading,
            previous: first_reading,
        }
    }

    /// Takes this tick's reading and whether the hub was idle during the tick; true when memory
    /// has grown by [`GROWTH`] and held still while the hub was idle.
    pub fn burst_ended(&mut self, anon: u64, idle: bool) -> bool {
        self.baseline = self.baseline.min(anon);
        let grown = anon.saturating_sub(self.baseline);
        let this_tick = anon.saturating_sub(self.previous);
        self.previous = anon;
        idle && grown >= GROWTH && this_tick <= STILL.max(grown / STILL_FRACTION)
    }

    /// A trim ran and left `anon` resident: later growth is measured from there.
    pub fn trimmed(&mut self, anon: u64) {
        self.baseline = anon;
        self.previous = anon;
    }
}

/// Trims after each burst until shutdown. Returns at once where trimming is not available.
pub async fn trim_after_bursts(metrics: Metrics, mut shutdown: watch::Receiver<bool>) {
    let Some(first) = anon_resident_bytes().filter(|_| TRIM_AVAILABLE) else {
        return;
    };
    let mut bursts = BurstWatch::new(first);
    let mut activity = work_done();
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.changed() => return,
        }
        let Some(before) = anon_resident_bytes() else {
            return;
        };
        let done = work_done();
        let idle = done == activity;
        activity = done;
        if !bursts.burst_ended(before, idle) {
            continue;
        }
        let Ok(after) = tokio::task::spawn_blocking(|| {
            trim();
            anon_resident_bytes()
        })
        .await
        else {
            return;
        };
        let after = after.unwrap_or(before);
        bursts.trimmed(after);
        metrics.memory_trims.inc();
        metrics
            .memory_trimmed_bytes
            .inc_by(before.saturating_sub(after));
        debug!(before, after, "returned freed memory to the kernel");
    }
}

/// The process's anonymous resident memory (`RssAnon`), in bytes; `None` without procfs.
pub fn anon_resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    rss_anon(&status)
}

fn rss_anon(status: &str) -> Option<u64> {
    let kib = status
        .lines()
        .find_map(|line| line.strip_prefix("RssAnon:"))?
        .trim()
        .strip_suffix("kB")?
        .trim()
        .parse::<u64>()
        .ok()?;
    Some(kib * 1024)
}

/// Whether [`trim`] does anything on this platform.
pub const TRIM_AVAILABLE: bool = cfg!(all(target_os = "linux", target_env = "gnu"));

/// Gives every arena's free pages back to the kernel (`malloc_trim(0)`); a no-op off glibc.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
pub fn trim() {
    // SAFETY: malloc_trim takes no pointers and only releases pages of free chunks, under each
    // arena's own lock; it is safe to call from any thread at any time.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Gives every arena's free pages back to the kernel (`malloc_trim(0)`); a no-op off glibc.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn trim() {}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    impl BurstWatch {
        fn burst_ended_idle(&mut self, anon: u64) -> bool {
            self.burst_ended(anon, true)
        }
    }

    #[test]
    fn a_busy_hub_is_not_trimmed() {
        let mut watch = BurstWatch::new(10 * MIB);
        assert!(!watch.burst_ended(30 * MIB, false));
        assert!(
            !watch.burst_ended(30 * MIB, false),
            "still, but the writer is busy"
        );
        assert!(watch.burst_ended(30 * MIB, true), "still and idle");
    }

    #[test]
    fn a_burst_is_trimmed_once_memory_holds_still() {
        let mut watch = BurstWatch::new(10 * MIB);
        assert!(!watch.burst_ended_idle(12 * MIB), "2 MiB is not a burst");
        assert!(!watch.burst_ended_idle(20 * MIB), "still growing");
        assert!(watch.burst_ended_idle(20 * MIB), "grown 10 MiB and still");
        watch.trimmed(11 * MIB);
        assert!(
            !watch.burst_ended_idle(11 * MIB),
            "nothing new since the trim"
        );
        assert!(!watch.burst_ended_idle(14 * MIB));
        assert!(
            !watch.burst_ended_idle(14 * MIB),
            "3 MiB since the trim is not a burst"
        );
    }

    #[test]
    fn growth_is_measured_from_the_lowest_reading() {
        let mut watch = BurstWatch::new(20 * MIB);
        assert!(
            !watch.burst_ended_idle(12 * MIB),
            "memory went down by itself"
        );
        assert!(!watch.burst_ended_idle(17 * MIB), "growing");
        assert!(
            watch.burst_ended_idle(17 * MIB),
            "5 MiB above the low point, and still"
        );
    }

    #[test]
    fn slow_drift_within_a_tick_counts_as_still() {
        let mut watch = BurstWatch::new(10 * MIB);
        assert!(!watch.burst_ended_idle(15 * MIB));
        assert!(
            watch.burst_ended_idle(15 * MIB + STILL),
            "a quarter MiB per tick is still"
        );
    }

    #[test]
    fn the_tail_of_a_large_burst_does_not_put_the_trim_off() {
        // Readings of a hub warmed by a full node's relists (coldboot, KiB): memory goes on
        // growing at ≈0.6 MiB/s after the requests end.
        let mut watch = BurstWatch::new(1800 * 1024);
        assert!(!watch.burst_ended_idle(4396 * 1024), "start-up, 2.5 MiB");
        assert!(!watch.burst_ended_idle(30148 * 1024), "the relists");
        assert!(
            watch.burst_ended_idle(30732 * 1024),
            "0.6 MiB more against 28 MiB grown"
        );
        watch.trimmed(15 * 1024 * 1024);
        assert!(!watch.burst_ended_idle(15 * 1024 * 1024 + 600 * 1024));
        assert!(
            !watch.burst_ended_idle(24 * MIB),
            "9 MiB in one tick is a new burst, not a tail"
        );
    }

    #[test]
    fn rss_anon_is_read_from_proc_status() {
        let status =
            "Name:\toutpost\nVmRSS:\t   16896 kB\nRssAnon:\t    4404 kB\nRssFile:\t12492 kB\n";
        assert_eq!(rss_anon(status), Some(4404 * 1024));
        assert_eq!(rss_anon("VmRSS:\t1 kB\n"), None);
        assert_eq!(rss_anon("RssAnon:\tmany kB\n"), None);
        #[cfg(target_os = "linux")]
        assert!(anon_resident_bytes().is_some_and(|b| b > 0));
    }
}
