//! Pool sharing: the leader hub. One cloud copy of the pool-scope resources (Services,
//! EndpointSlices) per NodePool, served by the pool's leader hubs to the other hubs of the pool,
//! as yurthub ≥ 1.6 does (OpenYurt's "reuse nodepool list/watch requests").
//!
//! Start at [`PoolSharing::start`]. The hub follows ConfigMap `<--namespace>/leader-hub-<pool>`
//! live (the pool from `--nodepool-name`, else the node's `apps.openyurt.io/nodepool` label), as
//! yurt-manager writes it: `leaders` = `node/ip,…`, `enable-leader-election`, `interconnectivity`,
//! `pool-scoped-metadata`. From it, this hub's [`Role`]:
//! - **leader** (its node is in `leaders`): [`port`] serves the shared cache's LISTs and WATCHes
//!   over HTTPS on `<its ip>:--multiplexer-port`, to the nodes of the pool only (client
//!   certificates of the cluster CA, membership from the NodePool's `status.nodes`);
//! - **follower** (election enabled, leaders listed, this node not one of them): its shared
//!   cache is fed from a leader instead of the cloud ([`source`]), spread over the leaders,
//!   failing over to another (resuming the watch from its resourceVersion) or to the cloud;
//! - **none**: the shared cache is fed from the cloud, as without pool sharing.
//!
//! Without the ConfigMap (no yurt-manager), `--enable-pool-leader-election` has the hubs of a
//! pool agree on their leaders themselves ([`election`]).

pub mod election;
pub mod port;
pub mod source;

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::sync::Arc;

use outpost_cache::Store;
use outpost_filter::side::{NodePoolEntry, resolve_pool_name};
use outpost_proxy::Metrics;
use outpost_proxy::upstream::Upstream;
use tokio::sync::watch;
use tracing::{info, warn};

use crate::side::hubcfg::{ConfigWatch, HubCfg};
use crate::side::own::SyncState;
use crate::side::reflector::{LeaderSources, OneObject, Reflector, Source};
use crate::supervisor::Supervisor;

/// yurthub's `--multiplexer-port` default.
pub const DEFAULT_PORT: u16 = 10269;

/// What pool sharing is started with.
#[derive(Debug, Clone)]
pub struct PoolSettings {
    /// `--node-name`.
    pub node: String,
    /// `--namespace`: where `leader-hub-<pool>` lives.
    pub namespace: String,
    /// `--nodepool-name`; `None`: the node's pool label.
    pub pool: Option<String>,
    /// `--multiplexer-port`: where a leader serves, on its address in `leaders`.
    pub port: u16,
    /// `--enable-pool-leader-election`: how many leaders (`--pool-leader-replicas`) the hubs
    /// elect while no `leader-hub-<pool>` ConfigMap exists; `None`: no election. With it, the
    /// pool's members are the Nodes labelled with the pool (not the NodePool's status, which
    /// only a controller writes).
    pub election: Option<usize>,
}

/// One leader hub, as `leaders` names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leader {
    pub node: String,
    pub ip: IpAddr,
}

/// What `leader-hub-<pool>` says, for this hub's pool.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PoolView {
    /// This hub's pool; `None` while unknown.
    pub pool: Option<String>,
    pub leaders: Vec<Leader>,
    /// `enable-leader-election` is `true`.
    pub election: bool,
    /// `interconnectivity` is not `false`: the pool's nodes reach each other.
    pub interconnectivity: bool,
    /// `pool-scoped-metadata`, as written (shown, not applied: `--pool-scope-resources` decides).
    pub pool_scoped_metadata: String,
}

/// This hub's part in its pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Serves the pool from `ip` (its address in `leaders`).
    Leader(IpAddr),
    /// Reads the pool-scope resources from the leaders.
    Follower,
    None,
}

impl Role {
    pub fn label(self) -> &'static str {
        match self {
            Role::Leader(_) => "leader",
            Role::Follower => "follower",
            Role::None => "none",
        }
    }
}

impl PoolView {
    /// The view of `pool` from the ConfigMap's data (empty when it does not exist).
    pub fn parse(pool: Option<String>, cfg: &HubCfg) -> PoolView {
        let leaders = cfg
            .get("leaders")
            .split(',')
            .map(str::trim)
            .filter(|entry| !entry.is_empty())
            .filter_map(|entry| {
                let leader = entry
                    .split_once('/')
                    .and_then(|(node, ip)| Some((node, ip.trim().parse().ok()?)))
                    .filter(|(node, _)| !node.is_empty());
                if leader.is_none() {
                    warn!(
                        entry,
                        "leader-hub: a `leaders` entry is not node/ip; ignored"
                    );
                }
                leader.map(|(node, ip)| Leader {
                    node: node.to_owned(),
                    ip,
                })
            })
            .collect();
        PoolView {
            pool,
            leaders,
            election: cfg.get("enable-leader-election").trim() == "true",
            interconnectivity: cfg.get("interconnectivity").trim() != "false",
            pool_scoped_metadata: cfg.get("pool-scoped-metadata").to_owned(),
        }
    }

