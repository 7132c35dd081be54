//! The offline WATCH: a real stream, where yurthub sends an empty one (§0.4 of the reference).
//!
//! - No `resourceVersion` (or `"0"`, or `sendInitialEvents=true`): `ADDED` for every cached object
//!   of the scope, then (with `sendInitialEvents` and bookmarks) the `k8s.io/initial-events-end`
//!   bookmark, as the apiserver does.
//! - `resourceVersion=N`: the cached events after N, filtered like the list (an object that left
//!   the selector comes as DELETED, see `Store::events_since`). When the cache
//!   cannot prove it holds all of them, a single `ERROR` event with a 410 `Expired` Status, exactly
//!   as kube-apiserver answers a watch from a compacted version, so the client relists.
//! - Then the stream stays open, sending `BOOKMARK`s when asked for, until `timeoutSeconds`, the
//!   client leaves, or the cloud is back: the stream then ends so the client re-watches (or
//!   relists) against the cloud and sees what changed while it was offline.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::Response;
use http_body::Frame;
use http_body_util::{BodyExt, StreamBody};
use outpost_cache::{CacheError, ReplayError, Scope, Store};
use outpost_core::wire::{EventType, ObjectMeta, bookmark_line};
use outpost_core::{RequestInfo, Status};
use tokio::sync::{mpsc, watch};

use super::kinds::KindInfo;
use super::lists::ListMemo;
use super::offline::{self, blocking, resolve_kind};
use super::overlay::{Overlay, Sent};
use crate::body::{BoxError, ProxyBody};
use crate::error::ProxyError;
pub(crate) use outpost_core::wire::event_line;

/// How often an idle offline watch sends a BOOKMARK when the client allows them.
pub const BOOKMARK_INTERVAL: Duration = Duration::from_secs(5);

/// `--min-request-timeout`'s default, kube-apiserver's and yurthub's (1800 s): a watch without
/// `timeoutSeconds` ends after a random 1x-2x of it, so that reconnects spread out.
pub const DEFAULT_MIN_REQUEST_TIMEOUT: Duration = Duration::from_secs(1800);

/// What the stream starts with.
struct Start {
    lines: Vec<Bytes>,
    /// The resourceVersion bookmarks carry.
    resource_version: String,
    /// A 410 was sent: end right after it.
    expired: bool,
}

/// Where an offline watch reads from: the cache (through the list memo) and the node's own
/// reports laid over it.
pub struct Source<'a> {
    pub lists: &'a ListMemo,
    pub store: &'a Arc<dyn Store>,
    pub overlay: &'a Arc<Overlay>,
}

/// Serves an offline WATCH of `scope`; `online` ends it when the cloud is back.
pub async fn serve(
    source: Source<'_>,
    scope: Scope,
    info: &RequestInfo,
    online: watch::Receiver<bool>,
    min_request_timeout: Duration,
) -> Result<Response<ProxyBody>, ProxyError> {
    let Source {
        lists,
        store,
        overlay,
    } = source;
    let q = &info.query;
    let from = q.resource_version.clone().filter(|rv| rv != "0");
    let initial_events = q.send_initial_events.unwrap_or(from.is_none());
    let kind;
    let mut reported = Reported::new(overlay.clone(), store.clone(), scope.clone());
    let start = if initial_events {
        let (covered, _) = lists.covered(store, scope.clone()).await?;
        let list = &covered.result;
        kind = covered.kind.clone();
        let rv = list.resource_version.as_str().to_owned();
        let mut lines: Vec<Bytes> = list
            .items
            .iter()
            .map(|o| event_line(EventType::Added, &reported.overlaid(&o.bytes)))
            .collect();
        if q.send_initial_events == Some(true) && q.allow_watch_bookmarks {
            lines.push(bookmark(&kind, &rv, true));
        }
        Start {
            lines,
            resource_version: rv,
            expired: false,
        }
    } else {
        let from = from.unwrap_or_default();
        kind = resolve_kind(store, &scope.gvr, None).await?;
        replay(store, scope, from, &mut reported).await?
    };
    let timeout = watch_timeout(info, min_request_timeout);
    let (tx, rx) = mpsc::channel(64);
    let bookmarks = q.allow_watch_bookmarks;
    tokio::spawn(stream(
        start, kind, bookmarks, timeout, online, reported, tx,
    ));
    Ok(streamed(rx))
}

/// An offline watch's view of the node's reports ([`Overlay`]): what it sent, and where to
/// read its scope again when they change.
struct Reported {
    sent: Sent,
    store: Arc<dyn Store>,
    scope: Scope,
    /// Until the reports are gone (the hub stops).
    open: bool,
}

impl Reported {
    fn new(overlay: Arc<Overlay>, store: Arc<dyn Store>, scope: Scope) -> Reported {
        Reported {
            sent: Sent::new(overlay, scope.gvr.clone()),
            store,
            scope,
            open: true,
        }
    }

    fn overlaid(&mut self, object: &Bytes) -> Bytes {
        match object_name(object) {
            Some(key) => self.sent.overlaid(key, object),
            None => object.clone(),
        }
    }

    /// The MODIFIED lines a change of the reports makes for this watch's scope.
    async fn modified(&mut self) -> Vec<Bytes> {
        let scope = self.scope.clone();
        let Ok(Some(list)) = blocking(&self.store, move |s| s.list(&scope)).await else {
            return Vec::new();
        };
        let objects = list
            .items
            .iter()
            .filter_map(|item| Some((object_name(&item.bytes)?, &item.bytes)));
        self.sent.modified(objects)
    }
}

