//! Stage 2 of the pipeline: a pure decision about how to serve a classified request.
//!
//! Today every request goes to an apiserver; what varies is the identity presented (the node's
//! certificate, or none when the caller brings a bearer token, as yurthub does) and whether the
//! request switches protocols. The edge cache adds its own routes here.

use http::HeaderMap;
use outpost_core::RequestInfo;

use crate::headers;
use crate::upstream::Identity;

/// How one request is served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Route {
    pub identity: Identity,
    /// exec / attach / port-forward: after `101 Switching Protocols` both sockets are spliced.
    pub tunnel: bool,
}

/// Decides the route from the classification and the request headers alone.
pub fn decide(_info: &RequestInfo, headers: &HeaderMap) -> Route {
    let identity = if headers::has_bearer_token(headers) {
        Identity::Bearer
    } else {
        Identity::Node
    };
    Route {
        identity,
        tunnel: headers::is_upgrade_request(headers),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{HeaderValue, Method};

    fn info(url: &str) -> RequestInfo {
        RequestInfo::classify(&Method::GET, url, Some("kubectl/v1.32")).unwrap()
    }

    #[test]
    fn bearer_callers_keep_their_identity() {
        let mut h = HeaderMap::new();
        h.insert("authorization", HeaderValue::from_static("Bearer t0k3n"));
        let r = decide(&info("/api/v1/pods"), &h);
        assert_eq!(r.identity, Identity::Bearer);
        assert!(!r.tunnel);
    }

    #[test]
    fn others_go_as_the_node() {
        let r = decide(&info("/api/v1/pods"), &HeaderMap::new());
        assert_eq!(r.identity, Identity::Node);
    }

    #[test]
    fn upgrades_are_tunnelled() {
        let mut h = HeaderMap::new();
        h.insert("connection", HeaderValue::from_static("Upgrade"));
        h.insert("upgrade", HeaderValue::from_static("SPDY/3.1"));
        let r = decide(&info("/api/v1/namespaces/d/pods/p/exec?command=sh"), &h);
        assert!(r.tunnel);
    }
}
