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

/// How one request is served.
#[derive(Debug, Clone)]
pub struct Route {
    pub identity: Identity,
    /// exec / attach / port-forward: after `101 Switching Protocols` both sockets are spliced.
    pub tunnel: bool,
    /// Edge mode: the cache's part in this request (`None`: proxy only).
    pub cache: Option<CachePlan>,
    /// Edge mode: one of kubelet's requests the hub answers itself ([`crate::autonomy`]): its
    /// lease always, its TokenRequests from what the cloud answered, and offline its
    /// registration and node status.
    pub kubelet: Option<KubeletRequest>,
    /// Edge mode: the cloud is known to be unreachable and the cache can take this request, so
    /// it is answered locally without waiting for upstream. Other requests are still tried
    /// upstream (a write that could succeed is never refused on stale evidence).
    pub local: bool,
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
        self.kubelet = None;
        self.cache = self.cache.map(|plan| plan.in_partition(&caller.partition));
        self.cache_may_answer = verified;
        self.local &= verified;
        self.token = Some(caller.token);
        self
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
    let cache = edge.and_then(|e| e.plan(info, headers));
    let offline = edge.is_some_and(Edge::is_offline);
    Route {
        kubelet: autonomy
            .filter(|_| !tunnel)
            .and_then(|a| a.classify(info, offline)),
        identity,
        tunnel,
        local: cache.as_ref().is_some_and(CachePlan::answers_offline) && offline,
        cache,
        filter: if tunnel {
            None
        } else {
            filtering.and_then(|f| f.chain(info))
        },
        cache_may_answer: true,
        token: None,
    }
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
        assert!(!r.tunnel);
    }

    #[test]
    fn others_go_as_the_node() {
        let r = bare("/api/v1/pods", &HeaderMap::new());
        assert_eq!(r.identity, Identity::Node);
    }

    #[test]
    fn a_secure_caller_is_never_kubelet_and_unverified_it_is_not_answered_locally() {
        let mut route = bare("/api/v1/pods", &HeaderMap::new());
        route.local = true;
        route.kubelet = Some(KubeletRequest::Lease);
        let caller = |token| SecureCaller {
            token,
            partition: "sa".into(),
        };
        let verified = route.clone().for_secure_caller(caller([1; 32]), true);
        assert!(verified.local && verified.cache_may_answer);
        assert_eq!(verified.kubelet, None);
        assert_eq!(verified.token, Some([1; 32]));
        let stranger = route.for_secure_caller(caller([2; 32]), false);
        assert!(!stranger.local && !stranger.cache_may_answer);
    }

    #[test]
    fn upgrades_are_tunnelled() {
        let mut h = HeaderMap::new();
        h.insert("connection", HeaderValue::from_static("Upgrade"));
        h.insert("upgrade", HeaderValue::from_static("SPDY/3.1"));
        let r = bare("/api/v1/namespaces/d/pods/p/exec?command=sh", &h);
        assert!(r.tunnel);
    }
}
