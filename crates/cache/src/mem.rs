//! [`MemStore`]: the cache semantics over a `BTreeMap`, for tests (and a proxy run without a
//! disk cache). Same engine, same records, same checksums as [`crate::SledStore`].

use crate::engine::Engine;
use crate::error::{CacheError, ReplayError};
use crate::kv::{Kv, MemKv};
use crate::model::*;
use crate::{Store, sled_store};

pub struct MemStore {
    engine: Engine<MemKv>,
}

impl std::fmt::Debug for MemStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemStore").finish_non_exhaustive()
    }
}

impl MemStore {
    pub fn new() -> Self {
        MemStore::with_max_events(sled_store::DEFAULT_MAX_EVENTS)
    }

    /// `max_events`: watch events kept per scope.
    pub fn with_max_events(max_events: usize) -> Self {
        MemStore {
            engine: Engine::new(MemKv::default(), max_events, Default::default()),
        }
    }

    #[cfg(test)]
    pub(crate) fn raw(&self) -> std::sync::RwLockWriteGuard<'_, MemKv> {
        self.engine.write_kv()
    }

    /// Flips one bit of the record stored for `key`, as a failing disk would: for tests of what
    /// the proxy does with a record that no longer passes its checksum. `false`: none stored.
    #[doc(hidden)]
    pub fn damage_object(&self, key: &ObjectKey) -> bool {
        self.damage(&crate::keys::object_key(crate::keys::OBJECT, key))
    }

    /// Flips one bit of the last byte stored under `raw_key` in the main tree.
    fn damage(&self, raw_key: &[u8]) -> bool {
        let mut kv = self.engine.write_kv();
        match kv.main.get_mut(raw_key).and_then(|v| v.last_mut()) {
            Some(last) => {
                *last ^= 0x20;
                true
            }
            None => false,
        }
    }
}

impl Default for MemStore {
    fn default() -> Self {
        MemStore::new()
    }
}

impl Store for MemStore {
    fn put_object(
        &self,
        component: &str,
        gvr: &Gvr,
        object: &[u8],
    ) -> Result<WriteOutcome, CacheError> {
        self.engine.put_object(component, gvr, object)
    }

    fn delete_object(&self, key: &ObjectKey) -> Result<bool, CacheError> {
        self.engine.delete_object(key)
    }

    fn replace_scope(
        &self,
        scope: &Scope,
        list_rv: &str,
        items: &[&[u8]],
    ) -> Result<ReplaceOutcome, CacheError> {
        self.engine.replace_scope(scope, list_rv, items)
    }

    fn renew_scope(
        &self,
        scope: &Scope,
        list_rv: &str,
        seq: u64,
    ) -> Result<Option<ReplaceOutcome>, CacheError> {
        self.engine.renew_scope(scope, list_rv, seq)
    }

    fn apply_events(
        &self,
        scope: &Scope,
        events: &[(EventType, &[u8])],
    ) -> Result<Vec<Result<WriteOutcome, CacheError>>, CacheError> {
        self.engine.apply_events(scope, events)
    }

    fn get(&self, key: &ObjectKey) -> Result<Lookup, CacheError> {
        self.engine.get(key)
    }

    fn holds_pinned(&self, key: &ObjectKey, object: &[u8]) -> Result<bool, CacheError> {
        self.engine.holds_pinned(key, object)
    }

    fn objects(
        &self,
        component: &str,
        gvr: &Gvr,
    ) -> Result<Vec<(ObjectKey, CachedObject)>, CacheError> {
        self.engine.objects(component, gvr)
    }

    fn list(&self, query: &Scope) -> Result<Option<ListResult>, CacheError> {
        self.engine.list(query)
    }

    fn scope_resource_version(&self, scope: &Scope) -> Result<Option<ResourceVersion>, CacheError> {
        self.engine.scope_resource_version(scope)
    }

    fn events_since(&self, query: &Scope, rv: &str) -> Result<Vec<Event>, ReplayError> {
        self.engine.events_since(query, rv)
    }

    fn put_document(&self, name: &str, bytes: &[u8]) -> Result<(), CacheError> {
        self.engine.put_document(name, bytes)
    }

