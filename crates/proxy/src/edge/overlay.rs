//! The node's own reports laid over what the cache serves while the cloud is away.
//!
//! When a node reboots offline its pods restart with new IPs, and kubelet reports their status
//! (`PATCH …/pods/<p>/status`, kept by [`crate::autonomy::pods`]). The cache holds the cloud's
//! last word: old IPs, old readiness. [`Overlay::apply`] gives offline readers the node's view:
//!
//! - a Pod reads with the status kubelet last reported (same uid only);
//! - an EndpointSlice's endpoints, and an Endpoints' addresses, that point at such a pod
//!   (by `targetRef` namespace, name and uid — never by IP: IPAM reuses IPs) carry its new IPs
//!   and readiness, so kube-proxy and coredns route to where the pods now are.
//!
//! An overlaid object keeps the cached resourceVersion: it is not cloud truth and is never
//! stored as such. Once the cloud is back its answers win, and the reports are replayed to it.
//! Open offline watches learn of a change through [`Overlay::subscribe`] and send MODIFIED.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};

use bytes::Bytes;
use outpost_cache::Gvr;
use serde_json::{Value, json};
use tokio::sync::watch;

/// One pod's status as kubelet last reported it offline.
#[derive(Debug, Clone, PartialEq)]
pub struct LocalPod {
    pub uid: String,
    pub status: Value,
}

impl LocalPod {
    /// The pod's IPs (`status.podIPs`, else `status.podIP`).
    fn ips(&self) -> Vec<&str> {
        let listed: Vec<&str> = self.status["podIPs"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|ip| ip["ip"].as_str())
            .collect();
        if listed.is_empty() {
            self.status["podIP"].as_str().into_iter().collect()
        } else {
            listed
        }
    }

    /// The pod's `Ready` condition, when reported.
    fn ready(&self) -> Option<bool> {
        self.status["conditions"]
            .as_array()?
            .iter()
            .find(|c| c["type"] == "Ready")
            .map(|c| c["status"] == "True")
    }
}

/// The pods whose status is reported locally, by (namespace, name).
#[derive(Default)]
pub struct Overlay {
    pods: RwLock<Reports>,
    changes: watch::Sender<u64>,
}

impl Overlay {
    pub fn is_empty(&self) -> bool {
        self.read().is_empty()
    }

    pub fn get(&self, namespace: &str, name: &str) -> Option<LocalPod> {
        self.read()
            .get(&(namespace.to_owned(), name.to_owned()))
            .cloned()
    }

