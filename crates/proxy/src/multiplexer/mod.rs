//! The pool-scope shared cache: yurthub's "multiplexer" (`--pool-scope-resources`, Services and
//! EndpointSlices by default).
//!
//! kubelet, kube-proxy and coredns each list and watch Services (and kube-proxy and coredns
//! EndpointSlices), and each relists after every reconnect. Here the hub lists and watches each
//! pool-scope resource once (a [`crate::feed`] the node agent runs, feeding a [`store::Shared`]) and
//! answers every node-local LIST and WATCH of it from memory ([`serve`]), with the apiserver's
//! semantics: selectors, resourceVersions, a window of recent changes to resume from, bookmarks.
//!
//! Start at [`Multiplexer::read`], which the pipeline calls for every request. Unlike yurthub's:
//! - a read it cannot answer exactly (the store not yet synced, a `continue` token, a
//!   resourceVersion outside its window, a field it cannot select by, a client that accepts no
//!   JSON) takes the normal way, upstream or to the edge cache, instead of a 429;
//! - callers are authorised: one without a bearer token is the node itself, whose identity fed
//!   the store; a caller with a token is answered here only after the apiserver answered that
//!   token's same read (verb, resource, namespace, name) within [`GRANT_TTL`].
//!
//! A resource's list and watch start with the first read of it, as yurthub's cachers do: a node
//! where nothing reads it keeps none of it in memory. In edge mode the objects are also kept in
//! the cache, so a hub restarted without the cloud answers from the copy; with the cloud up,
//! only a store fed from the cloud answers.

pub mod serve;
pub mod store;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http::{HeaderMap, Response};
use outpost_cache::Gvr;
use outpost_core::{RequestInfo, Verb};
use tracing::info;

use crate::body::ProxyBody;
use crate::callers::{SecureCaller, TokenDigest};
use crate::edge::negotiate;
use crate::edge::overlay::{Overlay, Sent};
use crate::feed::Feeds;
use crate::metrics::Metrics;
use crate::upstream::ServerStates;
use store::{Feed, Selection, Shared};

/// How long the apiserver's answer to a token's read authorises the same read here (the
/// apiserver's own cache of allowed webhook decisions lasts as long).
pub const GRANT_TTL: Duration = Duration::from_secs(300);
/// Grants kept at most; past this the expired ones go, and if that is not enough, all of them
/// (their callers are asked upstream once more).
const MAX_GRANTS: usize = 4096;

/// yurthub's `--pool-scope-resources` default.
pub const DEFAULT_POOL_SCOPE: &str = "/v1/services,discovery.k8s.io/v1/endpointslices";

/// A `group/version/resource` from `--pool-scope-resources` (`/v1/services`: the core group).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolScopeResource {
    pub gvr: Gvr,
}

/// A `--pool-scope-resources` entry that is not `group/version/resource`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{0:?} is not group/version/resource (e.g. /v1/services, discovery.k8s.io/v1/endpointslices)"
)]
pub struct PoolScopeError(String);

impl std::str::FromStr for PoolScopeResource {
    type Err = PoolScopeError;

    fn from_str(s: &str) -> Result<Self, PoolScopeError> {
        let parts: Vec<&str> = s.trim().split('/').collect();
        match parts[..] {
            [group, version, resource] if !version.is_empty() && !resource.is_empty() => {
                Ok(PoolScopeResource {
                    gvr: Gvr::new(group, version, resource),
                })
            }
            _ => Err(PoolScopeError(s.to_owned())),
        }
    }
}

impl PoolScopeResource {
    /// The collection's path.
    fn path(&self) -> String {
        let Gvr {
            group,
            version,
            resource,
        } = &self.gvr;
        if group.is_empty() {
            format!("/api/{version}/{resource}")
        } else {
            format!("/apis/{group}/{version}/{resource}")
        }
    }

    /// The field selectors the apiserver supports beyond name and namespace.
    fn selectable(&self) -> &'static [&'static str] {
        match (self.gvr.group.as_str(), self.gvr.resource.as_str()) {
            ("", "services") => &["spec.clusterIP", "spec.type"],
            _ => &[],
        }
    }
}

/// The shared stores, one per pool-scope resource.
pub struct Multiplexer {
    resources: Vec<Resource>,
    states: Arc<ServerStates>,
    grants: Grants,
    metrics: Metrics,
    min_request_timeout: Duration,
    feeds: Arc<dyn Feeds>,
    /// Edge mode: the node's own reports (its pods' new IPs), laid over offline answers.
    overlay: Option<Arc<Overlay>>,
}

