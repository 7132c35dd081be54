//! Which requests the edge cache takes part in, and under which key. Pure: no I/O.
//!
//! [`CachePolicy::plan`] turns a classified request into a [`CachePlan`] (or `None`, meaning
//! "proxy only"). The rules follow yurthub's `CanCacheFor` (§4.1 of the reference) where it is
//! right, and fix it where it is not: any number of selectors per resource are cached side by side
//! (yurthub caches only the first one it sees, forever).

use std::collections::BTreeSet;
use std::sync::{Arc, RwLock};

use http::HeaderMap;
use outpost_cache::{Gvr, ObjectKey, Scope};
use outpost_core::{RequestInfo, Verb};

/// yurthub's default cache agents (`pkg/yurthub/configuration/manager.go`), plus our own name.
pub const DEFAULT_AGENTS: &[&str] = &[
    "kubelet",
    "kube-proxy",
    "flanneld",
    "coredns",
    "raven-agent-ds",
    "yurttunnel-agent",
    "yurthub",
    "outpost",
];

/// Resources whose responses are never cached: credentials and one-off reviews.
const NEVER_CACHED: &[&str] = &[
    "certificatesigningrequests",
    "subjectaccessreviews",
    "selfsubjectaccessreviews",
    "localsubjectaccessreviews",
    "selfsubjectrulesreviews",
    "selfsubjectreviews",
    "tokenreviews",
];

/// Non-resource paths cached so that discovery (kubectl, client-go) works offline.
fn is_discovery_path(path: &str) -> bool {
    let trimmed = path.trim_end_matches('/');
    match trimmed {
        "/version" | "/api" | "/apis" => return true,
        _ => {}
    }
    let segments: Vec<&str> = trimmed.split('/').skip(1).collect();
    matches!(
        segments.as_slice(),
        ["api", _] | ["apis", _] | ["apis", _, _]
    )
}

/// The set of components whose responses are cached; replaced live when `yurt-hub-cfg` changes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheAgents {
    /// `*` in `cache_agents`: every component.
    all: bool,
    names: BTreeSet<String>,
}

impl CacheAgents {
    /// The defaults plus a `cache_agents` value (comma-separated, `*` = all).
    pub fn with_extra(extra: &str) -> CacheAgents {
        let mut names: BTreeSet<String> = DEFAULT_AGENTS.iter().map(|s| (*s).to_owned()).collect();
        let mut all = false;
        for name in extra.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            if name == "*" {
                all = true;
            } else {
                names.insert(name.to_ascii_lowercase());
            }
        }
        CacheAgents { all, names }
    }

    pub fn contains(&self, component: &str) -> bool {
        self.all || self.names.contains(component)
    }
}

impl Default for CacheAgents {
    fn default() -> Self {
        CacheAgents::with_extra("")
    }
}

/// What the cache does for one request.
#[derive(Debug, Clone, PartialEq)]
pub enum CachePlan {
    /// GET of one object: tee the response into the cache; offline, answer from it.
    Object { key: ObjectKey },
    /// LIST: the response replaces `scope`; offline, the cache answers `query`.
    List { scope: Scope },
    /// WATCH: events update `scope`; offline, a local stream serves it. `initial_events`: the
    /// stream may begin with the scope's whole state, ended by a `k8s.io/initial-events-end`
    /// bookmark (a streaming list, see `tee`).
    Watch { scope: Scope, initial_events: bool },
    /// A discovery document (`/version`, `/api`, `/apis/<g>/<v>`…), cached for any caller.
    Discovery { path: String },
    /// A write (create, update, patch): the object the apiserver answers with is the cloud's
    /// current one and is kept, as a GET's would be (a create's name comes from the answer:
    /// `key.name` is empty). Never answered from the cache.
    Written { key: ObjectKey },
}

impl CachePlan {
    /// Whether the cache may answer this request when the cloud cannot (reads only).
    pub fn answers_offline(&self) -> bool {
        !matches!(self, CachePlan::Written { .. })
    }

