//! The cache writer: one dedicated thread that applies what the tees collected, in order.
//!
//! Responses are handed over whole (a GET or LIST body) or line by line (watch events) through a
//! bounded queue, and parsed here, off the request path. When the queue is full the tee gives up
//! on that response rather than slow the client down (see `tee`); what was queued is applied in
//! the order it arrived, so a LIST always lands before the watch that follows it.
//!
//! Nothing that does not parse is cached: a body that is not the expected JSON (a `Status`, a
//! truncated stream, a protobuf body) is counted in `outpost_cache_writes_total{outcome="invalid"}`
//! and dropped; the client already received it unchanged.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};

use bytes::Bytes;
use outpost_cache::{CacheError, EventType, Gvr, ObjectKey, Scope, Store, WriteOutcome};
use serde::Deserialize;
use serde_json::value::RawValue;
use tracing::{debug, warn};

use super::kinds::{self, KindInfo};
use super::offline;
use crate::metrics::Metrics;

/// Operations queued between a tee and the writer thread.
#[derive(Debug)]
pub enum CacheOp {
    /// A GET's 2xx body.
    Object { key: ObjectKey, body: Bytes },
    /// A GET answered 404: the object no longer exists.
    Gone { key: ObjectKey },
    /// A complete LIST body: replaces the scope.
    List { scope: Scope, body: Bytes },
    /// One line of a watch stream.
    Event { scope: Scope, line: Bytes },
    /// A discovery response body and its content type.
    Document {
        name: String,
        content_type: String,
        body: Bytes,
    },
}

impl CacheOp {
    fn label(&self) -> &'static str {
        match self {
            CacheOp::Object { .. } => "object",
            CacheOp::Gone { .. } => "gone",
            CacheOp::List { .. } => "list",
            CacheOp::Event { .. } => "event",
            CacheOp::Document { .. } => "document",
        }
    }
}

/// The sending side, shared by every tee.
#[derive(Clone)]
pub struct Writer {
    tx: SyncSender<CacheOp>,
    metrics: Metrics,
}

/// Operations queued before tees start dropping: a burst of watch events or a few relists.
const QUEUE_DEPTH: usize = 4096;

impl Writer {
    /// Starts the writer thread over `store`. The thread ends when every `Writer` is dropped.
    /// `volatile`: the store keeps nothing across a restart (the disk cache could not be
    /// opened), so the cache counts as degraded whatever the store says.
    pub fn start(
        store: Arc<dyn Store>,
        metrics: Metrics,
        volatile: bool,
    ) -> std::io::Result<Writer> {
        let (tx, rx) = sync_channel(QUEUE_DEPTH);
        let thread_metrics = metrics.clone();
        thread_metrics.cache_degraded.set(i64::from(volatile));
        std::thread::Builder::new()
            .name("outpost-cache-writer".into())
            .spawn(move || run(store.as_ref(), &rx, &thread_metrics, volatile))?;
        Ok(Writer { tx, metrics })
    }

    /// Queues `op`; `false` when the queue is full or the writer is gone (the op is dropped).
    pub fn submit(&self, op: CacheOp) -> bool {
        let label = op.label();
        match self.tx.try_send(op) {
            Ok(()) => true,
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                self.metrics.cache_dropped.with_label_values(&[label]).inc();
                false
            }
        }
    }
}

fn run(store: &dyn Store, rx: &Receiver<CacheOp>, metrics: &Metrics, volatile: bool) {
    let mut known_kinds: HashMap<Gvr, KindInfo> = HashMap::new();
    for op in rx {
        let label = op.label();
        let outcome = match apply(store, op, &mut known_kinds) {
            Ok(outcome) => outcome,
            Err(ApplyError::Invalid(reason)) => {
                debug!(op = label, reason, "response not cached");
                "invalid"
            }
            Err(ApplyError::Store(e)) => {
                warn!(op = label, error = %e, "cache write failed");
                "error"
            }
        };
        metrics
            .cache_writes
            .with_label_values(&[label, outcome])
            .inc();
        metrics
            .cache_degraded
            .set(i64::from(volatile || store.health().degraded));
    }
    if let Err(e) = store.flush() {
        warn!(error = %e, "final cache flush failed");
    }
}

enum ApplyError {
    /// The bytes are not what the cache stores; nothing was written.
    Invalid(String),
    Store(CacheError),
}

impl From<CacheError> for ApplyError {
    fn from(e: CacheError) -> Self {
        match e {
            CacheError::InvalidObject(reason) => ApplyError::Invalid(reason),
            other => ApplyError::Store(other),
        }
    }
}

type Applied = Result<&'static str, ApplyError>;

