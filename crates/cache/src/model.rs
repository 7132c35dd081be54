//! The vocabulary of the cache: what is stored ([`ObjectKey`], [`CachedObject`]), what a LIST or
//! WATCH belongs to ([`Scope`], [`ScopeId`]) and what the [`Store`](crate::Store) methods return.
//!
//! Start with [`Scope`]: its doc explains how LIST results, watch events and single-object reads
//! share one copy of each object.

use std::fmt;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use outpost_core::selector::{FieldSelector, LabelSelector};

/// An API resource: `group` is `""` for the core group. Nothing is hard-coded per resource, so CRDs
/// work like built-in types.
#[derive(
    Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub struct Gvr {
    pub group: String,
    pub version: String,
    /// Plural resource name as in the URL, e.g. `pods`, `endpointslices`, `widgets`.
    pub resource: String,
}

impl Gvr {
    pub fn new(group: &str, version: &str, resource: &str) -> Self {
        Gvr {
            group: group.to_owned(),
            version: version.to_owned(),
            resource: resource.to_owned(),
        }
    }
}

impl fmt::Display for Gvr {
    /// yurthub's directory spelling, `pods.v1.core`, so operators recognise it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let group = if self.group.is_empty() {
            "core"
        } else {
            &self.group
        };
        write!(f, "{}.{}.{group}", self.resource, self.version)
    }
}

/// One cached object. `namespace` is `""` for cluster-scoped objects.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectKey {
    /// Who cached it (user agent before `/`): components never see each other's objects.
    pub component: String,
    pub gvr: Gvr,
    pub namespace: String,
    pub name: String,
}

impl ObjectKey {
    pub fn new(component: &str, gvr: &Gvr, namespace: &str, name: &str) -> Self {
        ObjectKey {
            component: component.to_owned(),
            gvr: gvr.clone(),
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        }
    }
}

impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}/", self.component, self.gvr)?;
        if !self.namespace.is_empty() {
            write!(f, "{}/", self.namespace)?;
        }
        f.write_str(&self.name)
    }
}

/// A `resourceVersion` exactly as the apiserver sent it, plus its `u64` reading when it has one.
///
/// Kubernetes says RVs are opaque; like yurthub (and every client that survives in practice) we
/// still order them as integers, but only when both sides parse. An RV that does not parse is
/// never "older" than anything, so it is accepted rather than blocking updates forever.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ResourceVersion {
    raw: String,
    number: Option<u64>,
}

impl ResourceVersion {
    pub fn new(raw: &str) -> Self {
        ResourceVersion {
            raw: raw.to_owned(),
            number: raw.parse().ok(),
        }
    }

    pub fn as_str(&self) -> &str {
        &self.raw
    }

    pub fn number(&self) -> Option<u64> {
        self.number
    }

    /// True only when both parse and `self < other`; equal versions are not older.
    pub fn is_older_than(&self, other: &ResourceVersion) -> bool {
        matches!((self.number, other.number), (Some(a), Some(b)) if a < b)
    }
}

impl fmt::Display for ResourceVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.raw)
    }
}

/// What a LIST (and the WATCH that follows it) covers: one component's view of one resource in
/// one namespace (or all), narrowed by label and field selectors.
///
/// # Model
/// - Objects are stored **once per component** under their [`ObjectKey`], whatever request
///   brought them in.
/// - A scope owns a **membership set** (which objects its last LIST plus later watch events say
///   it contains), its own resourceVersion and a bounded watch-event log.
/// - A single-object read (`GET`, or a write response) *pins* the object instead.
/// - An object is deleted when the last membership and the pin are gone, or when a watch
///   `DELETED` event (or an upstream 404, via `delete_object`) says it no longer exists.
///
/// So kubelet's `pods?fieldSelector=spec.nodeName=n1` across all namespaces and its `GET` of one
/// of those pods share one copy; a relist of the first scope that drops the pod leaves the
/// pinned copy alone. Any number of selector variants can be cached side by side, unlike
/// yurthub, whose first selector wins forever.
#[derive(Debug, Clone, PartialEq)]
pub struct Scope {
    pub component: String,
    pub gvr: Gvr,
    /// `None` = all namespaces; also what cluster-scoped resources use.
    pub namespace: Option<String>,
    pub labels: LabelSelector,
    pub fields: FieldSelector,
}

