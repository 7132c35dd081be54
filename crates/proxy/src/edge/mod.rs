//! Edge mode: the cache side of the pipeline.
//!
//! Start at [`Edge`]: the pipeline asks it three things, in lifecycle order.
//! 1. *route*: [`Edge::plan`] — does the cache take part in this request, and under which key
//!    ([`policy`]); [`Edge::is_offline`] — is every apiserver unhealthy ([`crate::upstream::states`]).
//! 2. *remote*: [`Edge::prepare_upstream`] asks for uncompressed JSON ([`negotiate`]);
//!    [`Edge::tee`] copies a good response into the cache on its way to the client ([`tee`]),
//!    and a single writer thread applies it ([`writer`]).
//! 3. *cache*: [`Edge::serve`] answers from the cache when the cloud is unreachable
//!    ([`offline`] for GET / LIST / discovery, [`watch`] for WATCH).
//!
//! Filters (a later issue) run on the way out, after the tee, so the cache keeps the upstream
//! truth and a change of filter configuration applies to cached data too.

pub mod confirmed;
pub mod kinds;
pub mod list_items;
pub mod lists;
pub mod negotiate;
pub mod offline;
pub mod overlay;
pub mod policy;
pub mod reads;
pub mod relisted;
pub mod tee;
pub mod watch;
pub mod writer;

use std::sync::Arc;

use http::{HeaderMap, Response, StatusCode};
use outpost_cache::Store;
use outpost_core::RequestInfo;
use tracing::{debug, warn};

pub use policy::{CacheAgents, CachePlan, CachePolicy};
pub use writer::Writer;

use crate::body::ProxyBody;
use crate::error::ProxyError;
use crate::metrics::Metrics;
use crate::upstream::ServerStates;
use tee::{Sink, TeeBody};
use writer::CacheOp;

/// How long an offline answer waits for the cache writer to apply what was queued before it
/// (the last responses passed on before the cloud went away). Normally nothing or milliseconds;
/// the bound only matters when the writer is stuck.
const CATCH_UP: std::time::Duration = std::time::Duration::from_millis(500);

/// How long a stopping hub waits for the store's final flush.
pub const FINAL_FLUSH_WITHIN: std::time::Duration = std::time::Duration::from_secs(2);

/// The edge cache as the pipeline sees it.
pub struct Edge {
    store: Arc<dyn Store>,
    /// Offline LIST answers while the cache is unchanged.
    lists: lists::ListMemo,
    policy: CachePolicy,
    writer: Writer,
    health: Arc<ServerStates>,
    metrics: Metrics,
    /// `--min-request-timeout`: how long an offline watch without `timeoutSeconds` lasts (1x-2x).
    min_request_timeout: std::time::Duration,
    /// The node's own reports (pod statuses) applied to what is served offline.
    overlay: Arc<overlay::Overlay>,
}

impl Edge {
    /// Starts the writer thread over `store` (`volatile`, `max_object_bytes`: see
    /// [`Writer::start_with`]).
    pub fn new(
        store: Arc<dyn Store>,
        policy: CachePolicy,
        health: Arc<ServerStates>,
        metrics: Metrics,
        volatile: bool,
        max_object_bytes: usize,
    ) -> std::io::Result<Edge> {
        let writer =
            Writer::start_with(store.clone(), metrics.clone(), volatile, max_object_bytes)?;
        Ok(Edge {
            health,
            store,
            lists: lists::ListMemo::default(),
            policy,
            writer,
            metrics,
            min_request_timeout: watch::DEFAULT_MIN_REQUEST_TIMEOUT,
            overlay: Arc::default(),
        })
    }