fn apply(store: &dyn Store, op: CacheOp, kinds: &mut HashMap<Gvr, KindInfo>) -> Applied {
    match op {
        CacheOp::Object { key, body } => apply_object(store, &key, &body, kinds),
        CacheOp::Gone { key } => Ok(if store.delete_object(&key)? {
            "deleted"
        } else {
            "absent"
        }),
        CacheOp::List { scope, body } => apply_list(store, &scope, &body, kinds),
        CacheOp::Event { scope, line } => apply_event(store, &scope, &line),
        CacheOp::Document {
            name,
            content_type,
            body,
        } => {
            serde_json::from_slice::<&RawValue>(&body)
                .map_err(|e| ApplyError::Invalid(format!("discovery body: {e}")))?;
            store.put_document(&name, &offline::discovery_document(&content_type, &body))?;
            Ok("stored")
        }
    }
}

fn apply_object(
    store: &dyn Store,
    key: &ObjectKey,
    body: &[u8],
    kinds: &mut HashMap<Gvr, KindInfo>,
) -> Applied {
    let kind = KindInfo::from_object(body)
        .ok_or_else(|| ApplyError::Invalid("object without kind/apiVersion".into()))?;
    if kind.kind == "Status" || kind.kind.ends_with("List") {
        return Err(ApplyError::Invalid(format!(
            "a {} is not an object",
            kind.kind
        )));
    }
    remember_kind(store, &key.gvr, kind, kinds)?;
    Ok(outcome_label(&store.put_object(
        &key.component,
        &key.gvr,
        body,
    )?))
}

#[derive(Deserialize)]
struct ListBody<'a> {
    kind: String,
    #[serde(rename = "apiVersion")]
    api_version: String,
    #[serde(default)]
    metadata: ListMeta,
    #[serde(borrow, default)]
    items: Option<Vec<&'a RawValue>>,
}

#[derive(Deserialize, Default)]
struct ListMeta {
    #[serde(default, rename = "resourceVersion")]
    resource_version: String,
    #[serde(default, rename = "continue")]
    continue_token: String,
}

fn apply_list(
    store: &dyn Store,
    scope: &Scope,
    body: &[u8],
    kinds: &mut HashMap<Gvr, KindInfo>,
) -> Applied {
    let list: ListBody<'_> =
        serde_json::from_slice(body).map_err(|e| ApplyError::Invalid(format!("list body: {e}")))?;
    let kind = KindInfo::from_list(&list.kind, &list.api_version)
        .ok_or_else(|| ApplyError::Invalid(format!("a {} is not a list", list.kind)))?;
    if !list.metadata.continue_token.is_empty() {
        // One page of a chunked list cannot replace a scope; the full list will.
        return Ok("partial");
    }
    if list.metadata.resource_version.is_empty() {
        return Err(ApplyError::Invalid("list without resourceVersion".into()));
    }
    let items: Vec<_> = list
        .items
        .unwrap_or_default()
        .into_iter()
        .map(|raw| kinds::with_type_meta(raw.get().as_bytes(), &kind))
        .collect();
    let item_refs: Vec<&[u8]> = items.iter().map(AsRef::as_ref).collect();
    remember_kind(store, &scope.gvr, kind, kinds)?;
    store.replace_scope(scope, &list.metadata.resource_version, &item_refs)?;
    Ok("replaced")
}

#[derive(Deserialize)]
struct EventLine<'a> {
    #[serde(rename = "type")]
    event_type: String,
    #[serde(borrow)]
    object: &'a RawValue,
}

fn apply_event(store: &dyn Store, scope: &Scope, line: &[u8]) -> Applied {
    let event: EventLine<'_> = serde_json::from_slice(line)
        .map_err(|e| ApplyError::Invalid(format!("watch event: {e}")))?;
    if event.event_type == "ERROR" {
        // A 410 or other error ends the stream; the client relists and the list replaces the scope.
        return Ok("error_event");
    }
    let event_type: EventType = event.event_type.parse().map_err(ApplyError::Invalid)?;
    let outcome = store.apply_event(scope, event_type, event.object.get().as_bytes())?;
    Ok(outcome_label(&outcome))
}

/// Records a resource's kind once per process (and so once on disk).
fn remember_kind(
    store: &dyn Store,
    gvr: &Gvr,
    kind: KindInfo,
    kinds: &mut HashMap<Gvr, KindInfo>,
) -> Result<(), ApplyError> {
    if kinds.get(gvr) == Some(&kind) {
        return Ok(());
    }
    let doc = serde_json::to_vec(&kind).expect("a KindInfo serializes");
    store.put_document(&kinds::document_name(gvr), &doc)?;
    kinds.insert(gvr.clone(), kind);
    Ok(())
}

