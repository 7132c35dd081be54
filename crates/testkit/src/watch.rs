//! WATCH: a chunked `application/json` stream, one `{"type":…,"object":…}` line per event.
//!
//! The stream is a lazily polled body (no spawned task), so it ends exactly when hyper drops it:
//! client disconnect, `timeoutSeconds`, server shutdown. Semantics follow the watch cache:
//! - initial state as `ADDED` events when `sendInitialEvents=true` (which `SetListOptionsDefaults`
//!   turns on for a watch with no / `0` resourceVersion), then, with `allowWatchBookmarks`, a
//!   `BOOKMARK` annotated `k8s.io/initial-events-end`;
//! - resuming from `resourceVersion=N` replays the event log; if `N` fell out of the window the
//!   stream is a single `ERROR` event carrying a 410 `Expired` Status, then ends;
//! - selectors apply to transitions: an object that stops matching is `DELETED` (its previous
//!   state at the new resourceVersion), one that starts matching is `ADDED`;
//! - periodic bookmarks every `bookmark_interval`;
//! - `cut_watches` makes the body fail, so the connection drops without the final chunk.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::stream;
use http::{HeaderValue, Response, header};
use http_body::Frame;
use http_body_util::{BodyExt, StreamBody};
use outpost_core::Status;
use outpost_core::selector::FieldSelector;
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio::time::{Instant, Interval, MissedTickBehavior};

use crate::handlers::{Target, parse_rv, wait_for_rv};
use crate::query::ListOptions;
use crate::registry::typed;
use crate::reply::{ApiError, Body, BoxError};
use crate::resources::ResourceDef;
use crate::state::Shared;
use crate::store::{Event, EventType, set_resource_version};

/// Base64 of `{"kind":"PodList","apiVersion":"v1","metadata":{},"items":null}\n` for pods, etc.
fn list_blueprint(def: &ResourceDef) -> String {
    use base64::Engine;
    let blueprint = format!(
        "{{\"kind\":\"{}\",\"apiVersion\":\"{}\",\"metadata\":{{}},\"items\":null}}\n",
        def.list_kind(),
        def.api_version()
    );
    base64::engine::general_purpose::STANDARD.encode(blueprint)
}

fn line(kind: &str, object: &Value) -> Bytes {
    let mut out = format!("{{\"type\":\"{kind}\",\"object\":").into_bytes();
    out.extend(serde_json::to_vec(object).unwrap_or_default());
    out.extend_from_slice(b"}\n");
    Bytes::from(out)
}

fn bookmark(def: &ResourceDef, rv: u64, initial_events_end: bool) -> Bytes {
    let mut obj = def.bookmark_object(rv);
    if initial_events_end {
        obj["metadata"]["annotations"] = json!({
            "k8s.io/initial-events-end": "true",
            "kubernetes.io/initial-events-list-blueprint": list_blueprint(def),
        });
    }
    line("BOOKMARK", &obj)
}

/// Everything one open watch needs between polls.
struct WatchStream {
    shared: Arc<Shared>,
    def: &'static ResourceDef,
    prefix: String,
    options: ListOptions,
    /// Every event with `rv <= cursor` has been considered.
    cursor: u64,
    queue: VecDeque<Bytes>,
    changes: watch::Receiver<u64>,
    cut: watch::Receiver<u64>,
    blackhole: watch::Receiver<bool>,
    bookmarks: Option<Interval>,
    deadline: Option<Instant>,
    finished: bool,
}

/// What one step of the stream produced.
enum Step {
    Data(Bytes),
    Abort,
    End,
}

impl WatchStream {
    fn matches(&self, obj: &Value) -> bool {
        self.options.filter(self.def).matches(obj)
    }

