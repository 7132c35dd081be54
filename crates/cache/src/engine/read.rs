//! Offline reads: single objects, LISTs and WATCH replays.
//!
//! # Which scope answers a query
//! A query (a [`Scope`] built from the client's request) is answered by one stored scope of the
//! same component and resource that *covers* it:
//! - its namespace is "all" or the query's namespace, and
//! - each of its selectors is empty or equal (canonically) to the query's.
//!
//! Among covering scopes the one with the most exact dimensions (namespace, labels, fields) wins,
//! then the most recently written one. Items are that scope's members, filtered by whatever the
//! scope did not already filter (namespace from the key, selectors evaluated on the stored JSON);
//! the list's resourceVersion is that scope's. An exact scope is not re-filtered: its membership
//! is the apiserver's own evaluation of the selector, which knows field labels that are not JSON
//! paths. No covering scope means the LIST was never cached (`None`; yurthub answers 404).

use std::collections::{HashMap, HashSet};

use serde_json::Value;

use crate::engine::{Engine, Suspect};
use crate::error::{CacheError, ReplayError, TooOld};
use crate::json::{self, Filter};
use crate::keys::{self, EVENT, MEMBER, OBJECT, PIN, SCOPE};
use crate::kv::Kv;
use crate::model::{
    CachedObject, Event, EventType, Gvr, ListResult, Lookup, ObjectKey, ResourceVersion, Scope,
    ScopeId,
};
use crate::record::{self, LogEntry, ScopeMeta};

/// The stored scope chosen for a query, and the filtering still to do.
struct Resolved<'q> {
    id: ScopeId,
    meta: ScopeMeta,
    filter: Filter<'q>,
}

/// How many of (namespace, labels, fields) match exactly, if `stored` covers `query` at all.
fn coverage(stored: &ScopeId, query: &ScopeId) -> Option<u8> {
    let ns = match &stored.namespace {
        None => query.namespace.is_none(),
        Some(ns) => (query.namespace.as_ref() == Some(ns)).then_some(true)?,
    };
    let selector = |s: &str, q: &str| match s.is_empty() {
        true => Some(q.is_empty()),
        false => (s == q).then_some(true),
    };
    let labels = selector(&stored.label_selector, &query.label_selector)?;
    let fields = selector(&stored.field_selector, &query.field_selector)?;
    Some(u8::from(ns) + u8::from(labels) + u8::from(fields))
}

fn filter_for<'q>(stored: &ScopeId, query: &'q Scope) -> Filter<'q> {
    Filter {
        namespace: query
            .namespace
            .as_deref()
            .filter(|_| stored.namespace.is_none()),
        labels: (stored.label_selector.is_empty() && !query.labels.is_empty())
            .then_some(&query.labels),
        fields: (stored.field_selector.is_empty() && !query.fields.is_empty())
            .then_some(&query.fields),
    }
}

fn resolve<'q, K: Kv>(
    kv: &K,
    query: &'q Scope,
    suspects: &mut Vec<Suspect>,
) -> Result<Option<Resolved<'q>>, CacheError> {
    let qid = query.id();
    let mut best: Option<((u8, u64), ScopeId, ScopeMeta)> = None;
    for entry in kv.scan(&keys::resource_prefix(SCOPE, &query.component, &query.gvr)) {
        let (key, raw) = entry?;
        let Some(id) = keys::decode_scope_key(&key) else {
            continue;
        };
        let Some(exact) = coverage(&id, &qid) else {
            continue;
        };
        let meta = match record::decode_scope(&raw) {
            Ok(meta) => meta,
            Err(e) => {
                suspects.push(Suspect {
                    key,
                    raw,
                    reason: e.0,
                });
                continue;
            }
        };
        let rank = (exact, meta.updated_ms);
        if best.as_ref().is_none_or(|(r, _, _)| rank > *r) {
            best = Some((rank, id, meta));
        }
    }
    Ok(best.map(|(_, id, meta)| Resolved {
        filter: filter_for(&id, query),
        id,
        meta,
    }))
}