fn outcome_label(outcome: &WriteOutcome) -> &'static str {
    match outcome {
        WriteOutcome::Stored => "stored",
        WriteOutcome::Deleted => "deleted",
        WriteOutcome::KeptNewer { .. } => "kept_newer",
        WriteOutcome::Bookmarked => "bookmarked",
        WriteOutcome::ScopeUnknown => "scope_unknown",
        WriteOutcome::Unchanged => "unchanged",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use outpost_cache::{Lookup, MemStore};
    use serde_json::Value;

    fn pods() -> Gvr {
        Gvr::new("", "v1", "pods")
    }

    fn scope() -> Scope {
        Scope::unfiltered("kubelet", &pods(), None)
    }

    fn apply_all(store: &MemStore, ops: Vec<CacheOp>) -> Vec<&'static str> {
        let mut kinds = HashMap::new();
        ops.into_iter()
            .map(|op| match apply(store, op, &mut kinds) {
                Ok(o) => o,
                Err(ApplyError::Invalid(_)) => "invalid",
                Err(ApplyError::Store(e)) => panic!("{e}"),
            })
            .collect()
    }

    const LIST: &str = r#"{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"10"},"items":[{"metadata":{"name":"a","namespace":"d","resourceVersion":"9","uid":"u1"}}]}"#;

    #[test]
    fn a_list_then_events_build_the_scope() {
        let store = MemStore::new();
        let added = r#"{"type":"ADDED","object":{"kind":"Pod","apiVersion":"v1","metadata":{"name":"b","namespace":"d","resourceVersion":"11","uid":"u2"}}}"#;
        let outcomes = apply_all(
            &store,
            vec![
                CacheOp::List {
                    scope: scope(),
                    body: Bytes::from_static(LIST.as_bytes()),
                },
                CacheOp::Event {
                    scope: scope(),
                    line: Bytes::from_static(added.as_bytes()),
                },
            ],
        );
        assert_eq!(outcomes, ["replaced", "stored"]);
        let Lookup::Found(a) = store
            .get(&ObjectKey::new("kubelet", &pods(), "d", "a"))
            .unwrap()
        else {
            panic!("a is cached");
        };
        let a: Value = serde_json::from_slice(&a.bytes).unwrap();
        assert_eq!(a["kind"], "Pod", "list items are stored as whole objects");
        let list = store.list(&scope()).unwrap().unwrap();
        assert_eq!(list.items.len(), 2);
        assert_eq!(list.resource_version.as_str(), "11");
        let kind = store.get_document("kinds/pods.v1.core").unwrap().unwrap();
        assert_eq!(
            serde_json::from_slice::<KindInfo>(&kind).unwrap().kind,
            "Pod"
        );
    }

    #[test]
    fn what_does_not_parse_is_not_cached() {
        let store = MemStore::new();
        let status = r#"{"kind":"Status","apiVersion":"v1","status":"Failure","code":500}"#;
        let outcomes = apply_all(
            &store,
            vec![
                CacheOp::List {
                    scope: scope(),
                    body: Bytes::from_static(b"{\"kind\":\"PodList\",\"items\":[{"),
                },
                CacheOp::List {
                    scope: scope(),
                    body: Bytes::from_static(status.as_bytes()),
                },
                CacheOp::Object {
                    key: ObjectKey::new("kubelet", &pods(), "d", "a"),
                    body: Bytes::from_static(status.as_bytes()),
                },
                CacheOp::Event {
                    scope: scope(),
                    line: Bytes::from_static(b"\x08\x01k8s protobuf"),
                },
                CacheOp::Document {
                    name: "discovery/x".into(),
                    content_type: "application/json".into(),
                    body: Bytes::from_static(b"<html>"),
                },
            ],
        );
        assert_eq!(outcomes, ["invalid"; 5]);
        assert!(store.list(&scope()).unwrap().is_none());
        assert!(store.get_document("discovery/x").unwrap().is_none());
    }

    #[test]
    fn paged_lists_do_not_replace_scopes() {
        let store = MemStore::new();
        let page = LIST.replace(
            r#""resourceVersion":"10"}"#,
            r#""resourceVersion":"10","continue":"abc"}"#,
        );
        let outcomes = apply_all(
            &store,
            vec![CacheOp::List {
                scope: scope(),
                body: Bytes::from(page),
            }],
        );
        assert_eq!(outcomes, ["partial"]);
        assert!(store.list(&scope()).unwrap().is_none());
    }

    #[test]
    fn a_404_forgets_the_object() {
        let store = MemStore::new();
        let key = ObjectKey::new("kubelet", &pods(), "d", "a");
        let outcomes = apply_all(
            &store,
            vec![
                CacheOp::Object {
                    key: key.clone(),
                    body: Bytes::from_static(
                        br#"{"kind":"Pod","apiVersion":"v1","metadata":{"name":"a","namespace":"d","resourceVersion":"3"}}"#,
                    ),
                },
                CacheOp::Gone { key: key.clone() },
                CacheOp::Gone { key: key.clone() },
            ],
        );
        assert_eq!(outcomes, ["stored", "deleted", "absent"]);
        assert_eq!(store.get(&key).unwrap(), Lookup::NotCached);
    }
}
