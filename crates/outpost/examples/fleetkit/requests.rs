//! The apiserver's request log read per hub: requests by verb in a window, the reconnect after
//! the outage (when each hub came back, how many requests per second the apiserver took at the
//! peak), and relists per (hub, resource, namespace, selectors).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Instant;

use outpost_testkit::RequestRecord;

use super::cluster::node_of_user;

/// Index of the hub a request came from, by node name.
pub struct HubIndex<'a>(HashMap<&'a str, usize>);

impl<'a> HubIndex<'a> {
    pub fn new(nodes: &'a [String]) -> HubIndex<'a> {
        HubIndex(
            nodes
                .iter()
                .enumerate()
                .map(|(i, n)| (n.as_str(), i))
                .collect(),
        )
    }

    pub fn of(&self, record: &RequestRecord) -> Option<usize> {
        node_of_user(&record.user).and_then(|node| self.0.get(node).copied())
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }
}

/// Requests per hub with `from <= at < until` that `pick` keeps.
pub fn count_per_hub(
    records: &[RequestRecord],
    hubs: &HubIndex<'_>,
    from: Instant,
    until: Instant,
    pick: impl Fn(&RequestRecord) -> bool,
) -> Vec<f64> {
    let mut counts = vec![0.0; hubs.len()];
    for r in records.iter().filter(|r| r.at >= from && r.at < until) {
        if let Some(i) = hubs.of(r).filter(|_| pick(r)) {
            counts[i] += 1.0;
        }
    }
    counts
}

/// A first page of a LIST (not a `continue`), which is what a relist costs.
pub fn is_list(r: &RequestRecord) -> bool {
    r.verb == "list" && !r.query.contains("continue=")
}

/// What one list reads: resource, namespace and selectors (not its paging or version).
fn list_key(r: &RequestRecord) -> String {
    let selectors: Vec<&str> = r
        .query
        .split('&')
        .filter(|p| p.starts_with("labelSelector=") || p.starts_with("fieldSelector="))
        .collect();
    let namespace = if r.namespace.is_empty() {
        String::new()
    } else {
        format!("{}/", r.namespace)
    };
    format!("{namespace}{}?{}", r.resource, selectors.join("&"))
}

/// One hub's return after the outage.
#[derive(Clone, Debug, Default)]
pub struct Return {
    /// Seconds from the apiserver's return to the hub's first request, and first LIST.
    pub first_request: Option<f64>,
    pub first_list: Option<f64>,
    pub lists: u64,
    /// (resource, namespace, selectors) listed more than once in the window, and the most
    /// lists of any one.
    pub keys_relisted: u64,
    pub max_lists_of_one_key: u64,
    /// The keys listed more than once: key, lists, and the User-Agents that listed it.
    pub repeated: Vec<(String, u64, Vec<String>)>,
}

/// The reconnect: per hub, and the apiserver's requests per second (whole seconds from `up`).
pub fn reconnect(
    records: &[RequestRecord],
    hubs: &HubIndex<'_>,
    up: Instant,
    until: Instant,
) -> (Vec<Return>, Vec<u64>) {
    let mut returns = vec![Return::default(); hubs.len()];
    let mut per_key: Vec<BTreeMap<String, (u64, BTreeSet<String>)>> =
        vec![BTreeMap::new(); hubs.len()];
    let seconds = until.saturating_duration_since(up).as_secs() as usize + 1;
    let mut per_second = vec![0u64; seconds];
    for r in records.iter().filter(|r| r.at >= up && r.at < until) {
        let since = r.at.duration_since(up).as_secs_f64();
        if let Some(slot) = per_second.get_mut(since as usize) {
            *slot += 1;
        }
        let Some(i) = hubs.of(r) else {
            continue;
        };
        let ret = &mut returns[i];
        ret.first_request.get_or_insert(since);
        if is_list(r) {
            ret.first_list.get_or_insert(since);
            ret.lists += 1;
            let (lists, agents) = per_key[i].entry(list_key(r)).or_default();
            *lists += 1;
            agents.insert(r.user_agent.clone().unwrap_or_default());
        }
    }
    for (ret, keys) in returns.iter_mut().zip(per_key) {
        ret.repeated = keys
            .into_iter()
            .filter(|(_, (n, _))| *n > 1)
            .map(|(key, (n, agents))| (key, n, agents.into_iter().collect()))
            .collect();
        ret.keys_relisted = ret.repeated.len() as u64;
        ret.max_lists_of_one_key = ret.repeated.iter().map(|(_, n, _)| *n).max().unwrap_or(1);
        if ret.lists == 0 {
            ret.max_lists_of_one_key = 0;
        }
    }
    (returns, per_second)
}
