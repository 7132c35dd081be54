//! A list + watch of one resource that the hub keeps for itself (the filters' Services,
//! NodePools and this Node, and the shared cache's pool-scope resources): the hub's own small
//! informer.
//!
//! [`Reflector::run`] lists, then watches from the list's resourceVersion, re-watches when a
//! stream ends and relists after an `ERROR` event (410 Gone), a failure, or its server turning
//! unhealthy (a dead link may hold a stream for minutes), with jittered exponential backoff
//! ([`Backoff`](super::own::Backoff): a 429's `Retry-After` is waited out) and, when the cloud
//! returns after an outage, at a random point of [`RETURN_SPREAD`](super::own::RETURN_SPREAD),
//! so that a fleet of hubs does not relist at once ([`Rounds`]). Every change is handed to a
//! [`Handler`]. In edge mode the objects are also kept in the cache as one
//! document, and a hub that starts offline begins from that copy, so filters behave the same
//! after a reboot without the cloud. The requests carry the hub's own User-Agent (`outpost/…`),
//! which is never filtered.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::BoxFuture;
use http::StatusCode;
use outpost_cache::Store;
use outpost_core::wire::{
    EventError, EventType, LineFramer, List, ObjectHead, WatchEvent, list_chunks, list_head,
};
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::own::{
    LIST_SHARED_FOR, Listed, OwnGets, Rounds, SharedLists, SyncState, WATCH_TIMEOUT_SECONDS,
    retry_after,
};
use crate::supervisor::Supervisor;
use outpost_proxy::error::{BoxError, ProxyError};
use outpost_proxy::feed::{Handler, ListHead, ListMeta};
use outpost_proxy::upstream::{Upstream, UpstreamBody};

const USER_AGENT: &str = "outpost/side-data";
/// Events are saved to the cache once the stream has been quiet this long (a burst of Service
/// changes is one write, not one per event).
const SAVE_AFTER_QUIET: Duration = Duration::from_secs(1);

/// The request path's feeds ([`outpost_proxy::feed::Feeds`]), each run by a reflector of its
/// own under the hub's supervisor.
pub struct ReflectorFeeds {
    pub upstream: Arc<Upstream>,
    pub store: Option<Arc<dyn Store>>,
    pub tasks: Arc<Supervisor>,
    /// Pool sharing: a follower's feeds list and watch its pool's leader hubs first.
    pub pool: Option<Arc<dyn LeaderSources>>,
    /// Shared with the side data's reflectors (those reading the cloud).
    pub lists: Arc<SharedLists>,
}

impl outpost_proxy::feed::Feeds for ReflectorFeeds {
    fn start(&self, name: &str, path: String, handler: Box<dyn Handler>) {
        let mut reflector = Reflector::new(
            name,
            path,
            self.upstream.clone(),
            self.store.clone(),
            handler,
        );
        // A follower's feeds read its leaders first; lists are shared between the reflectors
        // that read the same place.
        let from = match &self.pool {
            Some(pool) => {
                reflector.source = pool.source();
                SharedFrom::Pool
            }
            None => SharedFrom::Cloud,
        };
        let reflector = reflector.sharing(self.lists.clone(), from);
        self.tasks
            .spawn("shared cache feed", reflector.run(self.tasks.stopping()));
    }
}

/// Where a pool-sharing follower's reflectors read: its pool's leader hubs first
/// ([`crate::pool`] implements it; side data only asks for a [`Source`], so that it does not
/// depend on pool sharing, which reads its ConfigMap with side data's watch).
pub trait LeaderSources: Send + Sync {
    /// A source for one reflector.
    fn source(&self) -> Box<dyn Source>;
}

/// Where a reflector lists and watches: the cloud ([`Cloud`]), or for a pool-sharing follower
/// its pool's leader hubs first ([`crate::pool::source`]).
pub trait Source: Send + Sync + 'static {
    /// One GET of `path` (a list, or a watch), answered with its headers.
    fn get<'a>(&'a self, path: &'a str) -> BoxFuture<'a, Result<Opened, ProxyError>>;

    /// A watch this source opened failed mid-stream: whether another place may take it up at
    /// once, from the same resourceVersion (nothing missed, nothing relisted).
    fn failed(&self, _error: &ProxyError) -> bool {
        false
    }
}

