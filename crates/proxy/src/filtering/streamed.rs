//! [`StreamedList`]: a LIST body that streams through a filter chain whose filters each name a
//! marker ([`Chain::markers`]), instead of being held whole until it has been read.
//!
//! The list goes out as it comes, [`HOLD`] bytes behind the newest, and while no marker occurs
//! it is sent as received. At the first marker the rest is collected, the whole list is filtered
//! exactly as a buffered one ([`filter_whole`]), and what follows the bytes already sent goes out
//! once the filtered list is checked to begin with exactly those bytes. A filter keeps every
//! object it does not change byte for byte and a marker lies inside the object that may change,
//! so the check holds whenever that object began within `HOLD` bytes of its marker. When it does
//! not (a huge object, its marker further in), the response ends with an error rather than with
//! bytes the filters would have changed, and every later LIST is filtered whole: the client's
//! retry succeeds.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, ready};

use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};
use memchr::memmem;
use outpost_core::Verb;
use outpost_filter::{Chain, FilterContext, Outcome};
use tracing::warn;

use super::{MAX_FILTERED_BODY, count, count_outcome, filter_whole, too_large};
use crate::body::{BoxError, ProxyBody};
use crate::error::ProxyError;
use crate::metrics::Metrics;

/// How far behind the newest byte a streamed list is sent: the room an object's marker has,
/// from the object's start, for the object to be filtered rather than the response ended.
pub(crate) const HOLD: usize = 64 << 10;

/// What a streamed list needs to be filtered whole after all.
pub(crate) struct FilterJob {
    pub chain: Chain,
    pub ctx: Arc<FilterContext>,
    pub metrics: Metrics,
    /// The hub's switch: cleared when a list could not be finished, so later ones are whole.
    pub stream_lists: Arc<AtomicBool>,
}

type Filtered =
    Pin<Box<dyn Future<Output = Result<(Chain, Outcome, Bytes), ProxyError>> + Send + Sync>>;

enum State {
    /// No marker so far: sending all but the last [`HOLD`] bytes.
    Streaming,
    /// The list ended without a marker: sending what is held.
    Flushing,
    /// A marker occurred: reading the rest of the list.
    Collecting,
    /// The whole list is being filtered.
    Filtering(Filtered),
    /// The filtered list after the bytes already sent.
    Finishing(Bytes),
    Done,
}

/// A LIST body filtered on the way, see the module documentation.
pub(crate) struct StreamedList {
    inner: ProxyBody,
    job: Option<FilterJob>,
    markers: Vec<memmem::Finder<'static>>,
    /// The last bytes received, one short of the longest marker: a marker split across chunks.
    carry: Vec<u8>,
    carry_len: usize,
    /// Every chunk received, in order (kept for filtering the whole list).
    received: Vec<Bytes>,
    received_len: usize,
    /// How many of the received bytes were sent, and where the next one is: chunk, offset.
    sent: usize,
    next: (usize, usize),
    state: State,
}

impl StreamedList {
    pub(crate) fn new(inner: ProxyBody, markers: Vec<&'static [u8]>, job: FilterJob) -> Self {
        let carry_len = markers.iter().map(|m| m.len()).max().unwrap_or(1) - 1;
        StreamedList {
            inner,
            job: Some(job),
            markers: markers.into_iter().map(memmem::Finder::new).collect(),
            carry: Vec::new(),
            carry_len,
            received: Vec::new(),
            received_len: 0,
            sent: 0,
            next: (0, 0),
            state: State::Streaming,
        }
    }

    /// Keeps `chunk`; whether a marker ends in it.
    fn receive(&mut self, chunk: Bytes) -> bool {
        let found = self.marker_ends_in(&chunk);
        self.keep(chunk);
        found
    }

    fn keep(&mut self, chunk: Bytes) {
        self.received_len += chunk.len();
        self.received.push(chunk);
    }

    fn marker_ends_in(&mut self, chunk: &[u8]) -> bool {
        let keep = self.carry_len;
        let mut joint = std::mem::take(&mut self.carry);
        joint.extend_from_slice(&chunk[..chunk.len().min(keep)]);
        let found = self
            .markers
            .iter()
            .any(|m| m.find(&joint).is_some() || m.find(chunk).is_some());
        let tail = if chunk.len() >= keep {
            &chunk[chunk.len() - keep..]
        } else {
            &joint[joint.len().saturating_sub(keep)..]
        };
        self.carry = tail.to_vec();
        found
    }