impl Scope {
    pub fn new(
        component: &str,
        gvr: &Gvr,
        namespace: Option<&str>,
        labels: LabelSelector,
        fields: FieldSelector,
    ) -> Self {
        Scope {
            component: component.to_owned(),
            gvr: gvr.clone(),
            namespace: namespace.map(str::to_owned),
            labels,
            fields,
        }
    }

    /// Every object of `gvr` in `namespace` (or all), no selectors.
    pub fn unfiltered(component: &str, gvr: &Gvr, namespace: Option<&str>) -> Self {
        Scope::new(
            component,
            gvr,
            namespace,
            LabelSelector::default(),
            FieldSelector::default(),
        )
    }

    /// The identity under which the scope is stored: selectors in their canonical spelling, so
    /// `b=2,a=1` and `a=1,b=2` are one scope.
    pub fn id(&self) -> ScopeId {
        ScopeId {
            component: self.component.clone(),
            gvr: self.gvr.clone(),
            namespace: self.namespace.clone(),
            label_selector: self.labels.to_string(),
            field_selector: self.fields.to_string(),
        }
    }
}

/// A stored scope's identity, with selectors as canonical strings (see [`Scope::id`]).
#[derive(
    Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub struct ScopeId {
    pub component: String,
    pub gvr: Gvr,
    pub namespace: Option<String>,
    pub label_selector: String,
    pub field_selector: String,
}

impl fmt::Display for ScopeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ns = self.namespace.as_deref().unwrap_or("*");
        write!(
            f,
            "{}/{}/{ns}?labelSelector={}&fieldSelector={}",
            self.component, self.gvr, self.label_selector, self.field_selector
        )
    }
}

/// A watch event's type: the wire's own ([`outpost_core::wire::EventType`]). An `ERROR` event
/// is never cached (the store refuses one).
pub use outpost_core::wire::EventType;

/// A logged watch event, replayed by [`Store::events_since`](crate::Store::events_since).
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    pub event_type: EventType,
    pub resource_version: ResourceVersion,
    /// The object bytes exactly as upstream sent them in the event.
    pub object: Bytes,
}

/// An object as the cache holds it.
#[derive(Debug, Clone, PartialEq)]
pub struct CachedObject {
    /// The upstream JSON, byte for byte (never re-encoded).
    pub bytes: Bytes,
    pub resource_version: ResourceVersion,
    pub uid: String,
    /// CRC-32 of the stored record (header and bytes), checked on every read.
    pub checksum: u32,
    pub written_at: SystemTime,
}

/// The answer to a single-object read.
#[derive(Debug, Clone, PartialEq)]
pub enum Lookup {
    Found(CachedObject),
    NotCached,
    /// The entry failed its checksum or JSON decode; it has been moved to quarantine and is
    /// never served. Treat as absent and refetch when the cloud is back.
    Quarantined,
}

/// The answer to a LIST served from the cache.
#[derive(Debug, Clone, PartialEq)]
pub struct ListResult {
    /// The stored scope the items come from (see [`Store::list`](crate::Store::list)).
    pub served_from: ScopeId,
    /// That scope's last known resourceVersion: its LIST RV, advanced by watch events and
    /// bookmarks. Individual items may be newer when another path (a GET) refreshed them.
    pub resource_version: ResourceVersion,
    /// Matching objects ordered by (namespace, name), like the apiserver.
    pub items: Vec<CachedObject>,
    /// Members whose object could not be served (quarantined as corrupt). Non-empty means the
    /// list is incomplete: the proxy should not present it as the full truth (kubelet deletes
    /// pods missing from its list) and should refetch.
    pub missing: Vec<ObjectKey>,
    /// Why the answering scope is known to have missed watch events (see
    /// [`Store::mark_missed`](crate::Store::mark_missed)), if it is: its members may lack what
    /// was created or still hold what was deleted since, so it must not be served as the truth
    /// at its resourceVersion.
    pub missed: Option<String>,
}