    /// The same plan in a caller's own partition of its component's cache (`coredns@<caller>`):
    /// callers of the secure port never read what the node's components, or other callers,
    /// cached under the same User-Agent (see [`crate::callers::SecureCaller::partition`]).
    pub fn in_partition(self, partition: &str) -> CachePlan {
        let partitioned = |component: &str| format!("{component}@{partition}");
        match self {
            CachePlan::Object { mut key } => {
                key.component = partitioned(&key.component);
                CachePlan::Object { key }
            }
            CachePlan::Written { mut key } => {
                key.component = partitioned(&key.component);
                CachePlan::Written { key }
            }
            CachePlan::List { mut scope } => {
                scope.component = partitioned(&scope.component);
                CachePlan::List { scope }
            }
            CachePlan::Watch {
                mut scope,
                initial_events,
            } => {
                scope.component = partitioned(&scope.component);
                CachePlan::Watch {
                    scope,
                    initial_events,
                }
            }
            // Discovery documents are the same for everyone and cached once.
            discovery @ CachePlan::Discovery { .. } => discovery,
        }
    }
}

/// Decides [`CachePlan`]s. Cheap to clone; the agent set is shared and replaceable.
#[derive(Debug, Clone, Default)]
pub struct CachePolicy {
    agents: Arc<RwLock<Arc<CacheAgents>>>,
}

impl CachePolicy {
    pub fn new(agents: CacheAgents) -> CachePolicy {
        CachePolicy {
            agents: Arc::new(RwLock::new(Arc::new(agents))),
        }
    }

    /// Replaces the agent set (from `yurt-hub-cfg`); removing an agent keeps what it cached.
    pub fn set_agents(&self, agents: CacheAgents) {
        let mut guard = self.agents.write().unwrap_or_else(|p| p.into_inner());
        *guard = Arc::new(agents);
    }