    /// The next unsent received bytes, up to the `limit`-th.
    fn take_up_to(&mut self, limit: usize) -> Option<Bytes> {
        if self.sent >= limit {
            return None;
        }
        let (index, offset) = self.next;
        let chunk = &self.received[index];
        let n = (chunk.len() - offset).min(limit - self.sent);
        let out = chunk.slice(offset..offset + n);
        self.sent += n;
        self.next = if offset + n == chunk.len() {
            (index + 1, 0)
        } else {
            (index, offset + n)
        };
        Some(out)
    }

    /// Every received byte as one list, for the chain.
    fn whole(&self) -> Bytes {
        let mut whole = BytesMut::with_capacity(self.received_len);
        for chunk in &self.received {
            whole.extend_from_slice(chunk);
        }
        whole.freeze()
    }

    /// The filtered list's bytes after those already sent, or an error when it does not begin
    /// with them.
    fn rest_of(
        &mut self,
        outcome: Outcome,
        chain: &Chain,
        whole: Bytes,
    ) -> Result<Bytes, BoxError> {
        let job = self.job.as_ref().expect("filtered once");
        count_outcome(&job.metrics, chain, Verb::List, &outcome);
        let out = outcome.into_bytes(whole.clone());
        if out.len() >= self.sent && out[..self.sent] == whole[..self.sent] {
            return Ok(out.slice(self.sent..));
        }
        job.stream_lists.store(false, Ordering::Relaxed);
        count(&job.metrics, chain, "list", "stream_ended");
        warn!(
            kind = chain.kind(),
            sent = self.sent,
            "a filtered object began before the bytes already sent; response ended, later lists are filtered whole"
        );
        Err("list filtered after part of it was sent; retry".into())
    }

    fn start_filtering(&mut self) -> State {
        let job = self.job.as_ref().expect("filtered once");
        let whole = self.whole();
        State::Filtering(Box::pin(filter_whole(
            job.chain.clone(),
            Verb::List,
            whole,
            job.ctx.clone(),
        )))
    }
}