/// One pool-scope resource: its store, and until the first read of it, its idle feed.
struct Resource {
    gvr: Gvr,
    /// The collection's path.
    path: String,
    shared: Arc<Shared>,
    /// Started on the first read, as yurthub's multiplexer starts its cachers: a node where
    /// nothing reads the resource keeps none of it in memory.
    feed: Mutex<Option<Feed>>,
}

impl Multiplexer {
    /// A store and an idle feed per resource, started through `feeds` on its first read.
    pub fn new(
        resources: &[PoolScopeResource],
        states: &Arc<ServerStates>,
        feeds: Arc<dyn Feeds>,
        metrics: &Metrics,
        min_request_timeout: Duration,
        overlay: Option<Arc<Overlay>>,
    ) -> Arc<Multiplexer> {
        let resources: Vec<Resource> = resources
            .iter()
            .map(|resource| {
                let name = format!("pool-{}", resource.gvr);
                let shared = Shared::new(name, resource.selectable());
                let feed = Feed(shared.clone());
                Resource {
                    gvr: resource.gvr.clone(),
                    path: resource.path(),
                    shared,
                    feed: Mutex::new(Some(feed)),
                }
            })
            .collect();
        info!(resources = ?resources.iter().map(|r| r.gvr.to_string()).collect::<Vec<_>>(), "pool-scope shared cache");
        Arc::new(Multiplexer {
            resources,
            states: states.clone(),
            grants: Grants::default(),
            metrics: metrics.clone(),
            min_request_timeout,
            feeds,
            overlay,
        })
    }

    /// Whether this request is a read of a pool-scope resource that the store may answer;
    /// `None` for every other request. The first read of a resource starts its feed (and is
    /// itself sent the normal way, as are all until the store is synced).
    pub fn read(&self, info: &RequestInfo, headers: &HeaderMap) -> Option<SharedRead<'_>> {
        if !matches!(info.verb, Verb::List | Verb::Watch) || !info.subresource.is_empty() {
            return None;
        }
        let resource = self.resources.iter().find(|r| {
            r.gvr.resource == info.resource
                && r.gvr.version == info.api_version
                && r.gvr.group == info.api_group
        })?;
        self.start_feed(resource);
        let shared = &resource.shared;
        if !negotiate::accepts_json(headers) || !shared.selects_by(&info.query.field_selector) {
            return None;
        }
        let grant = SecureCaller::of(headers).map(|caller| GrantKey {
            token: caller.token,
            resource: shared.name.clone(),
            verb: info.verb,
            namespace: info.namespace.clone(),
            name: info.name.clone(),
        });
        Some(SharedRead {
            multiplexer: self,
            gvr: &resource.gvr,
            shared,
            selection: Selection {
                namespace: Some(info.namespace.clone()).filter(|ns| !ns.is_empty()),
                labels: info.query.label_selector.clone(),
                fields: info.query.field_selector.clone(),
            },
            grant,
        })
    }

    fn start_feed(&self, resource: &Resource) {
        let mut feed = resource.feed.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(feed) = feed.take() {
            info!(resource = %resource.shared.name, "first read: starting the shared cache's list and watch");
            self.feeds
                .start(&resource.shared.name, resource.path.clone(), Box::new(feed));
        }
    }
}

/// A read of a pool-scope resource.
pub struct SharedRead<'a> {
    multiplexer: &'a Multiplexer,
    gvr: &'a Gvr,
    shared: &'a Arc<Shared>,
    selection: Selection,
    /// For a caller with a bearer token: what must have been granted.
    grant: Option<GrantKey>,
}

