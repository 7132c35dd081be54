//! How upstream responses change the keyspace. Each public function plans one [`WriteBatch`]
//! from the current state; [`Engine::write`] commits it atomically. The planner reads its own
//! pending writes, so a run of watch events plans into one batch (`apply_events`, the writer's
//! group commit) and ends exactly where applying them one by one would.
//!
//! Rules, in one place:
//! - an object is never replaced by an older resourceVersion (both parse and the new one is
//!   smaller); equal or unparseable versions are accepted;
//! - a LIST replaces its scope's membership, sets the scope RV to the list RV and resets the
//!   scope's event log (the events between the old log and the relist are unknown); a LIST
//!   older than the scope (both RVs parse, the list's is smaller: another client's watch of the
//!   same scope moved it on while this LIST was on its way) is refused whole, since replacing
//!   would move the scope back in time: members created since would vanish and deleted ones
//!   return, under a resourceVersion that claims otherwise;
//! - a watch event older than its scope's RV is superseded and changes nothing: the scope
//!   already holds its effect or a later one (two clients of one component watching the same
//!   scope, one behind the other; a late ADDED would bring back what the other saw deleted);
//! - ADDED/MODIFIED upsert the object and make it a member; DELETED removes the object from
//!   every scope of its component and drops its pin, unless the cache holds a newer version
//!   (then only this scope's membership goes);
//! - an object nobody references any more (no membership, no pin) is deleted with the last
//!   reference.

use std::collections::BTreeSet;

use bytes::Bytes;

use crate::engine::Engine;
use crate::error::CacheError;
use crate::json::{self, Identity};
use crate::keys::{self, MEMBER, OBJECT, PIN, SCOPE};
use crate::kv::{Kv, WriteBatch};
use crate::model::{
    EventType, Gvr, ObjectKey, ReplaceOutcome, ResourceVersion, Scope, ScopeId, WriteOutcome,
};
use crate::record::{self, ScopeMeta};

/// Reads the current state and accumulates one batch.
struct Planner<'a, K> {
    kv: &'a K,
    batch: WriteBatch,
    now_ms: u64,
    max_events: usize,
}

impl<'a, K: Kv> Planner<'a, K> {
    fn new(kv: &'a K, max_events: usize) -> Self {
        Planner {
            kv,
            batch: WriteBatch::default(),
            now_ms: record::now_millis(),
            max_events,
        }
    }

    /// The value as this batch leaves it: the planner's own writes first, then the store. A
    /// batch of several watch events must see the earlier events' writes.
    fn get(&self, key: &[u8]) -> Result<Option<Bytes>, CacheError> {
        match self.batch.main.get(key) {
            Some(pending) => Ok(pending.as_deref().map(Bytes::copy_from_slice)),
            None => self.kv.get(key),
        }
    }

    /// The keys under `prefix` as this batch leaves them, in order.
    fn keys_under(&self, prefix: &[u8]) -> Result<Vec<Vec<u8>>, CacheError> {
        let mut keys: BTreeSet<Vec<u8>> = self
            .kv
            .scan(prefix)
            .map(|entry| entry.map(|(k, _)| k))
            .collect::<Result<_, _>>()?;
        let pending = self.batch.main.range(prefix.to_vec()..);
        for (key, value) in pending.take_while(|(k, _)| k.starts_with(prefix)) {
            match value {
                Some(_) => keys.insert(key.clone()),
                None => keys.remove(key),
            };
        }
        Ok(keys.into_iter().collect())
    }

    /// The stored object's version; a corrupt record counts as absent so the write heals it.
    fn stored_rv(&self, key: &ObjectKey) -> Result<Option<ResourceVersion>, CacheError> {
        let raw = self.get(&keys::object_key(OBJECT, key))?;
        Ok(raw.and_then(|raw| record::decode_object(&raw).ok().map(|o| o.resource_version)))
    }