/// Reads one object record, reporting it if corrupt. `check_json` re-parses the bytes too.
fn read_object<K: Kv>(
    kv: &K,
    key: &ObjectKey,
    check_json: bool,
    suspects: &mut Vec<Suspect>,
) -> Result<Option<Result<CachedObject, ()>>, CacheError> {
    let raw_key = keys::object_key(OBJECT, key);
    let Some(raw) = kv.get(&raw_key)? else {
        return Ok(None);
    };
    let decoded =
        record::decode_object(&raw).and_then(|o| match !check_json || json::is_valid(&o.bytes) {
            true => Ok(o),
            false => Err(record::Corrupt("stored bytes are not valid JSON".into())),
        });
    Ok(Some(decoded.map_err(|e| {
        suspects.push(Suspect {
            key: raw_key,
            raw,
            reason: e.0,
        });
    })))
}

/// Applies the query's leftover selectors; `Err` = the bytes do not parse (corruption).
fn selected(filter: &Filter<'_>, bytes: &[u8]) -> Result<bool, serde_json::Error> {
    if !filter.needs_json() {
        return Ok(true);
    }
    Ok(filter.matches_json(&filter.parts(bytes)?))
}

/// Where a watch from `rv` starts in `log`, if the log provably holds everything after `rv`:
/// 1. `rv` is the log's floor: from the start;
/// 2. `rv` is a logged version: after its last occurrence;
/// 3. `rv` and the floor parse and `rv` > floor: from the first event newer than `rv`.
fn replay_start(log: &[LogEntry], floor: &ResourceVersion, rv: &ResourceVersion) -> Option<usize> {
    if rv.as_str() == floor.as_str() {
        return Some(0);
    }
    if let Some(i) = log
        .iter()
        .rposition(|e| e.resource_version.as_str() == rv.as_str())
    {
        return Some(i + 1);
    }
    match (rv.number(), floor.number()) {
        (Some(n), Some(f)) if n > f => Some(
            log.iter()
                .position(|e| e.resource_version.number().is_some_and(|v| v > n))
                .unwrap_or(log.len()),
        ),
        _ => None,
    }
}

/// How a replayed event reaches a query that its scope's log answers without filtering exactly
/// (a broader scope serving a narrower query). Like kube-apiserver's watch filter, an object
/// that no longer matches the query's selectors is sent as DELETED, so the client drops what
/// it holds. The log keeps no earlier versions to tell whether the object matched at the
/// client's version, so this is sent for every object that was in the scope then; a reflector
/// ignores a DELETED of an object it does not hold. An object that entered the scope after the
/// client's version (its first entry in the tail is ADDED) was never the client's, and is left
/// out. Namespaces never change, so an object of another namespace is always left out.
/// Bookmarks always pass.
fn narrowed(filter: &Filter<'_>, replayed: Replayed) -> Result<Option<Event>, serde_json::Error> {
    let Replayed { mut event, entered } = replayed;
    if event.event_type == EventType::Bookmark
        || (filter.namespace.is_none() && !filter.needs_json())
    {
        return Ok(Some(event));
    }
    let parts = filter.parts(&event.object)?;
    let ns = parts
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .unwrap_or("");
    if !filter.matches_namespace(ns) {
        return Ok(None);
    }
    if filter.matches_json(&parts) {
        return Ok(Some(event));
    }
    if entered {
        return Ok(None);
    }
    event.event_type = EventType::Deleted;
    Ok(Some(event))
}

impl<K: Kv> Engine<K> {
    /// Whether `bytes` are stored under `key` as they are, at a resourceVersion, and pinned.
    pub(crate) fn holds_pinned(&self, key: &ObjectKey, bytes: &[u8]) -> Result<bool, CacheError> {
        self.read(|kv, _| {
            let Some(raw) = kv.get(&keys::object_key(OBJECT, key))? else {
                return Ok(false);
            };
            let same = record::decode_object(&raw).is_ok_and(|stored| {
                !stored.resource_version.as_str().is_empty() && stored.bytes == bytes
            });
            Ok(same && kv.get(&keys::object_key(PIN, key))?.is_some())
        })
    }

    pub(crate) fn get(&self, key: &ObjectKey) -> Result<Lookup, CacheError> {
        self.read(|kv, suspects| {
            Ok(match read_object(kv, key, true, suspects)? {
                None => Lookup::NotCached,
                Some(Ok(object)) => Lookup::Found(object),
                Some(Err(())) => Lookup::Quarantined,
            })
        })
    }