impl SharedRead<'_> {
    /// The answer from the store, or `None` to go the normal way.
    pub fn answer(&self, info: &RequestInfo) -> Option<Response<ProxyBody>> {
        let mux = self.multiplexer;
        if self.grant.as_ref().is_some_and(|g| !mux.grants.allows(g)) {
            return None;
        }
        let offline = !mux.states.is_online();
        // Offline, readers see the node's own reports (its pods' new IPs) over the store.
        let sent = mux
            .overlay
            .clone()
            .filter(|_| offline)
            .map(|overlay| Sent::new(overlay, self.gvr.clone()));
        let resp = match info.verb {
            Verb::List => {
                let not_older_than = serve::list_from(info)?;
                let snapshot = self.shared.list(&self.selection, not_older_than, offline)?;
                serve::list_response(snapshot, sent)
            }
            _ => {
                let from = serve::watch_from(info)?;
                let opened = self.shared.open_watch(&self.selection, from, offline)?;
                serve::watch_response(
                    self.shared.clone(),
                    opened,
                    self.selection.clone(),
                    info,
                    (mux.states.subscribe(), sent),
                    mux.min_request_timeout,
                )
            }
        };
        mux.metrics
            .shared_served
            .with_label_values(&[&self.shared.name, info.verb.as_str()])
            .inc();
        Some(resp)
    }

    /// Whether the store answers reads now (a list applied, fed from the cloud since or the
    /// cloud away); the leader hub's port waits for it before answering another hub.
    pub fn is_servable(&self) -> bool {
        self.shared
            .is_servable(!self.multiplexer.states.is_online())
    }

    /// Called with the normal way's answer: the apiserver's success for a token is its grant.
    pub fn learn(&self, resp: &Response<ProxyBody>) {
        let from_apiserver = !resp.headers().contains_key(crate::headers::SERVED_FROM);
        if let (Some(grant), true) = (&self.grant, resp.status().is_success() && from_apiserver) {
            self.multiplexer.grants.remember(grant.clone());
        }
    }
}

/// One read a token was allowed by the apiserver.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct GrantKey {
    token: TokenDigest,
    resource: String,
    verb: Verb,
    namespace: String,
    name: String,
}

/// Reads the apiserver allowed, by token, for [`GRANT_TTL`].
#[derive(Default)]
struct Grants(Mutex<HashMap<GrantKey, Instant>>);

impl Grants {
    /// Whether `key` was granted, or a read that covers it: the same read in all namespaces,
    /// or of every name.
    fn allows(&self, key: &GrantKey) -> bool {
        let grants = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let wider = |namespace: &str, name: &str| GrantKey {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            ..key.clone()
        };
        [
            key.clone(),
            wider(&key.namespace, ""),
            wider("", &key.name),
            wider("", ""),
        ]
        .iter()
        .any(|k| grants.get(k).is_some_and(|at| at.elapsed() < GRANT_TTL))
    }

    fn remember(&self, key: GrantKey) {
        let mut grants = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if grants.len() >= MAX_GRANTS {
            grants.retain(|_, at| at.elapsed() < GRANT_TTL);
            if grants.len() >= MAX_GRANTS {
                grants.clear();
            }
        }
        grants.insert(key, Instant::now());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_scope_resources_parse_like_yurthubs_flag() {
        let services: PoolScopeResource = "/v1/services".parse().unwrap();
        assert_eq!(services.path(), "/api/v1/services");
        assert_eq!(services.selectable(), ["spec.clusterIP", "spec.type"]);
        let slices: PoolScopeResource = "discovery.k8s.io/v1/endpointslices".parse().unwrap();
        assert_eq!(slices.path(), "/apis/discovery.k8s.io/v1/endpointslices");
        assert!(slices.selectable().is_empty());
        for bad in ["services", "v1/services", "a/b/c/d", "/v1/"] {
            assert!(bad.parse::<PoolScopeResource>().is_err(), "{bad}");
        }
    }

    #[test]
    fn a_grant_covers_the_same_read_and_narrower_ones_only() {
        let grants = Grants::default();
        let key = |token: u8, verb, namespace: &str, name: &str| GrantKey {
            token: [token; 32],
            resource: "pool-services.v1.core".into(),
            verb,
            namespace: namespace.into(),
            name: name.into(),
        };
        grants.remember(key(1, Verb::List, "shop", ""));
        assert!(grants.allows(&key(1, Verb::List, "shop", "")));
        assert!(
            grants.allows(&key(1, Verb::List, "shop", "web")),
            "a name in it"
        );
        assert!(
            !grants.allows(&key(1, Verb::List, "", "")),
            "not all namespaces"
        );
        assert!(
            !grants.allows(&key(1, Verb::Watch, "shop", "")),
            "not another verb"
        );
        assert!(
            !grants.allows(&key(2, Verb::List, "shop", "")),
            "not another token"
        );
        grants.remember(key(2, Verb::Watch, "", ""));
        assert!(grants.allows(&key(2, Verb::Watch, "anywhere", "")));
        for i in 0..MAX_GRANTS {
            grants.remember(key(3, Verb::List, &i.to_string(), ""));
        }
        assert!(grants.0.lock().unwrap().len() <= MAX_GRANTS, "bounded");
    }
}
