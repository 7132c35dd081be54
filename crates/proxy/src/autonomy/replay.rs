//! What the hub kept while the cloud was away, sent when it returns: [`on_each_return`] runs a
//! replay each time, and [`ReplayError`] says why one could not be sent yet.

use tokio::sync::watch;

/// Why something kept while offline could not be sent to the cloud now (it is tried again on
/// the next return).
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error(transparent)]
    Call(#[from] crate::upstream::OwnCallError),
    #[error("{what} answered {code}")]
    Answered {
        what: String,
        code: http::StatusCode,
    },
    #[error(transparent)]
    Json(#[from] serde_json::Error),
}

impl ReplayError {
    pub(crate) fn answered(what: impl Into<String>, code: http::StatusCode) -> ReplayError {
        ReplayError::Answered {
            what: what.into(),
            code,
        }
    }
}

/// Runs `replay` now if the cloud answers, and again each time it comes back, until
/// `shutdown`: how what the hub kept while offline (node and pod status, events) reaches the
/// cloud.
pub async fn on_each_return<F, Fut>(
    mut online: watch::Receiver<bool>,
    mut shutdown: watch::Receiver<bool>,
    mut replay: F,
) where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    loop {
        if *online.borrow_and_update() {
            replay().await;
        }
        tokio::select! {
            changed = online.changed() => if changed.is_err() { return },
            _ = shutdown.changed() => return,
        }
    }
}