/// An answer from a [`Source`], and what ends a watch opened with it early.
pub struct Opened {
    pub resp: http::Response<UpstreamBody>,
    pub ends: BoxFuture<'static, Ends>,
    /// Whether it came over the WAN (from the cloud, not a leader hub of the pool): its bytes
    /// are counted as the cloud's.
    pub wan: bool,
}

/// Why a watch is ended before its stream does.
pub enum Ends {
    /// Its server became unhealthy (a dead link may hold a stream for minutes).
    Unhealthy,
    /// A better place to watch from appeared: watch again from the last resourceVersion.
    Moved,
}

/// The cloud: a healthy apiserver, with the hub's own identity.
pub struct Cloud(pub Arc<Upstream>);

impl Source for Cloud {
    fn get<'a>(&'a self, path: &'a str) -> BoxFuture<'a, Result<Opened, ProxyError>> {
        Box::pin(async move {
            let server = self.0.pick().ok_or(ProxyError::NoUpstream)?;
            // Taken before the send, so an outage during it still ends the watch.
            let outage = self.0.states().next_outage(server);
            let resp = OWN.send_to(&self.0, server, path).await?;
            let ends = Box::pin(async move {
                outage.await;
                Ends::Unhealthy
            });
            Ok(Opened {
                resp,
                ends,
                wan: true,
            })
        })
    }
}

/// The handler of a list that holds one object (selected by name): `set` gets the object after
/// every change, or `None` once it is gone.
pub struct OneObject<F>(pub F);

impl<F: FnMut(Option<&[u8]>) + Send + Sync + 'static> Handler for OneObject<F> {
    fn replace(&mut self, objects: &BTreeMap<String, Bytes>, _list: &ListHead) {
        (self.0)(objects.values().next().map(|b| &b[..]));
    }
    fn upsert(&mut self, object: &[u8]) {
        (self.0)(Some(object));
    }
    fn remove(&mut self, _object: &[u8]) {
        (self.0)(None);
    }
}

/// One resource kept in sync.
pub struct Reflector<H> {
    /// For logs, readiness and the cache document (`side/<name>`).
    name: String,
    /// The collection path, with any selector (`/api/v1/services`,
    /// `/api/v1/nodes?fieldSelector=metadata.name%3Dedge-1`).
    path: String,
    upstream: Arc<Upstream>,
    /// Where lists and watches go: the cloud, unless pool sharing says otherwise.
    pub source: Box<dyn Source>,
    store: Option<Arc<dyn Store>>,
    handler: H,
    state: watch::Sender<SyncState>,
    objects: BTreeMap<String, Bytes>,
    /// The last list's kind and apiVersion, saved with the objects.
    list_type: (String, String),
    resource_version: String,
    /// What the last refused read's `Retry-After` asked for.
    retry_after: Option<Duration>,
    /// Lists shared with the hub's other reflectors of the same collection.
    lists: Arc<SharedLists>,
    /// What lists are shared under: where they are read from, and the path.
    list_key: String,
    /// When the reason for the next list arose (the end of the last round): a shared list
    /// must be newer.
    listing_since: std::time::Instant,
}

/// One of the hub's own lists from `source`, as [`SharedLists`] shares it; `refused` gets a
/// refusal's `Retry-After`.
async fn fetch_list(
    source: &dyn Source,
    upstream: &Upstream,
    path: &str,
    refused: &mut Option<Duration>,
) -> Result<Listed, ProxyError> {
    let Opened { resp, wan, .. } = source.get(path).await?;
    match resp.status() {
        StatusCode::OK => {
            let counted = wan.then_some(upstream);
            Ok(Listed::Items(OWN.collect(counted, path, resp).await?))
        }
        StatusCode::NOT_FOUND => Ok(Listed::NotServed),
        status => {
            *refused = retry_after(&resp);
            Err(bad_reply(format!(
                "list {path} answered {status} (check the hub's RBAC in manifests/)"
            )))
        }
    }
}

/// Where a reflector's shared lists are read from: reflectors share only lists of the same
/// place.
#[derive(Debug, Clone, Copy)]
pub enum SharedFrom {
    Cloud,
    /// The pool's leader hubs first ([`crate::pool`]).
    Pool,
}

