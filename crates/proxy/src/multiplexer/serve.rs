//! LIST and WATCH answers from a [`Shared`] store, in the apiserver's shapes: a `XxxList` with
//! the store's resourceVersion, and a watch stream of `ADDED`/`MODIFIED`/`DELETED` lines with
//! `BOOKMARK`s when asked for, ended by `timeoutSeconds`, by a relist, or (for a watch served
//! while the feed was interrupted) by the cloud's return.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::Response;
use http::header::HeaderValue;
use outpost_core::RequestInfo;
use outpost_core::wire::{ListMeta, list_chunks, list_head};
use tokio::sync::{broadcast, mpsc, watch};

use super::store::{Item, OpenedWatch, Selection, Shared, Snapshot, WatchFrom};
use crate::body::ProxyBody;
use crate::edge::offline;
use crate::edge::overlay::Sent;
use crate::edge::watch::{bookmark, bookmark_ticks, event_line, streamed, watch_timeout};
use crate::headers::SERVED_FROM;

/// The [`SERVED_FROM`] mark of these answers.
const SHARED_CACHE: HeaderValue = HeaderValue::from_static("shared-cache");

/// Where a LIST or WATCH with these query options may be answered from the store; `None`
/// sends it upstream (a `continue` token, an exact or unreadable resourceVersion).
pub fn list_from(info: &RequestInfo) -> Option<u64> {
    let q = &info.query;
    if q.continue_token.as_deref().is_some_and(|t| !t.is_empty())
        || q.resource_version_match.as_deref() == Some("Exact")
    {
        return None;
    }
    // "" is answered like "0", as yurthub's multiplexer does; a version is "not older than".
    match q.resource_version.as_deref() {
        None | Some("") | Some("0") => Some(0),
        Some(rv) => rv.parse().ok(),
    }
}

pub fn watch_from(info: &RequestInfo) -> Option<WatchFrom> {
    let q = &info.query;
    let rv = match q.resource_version.as_deref() {
        None | Some("") | Some("0") => None,
        Some(rv) => Some(rv.parse::<u64>().ok()?),
    };
    Some(match (q.send_initial_events, rv) {
        (Some(true), rv) => WatchFrom::Current {
            not_older_than: rv.unwrap_or(0),
        },
        (None, None) => WatchFrom::Current { not_older_than: 0 },
        (_, Some(rv)) => WatchFrom::After(rv),
        (Some(false), None) => return None,
    })
}

/// A LIST body: the items as stored (with the node's reports, offline), in key order, as one
/// response in pieces.
pub fn list_response(snapshot: Snapshot, mut reports: Option<Sent>) -> Response<ProxyBody> {
    let metadata = ListMeta {
        resource_version: snapshot.resource_version.to_string(),
        ..ListMeta::default()
    };
    let head = list_head(
        &snapshot.kind.list_kind(),
        &snapshot.kind.api_version,
        &metadata,
    );
    let items = snapshot.items.iter().map(|item| match &mut reports {
        Some(reports) => reports.overlaid(item_key(item), &item.bytes),
        None => item.bytes.clone(),
    });
    marked(offline::json_response_in_pieces(list_chunks(head, items)))
}

fn item_key(item: &Item) -> (String, String) {
    (item.namespace.clone(), item.name.clone())
}

/// A WATCH stream from an opened watch; `online` ends a watch served while the feed was
/// interrupted, and with it come the node's reports it sees meanwhile.
pub fn watch_response(
    shared: Arc<Shared>,
    opened: OpenedWatch,
    selection: Selection,
    info: &RequestInfo,
    (online, reports): (watch::Receiver<bool>, Option<Sent>),
    min_request_timeout: Duration,
) -> Response<ProxyBody> {
    let q = &info.query;
    let watcher = Watcher {
        shared,
        selection,
        bookmarks: q.allow_watch_bookmarks,
        initial_events_end: q.allow_watch_bookmarks && q.send_initial_events == Some(true),
        reports: reports.filter(|_| !opened.live),
    };
    let (tx, rx) = mpsc::channel(64);
    let timeout = watch_timeout(info, min_request_timeout);
    tokio::spawn(watcher.run(opened, timeout, online, tx));
    marked(streamed(rx))
}

fn marked(mut resp: Response<ProxyBody>) -> Response<ProxyBody> {
    resp.headers_mut().insert(SERVED_FROM, SHARED_CACHE);
    resp
}

struct Watcher {
    shared: Arc<Shared>,
    selection: Selection,
    bookmarks: bool,
    initial_events_end: bool,
    /// Offline: the node's reports, as this watch sent them.
    reports: Option<Sent>,
}

