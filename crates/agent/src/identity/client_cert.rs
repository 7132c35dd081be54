//! kubelet's client certificate, borrowed: the hub notices when kubelet rotates it and presents
//! the new one.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use outpost_proxy::Metrics;
use outpost_proxy::upstream::Upstream;
use tokio::sync::watch;
use tracing::{info, warn};

/// Checks every `interval` whether kubelet rotated the certificate files the hub borrows, and
/// switches to the new pair once it loads. yurthub reloads only after the old one has expired;
/// by then the node has been failing its requests.
pub async fn watch_client_certificate(
    upstream: Arc<Upstream>,
    metrics: Metrics,
    interval: Duration,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut reported = None;
    loop {
        tokio::select! {
            () = tokio::time::sleep(interval) => {}
            _ = shutdown.wait_for(|stop| *stop) => return,
        }
        let current = upstream.tls();
        // Reading two small files is blocking I/O; keep it off the async workers.
        let checked = tokio::task::spawn_blocking(move || current.reload_if_changed()).await;
        match checked {
            Ok(Ok(None)) => reported = None,
            Ok(Ok(Some(tls))) if tls.identity.is_expired_at(SystemTime::now()) => {
                report_once(
                    &mut reported,
                    "the rotated client certificate has already expired",
                );
            }
            Ok(Ok(Some(tls))) => {
                info!(
                    user = %tls.identity.user,
                    not_after_unix = tls.identity.not_after_unix(),
                    "client certificate rotated; new requests present the new one"
                );
                metrics.record_client_certificate(&tls.identity);
                upstream.replace_tls(tls);
                reported = None;
            }
            // Mid-write, or broken: keep the old pair and look again next time.
            Ok(Err(e)) => report_once(&mut reported, &e.to_string()),
            Err(e) => report_once(&mut reported, &e.to_string()),
        }
    }
}

/// Logs a problem with the certificate files once, not on every check.
fn report_once(reported: &mut Option<String>, problem: &str) {
    if reported.as_deref() != Some(problem) {
        warn!(
            problem,
            "client certificate files changed but cannot be used yet; keeping the current certificate"
        );
        *reported = Some(problem.to_owned());
    }
}
