//! [`FilterSet`]: which filters are on, for which components, and the per-request lookup.
//!
//! Built once from the flags ([`FilterConfig`]), updated live from the `yurt-hub-cfg`
//! ConfigMap ([`FilterSet::set_hub_cfg`]). [`FilterSet::for_request`] is the only call on the
//! request path: it returns `None` without allocating when no filter applies, and the proxy then
//! passes the response bytes through untouched.

use std::collections::BTreeMap;

use outpost_core::{RequestInfo, Verb};

use crate::chain::Chain;
use crate::filter::{Filter, Needs};
use crate::filters;

/// Callers whose requests are never filtered: the hub itself (yurthub's own informers carry
/// `yurthub/…`; ours `outpost`). Its Service watch must see every Service, annotations and
/// all, to feed servicetopology.
const HUB_COMPONENTS: [&str; 2] = ["outpost", "yurthub"];

/// Subresources whose responses are the whole object (`pods/status` PATCH returns the Pod).
/// Others (`pods/log`, `…/scale`) are not the filtered kind, so they are never filtered.
const WHOLE_OBJECT_SUBRESOURCES: [&str; 2] = ["", "status"];

/// yurthub also accepts `filter_<name>` as a `yurt-hub-cfg` key.
const HUB_CFG_KEY_PREFIX: &str = "filter_";

/// The flags that choose the filters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FilterConfig {
    /// `--enable-resource-filter` (default true): false turns every filter off.
    pub enabled: bool,
    /// `--disabled-resource-filters`: names to turn off; `*` turns all off.
    pub disabled: Vec<String>,
    /// `--working-mode=cloud`: turns off the filters yurthub turns off there
    /// (discardcloudservice, forwardkubesvctraffic, serviceenvupdater).
    pub cloud_mode: bool,
}

impl Default for FilterConfig {
    fn default() -> Self {
        FilterConfig {
            enabled: true,
            disabled: Vec::new(),
            cloud_mode: false,
        }
    }
}

impl FilterConfig {
    /// Names in `--disabled-resource-filters` that are no filter (for a start-up warning).
    pub fn unknown_names(&self) -> Vec<&str> {
        self.disabled
            .iter()
            .map(|n| n.trim())
            .filter(|n| *n != "*" && !n.is_empty() && filters::by_name(n).is_none())
            .collect()
    }

    fn turns_off(&self, filter: &dyn Filter) -> bool {
        !self.enabled
            || (self.cloud_mode && filter.off_in_cloud_mode())
            || self
                .disabled
                .iter()
                .map(|n| n.trim())
                .any(|n| n == "*" || n == filter.name())
    }
}

/// The enabled filters with the components each applies to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FilterSet {
    entries: Vec<Entry>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    name: &'static str,
    /// Defaults first, then `yurt-hub-cfg` additions; no duplicates.
    components: Vec<String>,
}

impl Entry {
    fn filter(&self) -> &'static dyn Filter {
        filters::by_name(self.name).expect("entries name registered filters")
    }
}

impl FilterSet {
    /// The filters the flags leave on, each with its default components.
    pub fn new(config: &FilterConfig) -> FilterSet {
        let entries = filters::ALL
            .iter()
            .filter(|f| !config.turns_off(**f))
            .map(|f| Entry {
                name: f.name(),
                components: defaults(*f),
            })
            .collect();
        FilterSet { entries }
    }

    /// Applies the `yurt-hub-cfg` data: a key naming a filter (or `filter_<name>`) adds the
    /// comma-separated components of its value to that filter. Replaces earlier additions; the
    /// defaults always stay. Keys for disabled or unknown filters are ignored.
    pub fn set_hub_cfg(&mut self, data: &BTreeMap<String, String>) {
        for entry in &mut self.entries {
            entry.components = defaults(entry.filter());
        }
        for (key, value) in data {
            let key = key.trim();
            let name = key.strip_prefix(HUB_CFG_KEY_PREFIX).unwrap_or(key).trim();
            let Some(entry) = self.entries.iter_mut().find(|e| e.name == name) else {
                continue;
            };
            for component in parse_components(value) {
                if !entry.components.contains(&component) {
                    entry.components.push(component);
                }
            }
        }
    }