impl Watcher {
    async fn run(
        mut self,
        opened: OpenedWatch,
        timeout: Duration,
        mut online: watch::Receiver<bool>,
        tx: mpsc::Sender<Bytes>,
    ) {
        let OpenedWatch {
            kind,
            initial,
            resource_version,
            mut changes,
            mut breaks,
            live,
        } = opened;
        for (event, object) in initial {
            let object = match (&mut self.reports, super::serve::object_key(&object)) {
                (Some(reports), Some(key)) => reports.overlaid(key, &object),
                _ => object,
            };
            if tx.send(event_line(event, &object)).await.is_err() {
                return;
            }
        }
        let mut sent_rv = resource_version;
        if self.initial_events_end {
            let line = bookmark(&kind, &sent_rv.to_string(), true);
            if tx.send(line).await.is_err() {
                return;
            }
        }
        breaks.mark_unchanged();
        let deadline = tokio::time::sleep(timeout);
        tokio::pin!(deadline);
        let mut tick = bookmark_ticks();
        loop {
            let lines = tokio::select! {
                _ = &mut deadline => return,
                _ = tx.closed() => return,
                _ = breaks.changed() => return,
                // A watch served while the feed was interrupted (the cloud away) ends when the
                // cloud is back, so that its client resumes against fresh data.
                _ = online.wait_for(|up| *up), if !live => return,
                change = changes.recv() => match change {
                    Ok(change) => {
                        let Some((event, object)) = change.event_for(&self.selection) else {
                            continue;
                        };
                        sent_rv = change.rv();
                        vec![event_line(event, object)]
                    }
                    // Too far behind (or the store is gone): the client resumes from what it saw.
                    Err(broadcast::error::RecvError::Lagged(_) | broadcast::error::RecvError::Closed) => return,
                },
                changed = changed_reports(&mut self.reports) => match changed {
                    Ok(()) => self.reported_changes(),
                    Err(_) => {
                        self.reports = None;
                        continue;
                    }
                },
                _ = tick.tick(), if self.bookmarks => {
                    match self.shared.bookmark_version(&changes) {
                        Some(rv) if rv > sent_rv => {
                            sent_rv = rv;
                            vec![bookmark(&kind, &rv.to_string(), false)]
                        }
                        _ => continue,
                    }
                }
            };
            for line in lines {
                if tx.send(line).await.is_err() {
                    return;
                }
            }
        }
    }
}

impl Watcher {
    /// The MODIFIED lines a change of the node's reports makes for this watch's selection.
    fn reported_changes(&mut self) -> Vec<Bytes> {
        let Some(reports) = &mut self.reports else {
            return Vec::new();
        };
        let Some(snapshot) = self.shared.list(&self.selection, 0, true) else {
            return Vec::new();
        };
        reports.modified(
            snapshot
                .items
                .iter()
                .map(|item| (item_key(item), &item.bytes)),
        )
    }
}

/// Resolves when the reports change; never, when this watch has none.
async fn changed_reports(
    reports: &mut Option<Sent>,
) -> Result<(), tokio::sync::watch::error::RecvError> {
    match reports {
        Some(reports) => reports.changes.changed().await,
        None => std::future::pending().await,
    }
}

/// (namespace, name) of an object's bytes.
pub(crate) fn object_key(object: &[u8]) -> Option<(String, String)> {
    crate::edge::watch::object_name(object)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Method;

    fn info(query: &str) -> RequestInfo {
        let url = format!("/api/v1/services?{query}");
        RequestInfo::classify(&Method::GET, &url, Some("kube-proxy/v1.32")).unwrap()
    }

    #[test]
    fn lists_from_any_version_or_one_not_newer_than_the_store() {
        assert_eq!(list_from(&info("")), Some(0));
        assert_eq!(list_from(&info("resourceVersion=0&limit=500")), Some(0));
        assert_eq!(list_from(&info("resourceVersion=")), Some(0));
        assert_eq!(list_from(&info("resourceVersion=42")), Some(42));
        assert_eq!(
            list_from(&info("resourceVersion=42&resourceVersionMatch=Exact")),
            None
        );
        assert_eq!(list_from(&info("limit=5&continue=abc")), None);
        assert_eq!(list_from(&info("resourceVersion=x")), None);
    }

    #[test]
    fn watches_start_from_the_current_state_or_after_a_version() {
        let current = |rv| Some(WatchFrom::Current { not_older_than: rv });
        assert_eq!(watch_from(&info("watch=true")), current(0));
        assert_eq!(
            watch_from(&info("watch=true&resourceVersion=0")),
            current(0)
        );
        assert_eq!(
            watch_from(&info("watch=true&resourceVersion=7")),
            Some(WatchFrom::After(7))
        );
        let initial = "watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan";
        assert_eq!(
            watch_from(&info(&format!("{initial}&resourceVersion=7"))),
            current(7)
        );
        assert_eq!(watch_from(&info("watch=true&resourceVersion=x")), None);
    }
}
