//! How a hub stops, and lives, with a slow or stuck cache store.
//!
//! - A hub told to stop first applies the cache writes it owes: what it passed on to a client
//!   just before the stop must be in the cache when the node comes back without the cloud. The
//!   store here is slow on purpose, so the writer is still busy when `Hub::shutdown` is called.
//! - A store that stops answering (a deadlocked sled, a dead disk) fails liveness, delays a
//!   watch's ADDED or DELETED by a bounded time only (and marks its scope), and never keeps the
//!   hub from stopping.

use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use outpost_agent::{EdgeConfig, Hub};
use outpost_cache::{
    CacheError, CachedObject, CompactReport, Event, EventType, Gvr, Health, ListResult, Lookup,
    MemStore, ObjectKey, ReplaceOutcome, ReplayError, ResourceStats, ResourceVersion, Scope,
    ScopeId, Store, VerifyReport, WriteOutcome,
};
use outpost_certs::UpstreamTls;
use outpost_proxy::edge::CacheAgents;
use outpost_testkit::{FakeApiServer, FakeConfig};

mod common;

/// How long the slow store takes over a LIST's write.
const WRITE_DELAY: Duration = Duration::from_millis(500);

/// The longest a stuck call waits for the test to let it go, so no thread outlives a failed
/// test for long.
const STUCK_AT_MOST: Duration = Duration::from_secs(90);

/// A [`MemStore`] whose scope replacements (a LIST's write) may be slow, and whose every
/// database call can be made to stop answering, as a deadlocked sled does. The missed-events
/// marks, kept apart from the database, still answer.
#[derive(Default)]
struct TestStore {
    inner: MemStore,
    slow_lists: bool,
    stuck: Mutex<Option<Instant>>,
    unstuck: Condvar,
}

impl TestStore {
    fn slow() -> TestStore {
        TestStore {
            slow_lists: true,
            ..TestStore::default()
        }
    }

    fn stick(&self) {
        *self.stuck.lock().unwrap() = Some(Instant::now());
    }

    fn release(&self) {
        *self.stuck.lock().unwrap() = None;
        self.unstuck.notify_all();
    }

    /// Blocks while stuck (at most [`STUCK_AT_MOST`]).
    fn pass(&self) {
        let stuck = self.stuck.lock().unwrap();
        let _ = self
            .unstuck
            .wait_timeout_while(stuck, STUCK_AT_MOST, |s| s.is_some())
            .unwrap();
    }
}