    /// Writes the object unless a newer version, or these very bytes, are stored (a relist of
    /// unchanged objects rewrites none of them). Reads the stored record once. An object read
    /// only for its identity is read whole here, unless the store already holds these very
    /// bytes (they were read whole when they were written).
    fn upsert(&mut self, key: &ObjectKey, object: &Incoming<'_>) -> Result<Upsert, CacheError> {
        let (id, bytes) = (&object.id, object.bytes);
        let stored = self
            .get(&keys::object_key(OBJECT, key))?
            .and_then(|raw| record::decode_object(&raw).ok());
        if stored.as_ref().is_some_and(|s| same_version(s, id, bytes)) {
            return Ok(Upsert::AlreadyStored);
        }
        object.read_whole()?;
        if let Some(stored) = stored.filter(|s| id.rv.is_older_than(&s.resource_version)) {
            return Ok(Upsert::KeptNewer(stored.resource_version));
        }
        let value = record::encode_object(id.rv.as_str(), &id.uid, bytes, self.now_ms);
        self.batch.put(keys::object_key(OBJECT, key), value);
        Ok(Upsert::Written)
    }

    fn is_pinned(&self, key: &ObjectKey) -> Result<bool, CacheError> {
        Ok(self.get(&keys::object_key(PIN, key))?.is_some())
    }

    fn scope_meta(&self, scope: &ScopeId) -> Result<Option<ScopeMeta>, CacheError> {
        let raw = self.get(&keys::scope_key(SCOPE, scope))?;
        Ok(raw.and_then(|raw| record::decode_scope(&raw).ok()))
    }

    /// Every stored scope of the object's component and resource (typically one to three).
    fn sibling_scopes(&self, component: &str, gvr: &Gvr) -> Result<Vec<ScopeId>, CacheError> {
        let prefix = keys::resource_prefix(SCOPE, component, gvr);
        let keys = self.keys_under(&prefix)?;
        Ok(keys
            .iter()
            .filter_map(|k| keys::decode_scope_key(k))
            .collect())
    }