    /// Every object record of one component's resource (a prefix scan of the object keys, so
    /// scopes and pins do not matter), JSON-checked like `get`; corrupt ones are quarantined.
    pub(crate) fn objects(
        &self,
        component: &str,
        gvr: &Gvr,
    ) -> Result<Vec<(ObjectKey, CachedObject)>, CacheError> {
        self.read(|kv, suspects| {
            let mut objects = Vec::new();
            for entry in kv.scan(&keys::resource_prefix(OBJECT, component, gvr)) {
                let (raw_key, raw) = entry?;
                // An undecodable key is left to `verify`, which reports it.
                let Some(key) = keys::decode_object_key(&raw_key) else {
                    continue;
                };
                let decoded =
                    record::decode_object(&raw).and_then(|o| match json::is_valid(&o.bytes) {
                        true => Ok(o),
                        false => Err(record::Corrupt("stored bytes are not valid JSON".into())),
                    });
                match decoded {
                    Ok(object) => objects.push((key, object)),
                    Err(e) => suspects.push(Suspect {
                        key: raw_key,
                        raw,
                        reason: e.0,
                    }),
                }
            }
            Ok(objects)
        })
    }

    pub(crate) fn list(&self, query: &Scope) -> Result<Option<ListResult>, CacheError> {
        self.read(|kv, suspects| {
            let Some(scope) = resolve(kv, query, suspects)? else {
                return Ok(None);
            };
            let prefix = keys::scope_key(MEMBER, &scope.id);
            let mut result = ListResult {
                served_from: scope.id.clone(),
                resource_version: ResourceVersion::new(&scope.meta.rv),
                items: Vec::new(),
                missing: Vec::new(),
                missed: self.missed_reason(&scope.id),
            };
            for entry in kv.scan(&prefix) {
                let (member, _) = entry?;
                let Some((ns, name)) = keys::decode_member(&member, prefix.len()) else {
                    continue;
                };
                if !scope.filter.matches_namespace(&ns) {
                    continue;
                }
                let key = ObjectKey::new(&query.component, &query.gvr, &ns, &name);
                match read_object(kv, &key, false, suspects)? {
                    Some(Ok(object)) => match selected(&scope.filter, &object.bytes) {
                        Ok(true) => result.items.push(object),
                        Ok(false) => {}
                        Err(e) => {
                            let raw_key = keys::object_key(OBJECT, &key);
                            if let Some(raw) = kv.get(&raw_key)? {
                                suspects.push(Suspect {
                                    key: raw_key,
                                    raw,
                                    reason: format!("stored JSON: {e}"),
                                });
                            }
                            result.missing.push(key);
                        }
                    },
                    Some(Err(())) | None => result.missing.push(key),
                }
            }
            Ok(Some(result))
        })
    }

    pub(crate) fn scope_resource_version(
        &self,
        scope: &Scope,
    ) -> Result<Option<ResourceVersion>, CacheError> {
        self.read(|kv, suspects| {
            let key = keys::scope_key(SCOPE, &scope.id());
            let Some(raw) = kv.get(&key)? else {
                return Ok(None);
            };
            match record::decode_scope(&raw) {
                Ok(meta) => Ok(Some(ResourceVersion::new(&meta.rv))),
                Err(e) => {
                    suspects.push(Suspect {
                        key,
                        raw,
                        reason: e.0,
                    });
                    Ok(None)
                }
            }
        })
    }

    pub(crate) fn events_since(&self, query: &Scope, rv: &str) -> Result<Vec<Event>, ReplayError> {
        let too_old = |oldest| {
            ReplayError::TooOld(TooOld {
                oldest_available: oldest,
            })
        };
        let rv = ResourceVersion::new(rv);
        // The outer `?` is a storage failure; the inner result is the replay's own answer.
        self.read(|kv, suspects| {
            let Some(scope) = resolve(kv, query, suspects)? else {
                return Ok(Err(too_old(None)));
            };
            if let Some(reason) = self.missed_reason(&scope.id) {
                return Ok(Err(ReplayError::Missed(reason)));
            }
            let floor = ResourceVersion::new(&scope.meta.log_floor_rv);
            // A corrupt event leaves a hole in the log: nothing can be replayed exactly.
            let Some(log) = read_log(kv, &scope, suspects)? else {
                return Ok(Err(too_old(Some(ResourceVersion::new(&scope.meta.rv)))));
            };
            let Some(start) = replay_start(&log, &floor, &rv) else {
                return Ok(Err(too_old(Some(floor))));
            };
            let Some(replayed) = replayed_events(kv, &scope.id, &log[start..], suspects)? else {
                return Ok(Err(too_old(Some(ResourceVersion::new(&scope.meta.rv)))));
            };
            let mut events = Vec::new();
            for replayed in replayed {
                match narrowed(&scope.filter, replayed) {
                    Ok(Some(event)) => events.push(event),
                    Ok(None) => {}
                    Err(_) => return Ok(Err(too_old(Some(ResourceVersion::new(&scope.meta.rv))))),
                }
            }
            Ok(Ok(events))
        })?
    }
}