    /// Every reported pod.
    pub fn pods(&self) -> Vec<((String, String), LocalPod)> {
        self.read()
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    /// Records a pod's reported status; readers and open watches see it at once.
    pub fn set(&self, namespace: &str, name: &str, pod: LocalPod) {
        self.write()
            .insert((namespace.to_owned(), name.to_owned()), pod);
        self.changes.send_modify(|n| *n += 1);
    }

    /// Forgets a pod's report, unless a newer one (another status) came meanwhile.
    pub fn remove(&self, namespace: &str, name: &str, reported: &LocalPod) {
        let mut pods = self.write();
        let key = (namespace.to_owned(), name.to_owned());
        if pods.get(&key) == Some(reported) {
            pods.remove(&key);
        }
    }

    /// Ticks on every change.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// `object` (one of `gvr`, as the cache holds it) with the node's reports applied, or
    /// `None` when they change nothing.
    pub fn apply(&self, gvr: &Gvr, object: &[u8]) -> Option<Bytes> {
        let pods = self.read();
        if pods.is_empty() {
            return None;
        }
        let rewrite: fn(&Reports, &mut Value) -> bool =
            match (gvr.group.as_str(), gvr.resource.as_str()) {
                ("", "pods") => rewrite_pod,
                ("discovery.k8s.io", "endpointslices") => rewrite_slice,
                ("", "endpoints") => rewrite_endpoints,
                _ => return None,
            };
        let mut value: Value = serde_json::from_slice(object).ok()?;
        rewrite(&pods, &mut value).then(|| Bytes::from(value.to_string()))
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Reports> {
        self.pods.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Reports> {
        self.pods.write().unwrap_or_else(|p| p.into_inner())
    }
}

/// The reports as one open watch has sent them: what it sent of each object they changed, so
/// that a later report goes out as a MODIFIED of exactly the objects that now read differently.
pub struct Sent {
    overlay: Arc<Overlay>,
    gvr: Gvr,
    /// Ticks when the reports change.
    pub changes: watch::Receiver<u64>,
    /// (namespace, name) → the overlaid object last sent.
    sent: HashMap<(String, String), Bytes>,
}

impl Sent {
    pub fn new(overlay: Arc<Overlay>, gvr: Gvr) -> Sent {
        let mut changes = overlay.subscribe();
        changes.mark_unchanged();
        Sent {
            overlay,
            gvr,
            changes,
            sent: HashMap::new(),
        }
    }

    /// `object` of `key` as the node knows it, noted as sent when that is not the cache's.
    pub fn overlaid(&mut self, key: (String, String), object: &Bytes) -> Bytes {
        match self.overlay.apply(&self.gvr, object) {
            Some(overlaid) => {
                self.sent.insert(key, overlaid.clone());
                overlaid
            }
            None => object.clone(),
        }
    }

    /// For the objects a watch covers now (key and cached bytes), the MODIFIED lines the
    /// reports call for: each object that reads differently from what was sent of it (or, if
    /// nothing was, from the cache).
    pub fn modified<'a>(
        &mut self,
        objects: impl IntoIterator<Item = ((String, String), &'a Bytes)>,
    ) -> Vec<Bytes> {
        let mut lines = Vec::new();
        for (key, cached) in objects {
            let now = self
                .overlay
                .apply(&self.gvr, cached)
                .unwrap_or_else(|| cached.clone());
            if now != *self.sent.get(&key).unwrap_or(cached) {
                lines.push(outpost_core::wire::event_line(
                    outpost_core::wire::EventType::Modified,
                    &now,
                ));
                self.sent.insert(key, now);
            }
        }
        lines
    }
}

type Reports = BTreeMap<(String, String), LocalPod>;

/// The reported pod a `targetRef` (or the pod's own metadata) names, uid included.
fn reported<'a>(pods: &'a Reports, namespace: &str, reference: &Value) -> Option<&'a LocalPod> {
    if reference.get("kind").is_some_and(|k| k != "Pod") {
        return None;
    }
    let namespace = reference["namespace"].as_str().unwrap_or(namespace);
    let name = reference["name"].as_str()?;
    let pod = pods.get(&(namespace.to_owned(), name.to_owned()))?;
    (reference["uid"].as_str() == Some(pod.uid.as_str())).then_some(pod)
}

fn rewrite_pod(pods: &Reports, pod: &mut Value) -> bool {
    let meta = &pod["metadata"];
    let namespace = meta["namespace"].as_str().unwrap_or_default().to_owned();
    let Some(local) = reported(pods, &namespace, meta) else {
        return false;
    };
    if pod["status"] == local.status {
        return false;
    }
    pod["status"] = local.status.clone();
    true
}

fn rewrite_slice(pods: &Reports, slice: &mut Value) -> bool {
    let namespace = slice["metadata"]["namespace"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let ipv6 = slice["addressType"] == "IPv6";
    let Some(endpoints) = slice["endpoints"].as_array_mut() else {
        return false;
    };
    let mut changed = false;
    for endpoint in endpoints {
        let Some(local) = reported(pods, &namespace, &endpoint["targetRef"]) else {
            continue;
        };
        let ips: Vec<&str> = local
            .ips()
            .into_iter()
            .filter(|ip| ip.contains(':') == ipv6)
            .collect();
        if !ips.is_empty() && endpoint["addresses"] != json!(ips) {
            endpoint["addresses"] = json!(ips);
            changed = true;
        }
        if let Some(ready) = local.ready() {
            let conditions = &mut endpoint["conditions"];
            for condition in ["ready", "serving"] {
                if conditions[condition] != json!(ready) {
                    conditions[condition] = json!(ready);
                    changed = true;
                }
            }
        }
    }
    changed
}

/// An Endpoints' subsets: a reported pod's address gets its new IP (of the same family), and
/// moves between `addresses` and `notReadyAddresses` with its readiness.
fn rewrite_endpoints(pods: &Reports, endpoints: &mut Value) -> bool {
    let namespace = endpoints["metadata"]["namespace"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let Some(subsets) = endpoints["subsets"].as_array_mut() else {
        return false;
    };
    let mut changed = false;
    for subset in subsets {
        let mut ready = take_list(subset, "addresses");
        let mut not_ready = take_list(subset, "notReadyAddresses");
        let mut placed = (Vec::new(), Vec::new());
        for (was_ready, mut address) in ready
            .drain(..)
            .map(|a| (true, a))
            .chain(not_ready.drain(..).map(|a| (false, a)))
        {
            let mut is_ready = was_ready;
            if let Some(local) = reported(pods, &namespace, &address["targetRef"]) {
                let ipv6 = address["ip"].as_str().is_some_and(|ip| ip.contains(':'));
                if let Some(ip) = local.ips().into_iter().find(|ip| ip.contains(':') == ipv6)
                    && address["ip"] != ip
                {
                    address["ip"] = json!(ip);
                    changed = true;
                }
                is_ready = local.ready().unwrap_or(was_ready);
                changed |= is_ready != was_ready;
            }
            if is_ready {
                placed.0.push(address);
            } else {
                placed.1.push(address);
            }
        }
        put_list(subset, "addresses", placed.0);
        put_list(subset, "notReadyAddresses", placed.1);
    }
    changed
}

fn take_list(object: &mut Value, key: &str) -> Vec<Value> {
    match object.get_mut(key).map(Value::take) {
        Some(Value::Array(items)) => items,
        _ => Vec::new(),
    }
}

/// Puts `items` back under `key`, or leaves the key out when empty (as the apiserver writes it).
fn put_list(object: &mut Value, key: &str, items: Vec<Value>) {
    match object.as_object_mut() {
        Some(map) if items.is_empty() => {
            map.shift_remove(key);
        }
        Some(map) => {
            map.insert(key.to_owned(), Value::Array(items));
        }
        None => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn overlay_with(ip: &str, ready: bool) -> Overlay {
        let overlay = Overlay::default();
        overlay.set(
            "shop",
            "web-0",
            LocalPod {
                uid: "uid-new".into(),
                status: json!({"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}],
                    "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]}),
            },
        );
        overlay
    }

    fn slice(uid: &str) -> Value {
        json!({"kind": "EndpointSlice", "apiVersion": "discovery.k8s.io/v1",
            "metadata": {"name": "web-abc", "namespace": "shop", "resourceVersion": "7"},
            "addressType": "IPv4",
            "endpoints": [
                {"addresses": ["10.0.0.5"], "conditions": {"ready": false, "serving": false, "terminating": false},
                 "targetRef": {"kind": "Pod", "namespace": "shop", "name": "web-0", "uid": uid}},
                {"addresses": ["10.0.0.9"], "conditions": {"ready": true},
                 "targetRef": {"kind": "Pod", "namespace": "shop", "name": "web-1", "uid": "uid-1"}}]})
    }

    fn slices() -> Gvr {
        Gvr::new("discovery.k8s.io", "v1", "endpointslices")
    }

    #[test]
    fn a_slice_follows_the_reported_pod_by_reference_never_by_ip() {
        let overlay = overlay_with("10.0.0.77", true);
        let bytes = serde_json::to_vec(&slice("uid-new")).unwrap();
        let out: Value =
            serde_json::from_slice(&overlay.apply(&slices(), &bytes).unwrap()).unwrap();
        let ep = &out["endpoints"][0];
        assert_eq!(ep["addresses"], json!(["10.0.0.77"]));
        assert_eq!(ep["conditions"]["ready"], true);
        assert_eq!(ep["conditions"]["terminating"], false, "the rest stays");
        assert_eq!(
            out["endpoints"][1]["addresses"],
            json!(["10.0.0.9"]),
            "another pod"
        );
        assert_eq!(
            out["metadata"]["resourceVersion"], "7",
            "not a cloud version"
        );
        // The old pod of the same name (another uid) is not the reported one.
        let old = serde_json::to_vec(&slice("uid-old")).unwrap();
        assert_eq!(overlay.apply(&slices(), &old), None);
        // Another pod that had the new IP before is not touched: IPs are reused.
        let mut reused = slice("uid-new");
        reused["endpoints"][1]["addresses"] = json!(["10.0.0.77"]);
        let reused = serde_json::to_vec(&reused).unwrap();
        let out: Value =
            serde_json::from_slice(&overlay.apply(&slices(), &reused).unwrap()).unwrap();
        assert_eq!(out["endpoints"][1]["addresses"], json!(["10.0.0.77"]));
        assert_eq!(out["endpoints"][1]["targetRef"]["name"], "web-1");
    }

    #[test]
    fn an_endpoints_address_moves_with_readiness() {
        let overlay = overlay_with("10.0.0.77", false);
        let endpoints = json!({"kind": "Endpoints", "apiVersion": "v1",
            "metadata": {"name": "web", "namespace": "shop"},
            "subsets": [{"addresses": [
                {"ip": "10.0.0.5", "targetRef": {"kind": "Pod", "namespace": "shop", "name": "web-0", "uid": "uid-new"}},
                {"ip": "10.0.0.9", "targetRef": {"kind": "Pod", "namespace": "shop", "name": "web-1", "uid": "uid-1"}}],
              "ports": [{"port": 80}]}]});
        let bytes = serde_json::to_vec(&endpoints).unwrap();
        let out: Value = serde_json::from_slice(
            &overlay
                .apply(&Gvr::new("", "v1", "endpoints"), &bytes)
                .unwrap(),
        )
        .unwrap();
        let subset = &out["subsets"][0];
        assert_eq!(subset["addresses"][0]["ip"], "10.0.0.9");
        assert_eq!(subset["notReadyAddresses"][0]["ip"], "10.0.0.77");
        assert_eq!(subset["ports"][0]["port"], 80);
    }

    #[test]
    fn a_pod_reads_with_its_reported_status_for_its_own_uid_only() {
        let overlay = overlay_with("10.0.0.77", true);
        let pods = Gvr::new("", "v1", "pods");
        let pod = |uid: &str| {
            serde_json::to_vec(&json!({"kind": "Pod", "apiVersion": "v1",
                "metadata": {"name": "web-0", "namespace": "shop", "uid": uid},
                "spec": {"nodeName": "n"}, "status": {"phase": "Pending"}}))
            .unwrap()
        };
        let out: Value =
            serde_json::from_slice(&overlay.apply(&pods, &pod("uid-new")).unwrap()).unwrap();
        assert_eq!(out["status"]["podIP"], "10.0.0.77");
        assert_eq!(out["spec"]["nodeName"], "n");
        assert_eq!(overlay.apply(&pods, &pod("uid-other")), None);
        assert_eq!(
            overlay.apply(&Gvr::new("", "v1", "configmaps"), &pod("uid-new")),
            None
        );
    }
}