    /// The cacher's `convertToWatchEvent`: selector transitions become ADDED / DELETED.
    fn convert(&self, ev: &Event) -> Option<Bytes> {
        if !ev.key.starts_with(&self.prefix) {
            return None;
        }
        let now = ev.kind != EventType::Deleted && self.matches(&ev.object);
        let before = ev.prev.as_ref().is_some_and(|p| self.matches(p));
        let (kind, mut obj) = match (now, before) {
            (true, false) => ("ADDED", (*ev.object).clone()),
            (true, true) => ("MODIFIED", (*ev.object).clone()),
            (false, true) => ("DELETED", (**ev.prev.as_ref()?).clone()),
            (false, false) => return None,
        };
        set_resource_version(&mut obj, ev.rv);
        Some(line(kind, &typed(self.def, &obj)))
    }

    /// Queues the initial state and, if asked, the initial-events-end bookmark.
    fn queue_initial_state(&mut self) {
        let (rv, items) = self.shared.store.list(self.def, &self.prefix);
        for (_, obj) in &items {
            if self.matches(obj) {
                self.queue.push_back(line("ADDED", &typed(self.def, obj)));
            }
        }
        self.cursor = rv;
        if self.options.allow_watch_bookmarks {
            self.queue.push_back(bookmark(self.def, rv, true));
        }
    }

    /// Pulls new events from the log; an evicted cursor ends the watch with a 410.
    fn pull(&mut self) {
        match self.shared.store.events_since(self.def, self.cursor) {
            Ok((events, rv)) => {
                for ev in &events {
                    if let Some(b) = self.convert(ev) {
                        self.queue.push_back(b);
                    }
                }
                self.cursor = self.cursor.max(rv);
            }
            Err(too_old) => {
                self.queue
                    .push_back(expired_event(self.cursor, too_old.oldest));
                self.finished = true;
            }
        }
    }

    async fn next_step(&mut self) -> Step {
        loop {
            if let Some(b) = self.queue.pop_front() {
                return Step::Data(b);
            }
            if self.finished {
                return Step::End;
            }
            if let Some(step) = self.wait().await {
                return step;
            }
        }
    }

    /// Waits for the next thing to do; `Some` ends or aborts the stream.
    async fn wait(&mut self) -> Option<Step> {
        let deadline = self.deadline;
        let bookmarks_on = self.bookmarks.is_some();
        let blackholed = *self.blackhole.borrow_and_update();
        // Biased: a cut or a blackhole flip that raced with a write must win over the write.
        tokio::select! {
            biased;
            _ = self.cut.changed() => return Some(Step::Abort),
            _ = self.blackhole.changed() => {}
            _ = sleep_until_opt(deadline), if !blackholed => self.finished = true,
            _ = self.changes.changed(), if !blackholed => self.pull(),
            _ = tick(&mut self.bookmarks), if bookmarks_on && !blackholed => {
                self.pull();
                if !self.finished {
                    self.queue.push_back(bookmark(self.def, self.cursor, false));
                }
            }
        }
        None
    }
}