/// How a watch stream ended.
enum Ended {
    /// Cleanly (timeout): watch again from the last resourceVersion.
    Rewatch,
    /// An `ERROR` event (410 Gone…): list again.
    Relist,
}

impl<H: Handler> Reflector<H> {
    pub fn new(
        name: &str,
        path: String,
        upstream: Arc<Upstream>,
        store: Option<Arc<dyn Store>>,
        handler: H,
    ) -> Reflector<H> {
        Reflector {
            name: name.to_owned(),
            path,
            source: Box::new(Cloud(upstream.clone())),
            upstream,
            store,
            handler,
            state: watch::Sender::new(SyncState::Pending),
            objects: BTreeMap::new(),
            list_type: Default::default(),
            resource_version: String::new(),
            retry_after: None,
            lists: Arc::default(),
            list_key: String::new(),
            // A new reflector has seen nothing: any list still shared will do.
            listing_since: std::time::Instant::now()
                .checked_sub(LIST_SHARED_FOR)
                .unwrap_or_else(std::time::Instant::now),
        }
    }

    /// Shares lists of its collection with the other reflectors of `lists` that read `from`
    /// the same place (its [`Source`]).
    pub fn sharing(mut self, lists: Arc<SharedLists>, from: SharedFrom) -> Reflector<H> {
        self.lists = lists;
        self.list_key = format!("{from:?} {}", self.path);
        self
    }

    /// Whether the objects have been read, for readiness.
    pub fn sync_state(&self) -> watch::Receiver<SyncState> {
        self.state.subscribe()
    }

    /// Runs until `shutdown`: the cached copy first, then list + watch, again after a failure.
    /// A retry waits out its backoff, or less when the cloud comes back ([`Rounds`]).
    pub async fn run(mut self, shutdown: watch::Receiver<bool>) {
        self.load_cached().await;
        let mut rounds = Rounds::new(self.upstream.states().subscribe(), shutdown);
        loop {
            let Some(synced) = rounds.run(self.sync()).await else {
                return;
            };
            self.listing_since = std::time::Instant::now();
            let ended = synced.map_err(|e| {
                debug!(resource = %self.name, error = %e, "side-data sync failed; retrying");
                self.handler.interrupted();
                self.note_failure(&e);
                self.retry_after.take()
            });
            if !rounds.wait_after(ended).await {
                return;
            }
        }
    }

    /// One list, then watches from its resourceVersion until a stream asks for a relist.
    async fn sync(&mut self) -> Result<(), ProxyError> {
        self.list().await?;
        loop {
            match self.watch().await {
                Ok(Ended::Rewatch) => continue,
                Ok(Ended::Relist) => return Ok(()),
                Err(e) if self.source.failed(&e) => {
                    debug!(resource = %self.name, error = %e, "watch failed; resuming it elsewhere");
                }
                Err(e) => return Err(e),
            }
        }
    }

    async fn list(&mut self) -> Result<(), ProxyError> {
        let lists = self.lists.clone();
        let (source, path, since) = (&self.source, &self.path, self.listing_since);
        let mut refused = None;
        let listed = lists
            .list(&self.list_key, since, || {
                fetch_list(source.as_ref(), &self.upstream, path, &mut refused)
            })
            .await;
        self.retry_after = refused;
        let bytes = match listed? {
            Listed::Items(bytes) => bytes,
            Listed::NotServed => {
                // The resource is not served (no NodePool CRD in this cluster): nothing to
                // filter by.
                let head = ListHead {
                    from_cloud: true,
                    ..ListHead::default()
                };
                self.apply_list(BTreeMap::new(), head, "cloud (not served)");
                self.save().await;
                return Ok(());
            }
        };
        let (objects, mut head) = parse_list(&bytes, |o| self.handler.keep(o))?;
        head.from_cloud = true;
        self.apply_list(objects, head, "cloud");
        self.save().await;
        Ok(())
    }