    /// Whether anything other than `except` still holds the object.
    fn referenced_elsewhere(&self, key: &ObjectKey, except: &ScopeId) -> Result<bool, CacheError> {
        if self.is_pinned(key)? {
            return Ok(true);
        }
        for scope in self.sibling_scopes(&key.component, &key.gvr)? {
            let member = keys::member_key(&scope, &key.namespace, &key.name);
            if scope != *except && self.get(&member)?.is_some() {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Drops `scope`'s membership, and the object itself if that was its last reference.
    fn leave_scope(&mut self, key: &ObjectKey, scope: &ScopeId) -> Result<(), CacheError> {
        self.batch
            .remove(keys::member_key(scope, &key.namespace, &key.name));
        if !self.referenced_elsewhere(key, scope)? {
            self.batch.remove(keys::object_key(OBJECT, key));
        }
        Ok(())
    }

    /// Removes the object, its pin and its membership in every scope.
    fn remove_everywhere(&mut self, key: &ObjectKey) -> Result<bool, CacheError> {
        let object = keys::object_key(OBJECT, key);
        let existed = self.get(&object)?.is_some();
        self.batch.remove(object);
        self.batch.remove(keys::object_key(PIN, key));
        for scope in self.sibling_scopes(&key.component, &key.gvr)? {
            self.batch
                .remove(keys::member_key(&scope, &key.namespace, &key.name));
        }
        Ok(existed)
    }

    fn put_scope(&mut self, scope: &ScopeId, meta: &ScopeMeta) {
        self.batch
            .put(keys::scope_key(SCOPE, scope), record::encode_scope(meta));
    }

    /// Appends to the scope's log and trims it to `max_events`, moving the floor up. Only a
    /// DELETED entry carries the object: the others' versions are in the object records.
    fn log_event(
        &mut self,
        scope: &ScopeId,
        meta: &mut ScopeMeta,
        event_type: EventType,
        item: &Incoming<'_>,
    ) -> Result<(), CacheError> {
        if self.max_events == 0 {
            meta.log_floor_rv = meta.rv.clone();
            return Ok(());
        }
        let carried = (event_type == EventType::Deleted).then_some(item.bytes);
        let id = &item.id;
        let value =
            record::encode_event(event_type, id.rv.as_str(), &id.namespace, &id.name, carried);
        self.batch.put(keys::event_key(scope, meta.log_next), value);
        meta.log_next += 1;
        while meta.log_next - meta.log_first > self.max_events as u64 {
            self.trim_oldest(scope, meta)?;
        }
        Ok(())
    }

    fn trim_oldest(&mut self, scope: &ScopeId, meta: &mut ScopeMeta) -> Result<(), CacheError> {
        let key = keys::event_key(scope, meta.log_first);
        let trimmed = self.get(&key)?;
        let trimmed_rv = trimmed.and_then(|raw| record::decode_event(&raw).ok());
        // If the trimmed event is unreadable its version is unknown: only watches from the
        // current scope version can still be served exactly.
        // The floor never moves back: a stale event (an older version that lost to a newer one)
        // can sit behind newer ones in the log, and trimming it must not re-admit watches from
        // versions whose events are already gone.
        meta.log_floor_rv = match trimmed_rv {
            Some(event)
                if event
                    .resource_version
                    .is_older_than(&ResourceVersion::new(&meta.log_floor_rv)) =>
            {
                meta.log_floor_rv.clone()
            }
            Some(event) => event.resource_version.as_str().to_owned(),
            None => meta.rv.clone(),
        };
        self.batch.remove(key);
        meta.log_first += 1;
        Ok(())
    }

    /// The scope's record after a LIST at `list_rv`, its log emptied: a new generation whose
    /// log starts there.
    fn restart_scope(
        &mut self,
        scope: &ScopeId,
        old: Option<ScopeMeta>,
        list_rv: &str,
    ) -> Result<(), CacheError> {
        self.clear_log(scope)?;
        // Sequence numbers keep counting across relists so no event key is ever reused.
        let next = old.as_ref().map_or(0, |m| m.log_next);
        let meta = ScopeMeta {
            rv: list_rv.to_owned(),
            generation: old.map_or(1, |m| m.generation + 1),
            updated_ms: self.now_ms,
            log_first: next,
            log_next: next,
            log_floor_rv: list_rv.to_owned(),
        };
        self.put_scope(scope, &meta);
        Ok(())
    }

    fn clear_log(&mut self, scope: &ScopeId) -> Result<(), CacheError> {
        let prefix = keys::scope_key(keys::EVENT, scope);
        for key in self.keys_under(&prefix)? {
            self.batch.remove(key);
        }
        Ok(())
    }

    fn members(&self, scope: &ScopeId) -> Result<BTreeSet<(String, String)>, CacheError> {
        let prefix = keys::scope_key(MEMBER, scope);
        let keys = self.keys_under(&prefix)?;
        Ok(keys
            .iter()
            .filter_map(|k| keys::decode_member(k, prefix.len()))
            .collect())
    }
}

/// The scope's version when it is newer than a LIST at `list_rv`: the list must not roll the
/// scope back, and is refused.
fn newer_than_list(meta: Option<&ScopeMeta>, list_rv: &str) -> Option<ResourceVersion> {
    let held = ResourceVersion::new(&meta?.rv);
    ResourceVersion::new(list_rv)
        .is_older_than(&held)
        .then_some(held)
}

/// Moves the scope's version forward (never back, never to an empty string).
fn advance(meta: &mut ScopeMeta, rv: &ResourceVersion, now_ms: u64) {
    if !rv.as_str().is_empty() && !rv.is_older_than(&ResourceVersion::new(&meta.rv)) {
        meta.rv = rv.as_str().to_owned();
    }
    meta.updated_ms = now_ms;
}

/// Objects of a namespaced scope must come from that namespace.
fn check_namespace(scope: &Scope, id: &Identity) -> Result<(), CacheError> {
    match &scope.namespace {
        Some(ns) if *ns != id.namespace => Err(CacheError::InvalidObject(format!(
            "object {}/{} is outside scope namespace {ns}",
            id.namespace, id.name
        ))),
        _ => Ok(()),
    }
}

fn object_key(scope: &Scope, id: &Identity) -> ObjectKey {
    ObjectKey::new(&scope.component, &scope.gvr, &id.namespace, &id.name)
}

/// An object on its way into the store, and how much of it has been read.
struct Incoming<'b> {
    id: Identity,
    bytes: &'b [u8],
    read_whole: bool,
}

impl<'b> Incoming<'b> {
    /// Reads (and so validates) the whole object.
    fn whole(bytes: &'b [u8]) -> Result<Self, CacheError> {
        Ok(Incoming {
            id: json::identity(bytes)?,
            bytes,
            read_whole: true,
        })
    }

    /// Reads only the identity; [`Planner::upsert`] reads the rest if it has to write it.
    fn located(bytes: &'b [u8]) -> Result<Self, CacheError> {
        Ok(Incoming {
            id: json::identity_prefix(bytes)?,
            bytes,
            read_whole: false,
        })
    }

    /// Validates what [`Incoming::located`] skipped; the whole object must name the same
    /// identity (it would not if `metadata` or one of its keys came twice).
    fn read_whole(&self) -> Result<(), CacheError> {
        if self.read_whole || json::identity(self.bytes)? == self.id {
            return Ok(());
        }
        Err(CacheError::InvalidObject(
            "metadata reads differently in whole".into(),
        ))
    }
}

/// Each item's identity only: a relist mostly repeats objects the store holds byte for byte,
/// and those need no second look. The others are read whole before they are written.
fn locate_items<'b>(scope: &Scope, items: &[&'b [u8]]) -> Result<Vec<Incoming<'b>>, CacheError> {
    items
        .iter()
        .enumerate()
        .map(|(i, bytes)| {
            let item = Incoming::located(bytes).map_err(|e| in_list_item(i, e))?;
            check_namespace(scope, &item.id)?;
            Ok(item)
        })
        .collect()
}

