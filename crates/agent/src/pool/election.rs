//! Leaders without a controller: when no `leader-hub-<pool>` ConfigMap exists and
//! `--enable-pool-leader-election` is set, every hub of a pool computes the same leaders from
//! what the cloud says about the pool's Nodes.
//!
//! Why not a Lease of our own in `--namespace`: a hub speaks with its node's identity, and
//! kube-apiserver's NodeRestriction admission lets a node write only its own Lease in
//! `kube-node-lease`, whatever RBAC grants. Reads pass no admission, and the Nodes already say
//! who is alive: kubelet (through its hub) renews the node's Lease, and the node lifecycle
//! controller turns a Node whose Lease went stale `Ready=Unknown` — with the apiserver's clock,
//! so no hub compares its clock with another's.
//!
//! The rule, the same on every hub ([`elect`]): the `replicas` first Nodes by name among those
//! labelled `apps.openyurt.io/nodepool=<pool>` that are `Ready`, schedulable, not being deleted
//! and have an address (their first `InternalIP`, as yurt-manager's `hubleader` controller
//! writes leaders). A leader that dies is replaced once the cloud marks its Node not ready;
//! until then followers fail over between the leaders left, or to the cloud, as with a
//! ConfigMap. While the cloud cannot be read the last Nodes seen (kept in the cache across a
//! restart) stand, so the pool keeps its leaders through an outage.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;

use bytes::Bytes;
use outpost_filter::side::NODE_POOL_LABEL;
use outpost_proxy::feed::{Handler, ListHead};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tracing::warn;

use super::Leader;

/// What the election needs to know of one Node of the pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    /// `Ready=True`, schedulable and not being deleted.
    pub eligible: bool,
    /// Where it would serve the pool: its first `InternalIP`.
    pub ip: Option<IpAddr>,
}

/// The outcome, as every hub of the pool computes it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Elected {
    pub leaders: Vec<Leader>,
    /// Every Node labelled with the pool: who may read from a leader.
    pub members: BTreeSet<String>,
}

/// The `replicas` first eligible Nodes with an address, by name.
pub fn elect(candidates: &BTreeMap<String, Candidate>, replicas: usize) -> Vec<Leader> {
    candidates
        .iter()
        .filter(|(_, c)| c.eligible)
        .filter_map(|(node, c)| {
            Some(Leader {
                node: node.clone(),
                ip: c.ip?,
            })
        })
        .take(replicas)
        .collect()
}

/// The list path of the Nodes of `pool`.
pub fn nodes_of(pool: &str) -> String {
    let label = NODE_POOL_LABEL.replace('/', "%2F");
    format!("/api/v1/nodes?labelSelector={label}%3D{pool}")
}

#[derive(Deserialize, Serialize)]
struct Node {
    metadata: Meta,
    #[serde(default)]
    spec: Spec,
    #[serde(default)]
    status: Status,
}

#[derive(Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
struct Meta {
    name: String,
    #[serde(default)]
    deletion_timestamp: Option<String>,
}

#[derive(Deserialize, Serialize, Default)]
struct Spec {
    #[serde(default)]
    unschedulable: bool,
}

#[derive(Deserialize, Serialize, Default)]
struct Status {
    #[serde(default)]
    conditions: Vec<Condition>,
    #[serde(default)]
    addresses: Vec<Address>,
}

#[derive(Deserialize, Serialize)]
struct Condition {
    #[serde(rename = "type")]
    kind: String,
    status: String,
}

#[derive(Deserialize, Serialize)]
struct Address {
    #[serde(rename = "type")]
    kind: String,
    address: String,
}

impl Node {
    fn candidate(&self) -> Candidate {
        let ready = self
            .status
            .conditions
            .iter()
            .any(|c| c.kind == "Ready" && c.status == "True");
        let ip = self
            .status
            .addresses
            .iter()
            .filter(|a| a.kind == "InternalIP")
            .find_map(|a| a.address.parse().ok());
        Candidate {
            eligible: ready
                && !self.spec.unschedulable
                && self.metadata.deletion_timestamp.is_none(),
            ip,
        }
    }
}

/// Reads a Node; `None` (with a log line) when it is not one.
fn parse(object: &[u8]) -> Option<Node> {
    serde_json::from_slice(object)
        .map_err(|e| warn!(error = %e, "pool election: a Node could not be read; left out"))
        .ok()
}

/// The Nodes of the pool as a reflector hands them over, and the election's outcome after each
/// change.
pub struct Candidates {
    replicas: usize,
    nodes: BTreeMap<String, Candidate>,
    outcome: watch::Sender<Arc<Elected>>,
}

impl Candidates {
    pub fn new(replicas: usize, outcome: watch::Sender<Arc<Elected>>) -> Candidates {
        Candidates {
            replicas,
            nodes: BTreeMap::new(),
            outcome,
        }
    }

    fn publish(&self) {
        let elected = Elected {
            leaders: elect(&self.nodes, self.replicas),
            members: self.nodes.keys().cloned().collect(),
        };
        self.outcome.send_if_modified(|current| {
            let changed = **current != elected;
            if changed {
                *current = Arc::new(elected);
            }
            changed
        });
    }
}