/// One event of a replay, before the query's own filter.
struct Replayed {
    event: Event,
    /// The object's first entry in the replayed tail is ADDED: it was not in the scope at the
    /// version the replay starts from.
    entered: bool,
}

/// The events a replay of `entries` (a tail of a scope's log) sends, in log order. An entry
/// that carries its object is sent as it is. One that names its object is sent with the
/// object's stored bytes if it is that object's last entry in the tail, and skipped otherwise:
/// the replay sends each object's latest version, which is all a reflector keeps (a DELETED
/// entry is always sent). `None` when a named entry's version is no longer stored (the object
/// changed or went through another scope or a GET) and no later entry covers it: then nothing
/// can be replayed exactly.
fn replayed_events<K: Kv>(
    kv: &K,
    scope: &ScopeId,
    entries: &[LogEntry],
    suspects: &mut Vec<Suspect>,
) -> Result<Option<Vec<Replayed>>, CacheError> {
    let mut last_entry: HashMap<&(String, String), usize> = HashMap::new();
    let mut entered: HashSet<&(String, String)> = HashSet::new();
    for (i, entry) in entries.iter().enumerate() {
        let Some(named) = entry.object_name.as_ref() else {
            continue;
        };
        if last_entry.insert(named, i).is_none() && entry.event_type == EventType::Added {
            entered.insert(named);
        }
    }
    let mut events = Vec::with_capacity(entries.len());
    for (i, entry) in entries.iter().enumerate() {
        let object = match (&entry.object, &entry.object_name) {
            (Some(bytes), _) => bytes.clone(),
            (None, Some(named)) if last_entry[named] > i => continue,
            (None, Some((namespace, name))) => {
                let key = ObjectKey::new(&scope.component, &scope.gvr, namespace, name);
                match read_object(kv, &key, false, suspects)? {
                    Some(Ok(stored)) if stored.resource_version == entry.resource_version => {
                        stored.bytes
                    }
                    _ => return Ok(None),
                }
            }
            (None, None) => return Ok(None),
        };
        events.push(Replayed {
            event: Event {
                event_type: entry.event_type,
                resource_version: entry.resource_version.clone(),
                object,
            },
            entered: entry
                .object_name
                .as_ref()
                .is_some_and(|named| entered.contains(named)),
        });
    }
    Ok(Some(events))
}

/// The scope's whole event log, or `None` if any entry is corrupt or missing (a quarantined
/// event leaves a hole that no replay may skip over).
fn read_log<K: Kv>(
    kv: &K,
    scope: &Resolved<'_>,
    suspects: &mut Vec<Suspect>,
) -> Result<Option<Vec<LogEntry>>, CacheError> {
    let mut log = Vec::new();
    let mut intact = true;
    let mut expected = scope.meta.log_first;
    for entry in kv.scan(&keys::scope_key(EVENT, &scope.id)) {
        let (key, raw) = entry?;
        intact &= event_seq(&key) == Some(expected);
        expected += 1;
        match record::decode_event(&raw) {
            Ok(event) => log.push(event),
            Err(e) => {
                suspects.push(Suspect {
                    key,
                    raw,
                    reason: e.0,
                });
                intact = false;
            }
        }
    }
    Ok((intact && expected == scope.meta.log_next).then_some(log))
}