    fn get_document(&self, name: &str) -> Result<Option<bytes::Bytes>, CacheError> {
        self.engine.get_document(name)
    }

    fn delete_document(&self, name: &str) -> Result<(), CacheError> {
        self.engine.delete_document(name)
    }

    fn documents(&self, prefix: &str) -> Result<Vec<(String, bytes::Bytes)>, CacheError> {
        self.engine.documents(prefix)
    }

    fn verify(&self) -> Result<VerifyReport, CacheError> {
        self.engine.verify()
    }

    fn stats(&self) -> Result<Vec<ResourceStats>, CacheError> {
        self.engine.stats()
    }

    fn health(&self) -> Health {
        self.engine.health()
    }

    fn mark_missed(&self, scope: &ScopeId, reason: &str) -> Result<bool, CacheError> {
        self.engine.missed().mark(scope, reason)
    }

    fn clear_missed(&self, scope: &ScopeId) -> Result<bool, CacheError> {
        self.engine.missed().clear(scope)
    }

    fn write_seq(&self) -> u64 {
        self.engine.write_seq()
    }

    fn flush(&self) -> Result<(), CacheError> {
        Ok(())
    }

    /// Bytes of keys and values held.
    fn size_on_disk(&self) -> Result<u64, CacheError> {
        self.engine.read_kv().size()
    }