impl Handler for Candidates {
    fn replace(&mut self, objects: &BTreeMap<String, Bytes>, _list: &ListHead) {
        self.nodes = objects
            .values()
            .filter_map(|o| parse(o))
            .map(|n| (n.metadata.name.clone(), n.candidate()))
            .collect();
        self.publish();
    }

    fn upsert(&mut self, object: &[u8]) {
        if let Some(node) = parse(object) {
            self.nodes
                .insert(node.metadata.name.clone(), node.candidate());
            self.publish();
        }
    }

    fn remove(&mut self, object: &[u8]) {
        if let Some(node) = parse(object) {
            self.nodes.remove(&node.metadata.name);
            self.publish();
        }
    }

    /// Only what the election reads (a Node's images and the rest need not be saved).
    fn keep(&self, object: &[u8]) -> Option<Bytes> {
        let node = parse(object)?;
        serde_json::to_vec(&node).ok().map(Bytes::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node(name: &str, ready: &str, ip: Option<&str>) -> Vec<u8> {
        let addresses: Vec<_> = ip
            .map(|ip| {
                vec![
                    json!({"type": "Hostname", "address": name}),
                    json!({"type": "InternalIP", "address": ip}),
                ]
            })
            .unwrap_or_default();
        serde_json::to_vec(&json!({
            "metadata": {"name": name, "labels": {NODE_POOL_LABEL: "hz"}},
            "status": {"conditions": [{"type": "Ready", "status": ready}], "addresses": addresses},
        }))
        .unwrap()
    }

    fn leaders(c: &Candidates) -> Vec<String> {
        let elected = c.outcome.borrow();
        elected.leaders.iter().map(|l| l.node.clone()).collect()
    }

    #[test]
    fn the_first_ready_nodes_with_an_address_lead() {
        let (tx, _rx) = watch::channel(Arc::default());
        let mut c = Candidates::new(2, tx);
        let objects: BTreeMap<String, Bytes> = [
            node("edge-3", "True", Some("10.0.0.3")),
            node("edge-1", "Unknown", Some("10.0.0.1")),
            node("edge-2", "True", None),
            node("edge-4", "True", Some("10.0.0.4")),
            node("edge-5", "True", Some("10.0.0.5")),
        ]
        .into_iter()
        .enumerate()
        .map(|(i, n)| (i.to_string(), Bytes::from(n)))
        .collect();
        c.replace(&objects, &ListHead::default());
        assert_eq!(leaders(&c), ["edge-3", "edge-4"]);
        assert_eq!(c.outcome.borrow().members.len(), 5);
        assert_eq!(
            c.outcome.borrow().leaders[0].ip,
            "10.0.0.3".parse::<IpAddr>().unwrap()
        );

        // edge-1 comes back: it leads again, edge-4 steps down.
        c.upsert(&node("edge-1", "True", Some("10.0.0.1")));
        assert_eq!(leaders(&c), ["edge-1", "edge-3"]);
        // edge-3 is marked not ready by the node lifecycle controller, then deleted.
        c.upsert(&node("edge-3", "Unknown", Some("10.0.0.3")));
        assert_eq!(leaders(&c), ["edge-1", "edge-4"]);
        c.remove(&node("edge-1", "True", Some("10.0.0.1")));
        assert_eq!(leaders(&c), ["edge-4", "edge-5"]);
        // What is saved for a restart reads back the same.
        let kept = c.keep(&node("edge-5", "True", Some("10.0.0.5"))).unwrap();
        assert_eq!(
            parse(&kept).map(|n| n.candidate()),
            parse(&node("edge-5", "True", Some("10.0.0.5"))).map(|n| n.candidate())
        );
        // Something that is not a Node changes nothing.
        c.upsert(b"{not json");
        assert_eq!(leaders(&c), ["edge-4", "edge-5"]);
    }

    #[test]
    fn cordoned_or_deleted_nodes_do_not_lead() {
        let mut cordoned: serde_json::Value =
            serde_json::from_slice(&node("edge-1", "True", Some("10.0.0.1"))).unwrap();
        cordoned["spec"] = json!({"unschedulable": true});
        let mut deleting: serde_json::Value =
            serde_json::from_slice(&node("edge-2", "True", Some("10.0.0.2"))).unwrap();
        deleting["metadata"]["deletionTimestamp"] = json!("2026-11-26T10:00:00Z");
        let (tx, _rx) = watch::channel(Arc::default());
        let mut c = Candidates::new(1, tx);
        c.upsert(&serde_json::to_vec(&cordoned).unwrap());
        c.upsert(&serde_json::to_vec(&deleting).unwrap());
        assert!(leaders(&c).is_empty());
        c.upsert(&node("edge-9", "True", Some("10.0.0.9")));
        assert_eq!(leaders(&c), ["edge-9"]);
    }

    #[test]
    fn the_pool_is_selected_by_its_label() {
        assert_eq!(
            nodes_of("hz"),
            "/api/v1/nodes?labelSelector=apps.openyurt.io%2Fnodepool%3Dhz"
        );
    }
}