fn in_list_item(i: usize, e: CacheError) -> CacheError {
    match e {
        CacheError::InvalidObject(reason) => {
            CacheError::InvalidObject(format!("list item {i}: {reason}"))
        }
        other => other,
    }
}

impl<K: Kv> Engine<K> {
    pub(crate) fn replace_scope(
        &self,
        scope: &Scope,
        list_rv: &str,
        items: &[&[u8]],
    ) -> Result<ReplaceOutcome, CacheError> {
        let located = locate_items(scope, items)?;
        let id = scope.id();
        self.write(|kv| {
            let mut p = Planner::new(kv, self.max_events());
            let old_meta = p.scope_meta(&id)?;
            let mut outcome = ReplaceOutcome::default();
            if let Some(held) = newer_than_list(old_meta.as_ref(), list_rv) {
                outcome.refused_older_than = Some(held);
                return Ok((p.batch, outcome));
            }
            let old_members = p.members(&id)?;
            let mut new_members = BTreeSet::new();
            for (i, item) in located.iter().enumerate() {
                let key = object_key(scope, &item.id);
                match p.upsert(&key, item).map_err(|e| in_list_item(i, e))? {
                    Upsert::Written => {
                        outcome.stored += 1;
                        outcome.written_bytes += item.bytes.len();
                    }
                    Upsert::AlreadyStored => outcome.stored += 1,
                    Upsert::KeptNewer(_) => outcome.kept_newer += 1,
                }
                let member = (key.namespace, key.name);
                if !old_members.contains(&member) {
                    p.batch
                        .put(keys::member_key(&id, &member.0, &member.1), Vec::new());
                }
                new_members.insert(member);
            }
            for (ns, name) in old_members.difference(&new_members) {
                p.leave_scope(&ObjectKey::new(&scope.component, &scope.gvr, ns, name), &id)?;
                outcome.removed += 1;
            }
            p.restart_scope(&id, old_meta, list_rv)?;
            Ok((p.batch, outcome))
        })
    }