    /// `--min-request-timeout` instead of its default.
    pub fn with_min_request_timeout(mut self, timeout: std::time::Duration) -> Edge {
        self.min_request_timeout = timeout;
        self
    }

    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// Applies the cache writes still queued (at most `within`) and flushes the store (at most
    /// [`FINAL_FLUSH_WITHIN`]): what a stopping hub passed on just before the stop (a relist,
    /// the last watch events) must be in the cache when the node restarts without the cloud.
    /// Both are bounded: a stuck store must not keep the hub from stopping within its grace
    /// period.
    pub async fn finish_writes(&self, within: std::time::Duration) {
        if !self.writer.caught_up(within).await {
            warn!(
                waited_s = within.as_secs(),
                "stopping with cache writes still queued; they are lost and the next relist repairs the cache"
            );
        }
        let store = self.store.clone();
        let flush = tokio::task::spawn_blocking(move || store.flush());
        match tokio::time::timeout(FINAL_FLUSH_WITHIN, flush).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(e))) => warn!(error = %e, "final cache flush failed"),
            Ok(Err(e)) => warn!(error = %e, "final cache flush failed"),
            Err(_) => warn!(
                waited_s = FINAL_FLUSH_WITHIN.as_secs(),
                "final cache flush did not finish; stopping without it (every write was flushed when it was made)"
            ),
        }
    }

    /// The node's own reports laid over offline answers ([`overlay`]).
    pub fn overlay(&self) -> &Arc<overlay::Overlay> {
        &self.overlay
    }

    /// The cache writer, for what is kept besides responses (kubelet's tokens).
    pub fn writer(&self) -> &Writer {
        &self.writer
    }

    pub fn health(&self) -> &Arc<ServerStates> {
        &self.health
    }

    pub fn policy(&self) -> &CachePolicy {
        &self.policy
    }

    /// Whether the cache takes part in this request. A client that accepts no JSON is proxied
    /// without the cache: the cache could never answer it in its own encoding.
    pub fn plan(&self, info: &RequestInfo, headers: &HeaderMap) -> Option<CachePlan> {
        self.policy
            .plan(info, headers)
            .filter(|_| negotiate::accepts_json(headers))
    }

    pub fn is_offline(&self) -> bool {
        !self.health.is_online()
    }

    /// Rewrites a cached request's headers so the response can be cached as received. A client
    /// that prefers a server-side Table (`kubectl get`) but accepts plain JSON gets plain JSON,
    /// online and offline alike, and prints it itself; discovery keeps its own negotiation.
    pub fn prepare_upstream(&self, plan: &CachePlan, headers: &mut HeaderMap) {
        if !matches!(plan, CachePlan::Discovery { .. }) {
            negotiate::ask_for_json(headers);
        }
    }

    /// Copies a response into the cache as it streams to the client (2xx JSON only: an object,
    /// a list, watch events, a discovery document, or the object a write left); a GET answered
    /// 404 removes the object from the cache.
    pub fn tee(&self, plan: CachePlan, resp: Response<ProxyBody>) -> Response<ProxyBody> {
        let status = resp.status();
        if status == StatusCode::NOT_FOUND {
            if let CachePlan::Object { key } = plan {
                // A full queue leaves the stale object; nothing else to do about it here.
                let _ = self.writer.submit(CacheOp::Gone { key });
            }
            return resp;
        }
        if !status.is_success() {
            return resp;
        }
        let Some(sink) = self.sink(plan, resp.headers()) else {
            return resp;
        };
        let writer = self.writer.clone();
        resp.map(|body| {
            use http_body_util::BodyExt;
            TeeBody::new(body, sink, writer).boxed()
        })
    }

    /// Where a response to `plan` goes in the cache, if it can be stored as received (the plan
    /// moves into the sink: its key is not copied for every response).
    fn sink(&self, plan: CachePlan, headers: &HeaderMap) -> Option<Sink> {
        Some(match plan {
            CachePlan::Discovery { path } => return Self::discovery_sink(&path, headers),
            _ if !negotiate::is_plain_json(headers) => {
                debug!(?plan, "response not cacheable as received");
                return None;
            }
            CachePlan::Object { key } => Sink::Object(key),
            CachePlan::List { scope } => Sink::List(scope),
            CachePlan::Watch {
                scope,
                initial_events,
            } => Sink::Watch {
                scope,
                initial_events,
            },
            CachePlan::Written { key } => Sink::Written(key),
        })
    }

    /// A discovery document's sink, by the variant its `Content-Type` names.
    fn discovery_sink(path: &str, headers: &HeaderMap) -> Option<Sink> {
        let content_type = headers
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok());
        let Some((content_type, variant)) =
            content_type.and_then(|t| Some((t, offline::discovery_variant(t)?)))
        else {
            debug!(
                path,
                ?content_type,
                "discovery document not cacheable as received"
            );
            return None;
        };
        let name = offline::discovery_names(path)[variant].clone();
        Some(Sink::Document {
            name,
            content_type: content_type.to_owned(),
        })
    }

    /// Answers from the cache (the cloud is unreachable).
    pub async fn serve(
        &self,
        plan: CachePlan,
        info: &RequestInfo,
        headers: &HeaderMap,
    ) -> Result<Response<ProxyBody>, ProxyError> {
        let verb = info.verb.as_str();
        if !self.writer.caught_up(CATCH_UP).await {
            debug!(
                verb,
                "the cache writer is still behind; answering from the cache as it is"
            );
        }
        let result = match check_resource_version(&plan, info) {
            Err(status) => Err(ProxyError::Local(status)),
            Ok(()) => self.answer(plan, info, headers).await,
        };
        let label = match &result {
            Ok(_) => "served",
            Err(e) => e.kind(),
        };
        self.metrics
            .cache_served
            .with_label_values(&[verb, label])
            .inc();
        result
    }

    async fn answer(
        &self,
        plan: CachePlan,
        info: &RequestInfo,
        headers: &HeaderMap,
    ) -> Result<Response<ProxyBody>, ProxyError> {
        match plan {
            CachePlan::Object { key } => offline::get(&self.store, &self.overlay, key).await,
            CachePlan::List { scope } => {
                offline::list(&self.lists, &self.store, &self.overlay, scope, info).await
            }
            CachePlan::Watch { scope, .. } => {
                let online = self.health.subscribe();
                let timeout = self.min_request_timeout;
                let source = watch::Source {
                    lists: &self.lists,
                    store: &self.store,
                    overlay: &self.overlay,
                };
                watch::serve(source, scope, info, online, timeout).await
            }
            CachePlan::Discovery { path } => offline::discovery(&self.store, &path, headers).await,
            CachePlan::Written { .. } => Err(ProxyError::Offline(
                "a write is never answered from the edge cache".into(),
            )),
        }
    }
}

/// kube-apiserver's check of a read's `resourceVersion` (an unsigned integer, or empty), so
/// that the cache refuses what the cloud refuses, with the same words.
fn check_resource_version(
    plan: &CachePlan,
    info: &RequestInfo,
) -> Result<(), outpost_core::Status> {
    if matches!(plan, CachePlan::Discovery { .. }) {
        return Ok(());
    }
    match info.query.resource_version.as_deref() {
        Some(rv) if !rv.is_empty() && rv.parse::<u64>().is_err() => {
            Err(outpost_core::Status::bad_request(format!(
                "resourceVersion: Invalid value: {rv:?}: strconv.ParseUint: parsing {rv:?}: invalid syntax"
            )))
        }
        _ => Ok(()),
    }
}