async fn sleep_until_opt(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

async fn tick(interval: &mut Option<Interval>) {
    match interval {
        Some(i) => {
            i.tick().await;
        }
        None => std::future::pending().await,
    }
}

/// The `ERROR` event for a resourceVersion older than the event window.
fn expired_event(requested: u64, oldest: u64) -> Bytes {
    let status = Status::expired(format!("too old resource version: {requested} ({oldest})"));
    line("ERROR", &status.to_value())
}

/// Validates, resolves the starting point and returns the streaming 200 response.
pub async fn watch(
    shared: Arc<Shared>,
    t: Target<'_>,
    mut options: ListOptions,
) -> Result<Response<Body>, ApiError> {
    options.apply_defaults();
    options.validate()?;
    options.check_fields(t.def)?;
    if !t.name.is_empty() {
        options.field_selector = with_name(&options.field_selector, t.name)?;
    }
    let requested = match options.resource_version.as_str() {
        "" | "0" => None,
        rv => Some(parse_rv(rv)?),
    };
    if let Some(rv) = requested {
        wait_for_rv(&shared.store, rv).await?;
    }
    let stream = open(shared, t, options, requested);
    Ok(streaming_response(stream))
}

/// A legacy `/watch/.../<name>` watch is a watch with a `metadata.name` field selector.
fn with_name(existing: &FieldSelector, name: &str) -> Result<FieldSelector, ApiError> {
    let escaped: String = name
        .chars()
        .flat_map(|c| match c {
            '\\' | ',' | '=' => vec!['\\', c],
            _ => vec![c],
        })
        .collect();
    let joined = match existing.to_string() {
        s if s.is_empty() => format!("metadata.name={escaped}"),
        s => format!("{s},metadata.name={escaped}"),
    };
    FieldSelector::parse(&joined).map_err(|e| Status::bad_request(e.0).into())
}

fn open(
    shared: Arc<Shared>,
    t: Target<'_>,
    options: ListOptions,
    requested: Option<u64>,
) -> WatchStream {
    let interval = shared
        .config
        .bookmark_interval
        .max(Duration::from_millis(10));
    let bookmarks = options.allow_watch_bookmarks.then(|| {
        let mut i = tokio::time::interval_at(Instant::now() + interval, interval);
        i.set_missed_tick_behavior(MissedTickBehavior::Delay);
        i
    });
    let deadline = options
        .timeout_seconds
        .filter(|s| *s > 0)
        .map(|s| Instant::now() + Duration::from_secs(s));
    let prefix = match t.namespace {
        Some(ns) if t.def.namespaced => format!("{ns}/"),
        _ => String::new(),
    };
    let initial = options.send_initial_events == Some(true);
    let mut w = WatchStream {
        changes: shared.store.subscribe(),
        cut: shared.cut.subscribe(),
        blackhole: shared.faults.blackhole_signal(),
        cursor: shared.store.current_rv(),
        shared,
        def: t.def,
        prefix,
        options,
        queue: VecDeque::new(),
        bookmarks,
        deadline,
        finished: false,
    };
    if initial {
        w.queue_initial_state();
    } else if let Some(rv) = requested {
        w.cursor = rv;
        w.pull();
    }
    w
}

fn streaming_response(w: WatchStream) -> Response<Body> {
    let frames = stream::unfold(w, |mut w| async move {
        match w.next_step().await {
            Step::Data(b) => Some((Ok::<_, BoxError>(Frame::data(b)), w)),
            Step::Abort => Some((Err("watch stream cut".into()), w.into_finished())),
            Step::End => None,
        }
    });
    let mut resp = Response::new(StreamBody::new(frames).boxed());
    let headers = resp.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    headers.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("no-cache, private"),
    );
    resp
}

impl WatchStream {
    /// After an abort the stream must not produce anything else.
    fn into_finished(mut self) -> Self {
        self.queue.clear();
        self.finished = true;
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::by_gvr;

    #[test]
    fn bookmark_lines_match_the_recorded_fixture() {
        let fixture = include_str!("../fixtures/watch-list-pods.jsonl");
        let recorded: Value = serde_json::from_str(fixture.lines().last().unwrap()).unwrap();
        let pods = by_gvr("v1/pods").unwrap();
        let ours: Value = serde_json::from_slice(&bookmark(pods, 498, true)).unwrap();
        assert_eq!(ours, recorded);
    }

    #[test]
    fn expired_event_carries_a_410_status() {
        let ev: Value = serde_json::from_slice(&expired_event(5, 9)).unwrap();
        assert_eq!(ev["type"], "ERROR");
        assert_eq!(ev["object"]["code"], 410);
        assert_eq!(ev["object"]["reason"], "Expired");
        assert_eq!(ev["object"]["message"], "too old resource version: 5 (9)");
    }

    #[test]
    fn named_watch_adds_a_name_selector() {
        let base = FieldSelector::parse("spec.nodeName=n").unwrap();
        let sel = with_name(&base, "a,b").unwrap();
        assert_eq!(sel.requires_exact_match("metadata.name"), Some("a,b"));
        assert_eq!(sel.requires_exact_match("spec.nodeName"), Some("n"));
    }
}
