//! One pool-scope resource held in memory, as the apiserver's watch cache holds it: the objects,
//! a window of the latest changes (for watches that resume from a resourceVersion), and the live
//! changes for open watches.
//!
//! [`Feed`] is what the resource's feed ([`crate::feed`], the node agent's reflector) writes through;
//! [`Shared::list`] and [`Shared::open_watch`] are what requests read. Every change is made and
//! broadcast under one lock, so a watch opened at resourceVersion N gets exactly the changes
//! after N, none twice.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use outpost_core::selector::{FieldSelector, LabelSelector};
use outpost_core::wire::EventType;
use serde::Deserialize;
use tokio::sync::{broadcast, watch};
use tracing::warn;

use crate::edge::kinds::{self, KindCheck, KindInfo, TypeMetaHead};
use crate::feed::{Handler, ListHead};

/// Changes kept for watches that resume from a resourceVersion. A watch from before the window
/// is not answered here (its client is sent upstream, which replays or answers 410).
const WINDOW: usize = 4096;
/// Changes an open watch may fall behind by before it is ended (its client re-watches from
/// the last resourceVersion it saw, and the window replays the rest).
const BACKLOG: usize = 1024;

/// One object as stored: its bytes (with `kind` and `apiVersion`, so that they serve as a list
/// item and as a watch event alike) and what selectors read.
#[derive(Debug)]
pub struct Item {
    pub bytes: Bytes,
    pub rv: u64,
    pub namespace: String,
    pub name: String,
    labels: BTreeMap<String, String>,
    /// The resource's selectable fields beyond name and namespace (a Service's `spec.type`…).
    fields: Vec<(&'static str, String)>,
}

impl Item {
    fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    fn field(&self, field: &str) -> Option<String> {
        match field {
            "metadata.name" => Some(self.name.clone()),
            "metadata.namespace" => Some(self.namespace.clone()),
            _ => self
                .fields
                .iter()
                .find(|(f, _)| *f == field)
                .map(|(_, v)| v.clone()),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeType {
    Added,
    Modified,
    Deleted,
}

/// One change, with the object before it (what a watch with a selector needs to tell "left the
/// selection" from "never in it").
#[derive(Debug)]
pub struct Change {
    pub change: ChangeType,
    pub object: Arc<Item>,
    pub previous: Option<Arc<Item>>,
}

impl Change {
    /// The event a watch with `selection` sees, if any: an object that enters the selection is
    /// `ADDED`, one that leaves it `DELETED` (as the apiserver's watch cache does).
    pub fn event_for(&self, selection: &Selection) -> Option<(EventType, &Bytes)> {
        let now = self.change != ChangeType::Deleted && selection.matches(&self.object);
        let before = match (&self.previous, self.change) {
            (Some(previous), _) => selection.matches(previous),
            (None, ChangeType::Deleted) => selection.matches(&self.object),
            (None, _) => false,
        };
        let event = match (before, now) {
            (false, true) => EventType::Added,
            (true, true) => EventType::Modified,
            (true, false) => EventType::Deleted,
            (false, false) => return None,
        };
        Some((event, &self.object.bytes))
    }

    pub fn rv(&self) -> u64 {
        self.object.rv
    }
}

/// Which objects a request reads: namespace, label and field selectors.
#[derive(Debug, Clone, Default)]
pub struct Selection {
    pub namespace: Option<String>,
    pub labels: LabelSelector,
    pub fields: FieldSelector,
}

impl Selection {
    pub fn matches(&self, item: &Item) -> bool {
        self.namespace
            .as_ref()
            .is_none_or(|ns| *ns == item.namespace)
            && self.labels.matches(&|key| item.labels.get(key).cloned())
            && self.fields.matches(&|field| item.field(field))
    }
}

/// What a read found.
pub struct Snapshot {
    pub kind: KindInfo,
    pub resource_version: u64,
    pub items: Vec<Arc<Item>>,
}

/// Where a watch starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WatchFrom {
    /// Every current object as `ADDED` (no resourceVersion, `0`, or `sendInitialEvents`),
    /// provided the store is at least at this resourceVersion.
    Current { not_older_than: u64 },
    /// The changes after this resourceVersion.
    After(u64),
}

/// An opened watch: what it starts with, and what follows.
pub struct OpenedWatch {
    pub kind: KindInfo,
    /// `ADDED` objects, or replayed changes, in order.
    pub initial: Vec<(EventType, Bytes)>,
    pub resource_version: u64,
    pub changes: broadcast::Receiver<Arc<Change>>,
    /// Moves when the watch must end: the store was relisted, or its feed broke.
    pub breaks: watch::Receiver<u64>,
    /// Whether the store was being fed from the cloud when the watch opened; a watch served
    /// from an interrupted store ends when the cloud is back.
    pub live: bool,
}

/// One pool-scope resource in memory.
pub struct Shared {
    /// `services.v1.core`, for logs, metrics and the saved copy.
    pub name: String,
    /// Field selectors the apiserver supports for this resource, beyond name and namespace.
    selectable: &'static [&'static str],
    state: Mutex<State>,
    changes: broadcast::Sender<Arc<Change>>,
    breaks: watch::Sender<u64>,
}

#[derive(Default)]
struct State {
    kind: Option<KindInfo>,
    objects: BTreeMap<String, Arc<Item>>,
    resource_version: u64,
    window: VecDeque<Arc<Change>>,
    /// Every change after this resourceVersion is in the window.
    window_start: u64,
    /// Objects to serve: a list (from the cloud or the saved copy) was applied.
    loaded: bool,
    /// Fed from the cloud without a break since the last list.
    live: bool,
    breaks: u64,
}

impl State {
    /// The kind to answer with, when reads can be answered here: a list was applied and it was
    /// fed from the cloud since, or the cloud is away.
    fn answering(&self, offline: bool) -> Option<KindInfo> {
        let servable = self.loaded && (self.live || offline);
        self.kind.clone().filter(|_| servable)
    }