impl Store for TestStore {
    fn put_object(&self, c: &str, gvr: &Gvr, o: &[u8]) -> Result<WriteOutcome, CacheError> {
        self.pass();
        self.inner.put_object(c, gvr, o)
    }
    fn delete_object(&self, key: &ObjectKey) -> Result<bool, CacheError> {
        self.pass();
        self.inner.delete_object(key)
    }
    fn replace_scope(
        &self,
        scope: &Scope,
        rv: &str,
        items: &[&[u8]],
    ) -> Result<ReplaceOutcome, CacheError> {
        self.pass();
        if self.slow_lists {
            std::thread::sleep(WRITE_DELAY);
        }
        self.inner.replace_scope(scope, rv, items)
    }
    fn renew_scope(
        &self,
        scope: &Scope,
        rv: &str,
        seq: u64,
    ) -> Result<Option<ReplaceOutcome>, CacheError> {
        self.pass();
        if self.slow_lists {
            std::thread::sleep(WRITE_DELAY);
        }
        self.inner.renew_scope(scope, rv, seq)
    }
    fn apply_events(
        &self,
        scope: &Scope,
        events: &[(EventType, &[u8])],
    ) -> Result<Vec<Result<WriteOutcome, CacheError>>, CacheError> {
        self.pass();
        self.inner.apply_events(scope, events)
    }
    fn get(&self, key: &ObjectKey) -> Result<Lookup, CacheError> {
        self.pass();
        self.inner.get(key)
    }
    fn holds_pinned(&self, key: &ObjectKey, o: &[u8]) -> Result<bool, CacheError> {
        self.pass();
        self.inner.holds_pinned(key, o)
    }
    fn objects(&self, c: &str, gvr: &Gvr) -> Result<Vec<(ObjectKey, CachedObject)>, CacheError> {
        self.pass();
        self.inner.objects(c, gvr)
    }
    fn list(&self, query: &Scope) -> Result<Option<ListResult>, CacheError> {
        self.pass();
        self.inner.list(query)
    }
    fn scope_resource_version(&self, scope: &Scope) -> Result<Option<ResourceVersion>, CacheError> {
        self.pass();
        self.inner.scope_resource_version(scope)
    }
    fn events_since(&self, query: &Scope, rv: &str) -> Result<Vec<Event>, ReplayError> {
        self.pass();
        self.inner.events_since(query, rv)
    }
    fn put_document(&self, name: &str, bytes: &[u8]) -> Result<(), CacheError> {
        self.pass();
        self.inner.put_document(name, bytes)
    }
    fn get_document(&self, name: &str) -> Result<Option<Bytes>, CacheError> {
        self.pass();
        self.inner.get_document(name)
    }
    fn delete_document(&self, name: &str) -> Result<(), CacheError> {
        self.pass();
        self.inner.delete_document(name)
    }
    fn documents(&self, prefix: &str) -> Result<Vec<(String, Bytes)>, CacheError> {
        self.pass();
        self.inner.documents(prefix)
    }
    fn verify(&self) -> Result<VerifyReport, CacheError> {
        self.pass();
        self.inner.verify()
    }
    fn stats(&self) -> Result<Vec<ResourceStats>, CacheError> {
        self.pass();
        self.inner.stats()
    }
    fn mark_missed(&self, scope: &ScopeId, reason: &str) -> Result<bool, CacheError> {
        self.inner.mark_missed(scope, reason)
    }
    fn clear_missed(&self, scope: &ScopeId) -> Result<bool, CacheError> {
        self.inner.clear_missed(scope)
    }
    /// As the store reports a call that stopped: how long it has been stuck.
    fn health(&self) -> Health {
        let mut health = self.inner.health();
        health.busy_for = self.stuck.lock().unwrap().map(|since| since.elapsed());
        health
    }
    fn write_seq(&self) -> u64 {
        self.inner.write_seq()
    }
    fn flush(&self) -> Result<(), CacheError> {
        self.pass();
        self.inner.flush()
    }
    fn size_on_disk(&self) -> Result<u64, CacheError> {
        self.inner.size_on_disk()
    }
    fn compact(&self) -> Result<CompactReport, CacheError> {
        self.pass();
        self.inner.compact()
    }
}

fn edge_config(store: Arc<TestStore>, hung_after: Duration) -> EdgeConfig {
    EdgeConfig {
        store,
        agents: CacheAgents::default(),
        volatile: None,
        min_request_timeout: outpost_proxy::edge::watch::DEFAULT_MIN_REQUEST_TIMEOUT,
        max_object_bytes: outpost_proxy::edge::writer::DEFAULT_MAX_OBJECT_BYTES,
        hung_after,
    }
}

const KUBELET: &str = "kubelet/v1.32.4 (linux/amd64) kubernetes/test";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_hub_applies_the_cache_writes_it_owes() {
    let fake = FakeApiServer::start(FakeConfig::default()).await.unwrap();
    let certs = tempfile::tempdir().unwrap();
    let files = fake.pki().write_node_files(certs.path(), "edge-1").unwrap();
    let store = Arc::new(TestStore::slow());
    let tls = UpstreamTls::load(&files.client_pem, &files.ca_crt).unwrap();
    let edge = edge_config(store.clone(), outpost_agent::admin::CACHE_HUNG_AFTER);
    let hub = Hub::start(common::hub_config(&fake.url(), tls, Some(edge)))
        .await
        .unwrap();

    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let request = http::Request::get(format!("http://{}/api/v1/services", hub.proxy_addr()))
        .header("user-agent", KUBELET)
        .body(Empty::new())
        .unwrap();
    let resp = client.request(request).await.unwrap();
    assert_eq!(resp.status(), 200);
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    let list: serde_json::Value = serde_json::from_slice(&body).unwrap();
    let listed = list["items"].as_array().unwrap().len();
    assert!(listed > 0, "the fake seeds Services");
    drop(client);

    hub.shutdown().await;
    let cached = store
        .inner
        .objects("kubelet", &Gvr::new("", "v1", "services"))
        .unwrap();
    assert_eq!(
        cached.len(),
        listed,
        "the LIST the client received is in the cache once the hub has stopped"
    );
    fake.shutdown().await;
}

