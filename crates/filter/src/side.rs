//! Reading the side objects the hub watches for its filters (Services, NodePools, its own Node)
//! into the plain data a [`FilterContext`](crate::FilterContext) holds.
//!
//! The proxy owns the watches; these functions only parse one watched object, so the proxy's
//! loop stays "decode, then `insert_*`/`remove_*`".

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::DecodeError;

/// The Node label that names the node's pool when `--nodepool-name` is not given.
pub const NODE_POOL_LABEL: &str = "apps.openyurt.io/nodepool";

/// The Service annotations a filter reads (servicetopology's). A Service with none of them needs
/// no side data: in a cluster without topology-aware Services the hub keeps nothing of the
/// 1,000 Services it watches.
pub const SERVICE_ANNOTATIONS: &[&str] = &[crate::filters::TOPOLOGY_KEYS];

/// What the filters need of one Service: its [`SERVICE_ANNOTATIONS`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceEntry {
    pub namespace: String,
    pub name: String,
    pub annotations: BTreeMap<String, String>,
}

impl ServiceEntry {
    /// Reads a Service object (a GET body, a list item or a watch event's object), keeping the
    /// annotations a filter reads.
    pub fn from_json(body: &[u8]) -> Result<ServiceEntry, DecodeError> {
        let obj: Object = serde_json::from_slice(body)?;
        let mut annotations = obj.metadata.annotations.unwrap_or_default();
        annotations.retain(|key, _| SERVICE_ANNOTATIONS.contains(&key.as_str()));
        Ok(ServiceEntry {
            namespace: obj.metadata.namespace,
            name: obj.metadata.name,
            annotations,
        })
    }

    /// Whether a filter reads anything of this Service.
    pub fn matters(&self) -> bool {
        !self.annotations.is_empty()
    }

    /// The smallest Service object that [`ServiceEntry::from_json`] reads back as this entry:
    /// what the hub keeps, and saves for an offline start, instead of the whole object.
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({
            "metadata": {
                "namespace": self.namespace,
                "name": self.name,
                "annotations": self.annotations,
            }
        }))
        .expect("strings and a map of strings serialize")
    }
}

/// A NodePool (`apps.openyurt.io`) and the nodes its `status.nodes` lists.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodePoolEntry {
    pub name: String,
    pub nodes: Vec<String>,
}

impl NodePoolEntry {
    pub fn from_json(body: &[u8]) -> Result<NodePoolEntry, DecodeError> {
        let obj: Object = serde_json::from_slice(body)?;
        let nodes = obj.status.and_then(|s| s.nodes).unwrap_or_default();
        Ok(NodePoolEntry {
            name: obj.metadata.name,
            nodes,
        })
    }
}

/// The pool filters use: `--nodepool-name` when set, else the node's [`NODE_POOL_LABEL`].
/// `node` is this node's Node object; `None` when the hub could not fetch it.
pub fn resolve_pool_name(
    flag: Option<&str>,
    node: Option<&[u8]>,
) -> Result<Option<String>, DecodeError> {
    if let Some(pool) = flag.filter(|p| !p.is_empty()) {
        return Ok(Some(pool.to_owned()));
    }
    let Some(node) = node else { return Ok(None) };
    let obj: Object = serde_json::from_slice(node)?;
    let mut labels = obj.metadata.labels.unwrap_or_default();
    Ok(labels.remove(NODE_POOL_LABEL).filter(|p| !p.is_empty()))
}

/// The label that puts a NodeBucket in a pool.
pub const BUCKET_POOL_LABEL: &str = "openyurt.io/pool-name";

/// A NodeBucket (`apps.openyurt.io/v1alpha1`): one slice of a pool's nodes, which yurt-manager
/// keeps for large pools. A pool's nodes are the union of its buckets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeBucketEntry {
    pub name: String,
    /// Its [`BUCKET_POOL_LABEL`]; `None` when it has none.
    pub pool: Option<String>,
    pub nodes: Vec<String>,
}

impl NodeBucketEntry {
    pub fn from_json(body: &[u8]) -> Result<NodeBucketEntry, DecodeError> {
        let obj: Object = serde_json::from_slice(body)?;
        let pool = obj
            .metadata
            .labels
            .and_then(|mut labels| labels.remove(BUCKET_POOL_LABEL))
            .filter(|p| !p.is_empty());
        Ok(NodeBucketEntry {
            name: obj.metadata.name,
            pool,
            nodes: obj
                .nodes
                .unwrap_or_default()
                .into_iter()
                .map(|n| n.name)
                .filter(|n| !n.is_empty())
                .collect(),
        })
    }
}

#[derive(Deserialize)]
struct Object {
    #[serde(default)]
    metadata: Meta,
    status: Option<PoolStatus>,
    /// NodeBuckets list their nodes at the top level.
    nodes: Option<Vec<BucketNode>>,
}

#[derive(Deserialize)]
struct BucketNode {
    #[serde(default)]
    name: String,
}