    pub fn agents(&self) -> Arc<CacheAgents> {
        self.agents
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The plan for a request, or `None` when the cache stays out of it.
    pub fn plan(&self, info: &RequestInfo, headers: &HeaderMap) -> Option<CachePlan> {
        if crate::headers::is_upgrade_request(headers) {
            return None;
        }
        if !info.is_resource_request {
            return (info.verb == Verb::Get && is_discovery_path(&info.path)).then(|| {
                CachePlan::Discovery {
                    path: info.path.trim_end_matches('/').to_owned(),
                }
            });
        }
        let component = info.component.as_deref()?;
        if !self.agents().contains(component) || NEVER_CACHED.contains(&info.resource.as_str()) {
            return None;
        }
        let gvr = Gvr::new(&info.api_group, &info.api_version, &info.resource);
        match info.verb {
            Verb::Get if info.subresource.is_empty() || info.subresource == "status" => {
                Some(CachePlan::Object {
                    key: ObjectKey::new(component, &gvr, object_namespace(info), &info.name),
                })
            }
            Verb::Create | Verb::Update | Verb::Patch
                if info.subresource.is_empty() || info.subresource == "status" =>
            {
                Some(CachePlan::Written {
                    key: ObjectKey::new(component, &gvr, object_namespace(info), &info.name),
                })
            }
            Verb::List if info.subresource.is_empty() => Some(CachePlan::List {
                scope: scope_of(component, &gvr, info),
            }),
            Verb::Watch if info.subresource.is_empty() => Some(CachePlan::Watch {
                scope: scope_of(component, &gvr, info),
                initial_events: may_stream_a_list(info),
            }),
            _ => None,
        }
    }
}

/// Whether a watch may open with the scope's whole state and mark its end with a bookmark:
/// asked for (`sendInitialEvents=true`), or a watch from "now" or "0" that kube-apiserver with
/// WatchList turns into one. Either way only with bookmarks allowed: the marker is one.
fn may_stream_a_list(info: &RequestInfo) -> bool {
    let q = &info.query;
    let from_any = matches!(q.resource_version.as_deref(), None | Some("") | Some("0"));
    q.allow_watch_bookmarks && q.send_initial_events.unwrap_or(from_any)
}

/// kube-apiserver puts a namespace's own name in `namespace`; the object itself has none.
fn object_namespace(info: &RequestInfo) -> &str {
    if info.resource == "namespaces" && info.api_group.is_empty() {
        ""
    } else {
        &info.namespace
    }
}

fn scope_of(component: &str, gvr: &Gvr, info: &RequestInfo) -> Scope {
    let namespace = Some(object_namespace(info)).filter(|ns| !ns.is_empty());
    Scope::new(
        component,
        gvr,
        namespace,
        info.query.label_selector.clone(),
        info.query.field_selector.clone(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{HeaderValue, Method};

    const KUBELET: &str = "kubelet/v1.32.0 (linux/amd64) kubernetes/70d3cc9";

    fn plan_for(method: Method, url: &str, ua: &str) -> Option<CachePlan> {
        let info = RequestInfo::classify(&method, url, Some(ua)).unwrap();
        CachePolicy::default().plan(&info, &HeaderMap::new())
    }

    #[test]
    fn which_watches_may_open_with_a_streamed_list() {
        let initial_events = |query: &str| match plan_for(
            Method::GET,
            &format!("/api/v1/pods?watch=true&{query}"),
            KUBELET,
        ) {
            Some(CachePlan::Watch { initial_events, .. }) => initial_events,
            other => panic!("{query}: {other:?}"),
        };
        let streamed = "sendInitialEvents=true&resourceVersionMatch=NotOlderThan";
        assert!(initial_events(&format!(
            "{streamed}&allowWatchBookmarks=true"
        )));
        assert!(initial_events(&format!(
            "{streamed}&allowWatchBookmarks=true&resourceVersion=42"
        )));
        assert!(!initial_events(streamed), "the marker is a bookmark");
        assert!(initial_events("allowWatchBookmarks=true"));
        assert!(initial_events("allowWatchBookmarks=true&resourceVersion=0"));
        assert!(!initial_events(
            "allowWatchBookmarks=true&resourceVersion=42"
        ));
        assert!(!initial_events(
            "allowWatchBookmarks=true&sendInitialEvents=false&resourceVersionMatch=NotOlderThan"
        ));
    }

    #[test]
    fn kubelet_reads_are_cached_under_their_scope() {
        let Some(CachePlan::List { scope }) = plan_for(
            Method::GET,
            "/api/v1/pods?fieldSelector=spec.nodeName%3Dedge-1&limit=500&resourceVersion=0",
            KUBELET,
        ) else {
            panic!("pod list must be cached");
        };
        assert_eq!(scope.component, "kubelet");
        assert_eq!(scope.gvr, Gvr::new("", "v1", "pods"));
        assert_eq!(scope.namespace, None);
        assert_eq!(scope.fields.to_string(), "spec.nodeName=edge-1");

        let Some(CachePlan::Watch { scope, .. }) = plan_for(
            Method::GET,
            "/apis/discovery.k8s.io/v1/namespaces/kube-system/endpointslices?watch=true&labelSelector=a%3Db",
            "kube-proxy/v1.32.0",
        ) else {
            panic!("watch must be cached");
        };
        assert_eq!(scope.namespace.as_deref(), Some("kube-system"));
        assert_eq!(scope.labels.to_string(), "a=b");

        let Some(CachePlan::Object { key }) = plan_for(
            Method::GET,
            "/api/v1/nodes/edge-1?resourceVersion=0",
            KUBELET,
        ) else {
            panic!("node GET must be cached");
        };
        assert_eq!(key.to_string(), "kubelet/nodes.v1.core/edge-1");
    }

    #[test]
    fn namespaces_are_keyed_without_a_namespace() {
        let Some(CachePlan::Object { key }) =
            plan_for(Method::GET, "/api/v1/namespaces/kube-system", KUBELET)
        else {
            panic!("namespace GET must be cached");
        };
        assert_eq!(key.namespace, "");
        assert_eq!(key.name, "kube-system");
    }

    #[test]
    fn a_write_keeps_the_object_it_leaves_and_is_never_answered_offline() {
        let Some(plan @ CachePlan::Written { .. }) =
            plan_for(Method::PUT, "/api/v1/nodes/edge-1", KUBELET)
        else {
            panic!("a write's answer is kept");
        };
        assert!(!plan.answers_offline());
        let Some(CachePlan::Written { key }) =
            plan_for(Method::POST, "/apis/storage.k8s.io/v1/csinodes", KUBELET)
        else {
            panic!("a create's answer is kept");
        };
        assert_eq!(key.name, "", "the answer names it");
        assert!(plan_for(Method::DELETE, "/api/v1/nodes/edge-1", KUBELET).is_none());
        assert!(
            plan_for(
                Method::POST,
                "/api/v1/namespaces/d/serviceaccounts/sa/token",
                KUBELET
            )
            .is_none(),
            "a subresource other than status"
        );
    }

    #[test]
    fn what_is_never_cached() {
        // Unknown components, reviews, CSRs, subresources other than status.
        assert!(plan_for(Method::GET, "/api/v1/pods", "curl/8.0").is_none());
        assert!(
            plan_for(
                Method::GET,
                "/apis/certificates.k8s.io/v1/certificatesigningrequests",
                KUBELET
            )
            .is_none()
        );
        assert!(plan_for(Method::GET, "/api/v1/namespaces/d/pods/p/log", KUBELET).is_none());
        let info = RequestInfo::classify(&Method::GET, "/api/v1/pods", None).unwrap();
        assert!(
            CachePolicy::default()
                .plan(&info, &HeaderMap::new())
                .is_none()
        );
        let mut upgrade = HeaderMap::new();
        upgrade.insert("connection", HeaderValue::from_static("Upgrade"));
        upgrade.insert("upgrade", HeaderValue::from_static("websocket"));
        let info = RequestInfo::classify(&Method::GET, "/api/v1/pods?watch=1", Some(KUBELET));
        assert!(
            CachePolicy::default()
                .plan(&info.unwrap(), &upgrade)
                .is_none()
        );
    }

    #[test]
    fn agents_come_from_defaults_and_config() {
        let policy = CachePolicy::default();
        assert!(plan_for(Method::GET, "/api/v1/pods", "kubectl/v1.32.0").is_none());
        policy.set_agents(CacheAgents::with_extra("kubectl, foo"));
        let info =
            RequestInfo::classify(&Method::GET, "/api/v1/pods", Some("kubectl/v1.32.0")).unwrap();
        assert!(policy.plan(&info, &HeaderMap::new()).is_some());
        policy.set_agents(CacheAgents::with_extra("*"));
        let info = RequestInfo::classify(&Method::GET, "/api/v1/pods", Some("anything")).unwrap();
        assert!(policy.plan(&info, &HeaderMap::new()).is_some());
    }

    #[test]
    fn discovery_paths() {
        for path in [
            "/version",
            "/version/",
            "/api",
            "/apis",
            "/api/v1",
            "/apis/apps",
            "/apis/apps/v1",
        ] {
            assert_eq!(
                plan_for(Method::GET, path, "kubectl/v1.32"),
                Some(CachePlan::Discovery {
                    path: path.trim_end_matches('/').to_owned()
                }),
                "{path}"
            );
        }
        for path in ["/healthz", "/openapi/v2", "/metrics", "/apis/apps/v1/x/y"] {
            let plan = plan_for(Method::GET, path, "kubectl/v1.32");
            assert!(
                !matches!(plan, Some(CachePlan::Discovery { .. })),
                "{path}: {plan:?}"
            );
        }
    }
}
