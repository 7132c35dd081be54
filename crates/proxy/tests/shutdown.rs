//! A hub told to stop first applies the cache writes it owes: what it passed on to a client just
//! before the stop must be in the cache when the node comes back without the cloud. The store
//! here is slow on purpose, so the writer is still busy when `Hub::shutdown` is called.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use outpost_cache::{
    CacheError, CachedObject, CompactReport, Event, EventType, Gvr, Health, ListResult, Lookup,
    MemStore, ObjectKey, ReplaceOutcome, ReplayError, ResourceStats, ResourceVersion, Scope,
    ScopeId, Store, VerifyReport, WriteOutcome,
};
use outpost_certs::UpstreamTls;
use outpost_proxy::edge::CacheAgents;
use outpost_proxy::{EdgeConfig, Hub};
use outpost_testkit::{FakeApiServer, FakeConfig};

mod common;

/// How long the slow store takes over a LIST's write.
const WRITE_DELAY: Duration = Duration::from_millis(500);

/// A [`MemStore`] whose scope replacements (a LIST's write) take [`WRITE_DELAY`].
struct SlowStore(MemStore);

impl Store for SlowStore {
    fn put_object(&self, c: &str, gvr: &Gvr, o: &[u8]) -> Result<WriteOutcome, CacheError> {
        self.0.put_object(c, gvr, o)
    }
    fn delete_object(&self, key: &ObjectKey) -> Result<bool, CacheError> {
        self.0.delete_object(key)
    }
    fn replace_scope(
        &self,
        scope: &Scope,
        rv: &str,
        items: &[&[u8]],
    ) -> Result<ReplaceOutcome, CacheError> {
        std::thread::sleep(WRITE_DELAY);
        self.0.replace_scope(scope, rv, items)
    }
    fn apply_events(
        &self,
        scope: &Scope,
        events: &[(EventType, &[u8])],
    ) -> Result<Vec<Result<WriteOutcome, CacheError>>, CacheError> {
        self.0.apply_events(scope, events)
    }
    fn get(&self, key: &ObjectKey) -> Result<Lookup, CacheError> {
        self.0.get(key)
    }
    fn objects(&self, c: &str, gvr: &Gvr) -> Result<Vec<(ObjectKey, CachedObject)>, CacheError> {
        self.0.objects(c, gvr)
    }
    fn list(&self, query: &Scope) -> Result<Option<ListResult>, CacheError> {
        self.0.list(query)
    }
    fn scope_resource_version(&self, scope: &Scope) -> Result<Option<ResourceVersion>, CacheError> {
        self.0.scope_resource_version(scope)
    }
    fn events_since(&self, query: &Scope, rv: &str) -> Result<Vec<Event>, ReplayError> {
        self.0.events_since(query, rv)
    }
    fn put_document(&self, name: &str, bytes: &[u8]) -> Result<(), CacheError> {
        self.0.put_document(name, bytes)
    }
    fn get_document(&self, name: &str) -> Result<Option<Bytes>, CacheError> {
        self.0.get_document(name)
    }
    fn delete_document(&self, name: &str) -> Result<(), CacheError> {
        self.0.delete_document(name)
    }
    fn documents(&self, prefix: &str) -> Result<Vec<(String, Bytes)>, CacheError> {
        self.0.documents(prefix)
    }
    fn verify(&self) -> Result<VerifyReport, CacheError> {
        self.0.verify()
    }
    fn stats(&self) -> Result<Vec<ResourceStats>, CacheError> {
        self.0.stats()
    }
    fn mark_missed(&self, scope: &ScopeId, reason: &str) -> Result<bool, CacheError> {
        self.0.mark_missed(scope, reason)
    }
    fn clear_missed(&self, scope: &ScopeId) -> Result<bool, CacheError> {
        self.0.clear_missed(scope)
    }
    fn health(&self) -> Health {
        self.0.health()
    }
    fn write_seq(&self) -> u64 {
        self.0.write_seq()
    }
    fn flush(&self) -> Result<(), CacheError> {
        self.0.flush()
    }
    fn size_on_disk(&self) -> Result<u64, CacheError> {
        self.0.size_on_disk()
    }
    fn compact(&self) -> Result<CompactReport, CacheError> {
        self.0.compact()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_hub_applies_the_cache_writes_it_owes() {
    let fake = FakeApiServer::start(FakeConfig::default()).await.unwrap();
    let certs = tempfile::tempdir().unwrap();
    let files = fake.pki().write_node_files(certs.path(), "edge-1").unwrap();
    let store = Arc::new(SlowStore(MemStore::new()));
    let tls = UpstreamTls::load(&files.client_pem, &files.ca_crt).unwrap();
    let edge = EdgeConfig {
        store: store.clone(),
        agents: CacheAgents::default(),
        volatile: None,
        min_request_timeout: outpost_proxy::edge::watch::DEFAULT_MIN_REQUEST_TIMEOUT,
        max_object_bytes: outpost_proxy::edge::writer::DEFAULT_MAX_OBJECT_BYTES,
        hung_after: outpost_proxy::admin::CACHE_HUNG_AFTER,
    };
    let hub = Hub::start(common::hub_config(&fake.url(), tls, Some(edge)))
        .await
        .unwrap();

    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let request = http::Request::get(format!("http://{}/api/v1/services", hub.proxy_addr()))
        .header(
            "user-agent",
            "kubelet/v1.32.4 (linux/amd64) kubernetes/test",
        )
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
        .0
        .objects("kubelet", &Gvr::new("", "v1", "services"))
        .unwrap();
    assert_eq!(
        cached.len(),
        listed,
        "the LIST the client received is in the cache once the hub has stopped"
    );
    fake.shutdown().await;
}
