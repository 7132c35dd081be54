//! Stage 2 of the pipeline: how to serve a classified request.
//!
//! What varies is the identity presented upstream (the node's certificate, or none when the
//! caller brings a bearer token, as yurthub does), whether the request switches protocols, and in
//! edge mode whether the cache takes part ([`CachePlan`]) and whether the cloud is known to be
//! unreachable, in which case the request is answered locally without trying upstream; and which
//! response filters apply.

use http::HeaderMap;
use outpost_core::RequestInfo;

use outpost_filter::Chain;

use crate::autonomy::{Autonomy, KubeletRequest};
use crate::callers::{SecureCaller, TokenDigest};
use crate::edge::{CachePlan, Edge};
use crate::filtering::Filtering;
use crate::headers;
use crate::upstream::Identity;

/// What serves a request. [`decide`] picks one, in this order of precedence (the pool-scope
/// shared cache, which answers what it can from memory, is asked before any route:
/// [`crate::multiplexer`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Serve {
    /// exec / attach / port-forward: forwarded, and after `101 Switching Protocols` both
    /// sockets are spliced.
    Tunnel,
    /// Edge mode: one of kubelet's requests the hub answers itself ([`crate::autonomy`]): its
    /// lease always, its TokenRequests from what the cloud answered, and offline its
    /// registration and node status.
    Kubelet(KubeletRequest),
    /// Edge mode: the cloud is known to be unreachable and the cache can take this request
    /// ([`Route::cache`]), so it is answered locally without waiting for upstream.
    Cache,
    /// One exchange with an apiserver. Other requests are tried upstream even while the cloud
    /// is thought down (a write that could succeed is never refused on stale evidence).
    Remote,
}

/// How one request is served: by what, as whom, and with which cache and filters.
#[derive(Debug, Clone)]
pub struct Route {
    pub serve: Serve,
    pub identity: Identity,
    /// Edge mode: the cache's part in this request (`None`: proxy only). [`Serve::Cache`]
    /// answers from it; a remote answer is teed into it, and falls back to it when the cloud
    /// fails.
    pub cache: Option<CachePlan>,
    /// Edge mode: every apiserver is unhealthy.
    pub cloud_down: bool,
    /// The response filters that apply (`None`: the response streams through untouched).
    pub filter: Option<Chain>,
    /// Whether the cache may answer this caller when the cloud cannot: false for a secure-port
    /// caller whose token the apiserver never accepted.
    pub cache_may_answer: bool,
    /// A secure-port caller's token digest: the apiserver's answer verifies or refutes it.
    pub token: Option<TokenDigest>,
}

impl Route {
    /// A caller on the secure port (see [`crate::callers`]): never one of kubelet's own
    /// requests; its cache is its own `partition`; offline, answered from the cache only when
    /// its token is verified.
    pub fn for_secure_caller(mut self, caller: SecureCaller, verified: bool) -> Route {
        self.cache = self.cache.map(|plan| plan.in_partition(&caller.partition));
        self.cache_may_answer = verified;
        self.token = Some(caller.token);
        let tunnel = self.serve == Serve::Tunnel;
        self.serve = self.precedence(tunnel, None);
        self
    }

    /// The one place the precedence between what could serve a request is written down.
    fn precedence(&self, tunnel: bool, kubelet: Option<KubeletRequest>) -> Serve {
        match kubelet {
            _ if tunnel => Serve::Tunnel,
            Some(request) => Serve::Kubelet(request),
            None if self.cache_answers_locally() => Serve::Cache,
            None => Serve::Remote,
        }
    }

    /// The cloud is known to be unreachable, and the cache can and may take this request (a
    /// write's plan only keeps what the write leaves: it is never answered offline).
    pub fn cache_answers_locally(&self) -> bool {
        self.cache.as_ref().is_some_and(CachePlan::answers_offline)
            && self.cloud_down
            && self.cache_may_answer
    }
}

/// Decides the route from the classification, the request headers and the edge state.
pub fn decide(
    info: &RequestInfo,
    headers: &HeaderMap,
    edge: Option<&Edge>,
    autonomy: Option<&Autonomy>,
    filtering: Option<&Filtering>,
) -> Route {
    let identity = if headers::has_bearer_token(headers) {
        Identity::Bearer
    } else {
        Identity::Node
    };
    let tunnel = headers::is_upgrade_request(headers);
    let cloud_down = edge.is_some_and(Edge::is_offline);
    let mut route = Route {
        serve: Serve::Remote,
        identity,
        cache: edge.and_then(|e| e.plan(info, headers)),
        cloud_down,
        filter: if tunnel {
            None
        } else {
            filtering.and_then(|f| f.chain(info))
        },
        cache_may_answer: true,
        token: None,
    };
    let kubelet = autonomy
        .filter(|_| !tunnel)
        .and_then(|a| a.classify(info, cloud_down));
    route.serve = route.precedence(tunnel, kubelet);
    route
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{HeaderValue, Method};

    fn info(url: &str) -> RequestInfo {
        RequestInfo::classify(&Method::GET, url, Some("kubectl/v1.32")).unwrap()
    }

    /// The route of a GET of `url` with `headers`, on a hub without edge mode or filters.
    fn bare(url: &str, headers: &HeaderMap) -> Route {
        decide(&info(url), headers, None, None, None)
    }

    #[test]
    fn bearer_callers_keep_their_identity() {
        let mut h = HeaderMap::new();
        h.insert("authorization", HeaderValue::from_static("Bearer t0k3n"));
        let r = bare("/api/v1/pods", &h);
        assert_eq!(r.identity, Identity::Bearer);
        assert_ne!(r.serve, Serve::Tunnel);
    }

    #[test]
    fn others_go_as_the_node() {
        let r = bare("/api/v1/pods", &HeaderMap::new());
        assert_eq!(r.identity, Identity::Node);
    }

    #[test]
    fn a_secure_caller_is_never_kubelet_and_unverified_it_is_not_answered_locally() {
        let mut route = bare("/api/v1/pods", &HeaderMap::new());
        // Offline, with a cache plan: the cache could answer locally.
        route.cloud_down = true;
        route.cache = Some(CachePlan::Object {
            key: outpost_cache::ObjectKey::new(
                "kubelet",
                &outpost_cache::Gvr::new("", "v1", "pods"),
                "d",
                "p",
            ),
        });
        route.serve = Serve::Kubelet(KubeletRequest::Lease);
        let caller = |token| SecureCaller {
            token,
            partition: "sa".into(),
        };
        let verified = route.clone().for_secure_caller(caller([1; 32]), true);
        assert!(verified.serve == Serve::Cache && verified.cache_may_answer);
        assert!(!matches!(verified.serve, Serve::Kubelet(_)));
        assert_eq!(verified.token, Some([1; 32]));
        let stranger = route.for_secure_caller(caller([2; 32]), false);
        assert!(stranger.serve != Serve::Cache && !stranger.cache_may_answer);
    }

    #[test]
    fn upgrades_are_tunnelled() {
        let mut h = HeaderMap::new();
        h.insert("connection", HeaderValue::from_static("Upgrade"));
        h.insert("upgrade", HeaderValue::from_static("SPDY/3.1"));
        let r = bare("/api/v1/namespaces/d/pods/p/exec?command=sh", &h);
        assert_eq!(r.serve, Serve::Tunnel);
    }
}
