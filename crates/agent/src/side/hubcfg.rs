//! The `yurt-hub-cfg` ConfigMap (in `--namespace`), watched live.
//!
//! Its keys configure the hub while it runs: `cache_agents` adds components to the edge cache
//! (`*` = all), and a key named after a filter adds components to that filter. A change applies
//! without a restart and is logged. The hub fetches it with its own identity and user agent
//! (`outpost`), keeps the last version in the cache (edge mode) and starts from that copy when
//! the cloud is unreachable, so a node that boots offline keeps its configuration.
//!
//! Unlike yurthub, the ConfigMap is found by its name alone; yurthub's informer also requires the
//! label `openyurt.io/configmap-name=yurt-hub-cfg` and silently ignores a ConfigMap without it.
//!
//! [`ConfigWatch::named`] follows another ConfigMap the same way (pool sharing's
//! `leader-hub-<pool>`, [`crate::pool`]).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::StatusCode;
use outpost_cache::Store;
use outpost_core::wire::{EventError, EventType, LineFramer, WatchEvent};
use serde::Deserialize;
use tokio::sync::watch;
use tracing::{debug, info, warn};

use super::own::{OwnGets, Rounds, SyncState, WATCH_TIMEOUT_SECONDS, retry_after};
use outpost_proxy::error::{BoxError, ProxyError};
use outpost_proxy::upstream::Upstream;

pub const NAME: &str = "yurt-hub-cfg";
const USER_AGENT: &str = "outpost";

/// The ConfigMap's data; empty when it does not exist.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HubCfg {
    pub data: BTreeMap<String, String>,
}

impl HubCfg {
    pub fn get(&self, key: &str) -> &str {
        self.data.get(key).map_or("", String::as_str)
    }
}

#[derive(Deserialize)]
struct ConfigMap {
    #[serde(default)]
    metadata: Meta,
    #[serde(default)]
    data: BTreeMap<String, String>,
}

#[derive(Deserialize, Default)]
struct Meta {
    #[serde(default, rename = "resourceVersion")]
    resource_version: String,
}

/// Keeps `yurt-hub-cfg` in sync and publishes each change.
pub struct ConfigWatch {
    namespace: String,
    /// The ConfigMap's name; the last seen copy is kept in the cache as `config/<name>`.
    name: String,
    upstream: Arc<Upstream>,
    store: Option<Arc<dyn Store>>,
    tx: watch::Sender<Arc<HubCfg>>,
    state: watch::Sender<SyncState>,
}

impl ConfigWatch {
    pub fn new(
        namespace: &str,
        upstream: Arc<Upstream>,
        store: Option<Arc<dyn Store>>,
    ) -> ConfigWatch {
        ConfigWatch::named(namespace, NAME, upstream, store)
    }

    /// Follows the ConfigMap `namespace/name`.
    pub fn named(
        namespace: &str,
        name: &str,
        upstream: Arc<Upstream>,
        store: Option<Arc<dyn Store>>,
    ) -> ConfigWatch {
        ConfigWatch {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            upstream,
            store,
            tx: watch::Sender::new(Arc::new(HubCfg::default())),
            state: watch::Sender::new(SyncState::Pending),
        }
    }

    /// Whether the configuration has been read (see [`SyncState`]).
    pub fn sync_state(&self) -> watch::Receiver<SyncState> {
        self.state.subscribe()
    }

    pub fn subscribe(&self) -> watch::Receiver<Arc<HubCfg>> {
        self.tx.subscribe()
    }

    /// Runs until `shutdown`: the cached copy first, then get + watch, again after any failure
    /// ([`Rounds`]).
    pub async fn run(self, shutdown: watch::Receiver<bool>) {
        if let Some(cached) = self.load_cached().await {
            self.publish(cached, "edge cache");
        }
        let mut rounds = Rounds::new(self.upstream.states().subscribe(), shutdown);
        loop {
            let mut refused = None;
            let Some(synced) = rounds.run(self.sync(&mut refused)).await else {
                return;
            };
            let ended = synced.map_err(|e| {
                debug!(error = %e, "{} sync failed; retrying", self.name);
                SyncState::note_failure(&self.state, || e.to_string());
                refused
            });
            if !rounds.wait_after(ended).await {
                return;
            }
        }
    }

