//! The filters' side data: a reflector per kind of object the enabled filters need (Services,
//! NodePools or NodeBuckets, this Node's pool label), each with a handler that keeps the
//! request path's [`FilterContext`] up to date, and `yurt-hub-cfg`'s filter keys applied live.
//!
//! Start at [`SideData::start`]: it builds the request path's [`Filtering`] stage from the flags and
//! starts what feeds it.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

use bytes::Bytes;
use outpost_cache::Store;
use outpost_filter::side::{NodeBucketEntry, NodePoolEntry, ServiceEntry, resolve_pool_name};
use outpost_filter::{FilterConfig, FilterContext, FilterSet, Needs};
use outpost_proxy::Metrics;
use outpost_proxy::feed::{Handler, ListHead};
use outpost_proxy::filtering::Filtering;
use outpost_proxy::upstream::Upstream;
use tokio::sync::watch;
use tracing::{info, warn};

use super::hubcfg::HubCfg;
use super::own::SharedLists;
use super::own::SyncState;
use super::reflector::{LeaderSources, OneObject, Reflector, SharedFrom};
use crate::supervisor::Supervisor;

/// The filter flags and the node facts filters depend on.
#[derive(Debug, Clone)]
pub struct FilterSettings {
    /// `--enable-resource-filter`, `--disabled-resource-filters`, `--working-mode`.
    pub config: FilterConfig,
    /// `--nodepool-name`; `None` (or empty): the node's `apps.openyurt.io/nodepool` label.
    pub pool_name: Option<String>,
    /// Where rewritten Services point in-cluster clients: `--dummy-if-ip` (or the bind proxy
    /// address without the dummy interface) and `--proxy-secure-port`.
    pub hub_host: IpAddr,
    pub hub_port: u16,
    /// `--enable-pool-service-topology`: a pool's nodes are the union of its NodeBuckets
    /// instead of its NodePool's `status.nodes`.
    pub node_buckets: bool,
}

/// Where the side data is read from: the cloud, and for Services (when pool-scope) the pool's
/// leaders first.
pub struct Sources<'a> {
    pub upstream: &'a Arc<Upstream>,
    pub store: Option<&'a Arc<dyn Store>>,
    pub pool: Option<&'a Arc<dyn LeaderSources>>,
    /// Lists shared with the shared cache's reflectors.
    pub lists: &'a Arc<SharedLists>,
}

/// The side data's sources: one reflector per kind of object the enabled filters need.
pub struct SideData {
    ctx: watch::Sender<Arc<FilterContext>>,
}

impl SideData {
    /// Starts the filters: the set from the flags, the context from the settings, and the
    /// reflectors for what the enabled filters need (as `tasks`). Returns the filtering stage
    /// and the reflectors' sync states (for readiness). The reflectors read through
    /// `upstream`, keep their copy in `store` and share their lists in `lists`.
    pub fn start(
        node: &str,
        settings: &FilterSettings,
        from: &Sources<'_>,
        metrics: &Metrics,
        tasks: &Supervisor,
    ) -> (Arc<Filtering>, SideSync) {
        for unknown in settings.config.unknown_names() {
            warn!(
                filter = unknown,
                "--disabled-resource-filters names no filter"
            );
        }
        let set = FilterSet::new(&settings.config);
        let needs = set.needs();
        let mut ctx = FilterContext::new(node);
        ctx.set_hub(settings.hub_host, settings.hub_port)
            .set_pool_name(settings.pool_name.clone());
        info!(filters = ?set.names().collect::<Vec<_>>(), ?needs, "response filters");
        let side = SideData {
            ctx: watch::Sender::new(Arc::new(ctx)),
        };
        let filtering = Arc::new(Filtering::new(set, side.ctx.subscribe(), metrics));
        let mut sync = SideSync::default();
        let sources = side.sources(node, settings, needs);
        for (name, path, handler) in sources {
            let (upstream, store) = (from.upstream.clone(), from.store.cloned());
            let mut reflector = Reflector::new(name, path, upstream, store, handler);
            let shared_from = match (from.pool, name) {
                (Some(pool), "services") => {
                    reflector.source = pool.source();
                    SharedFrom::Pool
                }
                _ => SharedFrom::Cloud,
            };
            // Its lists are shared with the shared cache's reflectors reading the same place.
            let reflector = reflector.sharing(from.lists.clone(), shared_from);
            sync.states.push((name, reflector.sync_state()));
            tasks.spawn("side data", reflector.run(tasks.stopping()));
        }
        (filtering, sync)
    }

