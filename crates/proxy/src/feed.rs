//! Lists + watches the request path needs and the node agent runs: the request path says what
//! to do with each change ([`Handler`]), the agent's reflectors do the listing and watching
//! ([`Feeds`]). The pool-scope shared cache ([`crate::multiplexer`]) starts one on the first
//! read of a resource, and the filters' side data is kept by handlers the agent runs.

use std::collections::BTreeMap;

use bytes::Bytes;
pub use outpost_core::wire::ListMeta;

/// What the reflector tells its owner. Objects are the JSON of one item, as received.
pub trait Handler: Send + Sync + 'static {
    /// Every object, after a list (or the cached copy at start), and what the list said of itself.
    fn replace(&mut self, objects: &BTreeMap<String, Bytes>, list: &ListHead);
    /// An object was added or modified.
    fn upsert(&mut self, object: &[u8]);
    /// An object was deleted.
    fn remove(&mut self, object: &[u8]);
    /// The watch reached this resourceVersion (after an event, or a BOOKMARK without one).
    fn progressed(&mut self, _resource_version: &str) {}
    /// A list or watch failed: until the next `replace`, changes may be missed.
    fn interrupted(&mut self) {}
    /// What the reflector keeps of an object, to hand to `replace` again after a restart (the
    /// saved copy): `None` when nothing of it matters to the handler. By default, all of it.
    fn keep(&self, object: &[u8]) -> Option<Bytes> {
        keep_whole(object)
    }
}

/// The default [`Handler::keep`]: the whole object.
pub fn keep_whole(object: &[u8]) -> Option<Bytes> {
    Some(Bytes::copy_from_slice(object))
}

/// What a list says of itself besides its items.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListHead {
    /// `ServiceList`; empty when the list (or an older saved copy) did not say.
    pub kind: String,
    pub api_version: String,
    pub metadata: ListMeta,
    /// Whether the list came from the cloud just now, rather than from the saved copy.
    pub from_cloud: bool,
}

impl ListHead {
    pub fn resource_version(&self) -> &str {
        &self.metadata.resource_version
    }
}

/// Starts list + watch feeds (the node agent's reflectors) on the request path's behalf.
pub trait Feeds: Send + Sync + 'static {
    /// Keeps `handler` in step with the collection at `path` (`/api/v1/services`, with any
    /// selector) until the hub stops; `name` names it in logs, readiness and the cache document
    /// it is saved in (edge mode).
    fn start(&self, name: &str, path: String, handler: Box<dyn Handler>);
}

impl Handler for Box<dyn Handler> {
    fn replace(&mut self, objects: &BTreeMap<String, Bytes>, list: &ListHead) {
        (**self).replace(objects, list)
    }
    fn upsert(&mut self, object: &[u8]) {
        (**self).upsert(object)
    }
    fn remove(&mut self, object: &[u8]) {
        (**self).remove(object)
    }
    fn progressed(&mut self, resource_version: &str) {
        (**self).progressed(resource_version)
    }
    fn interrupted(&mut self) {
        (**self).interrupted()
    }
    fn keep(&self, object: &[u8]) -> Option<Bytes> {
        (**self).keep(object)
    }
}