    /// One GET, then one watch from its resourceVersion until the stream ends; `refused` gets a
    /// refusal's `Retry-After`.
    async fn sync(&self, refused: &mut Option<Duration>) -> Result<(), ProxyError> {
        let path = format!(
            "/api/v1/namespaces/{}/configmaps/{}",
            self.namespace, self.name
        );
        let resp = OWN.send(&self.upstream, &path).await?;
        let rv = match resp.status() {
            StatusCode::OK => {
                let bytes = OWN.collect(Some(&self.upstream), &path, resp).await?;
                let cm = self.parse(&bytes)?;
                self.save(bytes).await;
                let rv = cm.metadata.resource_version.clone();
                self.publish(HubCfg { data: cm.data }, "cloud");
                rv
            }
            StatusCode::NOT_FOUND => {
                self.publish(HubCfg::default(), "cloud (no ConfigMap)");
                String::new()
            }
            other => {
                *refused = retry_after(&resp);
                return Err(bad_reply(format!(
                    "GET {path} answered {other} (check the hub's RBAC in manifests/)"
                )));
            }
        };
        let watch_path = format!(
            "/api/v1/namespaces/{}/configmaps?fieldSelector=metadata.name%3D{}&watch=true&allowWatchBookmarks=true&timeoutSeconds={WATCH_TIMEOUT_SECONDS}&resourceVersion={rv}",
            self.namespace, self.name
        );
        let resp = OWN.send(&self.upstream, &watch_path).await?;
        if resp.status() != StatusCode::OK {
            *refused = retry_after(&resp);
            return Err(bad_reply(format!("watch answered {}", resp.status())));
        }
        let mut body = resp.into_body();
        let mut framer = LineFramer::new();
        while let Some(line) = OWN.next_line(&mut body, &mut framer).await? {
            let event = WatchEvent::parse(&line).map_err(|e| bad_reply(EventError::from(e)))?;
            let object = event.object().map_err(bad_reply)?;
            match event.event_type() {
                Ok(EventType::Added | EventType::Modified) => {
                    let bytes = Bytes::copy_from_slice(object.as_bytes());
                    let cm = self.parse(&bytes)?;
                    self.save(bytes).await;
                    self.publish(HubCfg { data: cm.data }, "cloud");
                }
                Ok(EventType::Deleted) => {
                    self.publish(HubCfg::default(), "cloud (ConfigMap deleted)");
                }
                Ok(EventType::Error) => return Ok(()),
                Ok(EventType::Bookmark) | Err(_) => {}
            }
        }
        Ok(())
    }

    fn publish(&self, cfg: HubCfg, source: &str) {
        self.state.send_replace(SyncState::Synced {
            source: source.to_owned(),
        });
        self.tx.send_if_modified(|current| {
            if **current == cfg {
                return false;
            }
            info!(source, keys = ?cfg.data.keys().collect::<Vec<_>>(), "{} applied", self.name);
            *current = Arc::new(cfg);
            true
        });
    }

    async fn load_cached(&self) -> Option<HubCfg> {
        let store = self.store.clone()?;
        let document = self.document();
        let doc = tokio::task::spawn_blocking(move || store.get_document(&document))
            .await
            .ok()?
            .ok()??;
        self.parse(&doc).ok().map(|cm| HubCfg { data: cm.data })
    }

    async fn save(&self, bytes: Bytes) {
        let Some(store) = self.store.clone() else {
            return;
        };
        let document = self.document();
        let saved =
            tokio::task::spawn_blocking(move || store.put_document(&document, &bytes)).await;
        if let Ok(Err(e)) = saved {
            warn!(config_map = %self.name, error = %e, "cannot keep the config map in the edge cache");
        }
    }

    /// The cache document the last seen copy is kept under.
    fn document(&self) -> String {
        format!("config/{}", self.name)
    }

    fn parse(&self, bytes: &[u8]) -> Result<ConfigMap, ProxyError> {
        parse(bytes).map_err(|e| bad_reply(format!("{}: {e}", self.name)))
    }
}

fn parse(bytes: &[u8]) -> Result<ConfigMap, serde_json::Error> {
    serde_json::from_slice(bytes)
}

const OWN: OwnGets = OwnGets {
    label: "config watch",
    user_agent: USER_AGENT,
};

fn bad_reply(cause: impl Into<BoxError>) -> ProxyError {
    OWN.bad_reply(cause)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_maps_parse_with_and_without_data() {
        let cm =
            parse(br#"{"metadata":{"resourceVersion":"7"},"data":{"cache_agents":"kubectl"}}"#)
                .unwrap();
        assert_eq!(cm.metadata.resource_version, "7");
        let cfg = HubCfg { data: cm.data };
        assert_eq!(cfg.get("cache_agents"), "kubectl");
        assert_eq!(cfg.get("servicetopology"), "");
        assert!(parse(br#"{"metadata":{}}"#).unwrap().data.is_empty());
        assert!(parse(b"not json").is_err());
    }
}