/// The store stops answering while kubelet watches its pods: an ADDED event reaches kubelet
/// once `DURABLE_WITHIN` has passed (and its scope is marked as having missed events), healthz
/// fails so the pod would be restarted, and the hub still stops within its grace period.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stuck_store_fails_liveness_and_holds_up_neither_a_watch_nor_the_stop() {
    let fake = FakeApiServer::start(FakeConfig::default()).await.unwrap();
    let certs = tempfile::tempdir().unwrap();
    let files = fake.pki().write_node_files(certs.path(), "edge-1").unwrap();
    let store = Arc::new(TestStore::default());
    let tls = UpstreamTls::load(&files.client_pem, &files.ca_crt).unwrap();
    let edge = edge_config(store.clone(), Duration::from_secs(1));
    let hub = Hub::start(common::hub_config(&fake.url(), tls, Some(edge)))
        .await
        .unwrap();
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let get = |path: String| {
        http::Request::get(path)
            .header("user-agent", KUBELET)
            .body(Empty::new())
            .unwrap()
    };
    let pods = format!(
        "http://{}/api/v1/pods?fieldSelector=spec.nodeName%3Dedge-1",
        hub.proxy_addr()
    );
    let listed = client.request(get(pods.clone())).await.unwrap();
    assert_eq!(listed.status(), 200);
    let listed = listed.into_body().collect().await.unwrap().to_bytes();
    let rv = serde_json::from_slice::<serde_json::Value>(&listed).unwrap()["metadata"]
        ["resourceVersion"]
        .as_str()
        .unwrap()
        .to_owned();
    let scope = Scope::new(
        "kubelet",
        &Gvr::new("", "v1", "pods"),
        None,
        Default::default(),
        outpost_core::selector::FieldSelector::parse("spec.nodeName=edge-1").unwrap(),
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while store.inner.list(&scope).unwrap().is_none() {
        assert!(Instant::now() < deadline, "the list was never cached");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let watch = client
        .request(get(format!("{pods}&watch=true&resourceVersion={rv}")))
        .await
        .unwrap();
    assert_eq!(watch.status(), 200);
    let mut body = watch.into_body();

    store.stick();
    let mut pod = fake.list("v1/pods", None).remove(0);
    pod["metadata"] = serde_json::json!({"name": "late", "namespace": "default"});
    pod["spec"]["nodeName"] = "edge-1".into();
    fake.create("v1/pods", pod).unwrap();
    let started = Instant::now();
    let mut seen = Vec::new();
    while !String::from_utf8_lossy(&seen).contains(r#""name":"late""#) {
        let frame = tokio::time::timeout(Duration::from_secs(15), body.frame())
            .await
            .expect("the event comes, stuck store or not")
            .expect("the watch is open")
            .unwrap();
        seen.extend_from_slice(frame.data_ref().map_or(&b""[..], |d| &d[..]));
    }
    let waited = started.elapsed();
    let bound = outpost_proxy::edge::tee::DURABLE_WITHIN;
    assert!(
        waited >= bound - Duration::from_millis(200) && waited < bound + Duration::from_secs(3),
        "held for {waited:?}, the bound is {bound:?}"
    );
    let missed = store.inner.list(&scope).unwrap().unwrap().missed;
    assert!(missed.is_some(), "the scope is marked as having missed it");

    let healthz = format!("http://{}/v1/healthz", hub.admin_addr());
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let resp = client.request(get(healthz.clone())).await.unwrap();
        if resp.status() == 500 {
            let text = resp.into_body().collect().await.unwrap().to_bytes();
            assert!(
                String::from_utf8_lossy(&text).contains("no progress"),
                "{text:?}"
            );
            break;
        }
        assert!(Instant::now() < deadline, "healthz never failed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    drop(body);
    drop(client);
    let stopping = Instant::now();
    let stopped = tokio::time::timeout(Duration::from_secs(25), hub.shutdown()).await;
    let took = stopping.elapsed();
    store.release();
    assert!(stopped.is_ok(), "the hub never stopped on a stuck store");
    assert!(took < Duration::from_secs(15), "stopped in {took:?}");
    fake.shutdown().await;
}