fn event_seq(key: &[u8]) -> Option<u64> {
    let tail = key.get(key.len().checked_sub(8)?..)?;
    Some(u64::from_be_bytes(tail.try_into().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Gvr;
    use outpost_core::selector::{FieldSelector, LabelSelector};

    fn id(ns: Option<&str>, labels: &str, fields: &str) -> ScopeId {
        Scope::new(
            "kubelet",
            &Gvr::new("", "v1", "pods"),
            ns,
            LabelSelector::parse(labels).expect("labels"),
            FieldSelector::parse(fields).expect("fields"),
        )
        .id()
    }

    #[test]
    fn coverage_prefers_exact_and_rejects_narrower_scopes() {
        let query = id(Some("a"), "app=x", "spec.nodeName=n1");
        assert_eq!(coverage(&query, &query), Some(3));
        assert_eq!(coverage(&id(None, "", ""), &query), Some(0));
        assert_eq!(coverage(&id(None, "", "spec.nodeName=n1"), &query), Some(1));
        assert_eq!(coverage(&id(Some("b"), "", ""), &query), None);
        assert_eq!(coverage(&id(None, "app=y", ""), &query), None);
        let all = id(None, "", "");
        assert_eq!(
            coverage(&id(Some("a"), "", ""), &all),
            None,
            "one namespace never covers all"
        );
    }

    #[test]
    fn objects_lists_every_object_of_a_resource_without_a_covering_scope() {
        use crate::{MemStore, Store};
        let store = MemStore::new();
        let pods = Gvr::new("", "v1", "pods");
        let pod = |ns: &str, name: &str| {
            format!(
                r#"{{"metadata":{{"name":"{name}","namespace":"{ns}","resourceVersion":"1"}}}}"#
            )
            .into_bytes()
        };
        let scope = Scope::new(
            "kubelet",
            &pods,
            None,
            LabelSelector::default(),
            FieldSelector::parse("spec.nodeName=n1").expect("fields"),
        );
        let items = [pod("b", "p2"), pod("a", "p1")];
        let refs: Vec<&[u8]> = items.iter().map(Vec::as_slice).collect();
        store.replace_scope(&scope, "5", &refs).expect("replace");
        store
            .put_object("kubelet", &pods, &pod("a", "pinned"))
            .expect("pin");
        store
            .put_object("kube-proxy", &pods, &pod("a", "other-component"))
            .expect("other component");
        let node = br#"{"metadata":{"name":"n1","resourceVersion":"1"}}"#;
        store
            .put_object("kubelet", &Gvr::new("", "v1", "nodes"), node)
            .expect("node");

        let unfiltered = Scope::unfiltered("kubelet", &pods, None);
        assert_eq!(
            store.list(&unfiltered).expect("list"),
            None,
            "no scope covers it"
        );
        let names = |store: &MemStore| -> Vec<String> {
            store
                .objects("kubelet", &pods)
                .expect("objects")
                .into_iter()
                .map(|(k, o)| {
                    assert!(json::is_valid(&o.bytes));
                    format!("{}/{}", k.namespace, k.name)
                })
                .collect()
        };
        assert_eq!(names(&store), ["a/p1", "a/pinned", "b/p2"]);

        let raw_key = keys::object_key(OBJECT, &ObjectKey::new("kubelet", &pods, "a", "p1"));
        *store
            .raw()
            .main
            .get_mut(&raw_key)
            .and_then(|v| v.last_mut())
            .expect("stored") ^= 0x20;
        assert_eq!(
            names(&store),
            ["a/pinned", "b/p2"],
            "corrupt ones are left out"
        );
        assert_eq!(store.health().quarantined, 1);
    }

    fn log(rvs: &[&str]) -> Vec<LogEntry> {
        rvs.iter()
            .map(|rv| LogEntry {
                event_type: EventType::Modified,
                resource_version: ResourceVersion::new(rv),
                object_name: Some(("ns".into(), format!("p{rv}"))),
                object: None,
            })
            .collect()
    }

    #[test]
    fn replay_starts_after_the_requested_version_or_refuses() {
        let rv = ResourceVersion::new;
        let l = log(&["105", "110", "120"]);
        assert_eq!(replay_start(&l, &rv("100"), &rv("100")), Some(0));
        assert_eq!(replay_start(&l, &rv("100"), &rv("110")), Some(2));
        assert_eq!(replay_start(&l, &rv("100"), &rv("107")), Some(1));
        assert_eq!(replay_start(&l, &rv("100"), &rv("130")), Some(3));
        assert_eq!(replay_start(&l, &rv("100"), &rv("99")), None);
        assert_eq!(replay_start(&l, &rv("100"), &rv("opaque")), None);
        let opaque = log(&["x1", "x2"]);
        assert_eq!(replay_start(&opaque, &rv("x0"), &rv("x1")), Some(1));
    }
}
