//! The object store: an etcd-like keyspace with one global resourceVersion counter, a bounded
//! per-resource event log, and a wake-up channel for watchers.
//!
//! Every write goes through [`Store::mutate`], a compare-and-swap under one lock, like etcd's
//! `GuaranteedUpdate`: it bumps the global revision, stamps `metadata.resourceVersion`, appends an
//! event (with the previous object, so watchers can compute selector transitions) and wakes
//! watchers. The log doubles as MVCC history: [`Store::snapshot`] rebuilds a resource's state at
//! any revision still inside the window by undoing newer events, which is what paging with
//! `continue` and `resourceVersionMatch=Exact` need.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use serde_json::Value;
use tokio::sync::watch;

use crate::resources::ResourceDef;

/// The watch event types that come from writes (bookmarks and errors are made by watchers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

/// One committed write. `object` is the new state (for deletes: the last state, stamped with the
/// deletion revision); `prev` is the state before, if any.
#[derive(Debug)]
pub struct Event {
    pub rv: u64,
    pub kind: EventType,
    pub key: String,
    pub object: Arc<Value>,
    pub prev: Option<Arc<Value>>,
}

/// What a [`Store::mutate`] callback decides.
pub enum Mutation {
    Put(Value),
    Delete,
    /// Nothing changed: no revision bump and no event, as for a no-op update in etcd.
    Noop,
}

/// A requested revision that the event log no longer covers; carries the oldest servable one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TooOld {
    pub oldest: u64,
}

#[derive(Default)]
struct Table {
    /// Keyed like etcd (`<namespace>/<name>` or `<name>`), so iteration order is etcd's.
    objects: BTreeMap<String, Arc<Value>>,
    log: VecDeque<Arc<Event>>,
    /// Every event of this resource with `rv > floor` is still in `log`.
    floor: u64,
}

struct Inner {
    rv: u64,
    tables: HashMap<(&'static str, &'static str), Table>,
}

/// Shared, synchronous, cheap to lock: all operations are in-memory.
pub struct Store {
    inner: Mutex<Inner>,
    window: usize,
    notify: watch::Sender<u64>,
}

/// `<namespace>/<name>` for namespaced resources, `<name>` otherwise.
pub fn object_key(def: &ResourceDef, namespace: Option<&str>, name: &str) -> String {
    match namespace {
        Some(ns) if def.namespaced => format!("{ns}/{name}"),
        _ => name.to_owned(),
    }
}

fn table_id(def: &'static ResourceDef) -> (&'static str, &'static str) {
    (def.group, def.name)
}

