//! Response filtering, the pipeline's stage between answering (remote or cache) and responding.
//!
//! Start at [`Filtering`]: at route time [`Filtering::chain`] says which filters apply (usually
//! none, and then the response streams through untouched); [`Filtering::prepare_upstream`] asks
//! upstream for JSON, which filters read; [`Filtering::apply`] rewrites the response: a GET body
//! whole, a LIST as it streams when its filters name markers ([`streamed`]; whole otherwise), a
//! WATCH stream line by line ([`FilteredWatch`]).
//!
//! Filtering sits *after* the cache tee and applies to cache answers too: the cache keeps the
//! upstream truth, offline answers are filtered exactly as online ones, and a change of filter
//! configuration (a `yurt-hub-cfg` edit, a Service annotation) applies to cached data at once.
//!
//! The side data filters read (Services, NodePools, this Node's pool label) comes in through
//! the [`FilterContext`] receiver [`Filtering::new`] is given: the node agent's reflectors keep it
//! (`outpost_agent::side::filters`), with the hub's own identity, cached for offline starts.

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::task::{Context, Poll, ready};

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, Response, header};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use outpost_core::wire::LineFramer;
use outpost_core::{RequestInfo, Verb};
use outpost_filter::{Chain, FilterContext, FilterSet, Outcome};
use tokio::sync::watch;
use tracing::{debug, info, warn};

use crate::body::{self, BoxError, ProxyBody};
use crate::edge::negotiate;
use crate::error::ProxyError;
use crate::headers::SERVED_FROM;
use crate::metrics::Metrics;

mod streamed;

use streamed::{FilterJob, StreamedList};

/// Bodies larger than this are filtered on a blocking thread, off the async workers.
const BLOCKING_ABOVE: usize = 256 << 10;
/// A GET or LIST body larger than this is passed unfiltered (and counted).
const MAX_FILTERED_BODY: usize = 256 << 20;

/// The filters and their current side data, shared by every request.
pub struct Filtering {
    set: RwLock<FilterSet>,
    ctx: watch::Receiver<Arc<FilterContext>>,
    metrics: Metrics,
    /// Cleared for good when a streamed list could not be finished ([`StreamedList`]).
    stream_lists: Arc<AtomicBool>,
}

impl Filtering {
    /// The filters from the flags (updated by [`Filtering::set_hub_cfg`]), reading their side
    /// data from `ctx` (the node agent's reflectors keep it).
    pub fn new(
        set: FilterSet,
        ctx: watch::Receiver<Arc<FilterContext>>,
        metrics: &Metrics,
    ) -> Filtering {
        Filtering {
            set: RwLock::new(set),
            ctx,
            metrics: metrics.clone(),
            stream_lists: Arc::new(AtomicBool::new(true)),
        }
    }

    /// The filter chain for this request, if any filter applies.
    pub fn chain(&self, info: &RequestInfo) -> Option<Chain> {
        self.set
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .for_request(info)
    }

    /// Asks upstream for uncompressed JSON when the client accepts it, so the filters can read
    /// the answer; a client that accepts no JSON gets its own encoding, unfiltered (counted).
    pub fn prepare_upstream(headers: &mut HeaderMap) {
        if negotiate::accepts_json(headers) {
            negotiate::ask_for_json(headers);
        }
    }

    /// Applies `chain` to a response: 2xx JSON only; anything else passes as it came.
    pub async fn apply(
        &self,
        chain: Chain,
        verb: Verb,
        resp: Response<ProxyBody>,
    ) -> Result<Response<ProxyBody>, ProxyError> {
        if !resp.status().is_success() {
            return Ok(resp);
        }
        if !negotiate::is_plain_json(resp.headers()) {
            self.count(&chain, "response", "undecodable");
            debug!(kind = chain.kind(), "response not JSON; passed unfiltered");
            return Ok(resp);
        }
        if verb == Verb::Watch {
            let (ctx, metrics) = (self.ctx.clone(), self.metrics.clone());
            return Ok(
                resp.map(move |inner| FilteredWatch::new(inner, chain, ctx, metrics).boxed())
            );
        }
        if let Some(markers) = self.streams(&chain, verb, &resp) {
            let (mut parts, inner) = resp.into_parts();
            // A filtered list may differ in length from the one announced.
            parts.headers.remove(header::CONTENT_LENGTH);
            let job = FilterJob {
                chain,
                ctx: self.ctx.borrow().clone(),
                metrics: self.metrics.clone(),
                stream_lists: self.stream_lists.clone(),
            };
            let body = StreamedList::new(inner, markers, job).boxed();
            return Ok(Response::from_parts(parts, body));
        }
        self.apply_whole(chain, verb, resp).await
    }

