//! The store reads every offline answer starts with, run off the async workers and bounded in
//! time ([`blocking`]): a scope's covered list and its kind.

use std::sync::Arc;

use outpost_cache::{CachedObject, Gvr, ListResult, Scope, Store};

use super::kinds::{self, KindInfo};
use crate::error::ProxyError;

/// How long an offline answer waits for a store call: far longer than any healthy read (an
/// offline LIST of a node's pods takes milliseconds), and short of a client's patience. A store
/// stuck longer (a deadlocked sled) is answered 503 here, and fails `/v1/healthz` after
/// `admin::CACHE_HUNG_AFTER`, so the hub is restarted.
pub const STORE_CALL_WITHIN: std::time::Duration = std::time::Duration::from_secs(10);

/// Runs a blocking store call off the async workers, for at most [`STORE_CALL_WITHIN`].
pub async fn blocking<T: Send + 'static>(
    store: &Arc<dyn Store>,
    call: impl FnOnce(&dyn Store) -> Result<T, outpost_cache::CacheError> + Send + 'static,
) -> Result<T, ProxyError> {
    let store = store.clone();
    let task = tokio::task::spawn_blocking(move || call(store.as_ref()));
    match tokio::time::timeout(STORE_CALL_WITHIN, task).await {
        Err(_) => Err(ProxyError::Cache(format!(
            "the cache did not answer within {STORE_CALL_WITHIN:?} (a store call is stuck)"
        ))),
        Ok(Err(e)) => Err(ProxyError::Cache(format!("cache task failed: {e}"))),
        Ok(Ok(result)) => result.map_err(|e| ProxyError::Cache(e.to_string())),
    }
}

/// The answer for a scope that missed watch events (see `outpost_cache::Store::mark_missed`):
/// what it holds may lack what was created or still hold what was deleted since.
pub fn missed_events(scope: &Scope, reason: &str) -> ProxyError {
    ProxyError::Offline(format!(
        "the cached {} of {} missed watch events ({reason}); it is served again once a LIST from the cloud replaces it",
        scope.gvr, scope.component
    ))
}

/// The scope's cached list and its kind (one trip to the blocking pool), or the reason it
/// cannot be served.
pub async fn covered_list(
    store: &Arc<dyn Store>,
    scope: Scope,
) -> Result<(ListResult, KindInfo), ProxyError> {
    let query = scope.clone();
    let name = kinds::document_name(&scope.gvr);
    let (list, kind_doc) = blocking(store, move |s| {
        Ok((s.list(&query)?, s.get_document(&name)?))
    })
    .await?;
    let Some(result) = list else {
        return Err(ProxyError::Offline(format!(
            "no cached list covers {} for {} (it was never listed while online)",
            scope.gvr, scope.component
        )));
    };
    if let Some(reason) = &result.missed {
        return Err(missed_events(&scope, reason));
    }
    if !result.missing.is_empty() {
        return Err(ProxyError::Offline(format!(
            "the cached {} list is incomplete ({} corrupt entries quarantined); it will be refetched when the cloud is back",
            scope.gvr,
            result.missing.len()
        )));
    }
    let kind = kind_from(kind_doc.as_deref(), &scope.gvr, result.items.first());
    Ok((result, kind))
}

/// The kind learned for `gvr` (a document written by the cache writer), else read off an item.
pub async fn resolve_kind(
    store: &Arc<dyn Store>,
    gvr: &Gvr,
    first: Option<&CachedObject>,
) -> Result<KindInfo, ProxyError> {
    let name = kinds::document_name(gvr);
    let doc = blocking(store, move |s| s.get_document(&name)).await?;
    Ok(kind_from(doc.as_deref(), gvr, first))
}

/// The kind from its learned document, else read off an item, else guessed from the resource.
fn kind_from(doc: Option<&[u8]>, gvr: &Gvr, first: Option<&CachedObject>) -> KindInfo {
    doc.and_then(|d| serde_json::from_slice::<KindInfo>(d).ok())
        .or_else(|| first.and_then(|o| KindInfo::from_object(&o.bytes)))
        .unwrap_or_else(|| KindInfo::fallback(gvr))
}
