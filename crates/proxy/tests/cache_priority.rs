//! The cache's CPU priority relative to the hub's, in a process of its own: every cache writer
//! sets the priority of all of its process's sled threads, so a writer started nicer than the
//! unit tests' writers would change the threads those tests look at.

use std::sync::Arc;
use std::time::{Duration, Instant};

use outpost_cache::MemStore;
use outpost_proxy::Metrics;
use outpost_proxy::edge::Writer;

/// The nice values of this process's threads named `outpost-cache-w…`.
fn writers_nice() -> Vec<i32> {
    outpost_testkit::threads::threads(None)
        .into_iter()
        .filter(|t| t.name.starts_with("outpost-cache-w"))
        .map(|t| t.nice)
        .collect()
}

/// A hub started nicer than the default (an operator's `nice -n 15`) keeps its cache below it,
/// at the nicest value, rather than raising the cache above its requests.
#[test]
fn the_cache_stays_below_a_hub_started_nicer() {
    let started_in = std::thread::spawn(|| {
        let me = rustix::thread::gettid();
        rustix::process::setpriority_process(Some(me), 15).expect("a thread may be nicer");
        Writer::start(Arc::new(MemStore::new()), Metrics::new(), false).unwrap()
    });
    let writer = started_in.join().unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while writers_nice() != [19] {
        assert!(
            Instant::now() < deadline,
            "the writer is not at nice 19: {:?}",
            writers_nice()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    drop(writer);
}