    /// The view the hubs elected (see [`election`]), as yurt-manager would have written it.
    fn elected(pool: &str, elected: &election::Elected) -> PoolView {
        PoolView {
            pool: Some(pool.to_owned()),
            leaders: elected.leaders.clone(),
            election: true,
            interconnectivity: true,
            pool_scoped_metadata: String::new(),
        }
    }

    /// `node`'s role: a leader when listed; a follower as yurthub reads it (election enabled,
    /// leaders exist, this node not one of them) and when the pool's nodes reach each other.
    pub fn role(&self, node: &str) -> Role {
        if let Some(me) = self.leaders.iter().find(|l| l.node == node) {
            return Role::Leader(me.ip);
        }
        if self.election && self.interconnectivity && !self.leaders.is_empty() {
            return Role::Follower;
        }
        Role::None
    }
}

/// This hub's pool, its leaders and members, kept up to date.
pub struct PoolSharing {
    settings: PoolSettings,
    view: watch::Sender<Arc<PoolView>>,
    /// The nodes of this hub's pool (its NodePool's `status.nodes`).
    members: watch::Sender<Arc<BTreeSet<String>>>,
    /// Whether `leader-hub-<pool>` has been read (or found absent, or failed to be read) once.
    known: watch::Sender<bool>,
    upstream: Arc<Upstream>,
    metrics: Metrics,
    /// Spreads the followers' feeds over the leaders, and remembers which failed lately.
    leaders: source::LeaderHealth,
}

impl PoolSharing {
    /// Starts following this hub's pool, its `leader-hub-<pool>` ConfigMap and its NodePool.
    pub fn start(
        settings: PoolSettings,
        upstream: &Arc<Upstream>,
        store: Option<&Arc<dyn Store>>,
        metrics: &Metrics,
        tasks: &Supervisor,
    ) -> Arc<PoolSharing> {
        let sharing = Arc::new(PoolSharing {
            settings,
            view: watch::Sender::new(Arc::default()),
            members: watch::Sender::new(Arc::default()),
            known: watch::Sender::new(false),
            upstream: upstream.clone(),
            metrics: metrics.clone(),
            leaders: source::LeaderHealth::default(),
        });
        sharing.publish(PoolView::default());
        let pool = watch::Sender::new(None);
        let pool_rx = pool.subscribe();
        match sharing.settings.pool.clone().filter(|p| !p.is_empty()) {
            Some(name) => {
                pool.send_replace(Some(name));
            }
            None => {
                let known = sharing.known.clone();
                let node = &sharing.settings.node;
                let path = format!("/api/v1/nodes?fieldSelector=metadata.name%3D{node}");
                let reflector = Reflector::new(
                    "pool-node",
                    path,
                    upstream.clone(),
                    store.cloned(),
                    OneObject(move |node: Option<&[u8]>| {
                        set_pool_label(&pool, node);
                        if pool.borrow().is_none() {
                            // No pool: nothing more to read before deciding.
                            known.send_replace(true);
                        }
                    }),
                );
                tasks.spawn("pool label", reflector.run(tasks.stopping()));
            }
        }
        let follow = sharing
            .clone()
            .follow(pool_rx, store.cloned(), tasks.stopping());
        tasks.spawn("leader hub config", follow);
        sharing
    }

    /// What `leader-hub-<pool>` says now, and its changes.
    pub fn view(&self) -> watch::Receiver<Arc<PoolView>> {
        self.view.subscribe()
    }

    /// Waits (at most `bound`) until `leader-hub-<pool>` has been read once, so that a feed
    /// started with the hub asks the leaders rather than the cloud when there are leaders.
    pub async fn until_known(&self, bound: std::time::Duration) {
        let mut known = self.known.subscribe();
        if tokio::time::timeout(bound, known.wait_for(|k| *k))
            .await
            .is_err()
        {
            // Not read in time (the cloud away, say): decide with what is known, from now on.
            self.known.send_replace(true);
        }
    }

    /// This hub's role now.
    pub fn role(&self) -> Role {
        self.view.borrow().role(&self.settings.node)
    }

    /// Whether `node` is in this hub's pool.
    pub fn has_member(&self, node: &str) -> bool {
        self.members.borrow().contains(node)
    }

