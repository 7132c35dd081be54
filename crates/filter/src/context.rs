//! [`FilterContext`]: everything filters know besides the object in hand, as plain data.
//!
//! The node's identity and the hub's own address come from flags; the Services and NodePools
//! come from watches the hub keeps itself. The proxy fills a context from those sources (the
//! [`crate::side`] helpers read the watched objects) and passes the current one to every call,
//! so a watch that outlives a Service change is filtered by the new state from then on.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr};

/// yurthub's `--dummy-if-ip` default: the address the hub answers on inside pods' reach.
pub const DEFAULT_HUB_HOST: IpAddr = IpAddr::V4(Ipv4Addr::new(169, 254, 2, 1));
/// yurthub's `--proxy-secure-port` default: the hub's HTTPS port for in-cluster clients.
pub const DEFAULT_HUB_PORT: u16 = 10268;

/// Side data for one filtering call. Cheap to read; the proxy rebuilds or mutates it as its
/// watches report changes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FilterContext {
    node_name: String,
    /// `--nodepool-name`, else the node's `apps.openyurt.io/nodepool` label; `None` when neither.
    pool_name: Option<String>,
    /// `--dummy-if-ip` (or the bind proxy address when the dummy interface is off).
    hub_host: IpAddr,
    /// `--proxy-secure-port`.
    hub_port: u16,
    /// Service annotations by namespace, then name (nested so lookups borrow, never allocate).
    services: HashMap<String, HashMap<String, BTreeMap<String, String>>>,
    /// Nodes of each NodePool (`status.nodes`, or the union of the pool's NodeBuckets).
    pools: HashMap<String, HashSet<String>>,
}

impl FilterContext {
    /// A context for `node_name` with the hub at yurthub's defaults and no side objects yet.
    pub fn new(node_name: impl Into<String>) -> FilterContext {
        FilterContext {
            node_name: node_name.into(),
            pool_name: None,
            hub_host: DEFAULT_HUB_HOST,
            hub_port: DEFAULT_HUB_PORT,
            services: HashMap::new(),
            pools: HashMap::new(),
        }
    }

    pub fn node_name(&self) -> &str {
        &self.node_name
    }

    pub fn pool_name(&self) -> Option<&str> {
        self.pool_name.as_deref()
    }

    pub fn hub_host(&self) -> IpAddr {
        self.hub_host
    }

    pub fn hub_port(&self) -> u16 {
        self.hub_port
    }

    /// The annotations of Service `namespace/name`, if the hub has seen it.
    pub fn service_annotations(
        &self,
        namespace: &str,
        name: &str,
    ) -> Option<&BTreeMap<String, String>> {
        self.services.get(namespace)?.get(name)
    }

    /// The nodes of NodePool `pool`, if the hub has seen it.
    pub fn pool_nodes(&self, pool: &str) -> Option<&HashSet<String>> {
        self.pools.get(pool)
    }

    /// An empty name counts as none: yurthub treats `--nodepool-name=""` as "not in a pool".
    pub fn set_pool_name(&mut self, pool: Option<String>) -> &mut Self {
        self.pool_name = pool.filter(|p| !p.is_empty());
        self
    }

    pub fn set_hub(&mut self, host: IpAddr, port: u16) -> &mut Self {
        self.hub_host = host;
        self.hub_port = port;
        self
    }

    /// Adds or replaces Service `namespace/name`.
    pub fn insert_service(
        &mut self,
        namespace: impl Into<String>,
        name: impl Into<String>,
        annotations: BTreeMap<String, String>,
    ) -> &mut Self {
        self.services
            .entry(namespace.into())
            .or_default()
            .insert(name.into(), annotations);
        self
    }

    pub fn remove_service(&mut self, namespace: &str, name: &str) -> &mut Self {
        if let Some(by_name) = self.services.get_mut(namespace) {
            by_name.remove(name);
            if by_name.is_empty() {
                self.services.remove(namespace);
            }
        }
        self
    }

    /// Replaces every Service (after a relist).
    pub fn clear_services(&mut self) -> &mut Self {
        self.services.clear();
        self
    }

    /// Adds or replaces NodePool `pool` with its member nodes.
    pub fn insert_pool<I, S>(&mut self, pool: impl Into<String>, nodes: I) -> &mut Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let nodes = nodes.into_iter().map(Into::into).collect();
        self.pools.insert(pool.into(), nodes);
        self
    }

    /// Forgets every NodePool (before a relist).
    pub fn clear_pools(&mut self) -> &mut Self {
        self.pools.clear();
        self
    }

    pub fn remove_pool(&mut self, pool: &str) -> &mut Self {
        self.pools.remove(pool);
        self
    }

    /// Builder form of [`FilterContext::set_pool_name`], for tests and start-up.
    pub fn with_pool_name(mut self, pool: impl Into<String>) -> Self {
        self.set_pool_name(Some(pool.into()));
        self
    }

    /// Builder form of [`FilterContext::set_hub`].
    pub fn with_hub(mut self, host: IpAddr, port: u16) -> Self {
        self.set_hub(host, port);
        self
    }

    /// Builder form of [`FilterContext::insert_service`], taking annotations as pairs.
    pub fn with_service(
        mut self,
        namespace: &str,
        name: &str,
        annotations: &[(&str, &str)],
    ) -> Self {
        let annotations = annotations
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        self.insert_service(namespace, name, annotations);
        self
    }

    /// Builder form of [`FilterContext::insert_pool`].
    pub fn with_pool(mut self, pool: &str, nodes: &[&str]) -> Self {
        self.insert_pool(pool, nodes.iter().copied());
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_yurthubs() {
        let ctx = FilterContext::new("edge-1");
        assert_eq!(ctx.node_name(), "edge-1");
        assert_eq!(ctx.hub_host().to_string(), "169.254.2.1");
        assert_eq!(ctx.hub_port(), 10268);
        assert_eq!(ctx.pool_name(), None);
    }

    #[test]
    fn services_and_pools_are_added_replaced_and_removed() {
        let mut ctx = FilterContext::new("n")
            .with_service("shop", "web", &[("a", "1")])
            .with_pool("p", &["n", "m"]);
        assert_eq!(ctx.service_annotations("shop", "web").unwrap()["a"], "1");
        assert!(ctx.pool_nodes("p").unwrap().contains("m"));
        ctx.insert_service("shop", "web", BTreeMap::new());
        assert!(ctx.service_annotations("shop", "web").unwrap().is_empty());
        ctx.remove_service("shop", "web").remove_pool("p");
        assert_eq!(ctx.service_annotations("shop", "web"), None);
        assert_eq!(ctx.pool_nodes("p"), None);
        assert!(ctx.services.is_empty(), "empty namespaces are pruned");
    }

    #[test]
    fn an_empty_pool_name_is_no_pool() {
        let mut ctx = FilterContext::new("n");
        ctx.set_pool_name(Some(String::new()));
        assert_eq!(ctx.pool_name(), None);
        assert_eq!(
            FilterContext::new("n").with_pool_name("p").pool_name(),
            Some("p")
        );
    }
}
