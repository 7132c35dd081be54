//! The edge cache's storage layer: what the proxy tees from upstream GET / LIST / WATCH
//! responses, per component, and serves back when the cloud is unreachable. No HTTP here.
//!
//! Start with the [`Store`] trait (the whole API), then [`Scope`] (how LIST results, watch events
//! and single GETs share one copy of each object). [`SledStore`] is the on-disk store under
//! `--disk-cache-path`; [`MemStore`] is the same semantics over a `BTreeMap`.
//!
//! - [`model`]: keys, scopes, results.
//! - `engine`: the semantics, written once over a small key-value seam (`kv`):
//!   `engine::write` (update rules), `engine::read` (which scope answers a query),
//!   `engine::document` (named documents), `engine::maintain` (verify, stats).
//! - `keys` / `record`: the on-disk key layout and checksummed values (documented there).
//! - [`sled_store`]: directory layout, flush policy, crash safety, compaction, the free-space
//!   floor, and what happens after a failed write or damage.
//! - `engine::missed`: scopes known to have missed watch events ([`Store::mark_missed`]).
//! - `guard`: sled's panics turned into [`CacheError::Damaged`].
//!
//! # Threading
//! Every method blocks: sled does disk I/O and the store serializes writers behind a lock. Call
//! writes from one dedicated writer task (a `spawn_blocking` loop fed by a bounded channel, so a
//! slow disk drops cache writes instead of slowing clients) and reads through `spawn_blocking`.
//! Never call the store on an async worker thread.

mod engine;
mod error;
mod guard;
mod json;
mod keys;
mod kv;
mod mem;
pub mod model;
mod record;
pub mod sled_store;

pub use error::{CacheError, ReplayError, TooOld};
pub use mem::MemStore;
pub use model::{
    CachedObject, CompactReport, CorruptEntry, Event, EventType, Gvr, Health, ListResult, Lookup,
    ObjectKey, ReplaceOutcome, ResourceStats, ResourceVersion, Scope, ScopeId, VerifyReport,
    WriteOutcome,
};
pub use sled_store::{BACKGROUND_THREAD_PREFIXES, SledOptions, SledStore};

/// The cache API the proxy programs against. Object-safe, so the proxy can hold an
/// `Arc<dyn Store>` and tests can swap in a [`MemStore`].
///
/// Object bytes go in and come out exactly as upstream sent them. Components are isolated: every
/// read names its component and sees only what that component cached.
pub trait Store: Send + Sync {
    /// Stores one object from a GET (or create/update/patch response) and *pins* it, so it
    /// survives relists of scopes that drop it. Never replaces a newer resourceVersion.
    fn put_object(
        &self,
        component: &str,
        gvr: &Gvr,
        object: &[u8],
    ) -> Result<WriteOutcome, CacheError>;

    /// Forgets an object everywhere (pin and every scope's membership), e.g. after an upstream
    /// 404. Returns whether it was cached.
    fn delete_object(&self, key: &ObjectKey) -> Result<bool, CacheError>;

    /// Atomically replaces a scope with a LIST result: `items` are the list's items, each the
    /// upstream bytes of one object. Members missing from `items` leave the scope (and are
    /// deleted if nothing else holds them), the scope's RV becomes `list_rv`, and its watch log
    /// restarts at `list_rv`. All or nothing: one unparseable item fails the whole call. A list
    /// older than the scope's RV is refused, nothing written
    /// ([`ReplaceOutcome::refused_older_than`]; see `engine::write`).
    fn replace_scope(
        &self,
        scope: &Scope,
        list_rv: &str,
        items: &[&[u8]],
    ) -> Result<ReplaceOutcome, CacheError>;

    /// What [`Store::replace_scope`] does with a list whose every byte but its `metadata`'s
    /// repeats the one that last replaced the scope: `seq` is [`Store::write_seq`] as that
    /// replace left it. While no object, pin, membership or watch log of the scope's resource
    /// (its component and GVR) has been written since, the items are stored as they are, so
    /// only the scope's RV (never back: [`ReplaceOutcome::refused_older_than`]) and its watch
    /// log move on, without reading an item (a bookmark since only moved the RV). `None`:
    /// something was written since (or the database switched, or the scope is gone), and the
    /// caller replaces the scope instead.
    fn renew_scope(
        &self,
        scope: &Scope,
        list_rv: &str,
        seq: u64,
    ) -> Result<Option<ReplaceOutcome>, CacheError>;

    /// Applies one watch event of the stream that followed the scope's LIST, in order. See
    /// `engine::write` for the rules (older versions never win; DELETED removes the object from
    /// the component's cache; BOOKMARK only advances the scope's RV).
    fn apply_event(
        &self,
        scope: &Scope,
        event_type: EventType,
        object: &[u8],
    ) -> Result<WriteOutcome, CacheError> {
        let mut outcomes = self.apply_events(scope, &[(event_type, object)])?;
        outcomes.pop().expect("one outcome per event")
    }