/// (namespace, name) of an object, read no deeper than its identity.
pub(crate) fn object_name(object: &[u8]) -> Option<(String, String)> {
    let meta = ObjectMeta::peek(object).ok()?;
    (!meta.name.is_empty()).then(|| (meta.namespace.into_owned(), meta.name.into_owned()))
}

/// How long a watch served by the hub lasts: `timeoutSeconds`, or 1x-2x `min_request_timeout`.
pub(crate) fn watch_timeout(info: &RequestInfo, min_request_timeout: Duration) -> Duration {
    info.query
        .timeout_seconds
        .filter(|&s| s > 0)
        .map_or_else(|| default_timeout(min_request_timeout), Duration::from_secs)
}

/// A watch response whose lines come from `lines`, as a task sends them.
pub(crate) fn streamed(lines: mpsc::Receiver<Bytes>) -> Response<ProxyBody> {
    let frames = futures_util::stream::unfold(lines, |mut rx| async move {
        let line = rx.recv().await?;
        Some((Ok::<_, BoxError>(Frame::data(line)), rx))
    });
    offline::cache_response(StreamBody::new(frames).boxed(), "application/json")
}

async fn replay(
    store: &Arc<dyn Store>,
    scope: Scope,
    from: String,
    reported: &mut Reported,
) -> Result<Start, ProxyError> {
    let since = from.clone();
    let query = scope.clone();
    let replayed = blocking(store, move |s| match s.events_since(&query, &since) {
        Ok(events) => Ok(Ok(events)),
        Err(ReplayError::TooOld(too_old)) => Ok(Err(Err(too_old))),
        Err(ReplayError::Missed(reason)) => Ok(Err(Ok(reason))),
        Err(ReplayError::Cache(e)) => Err::<_, CacheError>(e),
    })
    .await?;
    Ok(match replayed {
        Ok(events) => Start {
            resource_version: events
                .last()
                .map_or(from, |e| e.resource_version.as_str().to_owned()),
            lines: events
                .iter()
                .map(|e| event_line(e.event_type, &reported.overlaid(&e.object)))
                .collect(),
            expired: false,
        },
        Err(Ok(missed)) => return Err(offline::missed_events(&scope, &missed)),
        Err(Err(too_old)) => Start {
            lines: vec![expired_line(&from, &too_old.to_string())],
            resource_version: from,
            expired: true,
        },
    })
}

async fn stream(
    start: Start,
    kind: KindInfo,
    bookmarks: bool,
    timeout: Duration,
    mut online: watch::Receiver<bool>,
    mut reported: Reported,
    tx: mpsc::Sender<Bytes>,
) {
    for line in start.lines {
        if tx.send(line).await.is_err() {
            return;
        }
    }
    if start.expired {
        return;
    }
    let deadline = tokio::time::sleep(timeout);
    tokio::pin!(deadline);
    let mut tick = bookmark_ticks();
    loop {
        tokio::select! {
            _ = &mut deadline => return,
            () = until_online(&mut online) => return,
            _ = tx.closed() => return,
            changed = reported.sent.changes.changed(), if reported.open => {
                if changed.is_err() {
                    reported.open = false;
                    continue;
                }
                for line in reported.modified().await {
                    if tx.send(line).await.is_err() {
                        return;
                    }
                }
            }
            _ = tick.tick(), if bookmarks => {
                if tx.send(bookmark(&kind, &start.resource_version, false)).await.is_err() {
                    return;
                }
            }
        }
    }
}

/// Ticks every [`BOOKMARK_INTERVAL`], the first one interval from now.
pub(crate) fn bookmark_ticks() -> tokio::time::Interval {
    tokio::time::interval_at(
        tokio::time::Instant::now() + BOOKMARK_INTERVAL,
        BOOKMARK_INTERVAL,
    )
}

async fn until_online(online: &mut watch::Receiver<bool>) {
    if online.wait_for(|up| *up).await.is_err() {
        // The hub is shutting down: its state will never change again.
        std::future::pending::<()>().await;
    }
}

/// A BOOKMARK of `kind` at `rv` ([`bookmark_line`]).
pub(crate) fn bookmark(kind: &KindInfo, rv: &str, initial_events_end: bool) -> Bytes {
    bookmark_line(&kind.kind, &kind.api_version, rv, initial_events_end)
}

fn expired_line(from: &str, detail: &str) -> Bytes {
    let status = Status::expired(format!(
        "too old resource version: {from} (the edge cache cannot replay from it: {detail})"
    ));
    event_line(EventType::Error, &status.to_json())
}

fn default_timeout(min: Duration) -> Duration {
    let jitter = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::from(d.subsec_nanos()));
    let min_ms = u64::try_from(min.as_millis()).unwrap_or(u64::MAX).max(1);
    min + Duration::from_millis(jitter % min_ms)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    #[test]
    fn lines_have_the_apiserver_shape() {
        let kind = KindInfo::from_list("PodList", "v1").unwrap();
        let b: Value = serde_json::from_slice(&bookmark(&kind, "77", true)).unwrap();
        assert_eq!(b["type"], "BOOKMARK");
        assert_eq!(b["object"]["kind"], "Pod");
        assert_eq!(b["object"]["metadata"]["resourceVersion"], "77");
        assert_eq!(
            b["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"],
            "true"
        );
        let e: Value = serde_json::from_slice(&expired_line("5", "trimmed")).unwrap();
        assert_eq!(e["type"], "ERROR");
        assert_eq!(e["object"]["code"], 410);
        assert_eq!(e["object"]["reason"], "Expired");
        assert!(event_line(EventType::Added, b"{}").ends_with(b"}\n"));
        for min in [DEFAULT_MIN_REQUEST_TIMEOUT, Duration::from_secs(2)] {
            let t = default_timeout(min);
            assert!(t >= min && t < 2 * min, "{min:?}: {t:?}");
        }
    }
}