    /// Replaces every object (a list, or the cached copy at start) and reports the sync. Only a
    /// list from the cloud gives a resourceVersion to watch from: the saved copy may be old.
    fn apply_list(&mut self, objects: BTreeMap<String, Bytes>, head: ListHead, source: &str) {
        self.handler.replace(&objects, &head);
        self.objects = objects;
        self.list_type = (head.kind.clone(), head.api_version.clone());
        self.resource_version = if head.from_cloud {
            head.metadata.resource_version
        } else {
            String::new()
        };
        info!(resource = %self.name, objects = self.objects.len(), source, "side data listed");
        self.state.send_replace(SyncState::Synced {
            source: source.to_owned(),
        });
    }

    async fn watch(&mut self) -> Result<Ended, ProxyError> {
        if self.resource_version.is_empty() {
            // A resource that is not served: look again later.
            tokio::time::sleep(Duration::from_secs(WATCH_TIMEOUT_SECONDS)).await;
            return Ok(Ended::Relist);
        }
        let separator = if self.path.contains('?') { '&' } else { '?' };
        let path = format!(
            "{}{separator}watch=true&allowWatchBookmarks=true&timeoutSeconds={WATCH_TIMEOUT_SECONDS}&resourceVersion={}",
            self.path, self.resource_version
        );
        let Opened { resp, ends, .. } = self.source.get(&path).await?;
        if resp.status() != StatusCode::OK {
            self.retry_after = retry_after(&resp);
            return Err(bad_reply(format!("watch answered {}", resp.status())));
        }
        let mut body = resp.into_body();
        let mut framer = LineFramer::new();
        let mut save_at: Option<Instant> = None;
        tokio::pin!(ends);
        loop {
            let line = tokio::select! {
                line = OWN.next_line(&mut body, &mut framer) => line,
                // A stream from a server found unhealthy may hang on a dead link for minutes:
                // it is left, and the next list (when the cloud is back) catches up.
                ends = &mut ends => {
                    self.save().await;
                    return match ends {
                        Ends::Unhealthy => Err(bad_reply("its server became unhealthy")),
                        Ends::Moved => Ok(Ended::Rewatch),
                    };
                }
                _ = sleep_until(save_at) => {
                    save_at = None;
                    self.save().await;
                    continue;
                }
            };
            let Some(line) = line? else { break };
            match self.apply_event(&line)? {
                Some(ended) => {
                    self.save().await;
                    return Ok(ended);
                }
                None => save_at = Some(Instant::now() + SAVE_AFTER_QUIET),
            }
        }
        if save_at.is_some() {
            self.save().await;
        }
        Ok(Ended::Rewatch)
    }

    /// Applies one watch event; `Some` when the stream asks to be ended.
    fn apply_event(&mut self, line: &[u8]) -> Result<Option<Ended>, ProxyError> {
        let event = WatchEvent::parse(line).map_err(|e| bad_reply(EventError::from(e)))?;
        let object = event.object().map_err(bad_reply)?;
        let meta = ObjectHead::parse(object.as_bytes())
            .map_err(|e| bad_reply(format!("watch event object: {e}")))?
            .metadata;
        match event.event_type() {
            Ok(EventType::Added | EventType::Modified) => {
                self.handler.upsert(object.as_bytes());
                match self.handler.keep(object.as_bytes()) {
                    Some(kept) => self.objects.insert(meta.key(), kept),
                    None => self.objects.remove(&meta.key()),
                };
            }
            Ok(EventType::Deleted) => {
                self.handler.remove(object.as_bytes());
                self.objects.remove(&meta.key());
            }
            Ok(EventType::Bookmark) => {}
            Ok(EventType::Error) => return Ok(Some(Ended::Relist)),
            Err(EventError::NoType) => return Err(bad_reply(EventError::NoType)),
            Err(_) => return Ok(Some(Ended::Relist)),
        }
        if !meta.resource_version.is_empty() {
            self.handler.progressed(&meta.resource_version);
            self.resource_version = meta.resource_version.into_owned();
        }
        Ok(None)
    }

    fn note_failure(&self, e: &ProxyError) {
        SyncState::note_failure(&self.state, || format!("{}: {e}", self.name));
    }

    fn document(&self) -> String {
        format!("side/{}", self.name)
    }