    /// The reflectors the enabled filters need, each with its handler.
    fn sources(
        &self,
        node: &str,
        settings: &FilterSettings,
        needs: Needs,
    ) -> Vec<(&'static str, String, Box<dyn Handler>)> {
        let mut sources: Vec<(&'static str, String, Box<dyn Handler>)> = Vec::new();
        if needs.services {
            sources.push((
                "services",
                "/api/v1/services".into(),
                Box::new(Services(self.ctx.clone())),
            ));
        }
        if needs.node_pools && settings.node_buckets {
            sources.push((
                "nodebuckets",
                "/apis/apps.openyurt.io/v1alpha1/nodebuckets".into(),
                Box::new(Buckets {
                    ctx: self.ctx.clone(),
                    buckets: BTreeMap::new(),
                }),
            ));
        } else if needs.node_pools {
            sources.push((
                "nodepools",
                "/apis/apps.openyurt.io/v1beta1/nodepools".into(),
                Box::new(Pools(self.ctx.clone())),
            ));
        }
        let pool_flag = settings.pool_name.as_deref().filter(|p| !p.is_empty());
        if needs.pool_name && pool_flag.is_none() {
            let ctx = self.ctx.clone();
            sources.push((
                "node",
                format!("/api/v1/nodes?fieldSelector=metadata.name%3D{node}"),
                Box::new(OneObject(move |node: Option<&[u8]>| {
                    set_pool_label(&ctx, node)
                })),
            ));
        }
        sources
    }
}

/// Readiness for the side data: every reflector's sync state.
#[derive(Debug, Default, Clone)]
pub struct SideSync {
    pub states: Vec<(&'static str, watch::Receiver<SyncState>)>,
}

/// Changes the shared context in place (cloned first only while a filter call holds it).
fn edit(ctx: &watch::Sender<Arc<FilterContext>>, change: impl FnOnce(&mut FilterContext)) {
    ctx.send_modify(|c| change(Arc::make_mut(c)));
}

/// Service annotations, for servicetopology: only of the Services that carry one a filter reads
/// (the others need nothing, and are neither kept nor saved).
struct Services(watch::Sender<Arc<FilterContext>>);

impl Services {
    /// Drops a Service the context knows (a send only when something changes).
    fn forget(&self, e: &ServiceEntry) {
        let known = self
            .0
            .borrow()
            .service_annotations(&e.namespace, &e.name)
            .is_some();
        if known {
            edit(&self.0, |ctx| {
                ctx.remove_service(&e.namespace, &e.name);
            });
        }
    }
}

impl Handler for Services {
    fn replace(&mut self, objects: &BTreeMap<String, Bytes>, _list: &ListHead) {
        let entries: Vec<ServiceEntry> = objects
            .values()
            .filter_map(|o| ServiceEntry::from_json(o).ok())
            .filter(ServiceEntry::matters)
            .collect();
        edit(&self.0, |ctx| {
            ctx.clear_services();
            for e in entries {
                ctx.insert_service(e.namespace, e.name, e.annotations);
            }
        });
    }
    fn upsert(&mut self, object: &[u8]) {
        let Ok(e) = ServiceEntry::from_json(object) else {
            return;
        };
        if e.matters() {
            edit(&self.0, |ctx| {
                ctx.insert_service(e.namespace, e.name, e.annotations);
            });
        } else {
            // The annotation was removed (or never there): nothing to keep.
            self.forget(&e);
        }
    }
    fn keep(&self, object: &[u8]) -> Option<Bytes> {
        let entry = ServiceEntry::from_json(object).ok()?;
        entry.matters().then(|| Bytes::from(entry.to_json()))
    }
    fn remove(&mut self, object: &[u8]) {
        if let Ok(e) = ServiceEntry::from_json(object) {
            self.forget(&e);
        }
    }
}

/// NodePool membership, for servicetopology's pool scope.
struct Pools(watch::Sender<Arc<FilterContext>>);

impl Handler for Pools {
    fn replace(&mut self, objects: &BTreeMap<String, Bytes>, _list: &ListHead) {
        let entries: Vec<NodePoolEntry> = objects
            .values()
            .filter_map(|o| NodePoolEntry::from_json(o).ok())
            .collect();
        edit(&self.0, |ctx| {
            ctx.clear_pools();
            for e in entries {
                ctx.insert_pool(e.name, e.nodes);
            }
        });
    }
    fn upsert(&mut self, object: &[u8]) {
        if let Ok(e) = NodePoolEntry::from_json(object) {
            edit(&self.0, |ctx| {
                ctx.insert_pool(e.name, e.nodes);
            });
        }
    }
    fn remove(&mut self, object: &[u8]) {
        if let Ok(e) = NodePoolEntry::from_json(object) {
            edit(&self.0, |ctx| {
                ctx.remove_pool(&e.name);
            });
        }
    }
}

/// `--enable-pool-service-topology`: pools from NodeBuckets, each pool the union of the
/// buckets labelled with its name.
struct Buckets {
    ctx: watch::Sender<Arc<FilterContext>>,
    buckets: BTreeMap<String, NodeBucketEntry>,
}

impl Buckets {
    fn publish(&self) {
        let mut pools: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for bucket in self.buckets.values() {
            if let Some(pool) = &bucket.pool {
                let nodes = pools.entry(pool).or_default();
                nodes.extend(bucket.nodes.iter().map(String::as_str));
            }
        }
        edit(&self.ctx, |ctx| {
            ctx.clear_pools();
            for (pool, nodes) in &pools {
                ctx.insert_pool(*pool, nodes.iter().copied());
            }
        });
    }
}

impl Handler for Buckets {
    fn replace(&mut self, objects: &BTreeMap<String, Bytes>, _list: &ListHead) {
        self.buckets = objects
            .values()
            .filter_map(|o| NodeBucketEntry::from_json(o).ok())
            .map(|b| (b.name.clone(), b))
            .collect();
        self.publish();
    }
    fn upsert(&mut self, object: &[u8]) {
        if let Ok(b) = NodeBucketEntry::from_json(object) {
            self.buckets.insert(b.name.clone(), b);
            self.publish();
        }
    }
    fn remove(&mut self, object: &[u8]) {
        if let Ok(b) = NodeBucketEntry::from_json(object) {
            self.buckets.remove(&b.name);
            self.publish();
        }
    }
}

/// This Node's `apps.openyurt.io/nodepool` label, when `--nodepool-name` is not given.
fn set_pool_label(ctx: &watch::Sender<Arc<FilterContext>>, node: Option<&[u8]>) {
    let pool = match resolve_pool_name(None, node) {
        Ok(pool) => pool,
        Err(e) => {
            warn!(error = %e, "cannot read this node's pool label");
            return;
        }
    };
    ctx.send_if_modified(|c| {
        if c.pool_name() == pool.as_deref() {
            return false;
        }
        info!(pool = ?pool, "node pool (from the node's label)");
        Arc::make_mut(c).set_pool_name(pool);
        true
    });
}

/// Keeps the filters' components in step with `yurt-hub-cfg`.
pub async fn apply_hub_cfg(mut config: watch::Receiver<Arc<HubCfg>>, filtering: Arc<Filtering>) {
    loop {
        let data = config.borrow_and_update().data.clone();
        filtering.set_hub_cfg(&data);
        if config.changed().await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_services_handler_keeps_only_services_a_filter_reads() {
        let ctx = watch::Sender::new(Arc::new(FilterContext::new("edge-1")));
        let mut services = Services(ctx.clone());
        let annotated = br#"{"kind":"Service","metadata":{"namespace":"shop","name":"web","annotations":{"openyurt.io/topologyKeys":"kubernetes.io/hostname","meta.helm.sh/release-name":"shop"}},"spec":{"clusterIP":"10.96.0.7"}}"#;
        let plain = br#"{"kind":"Service","metadata":{"namespace":"shop","name":"db","annotations":{"meta.helm.sh/release-name":"shop"}},"spec":{"clusterIP":"10.96.0.8"}}"#;

        assert_eq!(
            services.keep(plain),
            None,
            "nothing of a plain Service is kept"
        );
        let kept = services
            .keep(annotated)
            .expect("an annotated Service is kept");
        let text = String::from_utf8_lossy(&kept);
        assert!(
            !text.contains("clusterIP") && !text.contains("helm"),
            "only what a filter reads is kept: {text}"
        );
        let objects = BTreeMap::from([("shop/web".to_owned(), kept)]);
        services.replace(&objects, &ListHead::default());
        let annotations = |name: &str| ctx.borrow().service_annotations("shop", name).cloned();
        assert_eq!(
            annotations("web").unwrap()["openyurt.io/topologyKeys"],
            "kubernetes.io/hostname",
            "the kept copy reads back"
        );

        services.upsert(plain);
        assert_eq!(annotations("db"), None);
        let unannotated = br#"{"metadata":{"namespace":"shop","name":"web","annotations":{}}}"#;
        services.upsert(unannotated);
        assert_eq!(annotations("web"), None, "annotation removed: forgotten");
        services.upsert(annotated);
        services.remove(annotated);
        assert_eq!(annotations("web"), None);
    }
}