impl Store {
    pub fn new(window: usize, initial_rv: u64) -> Self {
        Store {
            inner: Mutex::new(Inner {
                rv: initial_rv,
                tables: HashMap::new(),
            }),
            window: window.max(1),
            notify: watch::channel(initial_rv).0,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock cannot leave the maps half-written (every write is a
        // single insert/remove), so a poisoned lock is still consistent.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn current_rv(&self) -> u64 {
        self.lock().rv
    }

    /// Wakes on every committed write; the value is the new global revision.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.notify.subscribe()
    }

    pub fn get(&self, def: &'static ResourceDef, key: &str) -> Option<Arc<Value>> {
        let inner = self.lock();
        inner.tables.get(&table_id(def))?.objects.get(key).cloned()
    }

    /// Objects whose key starts with `prefix` (`""` = all), in key order, at the current revision.
    pub fn list(
        &self,
        def: &'static ResourceDef,
        prefix: &str,
    ) -> (u64, Vec<(String, Arc<Value>)>) {
        let inner = self.lock();
        let items = inner
            .tables
            .get(&table_id(def))
            .map(|t| collect_prefix(&t.objects, prefix))
            .unwrap_or_default();
        (inner.rv, items)
    }

    /// The state at revision `at` (must be <= current), rebuilt by undoing newer events.
    pub fn snapshot(
        &self,
        def: &'static ResourceDef,
        prefix: &str,
        at: u64,
    ) -> Result<Vec<(String, Arc<Value>)>, TooOld> {
        let inner = self.lock();
        let Some(table) = inner.tables.get(&table_id(def)) else {
            return Ok(Vec::new());
        };
        if at < table.floor {
            return Err(TooOld {
                oldest: table.floor,
            });
        }
        let mut objects = table.objects.clone();
        for ev in table.log.iter().rev().take_while(|e| e.rv > at) {
            match (&ev.kind, &ev.prev) {
                (EventType::Added, _) | (_, None) => objects.remove(&ev.key),
                (_, Some(prev)) => objects.insert(ev.key.clone(), prev.clone()),
            };
        }
        Ok(collect_prefix(&objects, prefix))
    }

    /// Events of `def` with `rv > since` and the current revision (all events up to it are
    /// included), or [`TooOld`] if some were already evicted.
    pub fn events_since(
        &self,
        def: &'static ResourceDef,
        since: u64,
    ) -> Result<(Vec<Arc<Event>>, u64), TooOld> {
        let inner = self.lock();
        let Some(table) = inner.tables.get(&table_id(def)) else {
            return Ok((Vec::new(), inner.rv));
        };
        if since < table.floor {
            return Err(TooOld {
                oldest: table.floor,
            });
        }
        let start = table.log.partition_point(|e| e.rv <= since);
        Ok((table.log.iter().skip(start).cloned().collect(), inner.rv))
    }

    /// Atomically reads the object at `key`, lets `f` decide (given the revision the write would
    /// get), and commits. Returns the resulting object: the stored one, the deleted one (stamped
    /// with the deletion revision) or, for [`Mutation::Noop`], the current one.
    pub fn mutate<F>(
        &self,
        def: &'static ResourceDef,
        key: &str,
        f: F,
    ) -> Result<Option<Arc<Value>>, outpost_core::Status>
    where
        F: FnOnce(Option<&Value>, u64) -> Result<Mutation, outpost_core::Status>,
    {
        let mut inner = self.lock();
        let next_rv = inner.rv + 1;
        let table = inner.tables.entry(table_id(def)).or_default();
        let prev = table.objects.get(key).cloned();
        let (kind, object) = match f(prev.as_deref(), next_rv)? {
            Mutation::Noop => return Ok(prev),
            Mutation::Put(mut obj) => {
                set_resource_version(&mut obj, next_rv);
                in_apiserver_order(def, &mut obj);
                let kind = if prev.is_some() {
                    EventType::Modified
                } else {
                    EventType::Added
                };
                let obj = Arc::new(obj);
                table.objects.insert(key.to_owned(), obj.clone());
                (kind, obj)
            }
            Mutation::Delete => {
                let Some(old) = table.objects.remove(key) else {
                    return Ok(None);
                };
                let mut gone = (*old).clone();
                set_resource_version(&mut gone, next_rv);
                (EventType::Deleted, Arc::new(gone))
            }
        };
        let event = Arc::new(Event {
            rv: next_rv,
            kind,
            key: key.to_owned(),
            object: object.clone(),
            prev,
        });
        table.log.push_back(event);
        if table.log.len() > self.window {
            table.log.pop_front();
            // Like the watch cache: the oldest servable revision is the oldest kept event's - 1.
            table.floor = table.log.front().map_or(next_rv, |e| e.rv - 1);
        }
        inner.rv = next_rv;
        drop(inner);
        self.notify.send_replace(next_rv);
        Ok(Some(object))
    }

    /// Seeds an object as-is (keeping its resourceVersion), without an event.
    pub fn insert_raw(&self, def: &'static ResourceDef, key: &str, mut obj: Value) {
        in_apiserver_order(def, &mut obj);
        let mut inner = self.lock();
        let rv = resource_version_of(&obj).unwrap_or(0);
        inner.rv = inner.rv.max(rv);
        let table = inner.tables.entry(table_id(def)).or_default();
        table.objects.insert(key.to_owned(), Arc::new(obj));
    }

    /// Moves the global revision forward (to where a seeded list says the cluster was).
    pub fn advance_to(&self, rv: u64) {
        let mut inner = self.lock();
        inner.rv = inner.rv.max(rv);
        self.notify.send_replace(inner.rv);
    }

    /// Forgets all history: watches and snapshots can start at the current revision, no earlier,
    /// like a watch cache that was just initialised from a list.
    pub fn compact_all(&self) {
        let mut inner = self.lock();
        let rv = inner.rv;
        for table in inner.tables.values_mut() {
            table.log.clear();
            table.floor = rv;
        }
        inner.default_floor(rv);
    }
}

impl Inner {
    /// Tables created later (first write after seeding) must not serve pre-seed history either.
    fn default_floor(&mut self, rv: u64) {
        for def in crate::resources::RESOURCES {
            self.tables.entry(table_id(def)).or_insert_with(|| Table {
                floor: rv,
                ..Table::default()
            });
        }
    }
}

fn collect_prefix(
    objects: &BTreeMap<String, Arc<Value>>,
    prefix: &str,
) -> Vec<(String, Arc<Value>)> {
    objects
        .range(prefix.to_owned()..)
        .take_while(|(k, _)| k.starts_with(prefix))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

pub fn set_resource_version(obj: &mut Value, rv: u64) {
    if let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.insert("resourceVersion".into(), rv.to_string().into());
    }
}

/// `ObjectMeta`'s fields in the order of the Go struct, which is how they are encoded.
const OBJECT_META_ORDER: &[&str] = &[
    "name",
    "generateName",
    "namespace",
    "selfLink",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "labels",
    "annotations",
    "ownerReferences",
    "finalizers",
    "managedFields",
];

/// Keys in the order kube-apiserver writes them, whatever order the client sent: a built-in
/// object is decoded into its Go struct and encoded field by field (`kind`, `apiVersion`,
/// `metadata` with `name` first, `spec`, `status`); a custom resource is an unstructured map,
/// which Go encodes with sorted keys at every level. What the hub reads first in an object
/// (its kind, its identity) therefore comes where a real apiserver puts it.
pub(crate) fn in_apiserver_order(def: &ResourceDef, obj: &mut Value) {
    if !def.builtin {
        sort_keys_deep(obj);
        return;
    }
    let Some(map) = obj.as_object_mut() else {
        return;
    };
    put_first(map, &["kind", "apiVersion", "metadata", "spec", "status"]);
    if let Some(meta) = map.get_mut("metadata").and_then(Value::as_object_mut) {
        put_first(meta, OBJECT_META_ORDER);
    }
}

/// Moves `keys` (those present) to the front, in that order; the others keep theirs.
fn put_first(map: &mut serde_json::Map<String, Value>, keys: &[&str]) {
    let mut at = 0;
    for key in keys {
        if let Some(value) = map.shift_remove(*key) {
            map.shift_insert(at, (*key).to_owned(), value);
            at += 1;
        }
    }
}

fn sort_keys_deep(value: &mut Value) {
    match value {
        Value::Object(map) => {
            map.sort_keys();
            map.values_mut().for_each(sort_keys_deep);
        }
        Value::Array(items) => items.iter_mut().for_each(sort_keys_deep),
        _ => {}
    }
}

pub fn resource_version_of(obj: &Value) -> Option<u64> {
    obj.pointer("/metadata/resourceVersion")?
        .as_str()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::resources::by_gvr;

    fn cm(name: &str, v: &str) -> Value {
        json!({"metadata": {"name": name, "namespace": "default"}, "data": {"v": v}})
    }

    fn put(store: &Store, name: &str, v: &str) -> u64 {
        let def = by_gvr("v1/configmaps").unwrap();
        let obj = store
            .mutate(def, &format!("default/{name}"), |_, _| {
                Ok(Mutation::Put(cm(name, v)))
            })
            .unwrap()
            .unwrap();
        resource_version_of(&obj).unwrap()
    }

    fn delete(store: &Store, name: &str) -> u64 {
        let def = by_gvr("v1/configmaps").unwrap();
        let obj = store
            .mutate(def, &format!("default/{name}"), |_, _| Ok(Mutation::Delete))
            .unwrap()
            .unwrap();
        resource_version_of(&obj).unwrap()
    }

    fn values_at(store: &Store, at: u64) -> Vec<String> {
        let def = by_gvr("v1/configmaps").unwrap();
        store
            .snapshot(def, "default/", at)
            .unwrap()
            .iter()
            .map(|(k, v)| format!("{k}={}", v["data"]["v"].as_str().unwrap()))
            .collect()
    }

    #[test]
    fn every_write_bumps_the_global_revision() {
        let store = Store::new(10, 100);
        assert_eq!(put(&store, "a", "1"), 101);
        assert_eq!(put(&store, "b", "1"), 102);
        assert_eq!(delete(&store, "a"), 103);
        assert_eq!(store.current_rv(), 103);
    }

    #[test]
    fn snapshots_undo_newer_events() {
        let store = Store::new(10, 0);
        let r1 = put(&store, "a", "1");
        let r2 = put(&store, "b", "1");
        put(&store, "a", "2");
        delete(&store, "b");
        assert_eq!(values_at(&store, r1), ["default/a=1"]);
        assert_eq!(values_at(&store, r2), ["default/a=1", "default/b=1"]);
        assert_eq!(values_at(&store, store.current_rv()), ["default/a=2"]);
    }

    #[test]
    fn eviction_raises_the_floor() {
        let store = Store::new(2, 0);
        let def = by_gvr("v1/configmaps").unwrap();
        let r1 = put(&store, "a", "1");
        put(&store, "a", "2");
        put(&store, "a", "3");
        // r1 was evicted; r1 itself is still a valid starting point since r2 is kept.
        assert_eq!(
            store.events_since(def, r1 - 1).unwrap_err(),
            TooOld { oldest: r1 }
        );
        assert_eq!(store.events_since(def, r1).unwrap().0.len(), 2);
        assert!(store.snapshot(def, "", r1 - 1).is_err());
    }

    #[test]
    fn noop_mutations_do_not_bump() {
        let store = Store::new(10, 5);
        let def = by_gvr("v1/configmaps").unwrap();
        let got = store
            .mutate(def, "default/x", |_, _| Ok(Mutation::Noop))
            .unwrap();
        assert!(got.is_none());
        assert_eq!(store.current_rv(), 5);
        assert!(store.events_since(def, 0).unwrap().0.is_empty());
    }

    #[test]
    fn compact_all_forgets_history() {
        let store = Store::new(10, 0);
        let def = by_gvr("v1/configmaps").unwrap();
        put(&store, "a", "1");
        store.compact_all();
        assert_eq!(
            store.events_since(def, 0).unwrap_err(),
            TooOld { oldest: 1 }
        );
        let other = by_gvr("v1/secrets").unwrap();
        assert!(store.events_since(other, 0).is_err());
        assert!(store.events_since(other, 1).unwrap().0.is_empty());
    }

    #[test]
    fn objects_keep_the_key_order_kube_apiserver_writes() {
        let store = Store::new(8, 1);
        let keys = |v: &Value| v.as_object().unwrap().keys().cloned().collect::<Vec<_>>();
        let pods = by_gvr("v1/pods").unwrap();
        let sorted_pod = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"annotations": {}, "labels": {"b": "1", "a": "2"}, "name": "p",
                "namespace": "default", "uid": "u"},
            "spec": {"nodeName": "n1"}, "status": {"phase": "Running"}, "zzz": 1});
        let pod = store
            .mutate(pods, "default/p", |_, _| Ok(Mutation::Put(sorted_pod)))
            .unwrap()
            .unwrap();
        assert_eq!(
            keys(&pod),
            ["kind", "apiVersion", "metadata", "spec", "status", "zzz"]
        );
        assert_eq!(
            keys(&pod["metadata"]),
            [
                "name",
                "namespace",
                "uid",
                "resourceVersion",
                "labels",
                "annotations"
            ]
        );
        assert_eq!(
            keys(&pod["metadata"]["labels"]),
            ["b", "a"],
            "maps keep the client's order"
        );
        let pools = by_gvr("apps.openyurt.io/v1beta1/nodepools").unwrap();
        let pool = json!({"metadata": {"name": "p1", "labels": {"b": "1", "a": "2"}},
            "spec": {"type": "Edge"}, "apiVersion": "apps.openyurt.io/v1beta1", "kind": "NodePool"});
        let pool = store
            .mutate(pools, "p1", |_, _| Ok(Mutation::Put(pool)))
            .unwrap()
            .unwrap();
        assert_eq!(keys(&pool), ["apiVersion", "kind", "metadata", "spec"]);
        assert_eq!(
            keys(&pool["metadata"]),
            ["labels", "name", "resourceVersion"]
        );
        assert_eq!(keys(&pool["metadata"]["labels"]), ["a", "b"]);
    }
}