    /// See [`crate::Store::renew_scope`]: what `replace_scope` writes for a list whose items
    /// the scope holds as they are, no item of its resource written since `seq` (checked under
    /// the write lock, so nothing can commit in between): the scope's version, generation and
    /// log. A bookmark since then only moved the scope's version, which this checks as
    /// `replace_scope` does.
    pub(crate) fn renew_scope(
        &self,
        scope: &Scope,
        list_rv: &str,
        seq: u64,
    ) -> Result<Option<ReplaceOutcome>, CacheError> {
        let id = scope.id();
        self.write(|kv| {
            let mut p = Planner::new(kv, self.max_events());
            let resource = keys::resource_prefix(SCOPE, &scope.component, &scope.gvr);
            if !self.items_unchanged_since(&resource[1..], seq) {
                return Ok((p.batch, None));
            }
            let Some(old_meta) = p.scope_meta(&id)? else {
                return Ok((p.batch, None));
            };
            let mut outcome = ReplaceOutcome::default();
            if let Some(held) = newer_than_list(Some(&old_meta), list_rv) {
                outcome.refused_older_than = Some(held);
                return Ok((p.batch, Some(outcome)));
            }
            // The log is empty, unless the scope's own watch logged an event (then `seq` is stale).
            p.restart_scope(&id, Some(old_meta), list_rv)?;
            Ok((p.batch, Some(outcome)))
        })
    }

    /// Consecutive watch events of one scope, planned in order into one batch (one commit, so
    /// one flush): each event sees the writes of those before it. An event that does not parse
    /// gets its own error and writes nothing; the others still apply.
    pub(crate) fn apply_events(
        &self,
        scope: &Scope,
        events: &[(EventType, &[u8])],
    ) -> Result<Vec<Result<WriteOutcome, CacheError>>, CacheError> {
        let parsed: Vec<_> = events
            .iter()
            .map(|(event_type, bytes)| parse_event(scope, *event_type, bytes))
            .collect();
        let id = scope.id();
        self.write(|kv| {
            let mut p = Planner::new(kv, self.max_events());
            let mut outcomes = Vec::with_capacity(events.len());
            for ((event_type, _), parsed) in events.iter().zip(parsed) {
                outcomes.push(match parsed {
                    Ok(parsed) => plan_event(&mut p, scope, &id, *event_type, parsed),
                    Err(e) => Err(e),
                });
            }
            Ok((p.batch, outcomes))
        })
    }

    pub(crate) fn put_object(
        &self,
        component: &str,
        gvr: &Gvr,
        bytes: &[u8],
    ) -> Result<WriteOutcome, CacheError> {
        let item = Incoming::located(bytes)?;
        let key = ObjectKey::new(component, gvr, &item.id.namespace, &item.id.name);
        self.write(|kv| {
            let mut p = Planner::new(kv, self.max_events());
            let outcome = match p.upsert(&key, &item)? {
                // A repeated GET of an unchanged object: nothing to write, not even the pin.
                Upsert::AlreadyStored if p.is_pinned(&key)? => {
                    return Ok((p.batch, WriteOutcome::Unchanged));
                }
                Upsert::Written | Upsert::AlreadyStored => WriteOutcome::Stored,
                Upsert::KeptNewer(stored) => WriteOutcome::KeptNewer { stored },
            };
            p.batch.put(keys::object_key(PIN, &key), Vec::new());
            Ok((p.batch, outcome))
        })
    }

    pub(crate) fn delete_object(&self, key: &ObjectKey) -> Result<bool, CacheError> {
        self.write(|kv| {
            let mut p = Planner::new(kv, self.max_events());
            let existed = p.remove_everywhere(key)?;
            Ok((p.batch, existed))
        })
    }
}

/// What [`Planner::upsert`] did with one object.
enum Upsert {
    Written,
    /// These very bytes were stored at this resourceVersion already.
    AlreadyStored,
    /// A newer version is stored and was kept.
    KeptNewer(ResourceVersion),
}

/// Whether `stored` is exactly `bytes` at `id`'s (non-empty) resourceVersion.
fn same_version(stored: &crate::CachedObject, id: &Identity, bytes: &[u8]) -> bool {
    !id.rv.as_str().is_empty()
        && stored.resource_version.as_str() == id.rv.as_str()
        && stored.bytes == bytes
}