    /// The enabled filters' names, in application order.
    pub fn names(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.entries.iter().map(|e| e.name)
    }

    /// The components filter `name` applies to, if it is enabled.
    pub fn components(&self, name: &str) -> Option<&[String]> {
        self.entries
            .iter()
            .find(|e| e.name == name)
            .map(|e| e.components.as_slice())
    }

    /// The side data the enabled filters need.
    pub fn needs(&self) -> Needs {
        self.entries
            .iter()
            .fold(Needs::default(), |n, e| n.union(e.filter().needs()))
    }

    /// The chain for a classified request; `None` when no filter applies (non-resource
    /// requests and requests without a User-Agent included), also when the request names an
    /// object (by path or `metadata.name` field selector) or a namespace that the applicable
    /// filters can never change.
    pub fn for_request(&self, info: &RequestInfo) -> Option<Chain> {
        if !info.is_resource_request {
            return None;
        }
        self.for_parts(
            info.component.as_deref()?,
            &info.api_group,
            &info.api_version,
            &info.resource,
            &info.subresource,
            info.verb,
        )?
        .for_object(&info.namespace, &info.name)
    }

    /// [`FilterSet::for_request`] from the parts; `component` is already lower-cased.
    pub fn for_parts(
        &self,
        component: &str,
        group: &str,
        version: &str,
        resource: &str,
        subresource: &str,
        verb: Verb,
    ) -> Option<Chain> {
        if HUB_COMPONENTS.contains(&component) || !WHOLE_OBJECT_SUBRESOURCES.contains(&subresource)
        {
            return None;
        }
        let mut chain: Option<Chain> = None;
        for entry in &self.entries {
            if !entry.components.iter().any(|c| c == component) {
                continue;
            }
            let filter = entry.filter();
            if let Some(rule) = filter.applies_to(group, version, resource, verb) {
                chain
                    .get_or_insert_with(|| Chain::new(rule.kind))
                    .push(filter);
            }
        }
        chain
    }
}

fn defaults(filter: &dyn Filter) -> Vec<String> {
    filter
        .default_components()
        .iter()
        .map(|c| (*c).to_owned())
        .collect()
}

/// `"kube-proxy, coredns/v1.11"` → `["kube-proxy", "coredns"]`: like a request's component,
/// the part before `/`, lower-cased.
fn parse_components(value: &str) -> impl Iterator<Item = String> + '_ {
    value
        .split(',')
        .map(|c| {
            c.split('/')
                .next()
                .unwrap_or_default()
                .trim()
                .to_ascii_lowercase()
        })
        .filter(|c| !c.is_empty())
}

#[cfg(test)]
mod tests {
    use http::Method;

    use super::*;