    async fn load_cached(&mut self) {
        let Some(store) = self.store.clone() else {
            return;
        };
        let name = self.document();
        let doc = tokio::task::spawn_blocking(move || store.get_document(&name)).await;
        let Ok(Ok(Some(doc))) = doc else { return };
        match gunzip(&doc).and_then(|doc| parse_list(&doc, |o| self.handler.keep(o))) {
            Ok((objects, head)) => {
                // Serve from the copy (not written back), but list afresh from the cloud: the
                // copy may be old.
                let cached_rv = head.resource_version().to_owned();
                self.apply_list(objects, head, "edge cache");
                debug!(resource = %self.name, %cached_rv, "side data loaded from the cache");
            }
            Err(e) => warn!(resource = %self.name, error = %e, "ignoring a corrupt cached copy"),
        }
    }

    /// Keeps what the handler kept of the objects in the cache (edge mode) as one list document,
    /// gzipped: a large value costs sled memory and copies out of proportion to its size (1,000
    /// whole Services, 0.75 MB of JSON, kept 4–5 MiB more of the hub's RSS than not saving at
    /// all; gzipped it is ≈1/10).
    async fn save(&self) {
        let Some(store) = self.store.clone() else {
            return;
        };
        let objects: Vec<Bytes> = self.objects.values().cloned().collect();
        let head = ListHead {
            kind: self.list_type.0.clone(),
            api_version: self.list_type.1.clone(),
            metadata: ListMeta {
                resource_version: self.resource_version.clone(),
                ..ListMeta::default()
            },
            from_cloud: false,
        };
        let name = self.document();
        let saved = tokio::task::spawn_blocking(move || -> Result<(), BoxError> {
            let packed = packed_list_document(&objects, &head)?;
            Ok(store.put_document(&name, &packed)?)
        })
        .await;
        if let Ok(Err(e)) = saved {
            warn!(resource = %self.name, error = %e, "cannot keep side data in the edge cache");
        }
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// What `keep` keeps of the items of a list body, by `namespace/name`, and the list's head
/// (kind, apiVersion, resourceVersion).
fn parse_list(
    bytes: &[u8],
    keep: impl Fn(&[u8]) -> Option<Bytes>,
) -> Result<(BTreeMap<String, Bytes>, ListHead), ProxyError> {
    let list = List::parse(bytes).map_err(|e| bad_reply(format!("list: {e}")))?;
    let mut objects = BTreeMap::new();
    for item in list.items() {
        let head = ObjectHead::parse(item.get().as_bytes())
            .map_err(|e| bad_reply(format!("list item: {e}")))?;
        if let Some(kept) = keep(item.get().as_bytes()) {
            objects.insert(head.metadata.key(), kept);
        }
    }
    let head = ListHead {
        kind: list.kind.unwrap_or_default().into_owned(),
        api_version: list.api_version.unwrap_or_default().into_owned(),
        metadata: ListMeta {
            resource_version: list.metadata.resource_version,
            ..ListMeta::default()
        },
        from_cloud: false,
    };
    Ok((objects, head))
}

/// gzip's first two bytes; a list document (JSON) starts with `{`.
const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];
/// No saved document grows past this when unpacked (a damaged one must not exhaust memory).
const MAX_UNPACKED: u64 = 256 << 20;

/// The objects as a list document, gzipped as it is written (no unpacked copy in between).
fn packed_list_document(objects: &[Bytes], head: &ListHead) -> std::io::Result<Vec<u8>> {
    let unpacked: usize = objects.iter().map(|o| o.len() + 1).sum();
    let mut packed = flate2::write::GzEncoder::new(
        Vec::with_capacity(unpacked / 8),
        flate2::Compression::fast(),
    );
    write_list_document(&mut packed, objects, head)?;
    packed.finish()
}

/// The saved document unpacked; one an older hub saved unpacked is taken as it is.
fn gunzip(doc: &[u8]) -> Result<std::borrow::Cow<'_, [u8]>, ProxyError> {
    use std::io::Read;
    if !doc.starts_with(&GZIP_MAGIC) {
        return Ok(std::borrow::Cow::Borrowed(doc));
    }
    let mut unpacked = Vec::new();
    flate2::read::GzDecoder::new(doc)
        .take(MAX_UNPACKED)
        .read_to_end(&mut unpacked)
        .map_err(|e| bad_reply(format!("saved side data: {e}")))?;
    Ok(std::borrow::Cow::Owned(unpacked))
}