    /// GET, LIST, PATCH: the whole body, filtered at once.
    async fn apply_whole(
        &self,
        chain: Chain,
        verb: Verb,
        resp: Response<ProxyBody>,
    ) -> Result<Response<ProxyBody>, ProxyError> {
        let (mut parts, body) = resp.into_parts();
        let Some(bytes) = collect_up_to(body, MAX_FILTERED_BODY).await? else {
            self.count(&chain, "response", "too_large");
            return Err(too_large());
        };
        let ctx = self.ctx.borrow().clone();
        let (chain, outcome, bytes) = filter_whole(chain, verb, bytes, ctx).await?;
        self.count_outcome(&chain, verb, &outcome);
        let out = outcome.into_bytes(bytes);
        parts
            .headers
            .insert(header::CONTENT_LENGTH, out.len().into());
        Ok(Response::from_parts(parts, body::full(out)))
    }

    /// A LIST from upstream whose filters name their markers and whose length is not declared
    /// (kube-apiserver declares none for a large list) is streamed ([`StreamedList`]), unless an
    /// earlier one could not be finished. One whose length is known (declared, or an answer a
    /// cache holds whole) is filtered whole and declares its new length.
    fn streams(
        &self,
        chain: &Chain,
        verb: Verb,
        resp: &Response<ProxyBody>,
    ) -> Option<Vec<&'static [u8]>> {
        let headers = resp.headers();
        let whole = headers.contains_key(header::CONTENT_LENGTH)
            || headers.contains_key(SERVED_FROM)
            || resp.body().size_hint().exact().is_some();
        if verb != Verb::List || whole || !self.stream_lists.load(Ordering::Relaxed) {
            return None;
        }
        chain.markers()
    }

    fn count(&self, chain: &Chain, shape: &str, outcome: &str) {
        count(&self.metrics, chain, shape, outcome);
    }

    fn count_outcome(&self, chain: &Chain, verb: Verb, outcome: &Outcome) {
        count_outcome(&self.metrics, chain, verb, outcome);
    }

    /// Applies `yurt-hub-cfg`: filter-named keys add components. Logs a change.
    pub fn set_hub_cfg(&self, data: &BTreeMap<String, String>) {
        let mut set = self.set.write().unwrap_or_else(|p| p.into_inner());
        let before = set.clone();
        set.set_hub_cfg(data);
        if *set != before {
            let components: Vec<String> = set
                .names()
                .map(|n| format!("{n}={}", set.components(n).unwrap_or_default().join("+")))
                .collect();
            info!(?components, "filter components changed");
        }
    }
}

/// `chain` applied to a whole GET, LIST or PATCH body, on a blocking thread when it is large.
async fn filter_whole(
    chain: Chain,
    verb: Verb,
    bytes: Bytes,
    ctx: Arc<FilterContext>,
) -> Result<(Chain, Outcome, Bytes), ProxyError> {
    let filter = move |chain: Chain, bytes: Bytes| {
        let outcome = if verb == Verb::List {
            chain.filter_list(&bytes, &ctx)
        } else {
            chain.filter_object(&bytes, &ctx)
        };
        (chain, outcome, bytes)
    };
    if bytes.len() > BLOCKING_ABOVE {
        tokio::task::spawn_blocking(move || filter(chain, bytes))
            .await
            .map_err(|e| ProxyError::Internal(format!("response filter task: {e}")))
    } else {
        Ok(filter(chain, bytes))
    }
}

fn too_large() -> ProxyError {
    ProxyError::BadReply {
        server: "upstream".into(),
        cause: format!("response body larger than {MAX_FILTERED_BODY} bytes to filter").into(),
    }
}

fn count(metrics: &Metrics, chain: &Chain, shape: &str, outcome: &str) {
    metrics
        .filtered
        .with_label_values(&[chain.kind(), shape, outcome])
        .inc();
}

