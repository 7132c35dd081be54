//! [`Supervisor`]: the hub's background tasks, each named, told to stop by one signal and
//! awaited at shutdown; one still running past its deadline (an apiserver call that hangs) is
//! aborted and named in the log, so a stopping hub never waits on the cloud.

use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::warn;

/// Owns the hub's tasks and their shutdown signal.
pub struct Supervisor {
    shutdown: watch::Sender<bool>,
    /// Tasks may be added while the hub runs (the shared cache starts a feed on first read).
    tasks: Mutex<Vec<(&'static str, JoinHandle<()>)>>,
}

impl Default for Supervisor {
    fn default() -> Self {
        Supervisor {
            shutdown: watch::Sender::new(false),
            tasks: Mutex::default(),
        }
    }
}

impl Supervisor {
    /// Runs `task` until it ends; it is expected to end soon after [`Supervisor::stopping`]
    /// fires.
    pub fn spawn(&self, name: &'static str, task: impl Future<Output = ()> + Send + 'static) {
        let handle = tokio::spawn(task);
        self.tasks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((name, handle));
    }

    /// The shutdown signal: changes (to `true`) when the hub stops.
    pub fn stopping(&self) -> watch::Receiver<bool> {
        self.shutdown.subscribe()
    }

    /// Signals every task to stop and awaits them for at most `within` in all; aborts those still
    /// running then (logging their names) and returns those names.
    pub async fn stop(&self, within: Duration) -> Vec<&'static str> {
        let _ = self.shutdown.send(true);
        let tasks = std::mem::take(&mut *self.tasks.lock().unwrap_or_else(|p| p.into_inner()));
        join_or_abort(tasks, within).await
    }
}

/// Awaits `tasks` for at most `within` in all; aborts those still running then (logging their
/// names) and returns those names.
async fn join_or_abort(
    tasks: Vec<(&'static str, JoinHandle<()>)>,
    within: Duration,
) -> Vec<&'static str> {
    let deadline = tokio::time::Instant::now() + within;
    let mut aborted = Vec::new();
    for (name, mut task) in tasks {
        if tokio::time::timeout_at(deadline, &mut task).await.is_err() {
            warn!(task = name, "did not stop in time; aborted");
            task.abort();
            aborted.push(name);
        }
    }
    aborted
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    /// Sets its flag when dropped: an aborted task drops its future.
    struct Dropped(Arc<AtomicBool>);

    impl Drop for Dropped {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    #[tokio::test]
    async fn a_task_that_ignores_shutdown_is_aborted_at_the_deadline() {
        let dropped = Arc::new(AtomicBool::new(false));
        let guard = Dropped(dropped.clone());
        let stuck = tokio::spawn(async move {
            let _guard = guard;
            std::future::pending::<()>().await;
        });
        let quick = tokio::spawn(async {});
        let started = std::time::Instant::now();
        let aborted = join_or_abort(
            vec![("stuck", stuck), ("quick", quick)],
            Duration::from_millis(100),
        )
        .await;
        assert_eq!(aborted, ["stuck"]);
        assert!(started.elapsed() < Duration::from_secs(2));
        for _ in 0..100 {
            if dropped.load(Ordering::SeqCst) {
                return;
            }
            tokio::task::yield_now().await;
        }
        panic!("the stuck task was not aborted");
    }
}