    /// Follows the ConfigMap and the NodePool of the current pool; again when the pool changes.
    async fn follow(
        self: Arc<Self>,
        mut pool: watch::Receiver<Option<String>>,
        store: Option<Arc<dyn Store>>,
        mut shutdown: watch::Receiver<bool>,
    ) {
        loop {
            let current = pool.borrow_and_update().clone();
            self.publish(PoolView {
                pool: current.clone(),
                ..PoolView::default()
            });
            let following = async {
                match &current {
                    Some(name) => self.follow_pool(name, store.clone()).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = following => return,
                // A pool from the flag never changes (its sender is gone): follow it on.
                Ok(()) = pool.changed() => {}
                _ = shutdown.changed() => return,
            }
        }
    }

    /// The ConfigMap `leader-hub-<pool>`, and the pool's members (its NodePool, or with an
    /// election its labelled Nodes), until dropped.
    async fn follow_pool(&self, pool: &str, store: Option<Arc<dyn Store>>) {
        // Ended by dropping this future; the watches need a shutdown signal that never comes.
        let (_never, stop) = watch::channel(false);
        let config = ConfigWatch::named(
            &self.settings.namespace,
            &format!("leader-hub-{pool}"),
            self.upstream.clone(),
            store.clone(),
        );
        let mut changes = config.subscribe();
        let (election, mut elected) = self.election(pool, store.clone()).unzip();
        // Known once the ConfigMap has been read, and with an election the pool's Nodes.
        let mut reads = vec![config.sync_state()];
        reads.extend(election.as_ref().map(Reflector::sync_state));
        let known = async {
            for read in &mut reads {
                if read.wait_for(|s| *s != SyncState::Pending).await.is_err() {
                    return;
                }
            }
            self.known.send_replace(true);
        };
        let apply = async {
            loop {
                let cfg = changes.borrow_and_update().clone();
                let outcome = elected.as_mut().map(|e| e.borrow_and_update().clone());
                if let Some(outcome) = &outcome {
                    set_member_names(&self.members, outcome.members.clone());
                }
                self.publish(match outcome {
                    // A ConfigMap (yurt-manager's) has the last word.
                    Some(outcome) if cfg.data.is_empty() => PoolView::elected(pool, &outcome),
                    _ => PoolView::parse(Some(pool.to_owned()), &cfg),
                });
                let elected_changed = async {
                    let changed = match elected.as_mut() {
                        Some(e) => e.changed().await.is_ok(),
                        None => false,
                    };
                    if !changed {
                        std::future::pending::<()>().await;
                    }
                };
                tokio::select! {
                    changed = changes.changed() => if changed.is_err() { return },
                    () = elected_changed => {}
                }
            }
        };
        let members_stop = stop.clone();
        let members = async {
            match election {
                Some(reflector) => reflector.run(members_stop).await,
                None => self.members_while_leader(pool, store, members_stop).await,
            }
        };
        tokio::join!(config.run(stop), members, apply, known);
    }

    /// With `--enable-pool-leader-election`, the reflector of the pool's Nodes and the
    /// election's outcome.
    fn election(
        &self,
        pool: &str,
        store: Option<Arc<dyn Store>>,
    ) -> Option<(
        Reflector<election::Candidates>,
        watch::Receiver<Arc<election::Elected>>,
    )> {
        let replicas = self.settings.election?;
        let (outcome, elected) = watch::channel(Arc::default());
        // Named by the pool, so that a node moved to another pool never starts from the saved
        // Nodes of its old one.
        let reflector = Reflector::new(
            &format!("pool-candidates-{pool}"),
            election::nodes_of(pool),
            self.upstream.clone(),
            store,
            election::Candidates::new(replicas, outcome),
        );
        Some((reflector, elected))
    }

    /// The pool's members, from its NodePool, kept while this hub is a leader (who may read
    /// from it); forgotten when it no longer is.
    async fn members_while_leader(
        &self,
        pool: &str,
        store: Option<Arc<dyn Store>>,
        stop: watch::Receiver<bool>,
    ) {
        let node = &self.settings.node;
        let leading = |v: &Arc<PoolView>| matches!(v.role(node), Role::Leader(_));
        let mut view = self.view();
        loop {
            if view.wait_for(leading).await.is_err() {
                return;
            }
            let path = format!(
                "/apis/apps.openyurt.io/v1beta1/nodepools?fieldSelector=metadata.name%3D{pool}"
            );
            let sender = self.members.clone();
            let members = OneObject(move |pool: Option<&[u8]>| set_members(&sender, pool));
            let reflector = Reflector::new(
                &format!("pool-members-{pool}"),
                path,
                self.upstream.clone(),
                store.clone(),
                members,
            );
            let no_longer = async { view.wait_for(|v| !leading(v)).await.map(|_| ()) };
            tokio::select! {
                () = reflector.run(stop.clone()) => return,
                ended = no_longer => if ended.is_err() { return },
            }
            self.members.send_replace(Arc::default());
        }
    }

    /// Takes a new view: one log line and a count when the leaders (or the pool) change.
    fn publish(&self, view: PoolView) {
        let node = &self.settings.node;
        let role = view.role(node);
        self.view.send_if_modified(|current| {
            if **current == view {
                return false;
            }
            let before = current.role(node);
            let moved = current.pool != view.pool || current.leaders != view.leaders;
            if moved || before != role {
                let leaders: Vec<String> = view
                    .leaders
                    .iter()
                    .map(|l| format!("{}/{}", l.node, l.ip))
                    .collect();
                info!(pool = ?view.pool, ?leaders, election = view.election, role = role.label(), "pool leaders changed");
                self.metrics.pool_leader_changes.inc();
            }
            *current = Arc::new(view);
            true
        });
        for label in ["leader", "follower", "none"] {
            let value = i64::from(label == role.label());
            self.metrics
                .pool_role
                .with_label_values(&[label])
                .set(value);
        }
    }

    /// The source a follower's shared-cache feed lists and watches from.
    pub fn feed_source(self: &Arc<Self>) -> source::PoolSource {
        source::PoolSource::new(self.clone())
    }

    /// What side data's reflectors are given to read from the leaders.
    pub fn leader_sources(self: &Arc<Self>) -> Arc<dyn LeaderSources> {
        Arc::new(Leaders(self.clone()))
    }
}

/// Pool sharing as side data's reflectors see it: a source per reflector.
struct Leaders(Arc<PoolSharing>);

impl LeaderSources for Leaders {
    fn source(&self) -> Box<dyn Source> {
        Box::new(self.0.feed_source())
    }
}

/// This Node's pool label, when `--nodepool-name` is not given.
fn set_pool_label(pool: &watch::Sender<Option<String>>, node: Option<&[u8]>) {
    match resolve_pool_name(None, node) {
        Ok(name) => {
            pool.send_if_modified(|current| {
                let changed = *current != name;
                *current = name.clone();
                changed
            });
        }
        Err(e) => warn!(error = %e, "pool sharing: cannot read this node's pool label"),
    }
}

/// The pool's members, from its NodePool's `status.nodes`.
fn set_members(members: &watch::Sender<Arc<BTreeSet<String>>>, pool: Option<&[u8]>) {
    let nodes: BTreeSet<String> = pool
        .and_then(|p| NodePoolEntry::from_json(p).ok())
        .map(|p| p.nodes.into_iter().collect())
        .unwrap_or_default();
    set_member_names(members, nodes);
}

fn set_member_names(members: &watch::Sender<Arc<BTreeSet<String>>>, nodes: BTreeSet<String>) {
    members.send_if_modified(|current| {
        let changed = **current != nodes;
        if changed {
            info!(nodes = nodes.len(), "pool members");
            *current = Arc::new(nodes.clone());
        }
        changed
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(pairs: &[(&str, &str)]) -> HubCfg {
        HubCfg {
            data: pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        }
    }

    #[test]
    fn roles_follow_yurt_managers_config_map() {
        let data = cfg(&[
            (
                "leaders",
                "edge-1/10.0.0.1, edge-2/10.0.0.2,bad,/10.0.0.9,edge-3/x",
            ),
            ("enable-leader-election", "true"),
            ("interconnectivity", "true"),
            ("pool-scoped-metadata", "/v1/services"),
        ]);
        let view = PoolView::parse(Some("hz".into()), &data);
        assert_eq!(view.leaders.len(), 2, "malformed entries are left out");
        assert_eq!(
            view.role("edge-2"),
            Role::Leader("10.0.0.2".parse().unwrap())
        );
        assert_eq!(view.role("edge-7"), Role::Follower);
        let off = PoolView {
            election: false,
            ..view.clone()
        };
        assert_eq!(off.role("edge-7"), Role::None, "election disabled");
        let apart = PoolView {
            interconnectivity: false,
            ..view.clone()
        };
        assert_eq!(
            apart.role("edge-7"),
            Role::None,
            "nodes do not reach each other"
        );
        assert_eq!(
            PoolView::parse(None, &HubCfg::default()).role("edge-7"),
            Role::None,
            "no ConfigMap"
        );
    }
}