    fn all_names() -> Vec<&'static str> {
        filters::ALL.iter().map(|f| f.name()).collect()
    }

    fn names(set: &FilterSet) -> Vec<&'static str> {
        set.names().collect()
    }

    fn chain_names(chain: Option<Chain>) -> Vec<&'static str> {
        chain.map(|c| c.names().collect()).unwrap_or_default()
    }

    fn disabled(names: &[&str]) -> FilterConfig {
        FilterConfig {
            disabled: names.iter().map(|n| (*n).to_owned()).collect(),
            ..FilterConfig::default()
        }
    }

    #[test]
    fn all_filters_are_on_by_default() {
        assert_eq!(
            names(&FilterSet::new(&FilterConfig::default())),
            all_names()
        );
    }

    #[test]
    fn disabling_by_name_star_and_flag() {
        let set = FilterSet::new(&disabled(&["servicetopology", " masterservice "]));
        assert!(!names(&set).contains(&"servicetopology"));
        assert!(!names(&set).contains(&"masterservice"));
        assert_eq!(names(&set).len(), 5);
        assert!(names(&FilterSet::new(&disabled(&["*"]))).is_empty());
        let off = FilterConfig {
            enabled: false,
            ..FilterConfig::default()
        };
        assert!(names(&FilterSet::new(&off)).is_empty());
        assert_eq!(
            disabled(&["masterservice", "nope", "*", ""]).unknown_names(),
            ["nope"]
        );
    }

    #[test]
    fn cloud_mode_turns_off_yurthubs_three() {
        let cloud = FilterConfig {
            cloud_mode: true,
            ..FilterConfig::default()
        };
        assert_eq!(
            names(&FilterSet::new(&cloud)),
            [
                "servicetopology",
                "masterservice",
                "inclusterconfig",
                "nodeportisolation"
            ]
        );
    }

    #[test]
    fn requests_map_to_yurthubs_default_chains() {
        let set = FilterSet::new(&FilterConfig::default());
        let chain = |c: &str, g: &str, v: &str, r: &str, verb| {
            chain_names(set.for_parts(c, g, v, r, "", verb))
        };
        assert_eq!(
            chain("kube-proxy", "", "v1", "services", Verb::Watch),
            ["discardcloudservice", "nodeportisolation"]
        );
        assert_eq!(
            chain("kubelet", "", "v1", "services", Verb::List),
            ["masterservice"]
        );
        assert_eq!(
            chain(
                "kube-proxy",
                "discovery.k8s.io",
                "v1",
                "endpointslices",
                Verb::List
            ),
            ["servicetopology", "forwardkubesvctraffic"]
        );
        assert_eq!(
            chain(
                "coredns",
                "discovery.k8s.io",
                "v1",
                "endpointslices",
                Verb::Watch
            ),
            ["servicetopology"]
        );
        assert_eq!(
            chain(
                "nginx-ingress-controller",
                "",
                "v1",
                "endpoints",
                Verb::List
            ),
            ["servicetopology"]
        );
        assert_eq!(
            chain("kubelet", "", "v1", "configmaps", Verb::Get),
            ["inclusterconfig"]
        );
        assert_eq!(
            chain("kubelet", "", "v1", "pods", Verb::Patch),
            ["serviceenvupdater"]
        );
        // Nothing applies: the zero-cost path.
        assert!(chain("kubelet", "", "v1", "nodes", Verb::Get).is_empty());
        assert!(chain("kubelet", "", "v1", "services", Verb::Get).is_empty());
        assert!(chain("flanneld", "", "v1", "services", Verb::List).is_empty());
        assert!(chain("kube-proxy", "", "v1", "pods", Verb::List).is_empty());
    }

    #[test]
    fn subresources_and_the_hub_itself_are_never_filtered() {
        let set = FilterSet::new(&FilterConfig::default());
        assert!(
            set.for_parts("kubelet", "", "v1", "pods", "status", Verb::Patch)
                .is_some()
        );
        assert!(
            set.for_parts("kubelet", "", "v1", "pods", "log", Verb::Get)
                .is_none()
        );
        let mut data = BTreeMap::new();
        data.insert("masterservice".to_owned(), "outpost,yurthub".to_owned());
        let mut set = set;
        set.set_hub_cfg(&data);
        assert!(
            set.for_parts("outpost", "", "v1", "services", "", Verb::List)
                .is_none()
        );
        assert!(
            set.for_parts("yurthub", "", "v1", "services", "", Verb::List)
                .is_none()
        );
    }

    #[test]
    fn hub_cfg_adds_components_and_replaces_earlier_additions() {
        let mut set = FilterSet::new(&disabled(&["nodeportisolation"]));
        let data: BTreeMap<String, String> = [
            ("servicetopology", " Traefik/v2, kube-proxy ,,"),
            ("filter_masterservice", "cilium-agent"),
            ("nodeportisolation", "cilium-agent"),
            ("cache_agents", "cilium-agent"),
            ("nope", "x"),
        ]
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
        set.set_hub_cfg(&data);
        assert_eq!(
            set.components("servicetopology").unwrap(),
            [
                "kube-proxy",
                "coredns",
                "nginx-ingress-controller",
                "traefik"
            ]
        );
        assert_eq!(
            set.components("masterservice").unwrap(),
            ["kubelet", "cilium-agent"]
        );
        assert_eq!(set.components("nodeportisolation"), None);
        assert!(
            set.for_parts(
                "traefik",
                "discovery.k8s.io",
                "v1",
                "endpointslices",
                "",
                Verb::List
            )
            .is_some()
        );
        assert!(
            set.for_parts("cilium-agent", "", "v1", "services", "", Verb::Watch)
                .is_some()
        );

        set.set_hub_cfg(&BTreeMap::new());
        assert_eq!(
            set.components("servicetopology").unwrap(),
            ["kube-proxy", "coredns", "nginx-ingress-controller"]
        );
        assert!(
            set.for_parts(
                "traefik",
                "discovery.k8s.io",
                "v1",
                "endpointslices",
                "",
                Verb::List
            )
            .is_none()
        );
    }

    #[test]
    fn needs_follow_the_enabled_filters() {
        let all = FilterSet::new(&FilterConfig::default()).needs();
        assert_eq!(
            all,
            Needs {
                services: true,
                node_pools: true,
                pool_name: true
            }
        );
        let no_topology = FilterSet::new(&disabled(&["servicetopology"])).needs();
        assert_eq!(
            no_topology,
            Needs {
                pool_name: true,
                ..Needs::default()
            }
        );
        assert_eq!(FilterSet::new(&disabled(&["*"])).needs(), Needs::default());
    }

    #[test]
    fn for_request_reads_a_classified_request() {
        let set = FilterSet::new(&FilterConfig::default());
        let info =
            |path: &str, ua: Option<&str>| RequestInfo::classify(&Method::GET, path, ua).unwrap();
        let watch = info(
            "/apis/discovery.k8s.io/v1/endpointslices?labelSelector=%21service.kubernetes.io%2Fheadless&watch=true",
            Some("kube-proxy/v1.32.0 (linux/amd64) kubernetes/70d3cc9"),
        );
        let chain = set.for_request(&watch).unwrap();
        assert_eq!(chain.kind(), "EndpointSlice");
        assert_eq!(
            chain_names(Some(chain)),
            ["servicetopology", "forwardkubesvctraffic"]
        );
        assert!(
            set.for_request(&info("/api/v1/services", None)).is_none(),
            "no User-Agent"
        );
        assert!(
            set.for_request(&info("/version", Some("kubelet/v1.32")))
                .is_none()
        );
        let cm = info(
            "/api/v1/namespaces/kube-system/configmaps/kube-proxy",
            Some("kubelet/v1.32.0"),
        );
        assert_eq!(chain_names(set.for_request(&cm)), ["inclusterconfig"]);
    }

    /// A filter that only ever changes one object leaves requests for others alone, so their
    /// answers stream through instead of being held for filtering.
    #[test]
    fn a_request_for_another_object_gets_no_single_object_filter() {
        let set = FilterSet::new(&FilterConfig::default());
        let names = |path: &str, ua: &str| {
            chain_names(
                set.for_request(&RequestInfo::classify(&Method::GET, path, Some(ua)).unwrap()),
            )
        };
        const KUBELET: &str = "kubelet/v1.32.0";
        assert!(names("/api/v1/namespaces/default/configmaps/app", KUBELET).is_empty());
        assert!(names("/api/v1/namespaces/kube-system/configmaps/coredns", KUBELET).is_empty());
        assert!(names("/api/v1/namespaces/default/configmaps", KUBELET).is_empty());
        assert!(
            names(
                "/api/v1/namespaces/kube-system/configmaps?fieldSelector=metadata.name%3Dkube-root-ca.crt",
                KUBELET
            )
            .is_empty()
        );
        assert_eq!(
            names("/api/v1/namespaces/kube-system/configmaps", KUBELET),
            ["inclusterconfig"]
        );
        assert_eq!(names("/api/v1/configmaps", KUBELET), ["inclusterconfig"]);
        assert_eq!(
            names(
                "/api/v1/configmaps?fieldSelector=metadata.name%3Dkube-proxy&watch=true",
                KUBELET
            ),
            ["inclusterconfig"]
        );
        const KUBE_PROXY: &str = "kube-proxy/v1.32.0";
        let slices = "/apis/discovery.k8s.io/v1/namespaces/kube-system/endpointslices";
        assert_eq!(names(slices, KUBE_PROXY), ["servicetopology"]);
        assert_eq!(
            names("/api/v1/namespaces/default/pods/p", KUBELET),
            ["serviceenvupdater"]
        );
    }
}
