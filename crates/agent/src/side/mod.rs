//! Side data: what the hub keeps for itself from the cloud, with its own identity, and saves in
//! the edge cache so that a hub started offline has it.
//!
//! - [`reflector`]: list + watch of one resource, the hub's own small informer; it also runs the
//!   request path's feeds ([`ReflectorFeeds`], the shared cache's pool-scope resources).
//! - [`filters`]: the response filters' side data (Services, NodePools, this Node's pool).
//! - [`hubcfg`]: the `yurt-hub-cfg` ConfigMap, watched live.
//! - [`own`]: how those reads are sent, and whether they have synced.

pub mod filters;
pub mod hubcfg;
pub mod own;
pub mod reflector;

pub use reflector::ReflectorFeeds;

use std::net::SocketAddr;
use std::sync::Arc;

use outpost_proxy::Metrics;
use outpost_proxy::edge::{CacheAgents, CachePolicy, Edge};
use outpost_proxy::filtering::Filtering;
use outpost_proxy::upstream::Upstream;
use tokio::sync::watch;
use tracing::info;

use crate::supervisor::Supervisor;
use filters::{SideData, SideSync};
use hubcfg::{ConfigWatch, HubCfg};
use own::SyncState;

/// The side data, started: the filtering stage it feeds, and whether it has synced.
pub struct Side {
    /// The response filters (none when turned off).
    pub filtering: Option<Arc<Filtering>>,
    /// Whether `yurt-hub-cfg` has been read.
    pub config: watch::Receiver<SyncState>,
    /// Whether the filters' side data has been read.
    pub side_data: SideSync,
    /// The lists its reflectors share, for the shared cache's feeds to share too.
    pub lists: Arc<own::SharedLists>,
}

/// What the side data is started with.
pub struct Settings<'c> {
    /// This node (`--node-name`).
    pub node: &'c str,
    /// Where `yurt-hub-cfg` lives (`--namespace`).
    pub namespace: &'c str,
    /// The filters, when filtering is on.
    pub filters: Option<&'c filters::FilterSettings>,
    /// Where the hub really listens for in-cluster clients (port 0 picks a free one, and the
    /// rewritten Services must point there).
    pub secure_addr: Option<SocketAddr>,
    /// Pool sharing, when Services are pool-scope: the filters' Services come from the pool's
    /// leaders too.
    pub pool: Option<Arc<dyn reflector::LeaderSources>>,
}

/// Starts `yurt-hub-cfg`'s watch and what follows it (the cache agents in edge mode, the
/// filters' components), and the filters with their side data.
pub fn start(
    config: &Settings<'_>,
    upstream: &Arc<Upstream>,
    edge: Option<&Edge>,
    metrics: &Metrics,
    tasks: &Supervisor,
) -> Side {
    let store = edge.map(|e| e.store().clone());
    let lists = Arc::new(own::SharedLists::default());
    let cfg_watch = ConfigWatch::new(config.namespace, upstream.clone(), store.clone());
    if let Some(edge) = edge {
        let policy = edge.policy().clone();
        tasks.spawn(
            "cache agents",
            apply_cache_agents(cfg_watch.subscribe(), policy),
        );
    }
    let (filtering, side_data) = match config.filters {
        Some(settings) => {
            let mut settings = settings.clone();
            if let Some(addr) = config.secure_addr {
                settings.hub_port = addr.port();
            }
            let node = config.node;
            let sources = filters::Sources {
                upstream,
                store: store.as_ref(),
                pool: config.pool.as_ref(),
                lists: &lists,
            };
            let (filtering, sync) = SideData::start(node, &settings, &sources, metrics, tasks);
            let apply = filters::apply_hub_cfg(cfg_watch.subscribe(), filtering.clone());
            tasks.spawn("filter settings", apply);
            (Some(filtering), sync)
        }
        None => (None, SideSync::default()),
    };
    let synced = cfg_watch.sync_state();
    tasks.spawn("yurt-hub-cfg", cfg_watch.run(tasks.stopping()));
    Side {
        filtering,
        config: synced,
        side_data,
        lists,
    }
}

/// Keeps the cache agents in step with `yurt-hub-cfg`'s `cache_agents` key.
async fn apply_cache_agents(mut config: watch::Receiver<Arc<HubCfg>>, policy: CachePolicy) {
    loop {
        let agents = CacheAgents::with_extra(config.borrow_and_update().get("cache_agents"));
        if *policy.agents() != agents {
            info!(?agents, "cache agents changed");
            policy.set_agents(agents);
        }
        if config.changed().await.is_err() {
            return;
        }
    }
}
