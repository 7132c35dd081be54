//! The hub's identities: the client certificate it presents upstream, and the serving
//! certificate of the secure port.
//!
//! - [`client_cert`]: kubelet's certificate, borrowed; a rotated one is picked up at once.
//! - [`bootstrap`]: token mode — the hub's own client certificate, obtained by a kubeadm join
//!   token and a CSR ([`csr`]), kept and renewed.
//! - [`serving_cert`]: the secure port's certificate, requested from the cluster by CSR.

pub mod bootstrap;
pub mod client_cert;
mod csr;
pub mod serving_cert;

use std::sync::Arc;
use std::time::Duration;

use outpost_certs::serving::CertSlot;
use outpost_proxy::Metrics;
use outpost_proxy::pipeline::Pipeline;
use outpost_proxy::upstream::Upstream;

use crate::supervisor::Supervisor;
use bootstrap::TokenBootstrap;
use serving_cert::{ServingCertConfig, ServingCertManager};

/// Keeps the client certificate current: kubelet's, reloaded when kubelet rotates it; in token
/// mode the hub's own, renewed before it expires.
/// `interval`: how often kubelet's files are looked at; `token_bootstrap`: token mode.
pub fn keep_client_certificate(
    interval: Duration,
    token_bootstrap: Option<&TokenBootstrap>,
    upstream: &Arc<Upstream>,
    metrics: &Metrics,
    tasks: &Supervisor,
) {
    let watch = client_cert::watch_client_certificate(
        upstream.clone(),
        metrics.clone(),
        interval,
        tasks.stopping(),
    );
    tasks.spawn("client certificate", watch);
    if let Some(bootstrap) = token_bootstrap {
        let renew = bootstrap::renew_client_certificate(
            upstream.clone(),
            bootstrap.clone(),
            tasks.stopping(),
        );
        tasks.spawn("client certificate renewal", renew);
    }
}

/// The secure port's certificate in `slot`: the kept one installed at once, then requested and
/// renewed by its manager.
pub fn keep_serving_certificate(
    certificate: ServingCertConfig,
    slot: &Arc<CertSlot>,
    pipeline: &Pipeline,
    tasks: &Supervisor,
) {
    let manager = ServingCertManager::new(
        certificate,
        pipeline.upstream.clone(),
        slot.clone(),
        pipeline.metrics.clone(),
    );
    manager.install_kept();
    tasks.spawn("serving certificate", manager.run(tasks.stopping()));
}