    /// Nothing to reclaim in memory.
    fn compact(&self) -> Result<CompactReport, CacheError> {
        let size = self.size_on_disk()?;
        let entries = self.engine.read_kv().main.len() as u64;
        Ok(CompactReport {
            before_bytes: size,
            after_bytes: size,
            entries,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::{self, OBJECT};
    use crate::record;

    fn pod(name: &str, rv: &str) -> Vec<u8> {
        format!(r#"{{"metadata":{{"name":"{name}","namespace":"a","resourceVersion":"{rv}"}}}}"#)
            .into_bytes()
    }

    fn key(name: &str) -> ObjectKey {
        ObjectKey::new("kubelet", &Gvr::new("", "v1", "pods"), "a", name)
    }

    fn flip_last_byte(store: &MemStore, raw_key: &[u8]) {
        assert!(store.damage(raw_key), "entry exists");
    }

    #[test]
    fn a_corrupt_object_is_quarantined_on_read_and_reported_missing_by_lists() {
        let store = MemStore::new();
        let scope = Scope::unfiltered("kubelet", &Gvr::new("", "v1", "pods"), None);
        let items = [pod("p1", "1"), pod("p2", "2")];
        let refs: Vec<&[u8]> = items.iter().map(Vec::as_slice).collect();
        store.replace_scope(&scope, "2", &refs).expect("replace");
        flip_last_byte(&store, &keys::object_key(OBJECT, &key("p1")));

        let list = store.list(&scope).expect("list").expect("cached");
        assert_eq!(list.missing, [key("p1")]);
        assert_eq!(list.items.len(), 1);
        assert_eq!(store.health().quarantined, 1);
        assert_eq!(store.get(&key("p1")).expect("get"), Lookup::NotCached);
        assert!(
            store.verify().expect("verify").corrupt.is_empty(),
            "already moved"
        );
    }

    #[test]
    fn get_reports_quarantine_once_then_absent() {
        let store = MemStore::new();
        store
            .put_object("kubelet", &key("p").gvr, &pod("p", "1"))
            .expect("put");
        flip_last_byte(&store, &keys::object_key(OBJECT, &key("p")));
        assert_eq!(store.get(&key("p")).expect("get"), Lookup::Quarantined);
        assert_eq!(store.get(&key("p")).expect("get"), Lookup::NotCached);
        store
            .put_object("kubelet", &key("p").gvr, &pod("p", "1"))
            .expect("refetched");
        assert!(
            matches!(store.get(&key("p")), Ok(Lookup::Found(_))),
            "a refetch heals"
        );
    }

    #[test]
    fn a_sealed_record_with_invalid_json_is_still_caught() {
        let store = MemStore::new();
        store
            .put_object("kubelet", &key("p").gvr, &pod("p", "1"))
            .expect("put");
        let bogus = record::encode_object("1", "", b"{\"metadata\":", 0);
        store
            .raw()
            .main
            .insert(keys::object_key(OBJECT, &key("p")), bogus);
        let report = store.verify().expect("verify");
        assert_eq!(report.corrupt.len(), 1);
        assert!(
            report.corrupt[0].reason.contains("JSON"),
            "{:?}",
            report.corrupt
        );
        assert_eq!(store.get(&key("p")).expect("get"), Lookup::NotCached);
    }

    #[test]
    fn a_corrupt_document_is_quarantined_by_get_and_by_verify() {
        let store = MemStore::new();
        let kind = br#"{"kind":"Pod","listKind":"PodList"}"#;
        for name in ["kinds/pods.v1.core", "/api"] {
            store.put_document(name, kind).expect("put");
        }
        flip_last_byte(&store, &keys::document_key("kinds/pods.v1.core"));
        assert_eq!(store.get_document("kinds/pods.v1.core").expect("get"), None);
        assert_eq!(store.health().quarantined, 1);
        assert!(
            store.verify().expect("verify").corrupt.is_empty(),
            "already moved"
        );

        flip_last_byte(&store, &keys::document_key("/api"));
        let report = store.verify().expect("verify");
        let bad: Vec<&str> = report.corrupt.iter().map(|c| c.key.as_str()).collect();
        assert_eq!(bad, ["document /api"]);
        assert_eq!(store.get_document("/api").expect("get"), None);
        assert_eq!(store.health().quarantined, 2);
        store.put_document("/api", kind).expect("refetched");
        assert_eq!(
            store.get_document("/api").expect("get").as_deref(),
            Some(&kind[..])
        );
    }

    #[test]
    fn health_answers_while_the_store_lock_is_held() {
        let store = std::sync::Arc::new(MemStore::new());
        let held = store.raw();
        let (tx, rx) = std::sync::mpsc::channel();
        let s2 = store.clone();
        std::thread::spawn(move || tx.send(s2.health()).expect("send"));
        let health = rx.recv_timeout(std::time::Duration::from_secs(5));
        drop(held);
        assert_eq!(
            health.expect("health blocked on the store lock"),
            Health::default()
        );
    }

    #[test]
    fn a_corrupt_event_log_refuses_replay_instead_of_skipping_events() {
        let store = MemStore::new();
        let scope = Scope::unfiltered("kubelet", &Gvr::new("", "v1", "pods"), None);
        store.replace_scope(&scope, "1", &[]).expect("replace");
        store
            .apply_event(&scope, EventType::Added, &pod("p", "2"))
            .expect("add");
        store
            .apply_event(&scope, EventType::Modified, &pod("p", "3"))
            .expect("mod");
        let first_event = keys::event_key(&scope.id(), 0);
        flip_last_byte(&store, &first_event);
        assert!(matches!(
            store.events_since(&scope, "1"),
            Err(ReplayError::TooOld(_))
        ));
        assert_eq!(store.health().quarantined, 1);
    }

    /// A call stuck waiting for the store's lock (behind a stuck write or read) counts as busy:
    /// it is what a deadlocked sled looks like from every other caller.
    #[test]
    fn a_call_waiting_for_the_lock_counts_as_busy() {
        let store = std::sync::Arc::new(MemStore::new());
        assert_eq!(store.health().busy_for, None);
        let held = store.raw();
        let waiting = {
            let store = store.clone();
            std::thread::spawn(move || {
                let pod = br#"{"metadata":{"name":"p","namespace":"a","resourceVersion":"1"}}"#;
                store.put_object("kubelet", &Gvr::new("", "v1", "pods"), pod)
            })
        };
        std::thread::sleep(std::time::Duration::from_millis(60));
        let busy = store.health().busy_for.expect("busy");
        assert!(busy >= std::time::Duration::from_millis(50), "{busy:?}");
        drop(held);
        waiting.join().unwrap().unwrap();
        assert_eq!(store.health().busy_for, None);
    }
}
