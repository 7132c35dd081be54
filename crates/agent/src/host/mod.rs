//! The node itself: what the hub keeps up on the host besides serving.
//!
//! - [`dummy_if`]: the node-local address in-cluster clients are sent to (yurthub's
//!   `hub-dummy0`), where the secure port listens.
//! - [`memory`]: freed memory given back to the kernel after bursts (glibc's `malloc_trim`).
//! - [`dump`]: the state dump of `kill -USR1`.

pub mod dummy_if;
pub mod dump;
pub mod memory;

use std::sync::Arc;

use outpost_proxy::Metrics;

use crate::supervisor::Supervisor;
use dummy_if::{DummyIfConfig, DummyInterface};

/// The dummy interface, set up now (when configured): the secure port binds its address next.
pub async fn dummy_interface(
    config: Option<DummyIfConfig>,
    metrics: &Metrics,
) -> Option<Arc<DummyInterface>> {
    let iface = Arc::new(DummyInterface::new(config?, metrics.dummy_if_ready.clone()));
    iface.ensure().await;
    Some(iface)
}

/// Keeps the dummy interface in place, and gives memory back after bursts of work.
pub fn start(dummy_if: Option<&Arc<DummyInterface>>, metrics: &Metrics, tasks: &Supervisor) {
    if let Some(iface) = dummy_if {
        tasks.spawn(
            "dummy interface",
            dummy_if::maintain(iface.clone(), tasks.stopping()),
        );
    }
    tasks.spawn(
        "memory trim",
        memory::trim_after_bursts(metrics.clone(), tasks.stopping()),
    );
}