#[derive(Default, Deserialize)]
struct Meta {
    #[serde(default)]
    namespace: String,
    #[serde(default)]
    name: String,
    labels: Option<BTreeMap<String, String>>,
    annotations: Option<BTreeMap<String, String>>,
}

#[derive(Deserialize)]
struct PoolStatus {
    nodes: Option<Vec<String>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_node_bucket() {
        let bucket = br#"{"apiVersion":"apps.openyurt.io/v1alpha1","kind":"NodeBucket",
            "metadata":{"name":"hz-1","labels":{"openyurt.io/pool-name":"hangzhou"}},
            "numNodes":2,"nodes":[{"name":"edge-1"},{"name":"edge-2"}]}"#;
        let entry = NodeBucketEntry::from_json(bucket).unwrap();
        assert_eq!(entry.name, "hz-1");
        assert_eq!(entry.pool.as_deref(), Some("hangzhou"));
        assert_eq!(entry.nodes, ["edge-1", "edge-2"]);
        let unlabelled = NodeBucketEntry::from_json(br#"{"metadata":{"name":"x"}}"#).unwrap();
        assert_eq!((unlabelled.pool, unlabelled.nodes.len()), (None, 0));
    }

    #[test]
    fn reads_a_service() {
        let svc = br#"{"kind":"Service","apiVersion":"v1","metadata":{"name":"web","namespace":"shop",
            "annotations":{"openyurt.io/topologyKeys":"openyurt.io/nodepool"}},"spec":{"type":"ClusterIP"}}"#;
        let entry = ServiceEntry::from_json(svc).unwrap();
        assert_eq!(
            (entry.namespace.as_str(), entry.name.as_str()),
            ("shop", "web")
        );
        assert_eq!(
            entry.annotations["openyurt.io/topologyKeys"],
            "openyurt.io/nodepool"
        );
        assert!(entry.matters());
        let bare =
            ServiceEntry::from_json(br#"{"metadata":{"name":"a","namespace":"b"}}"#).unwrap();
        assert!(bare.annotations.is_empty());
        assert!(!bare.matters());
    }

    #[test]
    fn a_service_keeps_only_what_a_filter_reads_and_reads_back_the_same() {
        let svc = br#"{"kind":"Service","metadata":{"name":"web","namespace":"shop","annotations":{
            "meta.helm.sh/release-name":"shop","openyurt.io/topologyKeys":"kubernetes.io/hostname"}},
            "spec":{"clusterIP":"10.96.0.10","ports":[{"port":80}]}}"#;
        let entry = ServiceEntry::from_json(svc).unwrap();
        assert_eq!(
            entry.annotations.keys().collect::<Vec<_>>(),
            ["openyurt.io/topologyKeys"]
        );
        let kept = entry.to_json();
        assert!(
            kept.len() < svc.len() / 2,
            "{}",
            String::from_utf8_lossy(&kept)
        );
        assert_eq!(ServiceEntry::from_json(&kept).unwrap(), entry);
        let helm_only = br#"{"metadata":{"name":"a","namespace":"b","annotations":{"meta.helm.sh/release-name":"a"}}}"#;
        assert!(!ServiceEntry::from_json(helm_only).unwrap().matters());
    }

    #[test]
    fn reads_a_node_pool() {
        let pool = br#"{"apiVersion":"apps.openyurt.io/v1beta2","kind":"NodePool","metadata":{"name":"hangzhou"},
            "spec":{"type":"Edge"},"status":{"nodes":["edge-1","edge-2"],"readyNodeNum":2}}"#;
        let entry = NodePoolEntry::from_json(pool).unwrap();
        assert_eq!(entry.name, "hangzhou");
        assert_eq!(entry.nodes, ["edge-1", "edge-2"]);
        let fresh = NodePoolEntry::from_json(br#"{"metadata":{"name":"new"},"spec":{}}"#).unwrap();
        assert!(fresh.nodes.is_empty());
    }

    #[test]
    fn the_flag_wins_over_the_node_label() {
        let node = br#"{"kind":"Node","metadata":{"name":"edge-1","labels":{"apps.openyurt.io/nodepool":"from-label"}}}"#;
        assert_eq!(
            resolve_pool_name(Some("flag"), Some(node))
                .unwrap()
                .as_deref(),
            Some("flag")
        );
        assert_eq!(
            resolve_pool_name(Some(""), Some(node)).unwrap().as_deref(),
            Some("from-label")
        );
        assert_eq!(
            resolve_pool_name(None, Some(node)).unwrap().as_deref(),
            Some("from-label")
        );
        assert_eq!(resolve_pool_name(None, None).unwrap(), None);
        let unlabelled = br#"{"kind":"Node","metadata":{"name":"edge-1"}}"#;
        assert_eq!(resolve_pool_name(None, Some(unlabelled)).unwrap(), None);
        assert!(resolve_pool_name(None, Some(b"not json")).is_err());
    }
}