/// Writes the objects as a list body that [`parse_list`] reads back.
fn write_list_document(
    out: &mut impl std::io::Write,
    objects: &[Bytes],
    head: &ListHead,
) -> std::io::Result<()> {
    let metadata = ListMeta {
        resource_version: head.resource_version().to_owned(),
        ..ListMeta::default()
    };
    let head = list_head(&head.kind, &head.api_version, &metadata);
    for chunk in list_chunks(head, objects.iter().cloned()) {
        out.write_all(&chunk)?;
    }
    Ok(())
}

const OWN: OwnGets = OwnGets {
    label: "side-data watch",
    user_agent: USER_AGENT,
};

fn bad_reply(cause: impl Into<BoxError>) -> ProxyError {
    OWN.bad_reply(cause)
}

#[cfg(test)]
mod tests {
    use super::*;
    use outpost_proxy::feed::keep_whole;

    /// The document unpacked, as older hubs saved it.
    fn list_document(objects: &BTreeMap<String, Bytes>, head: &ListHead) -> Vec<u8> {
        let objects: Vec<Bytes> = objects.values().cloned().collect();
        let mut doc = Vec::new();
        write_list_document(&mut doc, &objects, head).unwrap();
        doc
    }

    fn head(rv: &str) -> ListHead {
        ListHead {
            kind: "ServiceList".into(),
            api_version: "v1".into(),
            metadata: ListMeta {
                resource_version: rv.into(),
                ..ListMeta::default()
            },
            from_cloud: false,
        }
    }

    #[test]
    fn lists_round_trip_through_the_cached_document() {
        let body = br#"{"kind":"ServiceList","apiVersion":"v1","metadata":{"resourceVersion":"42"},"items":[
            {"metadata":{"name":"b","namespace":"x","resourceVersion":"40"}},
            {"metadata":{"name":"a","namespace":"x"}},
            {"metadata":{"name":"pool"}}]}"#;
        let (objects, listed) = parse_list(body, keep_whole).unwrap();
        assert_eq!(listed, head("42"));
        assert_eq!(objects.keys().collect::<Vec<_>>(), ["/pool", "x/a", "x/b"]);
        let doc = list_document(&objects, &listed);
        let (again, head_again) = parse_list(&doc, keep_whole).unwrap();
        assert_eq!((again, head_again), (objects, listed));
        let (_, bare) = parse_list(br#"{"items":[]}"#, keep_whole).unwrap();
        assert_eq!(bare, ListHead::default(), "older saved copies name no kind");
        assert!(parse_list(b"{\"items\":[1]}", keep_whole).is_err());
        assert!(parse_list(b"nope", keep_whole).is_err());
    }

    #[test]
    fn saved_documents_are_gzipped_and_unpacked_ones_of_older_hubs_still_read() {
        let objects: BTreeMap<String, Bytes> = (0..200)
            .map(|i| {
                let svc = format!(r#"{{"metadata":{{"name":"svc-{i}","namespace":"shop"}},"spec":{{"type":"ClusterIP","ports":[{{"port":8080}}]}}}}"#);
                (format!("shop/svc-{i}"), Bytes::from(svc))
            })
            .collect();
        let doc = list_document(&objects, &head("42"));
        let values: Vec<Bytes> = objects.values().cloned().collect();
        let packed = packed_list_document(&values, &head("42")).unwrap();
        assert!(packed.starts_with(&GZIP_MAGIC));
        assert!(
            packed.len() < doc.len() / 5,
            "{} of {}",
            packed.len(),
            doc.len()
        );
        let (again, listed) = parse_list(&gunzip(&packed).unwrap(), keep_whole).unwrap();
        assert_eq!((again, listed), (objects, head("42")));
        assert_eq!(
            &*gunzip(&doc).unwrap(),
            &doc[..],
            "an unpacked document is taken as it is"
        );
        let mut damaged = packed.clone();
        damaged.truncate(packed.len() / 2);
        assert!(gunzip(&damaged).is_err());
    }
}