    /// Applies consecutive events of one scope's stream as one atomic write (and so, on disk,
    /// one flush: a group commit), each exactly as [`Store::apply_event`] would, in order.
    /// Returns one result per event: an event that does not parse is rejected on its own. The
    /// outer error is a storage failure, and then none of them was written.
    fn apply_events(
        &self,
        scope: &Scope,
        events: &[(EventType, &[u8])],
    ) -> Result<Vec<Result<WriteOutcome, CacheError>>, CacheError>;

    fn get(&self, key: &ObjectKey) -> Result<Lookup, CacheError>;

    /// Whether `object` is stored under `key` byte for byte (at a resourceVersion) and pinned
    /// there, so that [`Store::put_object`] of it would write nothing (`Unchanged`). Such
    /// bytes were checked in full when they were stored: a repeated GET need not parse them
    /// again. Reads only; the stored bytes are not JSON-checked here.
    fn holds_pinned(&self, key: &ObjectKey, object: &[u8]) -> Result<bool, CacheError>;

    /// Every cached object of one component's resource, in (namespace, name) order, whatever
    /// brought it in (any scope's LIST or watch, or a pinned GET). Unlike [`Store::list`] this
    /// needs no covering scope: it is for tooling (`outpost cache export`), not for serving.
    /// Corrupt records are quarantined and left out (as with [`Store::get`]).
    fn objects(
        &self,
        component: &str,
        gvr: &Gvr,
    ) -> Result<Vec<(ObjectKey, CachedObject)>, CacheError>;

    /// Serves a LIST. `query` is the client's request as a scope (its selectors are evaluated on
    /// the stored JSON where the answering scope did not already apply them). `None` = no cached
    /// scope covers the query. See `engine::read` for how the answering scope is chosen.
    fn list(&self, query: &Scope) -> Result<Option<ListResult>, CacheError>;

    /// The stored scope's last known resourceVersion (exact scope, no covering).
    fn scope_resource_version(&self, scope: &Scope) -> Result<Option<ResourceVersion>, CacheError>;

    /// The events an offline WATCH from `rv` missed, from the scope [`Store::list`] would use,
    /// filtered like the list: each object changed since `rv` once, at its latest version, and
    /// every DELETED; through a broader scope, an object that no longer matches the query comes
    /// as DELETED. `Err(ReplayError::TooOld)` → answer 410 so the client relists.
    fn events_since(&self, query: &Scope, rv: &str) -> Result<Vec<Event>, ReplayError>;

    /// Stores a whole document under `name` (replacing any previous one), sealed like every
    /// record. For what is not an object in a scope: discovery responses (`/api`, `/apis/<g>/<v>`)
    /// so kubectl works offline, and per-resource kind records (`kinds/pods.v1.core`). Shared by
    /// all components; the bytes are kept verbatim and need not be JSON.
    fn put_document(&self, name: &str, bytes: &[u8]) -> Result<(), CacheError>;

    /// The document stored under `name`; a corrupt one is quarantined and reported as `Ok(None)`.
    fn get_document(&self, name: &str) -> Result<Option<bytes::Bytes>, CacheError>;

    /// Removes the document stored under `name`, if any.
    fn delete_document(&self, name: &str) -> Result<(), CacheError>;

    /// Every document whose name starts with `prefix`, in name order (what the hub keeps of its
    /// own under one prefix, e.g. `local/`); corrupt ones are quarantined and left out.
    fn documents(&self, prefix: &str) -> Result<Vec<(String, bytes::Bytes)>, CacheError>;

    /// Checks every entry (documents included); corrupt ones are quarantined and reported.
    fn verify(&self) -> Result<VerifyReport, CacheError>;

    /// Per component and resource; documents are not counted.
    fn stats(&self) -> Result<Vec<ResourceStats>, CacheError>;

    fn health(&self) -> Health;

    /// Marks a scope as having missed watch events (the proxy passed on an event the cache
    /// could not store). Until [`Store::clear_missed`], reads report it: [`ListResult::missed`]
    /// and [`ReplayError::Missed`]. The mark survives a restart; it is kept apart from the
    /// database, so it can be written when the database cannot. `Ok(true)`: newly marked.
    fn mark_missed(&self, scope: &ScopeId, reason: &str) -> Result<bool, CacheError>;

    /// Clears a scope's mark, once a LIST taken after the missed events replaced the scope.
    /// `Ok(true)`: it had one.
    fn clear_missed(&self, scope: &ScopeId) -> Result<bool, CacheError>;

    /// A number that moves whenever a write may have changed what reads return (every commit,
    /// whatever it touched). No I/O, no lock: a reader that notes it *before* a read may keep
    /// that read's answer for as long as the number has not moved.
    fn write_seq(&self) -> u64;

    /// Makes every completed write durable.
    fn flush(&self) -> Result<(), CacheError>;

    fn size_on_disk(&self) -> Result<u64, CacheError>;

    /// Rewrites the store without the garbage its engine accumulates.
    fn compact(&self) -> Result<CompactReport, CacheError>;
}