    /// The current objects `selection` reads, in key order.
    fn selected<'a>(&'a self, selection: &'a Selection) -> impl Iterator<Item = &'a Arc<Item>> {
        self.objects.values().filter(|item| selection.matches(item))
    }
}

impl Shared {
    pub fn new(name: String, selectable: &'static [&'static str]) -> Arc<Shared> {
        Arc::new(Shared {
            name,
            selectable,
            state: Mutex::new(State::default()),
            changes: broadcast::channel(BACKLOG).0,
            breaks: watch::Sender::new(0),
        })
    }

    /// Whether a field selector only names fields this resource can be selected by.
    pub fn selects_by(&self, fields: &FieldSelector) -> bool {
        fields.fields().all(|f| {
            matches!(f, "metadata.name" | "metadata.namespace") || self.selectable.contains(&f)
        })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves consistent data (every change is one insert and
        // one push): serve on.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether reads can be answered here now (see `State::answering`).
    pub fn is_servable(&self, offline: bool) -> bool {
        self.state().answering(offline).is_some()
    }

    /// The objects `selection` reads, if the store is servable and at least at `not_older_than`.
    pub fn list(
        &self,
        selection: &Selection,
        not_older_than: u64,
        offline: bool,
    ) -> Option<Snapshot> {
        let state = self.state();
        let kind = state.answering(offline)?;
        if state.resource_version < not_older_than {
            return None;
        }
        Some(Snapshot {
            kind,
            resource_version: state.resource_version,
            items: state.selected(selection).cloned().collect(),
        })
    }

    /// Opens a watch; `None` when it cannot be answered here (not servable, a resourceVersion
    /// ahead of the store or older than its window).
    pub fn open_watch(
        &self,
        selection: &Selection,
        from: WatchFrom,
        offline: bool,
    ) -> Option<OpenedWatch> {
        let state = self.state();
        let kind = state.answering(offline)?;
        let initial = match from {
            WatchFrom::Current { not_older_than } if not_older_than <= state.resource_version => {
                state
                    .selected(selection)
                    .map(|item| (EventType::Added, item.bytes.clone()))
                    .collect()
            }
            WatchFrom::After(rv) if rv >= state.window_start && rv <= state.resource_version => {
                state
                    .window
                    .iter()
                    .filter(|c| c.rv() > rv)
                    .filter_map(|c| c.event_for(selection))
                    .map(|(event, bytes)| (event, bytes.clone()))
                    .collect()
            }
            _ => return None,
        };
        Some(OpenedWatch {
            kind,
            initial,
            resource_version: state.resource_version,
            changes: self.changes.subscribe(),
            breaks: self.breaks.subscribe(),
            live: state.live,
        })
    }

    /// The store's resourceVersion for a BOOKMARK, when `pending` (changes not yet sent to the
    /// watch) is empty: a bookmark must never be ahead of an event its client has not seen.
    pub fn bookmark_version(&self, pending: &broadcast::Receiver<Arc<Change>>) -> Option<u64> {
        let state = self.state();
        pending.is_empty().then_some(state.resource_version)
    }

    fn replace(&self, objects: &BTreeMap<String, Bytes>, list: &ListHead) {
        let kind = KindInfo::from_list(&list.kind, &list.api_version);
        let head = kind.as_ref().map(TypeMetaHead::of);
        let mut items = BTreeMap::new();
        for bytes in objects.values() {
            match self.item(bytes, head.as_ref()) {
                Some(item) => {
                    items.insert(item.key(), Arc::new(item));
                }
                None => warn!(resource = %self.name, "skipping an object that does not parse"),
            }
        }
        let rv = list.resource_version().parse().unwrap_or(0);
        let mut state = self.state();
        if kind.is_some() {
            state.kind = kind;
        }
        state.objects = items;
        state.resource_version = rv;
        state.window.clear();
        state.window_start = rv;
        state.loaded = true;
        state.live = list.from_cloud;
        // Like the apiserver's Cacher after a relist: every watch ends, and its client resumes
        // (here, or upstream when its resourceVersion is older than the new window).
        state.breaks += 1;
        self.breaks.send_replace(state.breaks);
    }

    fn apply(&self, bytes: &[u8], deleted: bool) {
        let head = self.state().kind.as_ref().map(TypeMetaHead::of);
        let Some(item) = self.item(bytes, head.as_ref()) else {
            warn!(resource = %self.name, "skipping a change whose object does not parse");
            return;
        };
        let item = Arc::new(item);
        let mut state = self.state();
        let key = item.key();
        let previous = if deleted {
            state.objects.remove(&key)
        } else {
            state.objects.insert(key, item.clone())
        };
        let change = match (deleted, &previous) {
            (true, _) => ChangeType::Deleted,
            (false, None) => ChangeType::Added,
            (false, Some(_)) => ChangeType::Modified,
        };
        state.kind = state
            .kind
            .take()
            .or_else(|| KindInfo::from_object(&item.bytes));
        state.resource_version = state.resource_version.max(item.rv);
        let change = Arc::new(Change {
            change,
            object: item,
            previous,
        });
        if state.window.len() == WINDOW
            && let Some(oldest) = state.window.pop_front()
        {
            state.window_start = oldest.rv();
        }
        state.window.push_back(change.clone());
        // No receiver is not an error: nobody is watching.
        let _ = self.changes.send(change);
    }

    fn progressed(&self, rv: &str) {
        if let Ok(rv) = rv.parse::<u64>() {
            let mut state = self.state();
            state.resource_version = state.resource_version.max(rv);
        }
    }

    fn interrupted(&self) {
        let mut state = self.state();
        if state.live {
            // Changes may be missed from now on: open watches end, and reads go upstream (or,
            // with the cloud away, are answered from what is here) until the next list.
            state.live = false;
            state.breaks += 1;
            self.breaks.send_replace(state.breaks);
        }
    }

    /// Reads what selectors need; splices in `kind`/`apiVersion` when the object lacks them.
    fn item(&self, bytes: &[u8], head: Option<&TypeMetaHead>) -> Option<Item> {
        let parsed: Parsed = serde_json::from_slice(bytes).ok()?;
        let bytes = match head {
            Some(head) => Bytes::from(
                kinds::with_type_meta(bytes, head, KindCheck::UpToMetadata).into_owned(),
            ),
            None => Bytes::copy_from_slice(bytes),
        };
        let spec = parsed.spec.unwrap_or_default();
        let fields = self
            .selectable
            .iter()
            .filter_map(|&field| {
                let value = field.strip_prefix("spec.").and_then(|f| spec.get(f))?;
                Some((field, value.as_str()?.to_owned()))
            })
            .collect();
        Some(Item {
            bytes,
            rv: parsed.metadata.resource_version.parse().unwrap_or(0),
            namespace: parsed.metadata.namespace,
            name: parsed.metadata.name,
            labels: parsed.metadata.labels.unwrap_or_default(),
            fields,
        })
    }
}

#[derive(Deserialize)]
struct Parsed {
    #[serde(default)]
    metadata: Meta,
    #[serde(default)]
    spec: Option<serde_json::Map<String, serde_json::Value>>,
}

#[derive(Deserialize, Default)]
struct Meta {
    #[serde(default)]
    name: String,
    #[serde(default)]
    namespace: String,
    #[serde(default, rename = "resourceVersion")]
    resource_version: String,
    #[serde(default)]
    labels: Option<BTreeMap<String, String>>,
}

/// The reflector's side of a [`Shared`] store.
pub struct Feed(pub Arc<Shared>);

impl Handler for Feed {
    fn replace(&mut self, objects: &BTreeMap<String, Bytes>, list: &ListHead) {
        self.0.replace(objects, list);
    }

    fn upsert(&mut self, object: &[u8]) {
        self.0.apply(object, false);
    }

    fn remove(&mut self, object: &[u8]) {
        self.0.apply(object, true);
    }

    fn progressed(&mut self, resource_version: &str) {
        self.0.progressed(resource_version);
    }

    fn interrupted(&mut self) {
        self.0.interrupted();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::feed::ListMeta;

    fn service(name: &str, rv: u64, app: &str, kind: bool) -> Bytes {
        let type_meta = if kind {
            r#""kind":"Service","apiVersion":"v1","#
        } else {
            ""
        };
        Bytes::from(format!(
            r#"{{{type_meta}"metadata":{{"name":"{name}","namespace":"shop","resourceVersion":"{rv}","labels":{{"app":"{app}"}}}},"spec":{{"type":"ClusterIP","clusterIP":"10.0.0.{rv}"}}}}"#
        ))
    }

    fn services() -> Arc<Shared> {
        Shared::new(
            "pool-services.v1.core".into(),
            &["spec.clusterIP", "spec.type"],
        )
    }

    fn list(shared: &Shared, items: &[Bytes], rv: u64, from_cloud: bool) {
        let objects = items
            .iter()
            .enumerate()
            .map(|(i, b)| (format!("shop/{i}"), b.clone()))
            .collect();
        let head = ListHead {
            kind: "ServiceList".into(),
            api_version: "v1".into(),
            metadata: ListMeta {
                resource_version: rv.to_string(),
                ..ListMeta::default()
            },
            from_cloud,
        };
        shared.replace(&objects, &head);
    }

    fn selecting(labels: &str, fields: &str) -> Selection {
        Selection {
            namespace: None,
            labels: LabelSelector::parse(labels).unwrap(),
            fields: FieldSelector::parse(fields).unwrap(),
        }
    }

    fn names(snapshot: &Snapshot) -> Vec<&str> {
        snapshot.items.iter().map(|i| i.name.as_str()).collect()
    }

    fn events(lines: &[(EventType, Bytes)]) -> Vec<(&'static str, String)> {
        lines
            .iter()
            .map(|(e, b)| {
                let v: serde_json::Value = serde_json::from_slice(b).unwrap();
                assert_eq!(v["kind"], "Service", "every object names its kind");
                (
                    e.as_str(),
                    v["metadata"]["name"].as_str().unwrap().to_owned(),
                )
            })
            .collect()
    }

    #[test]
    fn lists_are_selected_by_namespace_labels_and_the_resources_fields() {
        let shared = services();
        assert!(
            shared.list(&Selection::default(), 0, true).is_none(),
            "nothing listed yet"
        );
        list(
            &shared,
            &[service("a", 5, "web", false), service("b", 6, "db", false)],
            10,
            true,
        );
        let all = shared.list(&Selection::default(), 0, false).unwrap();
        assert_eq!((names(&all), all.resource_version), (vec!["a", "b"], 10));
        assert_eq!(all.kind.list_kind(), "ServiceList");
        let web = shared.list(&selecting("app=web", ""), 0, false).unwrap();
        assert_eq!(names(&web), ["a"]);
        let by_ip = shared
            .list(&selecting("", "spec.clusterIP=10.0.0.6"), 0, false)
            .unwrap();
        assert_eq!(names(&by_ip), ["b"]);
        let not_a = shared.list(
            &selecting("", "metadata.name!=a,spec.type=ClusterIP"),
            0,
            false,
        );
        assert_eq!(names(&not_a.unwrap()), ["b"]);
        let elsewhere = Selection {
            namespace: Some("other".into()),
            ..Selection::default()
        };
        assert!(names(&shared.list(&elsewhere, 0, false).unwrap()).is_empty());
        assert!(
            shared.list(&Selection::default(), 11, false).is_none(),
            "newer than the store"
        );
        assert!(shared.selects_by(&FieldSelector::parse("spec.type=NodePort").unwrap()));
        assert!(!shared.selects_by(&FieldSelector::parse("spec.ports=x").unwrap()));
    }

    #[test]
    fn watches_see_objects_enter_and_leave_their_selection() {
        let shared = services();
        list(&shared, &[service("a", 5, "web", false)], 10, true);
        let opened = shared
            .open_watch(
                &selecting("app=web", ""),
                WatchFrom::Current { not_older_than: 0 },
                false,
            )
            .unwrap();
        assert_eq!(events(&opened.initial), [("ADDED", "a".into())]);
        let mut changes = opened.changes;
        shared.apply(&service("b", 11, "web", true), false);
        shared.apply(&service("a", 12, "db", true), false);
        shared.apply(&service("a", 13, "web", true), false);
        shared.apply(&service("c", 14, "db", true), false);
        shared.apply(&service("b", 15, "web", true), true);
        let web = selecting("app=web", "");
        let mut seen = Vec::new();
        while let Ok(change) = changes.try_recv() {
            if let Some((event, bytes)) = change.event_for(&web) {
                seen.push(events(&[(event, bytes.clone())]).remove(0));
            }
        }
        let expected = [
            ("ADDED", "b"),
            ("DELETED", "a"),
            ("ADDED", "a"),
            ("DELETED", "b"),
        ];
        assert_eq!(seen, expected.map(|(e, n)| (e, n.to_owned())));

        // Resumed from a version in the window: the same changes, replayed.
        let resumed = shared
            .open_watch(&web, WatchFrom::After(12), false)
            .unwrap();
        assert_eq!(
            events(&resumed.initial),
            [("ADDED", "a".into()), ("DELETED", "b".into())]
        );
        assert_eq!(resumed.resource_version, 15);
        assert!(
            shared
                .open_watch(&web, WatchFrom::After(9), false)
                .is_none(),
            "before the window"
        );
        assert!(
            shared
                .open_watch(&web, WatchFrom::After(16), false)
                .is_none(),
            "in the future"
        );
        shared.progressed("20");
        let pending = shared.changes.subscribe();
        assert_eq!(shared.bookmark_version(&pending), Some(20));
        shared.apply(&service("d", 21, "web", true), false);
        assert_eq!(
            shared.bookmark_version(&pending),
            None,
            "never ahead of an unsent change"
        );
    }

    #[test]
    fn a_relist_or_a_broken_feed_ends_watches_and_only_live_stores_answer_online() {
        let shared = services();
        list(&shared, &[service("a", 5, "web", false)], 10, false);
        assert!(
            !shared.is_servable(false),
            "a saved copy does not answer while online"
        );
        assert!(shared.is_servable(true), "it answers offline");
        list(&shared, &[service("a", 5, "web", false)], 10, true);
        assert!(shared.is_servable(false));
        let opened = shared
            .open_watch(&Selection::default(), WatchFrom::After(10), false)
            .unwrap();
        assert!(opened.live && opened.initial.is_empty());
        let mut breaks = opened.breaks;
        shared.interrupted();
        assert!(
            breaks.has_changed().unwrap(),
            "a broken feed ends open watches"
        );
        breaks.mark_unchanged();
        shared.interrupted();
        assert!(!breaks.has_changed().unwrap(), "once");
        assert!(!shared.is_servable(false) && shared.is_servable(true));
        list(&shared, &[], 30, true);
        assert!(breaks.has_changed().unwrap(), "a relist ends open watches");
        assert!(names(&shared.list(&Selection::default(), 0, false).unwrap()).is_empty());
        assert!(
            shared
                .open_watch(&Selection::default(), WatchFrom::After(12), false)
                .is_none(),
            "the window starts again at the relist"
        );
    }
}