/// What happened to one write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WriteOutcome {
    Stored,
    Deleted,
    /// The cache already held a newer resourceVersion of the object, which was kept. Scope
    /// membership and the scope's RV were still updated.
    KeptNewer {
        stored: ResourceVersion,
    },
    /// A BOOKMARK moved the scope's resourceVersion. Not flushed on its own: losing it to a
    /// crash only means replaying from the previous resourceVersion.
    Bookmarked,
    /// The cache already held exactly these bytes at this resourceVersion (a repeated GET of
    /// an unchanged object): nothing was written.
    Unchanged,
    /// The event's scope was never listed and the object is not cached: nothing to do (a scope
    /// built from events alone would look complete without being so).
    ScopeUnknown,
    /// The event is older than the scope's resourceVersion, which another watch of the same
    /// scope (or a newer LIST) already moved past it: the scope holds its effect or a later
    /// one, and nothing was written.
    Superseded {
        scope: ResourceVersion,
    },
}

/// What one [`Store::replace_scope`](crate::Store::replace_scope) did.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ReplaceOutcome {
    pub stored: usize,
    /// Bytes of the items written: an item already stored as it is counts none.
    pub written_bytes: usize,
    pub kept_newer: usize,
    /// Members of the previous generation absent from the new list.
    pub removed: usize,
    /// The scope already held a newer state (its resourceVersion, moved on by watch events or a
    /// newer LIST) than the list's: the list was refused and nothing was written.
    pub refused_older_than: Option<ResourceVersion>,
}

/// Per (component, resource) summary for `outpost cache ls`.
#[derive(Debug, Clone, PartialEq)]
pub struct ResourceStats {
    pub component: String,
    pub gvr: Gvr,
    pub objects: usize,
    /// Watch events held for offline replay, over all its scopes.
    pub events: usize,
    /// Stored record bytes (objects, event logs, scope records), before sled's own overhead.
    pub bytes: u64,
    pub scopes: usize,
    /// The highest resourceVersion seen among its objects and scopes.
    pub last_resource_version: Option<ResourceVersion>,
    pub last_write: Option<SystemTime>,
}

impl ResourceStats {
    /// Time since the last write, zero if the clock went backwards.
    pub fn age(&self) -> Option<Duration> {
        self.last_write
            .map(|t| SystemTime::now().duration_since(t).unwrap_or_default())
    }
}

/// Whether the cache can currently be trusted to persist writes.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Health {
    /// The last write or flush failed (disk full, I/O error, read-only file system). Cleared by
    /// the next successful write.
    pub degraded: bool,
    pub last_error: Option<String>,
    /// Entries in the quarantine tree: corrupt entries kept (never served) for inspection,
    /// across restarts.
    pub quarantined: u64,
    /// How long the oldest store call in progress (a read, a write or flush including its wait
    /// for the store's lock, a compaction since its last copied batch) has gone without
    /// progress. sled 0.34 has a known deadlock (see `sled_store`); if this exceeds a few
    /// seconds the store is stuck: stop teeing into it and restart the process.
    pub busy_for: Option<Duration>,
    /// Scopes known to have missed watch events (see [`Store::mark_missed`](crate::Store::mark_missed)).
    pub missed_scopes: u64,
}

/// The result of [`Store::verify`](crate::Store::verify).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct VerifyReport {
    pub checked: u64,
    /// Corrupt entries found, each now quarantined.
    pub corrupt: Vec<CorruptEntry>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CorruptEntry {
    /// Human-readable description of the stored key.
    pub key: String,
    pub reason: String,
}

/// Sizes around one [`Store::compact`](crate::Store::compact).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CompactReport {
    pub before_bytes: u64,
    pub after_bytes: u64,
    pub entries: u64,
}