/// Counts what the chain made of a whole body, and logs a body it could not read.
fn count_outcome(metrics: &Metrics, chain: &Chain, verb: Verb, outcome: &Outcome) {
    let shape = if verb == Verb::List { "list" } else { "object" };
    count(metrics, chain, shape, outcome_label(outcome));
    if let Outcome::Undecodable(e) = outcome {
        warn!(kind = chain.kind(), error = %e, "response body not decodable; passed unfiltered");
    }
}

/// The whole body, or `None` once it grows past `max` bytes.
async fn collect_up_to(mut body: ProxyBody, max: usize) -> Result<Option<Bytes>, ProxyError> {
    let mut buf = BytesMut::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| ProxyError::from_response_body(&e))?;
        if let Ok(data) = frame.into_data() {
            if buf.len() + data.len() > max {
                return Ok(None);
            }
            buf.extend_from_slice(&data);
        }
    }
    Ok(Some(buf.freeze()))
}

fn outcome_label(outcome: &Outcome) -> &'static str {
    match outcome {
        Outcome::Unchanged => "unchanged",
        Outcome::Replaced(_) => "replaced",
        Outcome::Undecodable(_) => "undecodable",
    }
}

/// A watch body filtered event by event: complete lines go through the chain with the side data
/// current at that moment; what arrives after the last newline waits for the rest of its line.
pub struct FilteredWatch {
    inner: Option<ProxyBody>,
    framer: LineFramer,
    chain: Chain,
    ctx: watch::Receiver<Arc<FilterContext>>,
    metrics: Metrics,
}

impl FilteredWatch {
    fn new(
        inner: ProxyBody,
        chain: Chain,
        ctx: watch::Receiver<Arc<FilterContext>>,
        metrics: Metrics,
    ) -> Self {
        FilteredWatch {
            inner: Some(inner),
            framer: LineFramer::new(),
            chain,
            ctx,
            metrics,
        }
    }

    /// Every complete line so far, filtered, as one chunk (`None` when there is none yet).
    fn drain(&mut self, at_end: bool) -> Option<Bytes> {
        let ctx = self.ctx.borrow().clone();
        let mut lines = Vec::new();
        while let Some(line) = self.framer.next_line() {
            lines.push(line);
        }
        if at_end {
            lines.extend(self.framer.finish());
        }
        let mut pieces: Vec<Bytes> = lines
            .into_iter()
            .map(|line| {
                let outcome = self.chain.filter_event(&line, &ctx);
                if !matches!(outcome, Outcome::Unchanged) {
                    self.metrics
                        .filtered
                        .with_label_values(&[self.chain.kind(), "event", outcome_label(&outcome)])
                        .inc();
                }
                outcome.into_bytes(line)
            })
            .collect();
        // One line (the common case) goes out as it is, several as one chunk.
        match pieces.len() {
            0 | 1 => pieces.pop(),
            _ => Some(Bytes::from(pieces.concat())),
        }
    }
}