impl Body for StreamedList {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        loop {
            match &mut this.state {
                State::Streaming => {
                    let limit = this.received_len.saturating_sub(HOLD);
                    if let Some(out) = this.take_up_to(limit) {
                        return Poll::Ready(Some(Ok(Frame::data(out))));
                    }
                    match ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
                        Some(Ok(frame)) => {
                            let Ok(data) = frame.into_data() else {
                                continue;
                            };
                            if this.receive(data) {
                                this.state = State::Collecting;
                            }
                        }
                        Some(Err(e)) => return Poll::Ready(Some(Err(e))),
                        None => this.state = State::Flushing,
                    }
                }
                State::Flushing => {
                    if let Some(out) = this.take_up_to(this.received_len) {
                        return Poll::Ready(Some(Ok(Frame::data(out))));
                    }
                    let job = this.job.as_ref().expect("counted once");
                    count(&job.metrics, &job.chain, "list", "unchanged");
                    this.state = State::Done;
                }
                State::Collecting => match ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
                    Some(Ok(frame)) => {
                        if let Ok(data) = frame.into_data() {
                            this.keep(data);
                        }
                        if this.received_len > MAX_FILTERED_BODY {
                            let job = this.job.as_ref().expect("counted once");
                            count(&job.metrics, &job.chain, "response", "too_large");
                            this.state = State::Done;
                            return Poll::Ready(Some(Err(too_large().into())));
                        }
                    }
                    Some(Err(e)) => return Poll::Ready(Some(Err(e))),
                    None => this.state = this.start_filtering(),
                },
                State::Filtering(filtered) => {
                    let result = ready!(filtered.as_mut().poll(cx));
                    this.state = State::Done;
                    let (chain, outcome, whole) = result.map_err(BoxError::from)?;
                    let rest = this.rest_of(outcome, &chain, whole)?;
                    this.state = State::Finishing(rest);
                }
                State::Finishing(rest) => {
                    let rest = std::mem::take(rest);
                    this.state = State::Done;
                    if !rest.is_empty() {
                        return Poll::Ready(Some(Ok(Frame::data(rest))));
                    }
                }
                State::Done => return Poll::Ready(None),
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self.state, State::Done)
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::RwLock;
    use std::time::Duration;

    use http::{Response, header};
    use http_body_util::{BodyExt, StreamBody};
    use outpost_core::RequestInfo;
    use outpost_filter::{FilterConfig, FilterSet};
    use tokio::sync::{mpsc, watch};

    use super::super::Filtering;
    use super::*;

    const KUBELET_PODS: &str = "/api/v1/pods?fieldSelector=spec.nodeName%3Dedge-1";
    /// What the filter writes in place of the apiserver's address.
    const HUB_HOST: &str = "169.254.2.1";

    fn filtering(metrics: &Metrics) -> Filtering {
        Filtering {
            set: RwLock::new(FilterSet::new(&FilterConfig::default())),
            ctx: watch::Sender::new(Arc::new(FilterContext::new("edge-1"))).subscribe(),
            metrics: metrics.clone(),
            stream_lists: Arc::new(AtomicBool::new(true)),
        }
    }

    /// A pod of about `size` bytes; with `env`, its container sets the apiserver's address,
    /// after `size` bytes of annotation. The annotation starts with an `&` escaped as Go's
    /// encoder writes it, which a rewritten pod writes plainly: a rewrite changes its first bytes.
    fn pod(i: usize, size: usize, env: bool) -> String {
        let env = if env {
            r#","env":[{"name":"KUBERNETES_SERVICE_HOST","value":"10.96.0.1"}]"#
        } else {
            ""
        };
        format!(
            r#"{{"metadata":{{"name":"p-{i}","namespace":"default","annotations":{{"pad":"\u0026{}"}}}},"spec":{{"nodeName":"edge-1","containers":[{{"name":"c","image":"busybox"{env}}}]}},"status":{{"phase":"Running"}}}}"#,
            "x".repeat(size)
        )
    }

    fn list(pods: &[String]) -> String {
        format!(
            r#"{{"kind":"PodList","apiVersion":"v1","metadata":{{"resourceVersion":"7"}},"items":[{}]}}"#,
            pods.join(",")
        )
    }

    type Feed = mpsc::Sender<Result<Frame<Bytes>, BoxError>>;

    fn kubelet_pods() -> RequestInfo {
        RequestInfo::classify(&http::Method::GET, KUBELET_PODS, Some("kubelet/v1.32.4")).unwrap()
    }

    /// A JSON response whose body, of undeclared length, is fed by the returned sender.
    fn fed_response() -> (Feed, Response<ProxyBody>) {
        let (tx, mut rx) = mpsc::channel(1 << 16);
        let frames = futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx));
        let mut resp = Response::new(StreamBody::new(frames).boxed());
        resp.headers_mut()
            .insert(header::CONTENT_TYPE, "application/json".parse().unwrap());
        (tx, resp)
    }

    /// kubelet's pod LIST through the filters, its body fed by the returned sender.
    async fn streamed(f: &Filtering) -> (Feed, Response<ProxyBody>) {
        let chain = f
            .chain(&kubelet_pods())
            .expect("kubelet's pods are filtered in edge mode");
        let (tx, resp) = fed_response();
        let applied = f.apply(chain, Verb::List, resp);
        let resp = tokio::time::timeout(Duration::from_secs(5), applied)
            .await
            .expect("the response is not held until the list's end")
            .unwrap();
        (tx, resp)
    }

    async fn feed(tx: &mpsc::Sender<Result<Frame<Bytes>, BoxError>>, bytes: &str, chunk: usize) {
        for piece in bytes.as_bytes().chunks(chunk) {
            tx.send(Ok(Frame::data(Bytes::copy_from_slice(piece))))
                .await
                .unwrap();
        }
    }

    /// The list as the chain makes it from the whole body: what a buffered LIST answers.
    fn filtered_whole(f: &Filtering, list: &str) -> String {
        let ctx = f.ctx.borrow().clone();
        let out = f
            .chain(&kubelet_pods())
            .unwrap()
            .filter_list(list.as_bytes(), &ctx)
            .into_bytes(Bytes::copy_from_slice(list.as_bytes()));
        String::from_utf8(out.to_vec()).unwrap()
    }

    #[tokio::test]
    async fn a_pod_list_goes_out_before_its_end_arrives() {
        let f = filtering(&Metrics::new());
        let (tx, resp) = streamed(&f).await;
        let pods: Vec<String> = (0..40).map(|i| pod(i, 8 << 10, false)).collect();
        let list = list(&pods);
        let (head, _rest) = list.split_at(list.len() / 2);
        feed(&tx, head, 16 << 10).await;
        let mut body = resp.into_body();
        let first = tokio::time::timeout(Duration::from_secs(5), body.frame())
            .await
            .expect("the first half goes out while the second is still awaited")
            .unwrap()
            .unwrap();
        let first = first.into_data().unwrap();
        assert!(list.as_bytes().starts_with(&first));
    }

    #[tokio::test]
    async fn a_pod_that_sets_the_apiserver_address_is_rewritten_as_in_a_whole_list() {
        let metrics = Metrics::new();
        let f = filtering(&metrics);
        let (tx, resp) = streamed(&f).await;
        let mut pods: Vec<String> = (0..40).map(|i| pod(i, 8 << 10, false)).collect();
        pods[30] = pod(30, 8 << 10, true);
        let list = list(&pods);
        let reader = tokio::spawn(async move { resp.into_body().collect().await });
        feed(&tx, &list, 4 << 10).await;
        drop(tx);
        let got = reader.await.unwrap().unwrap().to_bytes();
        let got = String::from_utf8(got.to_vec()).unwrap();
        assert!(got.contains(HUB_HOST), "the pod's env is rewritten");
        assert_eq!(got, filtered_whole(&f, &list));
        let replaced = metrics
            .filtered
            .with_label_values(&["Pod", "list", "replaced"])
            .get();
        assert_eq!(replaced, 1);
    }

    #[tokio::test]
    async fn a_marker_cut_across_chunks_is_found() {
        let f = filtering(&Metrics::new());
        let (tx, resp) = streamed(&f).await;
        let list = list(&[pod(0, 100, false), pod(1, 100, true)]);
        let reader = tokio::spawn(async move { resp.into_body().collect().await });
        feed(&tx, &list, 7).await;
        drop(tx);
        let got = reader.await.unwrap().unwrap().to_bytes();
        assert_eq!(
            String::from_utf8(got.to_vec()).unwrap(),
            filtered_whole(&f, &list)
        );
        assert!(std::str::from_utf8(&got).unwrap().contains(HUB_HOST));
    }

    #[tokio::test]
    async fn a_marker_far_into_a_huge_pod_ends_the_response_and_later_lists_are_whole() {
        let metrics = Metrics::new();
        let f = filtering(&metrics);
        let mut pods: Vec<String> = (0..4).map(|i| pod(i, 8 << 10, false)).collect();
        pods.push(pod(4, 2 * HOLD, true));
        let list = list(&pods);

        let (tx, resp) = streamed(&f).await;
        let reader = tokio::spawn(async move { resp.into_body().collect().await });
        feed(&tx, &list, 4 << 10).await;
        drop(tx);
        assert!(reader.await.unwrap().is_err(), "never the pod as received");
        let ended = metrics
            .filtered
            .with_label_values(&["Pod", "list", "stream_ended"])
            .get();
        assert_eq!(ended, 1);

        // The retry is filtered whole: read to its end, then answered with its length.
        let (tx, resp) = fed_response();
        feed(&tx, &list, 4 << 10).await;
        drop(tx);
        let out = f
            .apply(f.chain(&kubelet_pods()).unwrap(), Verb::List, resp)
            .await
            .unwrap();
        assert!(out.headers().contains_key(header::CONTENT_LENGTH));
        let got = out.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(
            String::from_utf8(got.to_vec()).unwrap(),
            filtered_whole(&f, &list)
        );
        assert!(std::str::from_utf8(&got).unwrap().contains(HUB_HOST));
    }
}
