//! Outpost's request path: one client request from the listener to the response.
//!
//! Start reading at [`pipeline`]: it spells out the request lifecycle (classify → route →
//! remote | cache → filter → respond) and the code follows that order. The node agent
//! (`outpost-agent`) builds a [`pipeline::Pipeline`] and serves [`pipeline::Pipeline::handle`] on
//! its listeners; what the request path needs from the agent (lists and watches it runs, side
//! data it keeps) comes in through [`feed`] and plain handles.
//!
//! - [`pipeline`]: the stages of one request; [`route`]: what serves it ([`route::Serve`]).
//! - [`upstream`]: apiserver addresses, load-balancing mode, pooled TLS clients, error sorting,
//!   and which servers are healthy ([`upstream::ServerStates`]).
//! - [`edge`]: edge mode — what is cached, the tee into the cache, offline serving.
//! - [`autonomy`]: kubelet's requests the hub answers itself (its lease, node and pod status,
//!   tokens, events, registration).
//! - [`multiplexer`]: the pool-scope shared cache (Services, EndpointSlices) all callers read.
//! - [`filtering`]: yurthub's response filters in the pipeline.
//! - [`feed`]: the lists and watches the agent runs for the request path.
//! - [`error`]: every failure and its one mapping to a Kubernetes `Status`.
//! - [`headers`]: hop-by-hop hygiene, upgrade and bearer detection; [`callers`]: the plain and
//!   secure entries, and the tokens the cache may answer offline.
//! - [`body`]: response bodies (and `objects`: request bodies read as objects).
//! - [`connections`]: counted upstream connections.
//! - [`metrics`]: every metric the hub exports; [`work`]: how busy the request path is.

pub mod autonomy;
pub mod body;
pub mod callers;
pub mod connections;
pub mod edge;
pub mod encoding;
pub mod error;
pub mod feed;
pub mod filtering;
pub mod headers;
pub mod metrics;
pub mod multiplexer;
pub(crate) mod objects;
pub mod pipeline;
pub mod route;
pub mod upstream;
pub mod work;

pub use error::ProxyError;
pub use metrics::Metrics;
pub use upstream::{LbMode, Server, UpstreamConfig};

/// The clock's time as `metav1.Time` (`2026-11-23T19:44:21Z`).
pub fn rfc3339_now() -> String {
    let since_epoch = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    outpost_core::time::rfc3339(since_epoch)
}