/// ADDED / MODIFIED. Without a known scope only objects the component already has are refreshed.
fn plan_upsert<K: Kv>(
    p: &mut Planner<'_, K>,
    key: &ObjectKey,
    item: &Incoming<'_>,
    scope: &ScopeId,
    scope_known: bool,
) -> Result<WriteOutcome, CacheError> {
    if !scope_known && p.stored_rv(key)?.is_none() {
        return Ok(WriteOutcome::ScopeUnknown);
    }
    let outcome = match p.upsert(key, item)? {
        Upsert::Written | Upsert::AlreadyStored => WriteOutcome::Stored,
        Upsert::KeptNewer(stored) => WriteOutcome::KeptNewer { stored },
    };
    if scope_known {
        p.batch.put(
            keys::member_key(scope, &key.namespace, &key.name),
            Vec::new(),
        );
    }
    Ok(outcome)
}

/// DELETED. A delete older than the stored version only means "gone from this scope".
fn plan_delete<K: Kv>(
    p: &mut Planner<'_, K>,
    key: &ObjectKey,
    item: &Identity,
    scope: &ScopeId,
    scope_known: bool,
) -> Result<WriteOutcome, CacheError> {
    match p.stored_rv(key)? {
        Some(stored) if item.rv.is_older_than(&stored) => {
            if scope_known {
                p.leave_scope(key, scope)?;
            }
            Ok(WriteOutcome::KeptNewer { stored })
        }
        Some(_) => {
            p.remove_everywhere(key)?;
            Ok(WriteOutcome::Deleted)
        }
        None if scope_known => {
            p.remove_everywhere(key)?;
            Ok(WriteOutcome::Deleted)
        }
        None => Ok(WriteOutcome::ScopeUnknown),
    }
}

/// What an event carries, read whole (most events are written) before the write lock is taken.
enum Parsed<'b> {
    Object(Incoming<'b>),
    Bookmark(ResourceVersion),
}

fn parse_event<'b>(
    scope: &Scope,
    event_type: EventType,
    bytes: &'b [u8],
) -> Result<Parsed<'b>, CacheError> {
    match event_type {
        EventType::Bookmark => return json::bookmark_rv(bytes).map(Parsed::Bookmark),
        EventType::Error => {
            return Err(CacheError::InvalidObject(
                "an ERROR event is not cached".into(),
            ));
        }
        EventType::Added | EventType::Modified | EventType::Deleted => {}
    }
    let item = Incoming::whole(bytes)?;
    check_namespace(scope, &item.id)?;
    Ok(Parsed::Object(item))
}

/// One event: the object's upsert or delete, then the scope's version and log.
fn plan_event<K: Kv>(
    p: &mut Planner<'_, K>,
    scope: &Scope,
    id: &ScopeId,
    event_type: EventType,
    parsed: Parsed<'_>,
) -> Result<WriteOutcome, CacheError> {
    let meta = p.scope_meta(id)?;
    let item = match parsed {
        Parsed::Bookmark(rv) => {
            let Some(mut meta) = meta else {
                return Ok(WriteOutcome::ScopeUnknown);
            };
            advance(&mut meta, &rv, p.now_ms);
            p.put_scope(id, &meta);
            return Ok(WriteOutcome::Bookmarked);
        }
        Parsed::Object(item) => item,
    };
    if let Some(held) = meta.as_ref().map(|m| ResourceVersion::new(&m.rv))
        && item.id.rv.is_older_than(&held)
    {
        return Ok(WriteOutcome::Superseded { scope: held });
    }
    let key = object_key(scope, &item.id);
    let outcome = match event_type {
        EventType::Deleted => plan_delete(p, &key, &item.id, id, meta.is_some())?,
        _ => plan_upsert(p, &key, &item, id, meta.is_some())?,
    };
    if let Some(mut meta) = meta {
        advance(&mut meta, &item.id.rv, p.now_ms);
        p.log_event(id, &mut meta, event_type, &item)?;
        p.put_scope(id, &meta);
    }
    Ok(outcome)
}