impl Body for FilteredWatch {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        loop {
            let Some(inner) = this.inner.as_mut() else {
                return Poll::Ready(None);
            };
            match ready!(Pin::new(inner).poll_frame(cx)) {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => {
                        this.framer.push(data);
                        if let Some(out) = this.drain(false) {
                            return Poll::Ready(Some(Ok(Frame::data(out))));
                        }
                    }
                    Err(frame) => return Poll::Ready(Some(Ok(frame))),
                },
                Some(Err(e)) => return Poll::Ready(Some(Err(e))),
                None => {
                    this.inner = None;
                    return Poll::Ready(this.drain(true).map(|out| Ok(Frame::data(out))));
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::StreamBody;
    use outpost_filter::FilterConfig;

    fn filtering(metrics: &Metrics) -> Filtering {
        let ctx = FilterContext::new("edge-1").with_service(
            "shop",
            "web",
            &[("openyurt.io/topologyKeys", "kubernetes.io/hostname")],
        );
        Filtering {
            set: RwLock::new(FilterSet::new(&FilterConfig::default())),
            ctx: watch::Sender::new(Arc::new(ctx)).subscribe(),
            metrics: metrics.clone(),
            stream_lists: Arc::new(AtomicBool::new(true)),
        }
    }

    fn kube_proxy(path: &str) -> RequestInfo {
        RequestInfo::classify(&http::Method::GET, path, Some("kube-proxy/v1.32.4")).unwrap()
    }

    fn response(content_type: &str, body: ProxyBody) -> Response<ProxyBody> {
        let mut resp = Response::new(body);
        resp.headers_mut()
            .insert(header::CONTENT_TYPE, content_type.parse().unwrap());
        resp
    }

    fn slice(nodes: &[&str]) -> String {
        let endpoints: Vec<String> = nodes
            .iter()
            .map(|n| format!(r#"{{"addresses":["10.0.0.1"],"nodeName":"{n}"}}"#))
            .collect();
        format!(
            r#"{{"metadata":{{"name":"web-1","namespace":"shop","labels":{{"kubernetes.io/service-name":"web"}}}},"endpoints":[{}]}}"#,
            endpoints.join(",")
        )
    }

    async fn text(resp: Response<ProxyBody>) -> String {
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        String::from_utf8(bytes.to_vec()).unwrap()
    }

    #[tokio::test]
    async fn a_body_that_is_not_json_passes_unchanged_and_is_counted() {
        let metrics = Metrics::new();
        let f = filtering(&metrics);
        let info = kube_proxy("/apis/discovery.k8s.io/v1/endpointslices");
        let chain = f.chain(&info).expect("kube-proxy's slices are filtered");
        let proto = b"k8s\0\x0a\x0fnot-json-at-all".to_vec();
        let resp = response(
            "application/vnd.kubernetes.protobuf",
            body::full(proto.clone()),
        );
        let out = f.apply(chain, Verb::List, resp).await.unwrap();
        let bytes = out.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(bytes, proto);
        let count = metrics
            .filtered
            .with_label_values(&["EndpointSlice", "response", "undecodable"])
            .get();
        assert_eq!(count, 1);
    }

    #[tokio::test]
    async fn a_list_is_filtered_whole_and_declares_its_new_length() {
        let metrics = Metrics::new();
        let f = filtering(&metrics);
        let info = kube_proxy("/apis/discovery.k8s.io/v1/endpointslices");
        let list = format!(
            r#"{{"kind":"EndpointSliceList","apiVersion":"discovery.k8s.io/v1","metadata":{{"resourceVersion":"5"}},"items":[{}]}}"#,
            slice(&["edge-1", "edge-2"])
        );
        let mut resp = response("application/json", body::full(list.clone()));
        resp.headers_mut()
            .insert(header::CONTENT_LENGTH, list.len().into());
        let out = f
            .apply(f.chain(&info).unwrap(), Verb::List, resp)
            .await
            .unwrap();
        let declared = out.headers()[header::CONTENT_LENGTH].clone();
        let got = text(out).await;
        assert!(got.contains("edge-1") && !got.contains("edge-2"), "{got}");
        assert!(got.len() < list.len());
        assert_eq!(declared, got.len().to_string().as_str());
    }

    #[tokio::test]
    async fn a_watch_is_filtered_line_by_line_across_chunk_boundaries() {
        let metrics = Metrics::new();
        let f = filtering(&metrics);
        let info = kube_proxy("/apis/discovery.k8s.io/v1/endpointslices?watch=true");
        let stream = format!(
            "{{\"type\":\"ADDED\",\"object\":{}}}\n{{\"type\":\"BOOKMARK\",\"object\":{{\"kind\":\"EndpointSlice\",\"metadata\":{{\"resourceVersion\":\"9\"}}}}}}\n{{\"type\":\"MODIFIED\",\"object\":{}}}",
            slice(&["edge-2", "edge-1"]),
            slice(&["edge-1"])
        );
        // Cut into 7-byte chunks, the last line without its newline.
        let chunks: Vec<Result<Frame<Bytes>, BoxError>> = stream
            .as_bytes()
            .chunks(7)
            .map(|c| Ok(Frame::data(Bytes::copy_from_slice(c))))
            .collect();
        let inner = StreamBody::new(futures_util::stream::iter(chunks)).boxed();
        let out = f
            .apply(
                f.chain(&info).unwrap(),
                Verb::Watch,
                response("application/json", inner),
            )
            .await
            .unwrap();
        let got = text(out).await;
        let lines: Vec<&str> = got.split_inclusive('\n').collect();
        assert_eq!(lines.len(), 3, "{got}");
        assert!(!lines[0].contains("edge-2") && lines[0].ends_with('\n'));
        assert!(lines[1].contains("BOOKMARK"));
        assert_eq!(
            lines[2],
            format!(
                "{{\"type\":\"MODIFIED\",\"object\":{}}}",
                slice(&["edge-1"])
            )
        );
    }
}
