//! Answers from the cache while the cloud is unreachable: GET, LIST (selectors, namespace,
//! `limit`/`continue`, list resourceVersion), discovery documents. The offline WATCH is in
//! [`super::watch`].
//!
//! Bodies are built from the stored upstream bytes; objects are never re-encoded. A LIST's
//! items come through [`super::lists::ListMemo`], which keeps answers while the cache is
//! unchanged. A LIST that no
//! cached scope covers, or one whose scope lost entries to corruption, is a 503 Status — never an
//! empty or partial list, because kubelet deletes pods missing from the list it is given. A scope
//! that the cloud itself reported empty is served empty: that is the truth as last seen.
//! (yurthub answers kubelet's empty pod list with 404 whatever the reason, §4.4.)

use std::borrow::Cow;
use std::sync::Arc;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{HeaderMap, Response};
use outpost_cache::{CachedObject, Gvr, ListResult, Lookup, ObjectKey, Scope, Store};
use outpost_core::RequestInfo;
use outpost_core::wire::{ListMeta, ObjectHead, list_chunks as list_chunks_of, list_head};
use serde::{Deserialize, Serialize};

use super::kinds::KindInfo;
use super::lists::{ListMemo, Source};
use super::overlay::Overlay;
pub use super::reads::{STORE_CALL_WITHIN, blocking, covered_list, missed_events, resolve_kind};
use crate::body::{self, ProxyBody};
use crate::error::ProxyError;

/// A complete JSON response marked as served by the cache.
pub fn json_response(body: impl Into<Bytes>, content_type: &str) -> Response<ProxyBody> {
    cache_response(body::full(body), content_type)
}

/// A response from the cache: its content type and the `x-outpost-served-from` mark.
pub fn cache_response(body: ProxyBody, content_type: &str) -> Response<ProxyBody> {
    let mut resp = Response::new(body);
    let headers = resp.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_str(content_type).unwrap_or(HeaderValue::from_static("application/json")),
    );
    headers.insert(
        crate::headers::SERVED_FROM,
        HeaderValue::from_static("edge-cache"),
    );
    resp
}

/// GET of one object. An object the cache lacks is `404 NotFound` only where the cache knows it
/// did not exist, as last seen from the cloud: a GET of it was answered 404, or a cached list
/// covering it did not hold it. Otherwise the cache simply does not know, and says so (503).
pub async fn get(
    store: &Arc<dyn Store>,
    overlay: &Overlay,
    key: ObjectKey,
) -> Result<Response<ProxyBody>, ProxyError> {
    let lookup_key = key.clone();
    let (lookup, known_absent) = blocking(store, move |s| {
        let lookup = s.get(&lookup_key)?;
        let known_absent = matches!(lookup, Lookup::NotCached)
            && (s.get_document(&absence_document(&lookup_key))?.is_some()
                || match covering_query(&lookup_key) {
                    Some(query) => s.list(&query)?.is_some_and(|l| l.items.is_empty()),
                    None => false,
                });
        Ok((lookup, known_absent))
    })
    .await?;
    match lookup {
        Lookup::Found(object) => {
            let bytes = overlay.apply(&key.gvr, &object.bytes);
            Ok(json_response(
                bytes.unwrap_or(object.bytes),
                "application/json",
            ))
        }
        Lookup::NotCached if known_absent => Err(ProxyError::NotCached {
            group: key.gvr.group,
            resource: key.gvr.resource,
            name: key.name,
        }),
        Lookup::NotCached => Err(ProxyError::Offline(format!(
            "{} {:?} is not in the edge cache, and no cached list says whether it exists",
            key.gvr, key.name
        ))),
        Lookup::Quarantined => Err(ProxyError::Offline(format!(
            "the cached {} {:?} was damaged and set aside; it will be refetched when the cloud is back",
            key.gvr, key.name
        ))),
    }
}

/// Where the cache notes that the cloud answered a GET of `key` with 404.
pub fn absence_document(key: &ObjectKey) -> String {
    let gvr = &key.gvr;
    format!(
        "absent/{}/{}/{}/{}/{}/{}",
        key.component, gvr.group, gvr.version, gvr.resource, key.namespace, key.name
    )
}

/// The LIST that would hold `key`'s object (its namespace, `metadata.name=<name>`): a cached
/// scope covering it knows whether the object existed.
fn covering_query(key: &ObjectKey) -> Option<Scope> {
    let plain = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_' | ':');
    if key.name.is_empty() || !key.name.chars().all(plain) {
        return None;
    }
    let fields =
        outpost_core::selector::FieldSelector::parse(&format!("metadata.name={}", key.name))
            .ok()?;
    let namespace = Some(key.namespace.as_str()).filter(|ns| !ns.is_empty());
    Some(Scope::new(
        &key.component,
        &key.gvr,
        namespace,
        outpost_core::selector::LabelSelector::default(),
        fields,
    ))
}

/// LIST of a scope, paged like the apiserver when the client sends `limit`.
pub async fn list(
    lists: &ListMemo,
    store: &Arc<dyn Store>,
    overlay: &Overlay,
    scope: Scope,
    info: &RequestInfo,
) -> Result<Response<ProxyBody>, ProxyError> {
    let start = match info
        .query
        .continue_token
        .as_deref()
        .filter(|t| !t.is_empty())
    {
        None => None,
        Some(token) => Some(ContinueToken::decode(token)?),
    };
    let gvr = scope.gvr.clone();
    let (covered, source) = lists.covered(store, scope).await?;
    let overlaid = overlaid_items(overlay, &gvr, &covered.result);
    let (result, kind) = match &overlaid {
        Some(result) => (result, &covered.kind),
        None => (&covered.result, &covered.kind),
    };
    let page = Page::of(result, start.as_ref(), page_limit(info));
    if overlaid.is_none() && source == Source::Memory && page.is_whole(result) {
        let body = covered.whole_body(|l| list_chunks(&l.kind, &l.result, &page).concat().into());
        return Ok(json_response(body, "application/json"));
    }
    Ok(json_response_in_pieces(list_chunks(kind, result, &page)))
}

/// The list's items with the node's reports applied ([`Overlay`]), when they change any.
fn overlaid_items(overlay: &Overlay, gvr: &Gvr, list: &ListResult) -> Option<ListResult> {
    if overlay.is_empty() {
        return None;
    }
    let mut changed = false;
    let items = list
        .items
        .iter()
        .map(|item| match overlay.apply(gvr, &item.bytes) {
            Some(bytes) => {
                changed = true;
                CachedObject {
                    bytes,
                    ..item.clone()
                }
            }
            None => item.clone(),
        })
        .collect();
    changed.then(|| ListResult {
        items,
        ..list.clone()
    })
}

/// The page size to honour. `resourceVersion=0` ("any version") is served whole, as the
/// apiserver's watch cache does: kubelet and kube-proxy send `limit=500&resourceVersion=0` and
/// expect every item in one answer.
fn page_limit(info: &RequestInfo) -> Option<u64> {
    let from_any =
        info.query.resource_version.as_deref() == Some("0") && info.query.continue_token.is_none();
    info.query.limit.filter(|_| !from_any)
}

/// Where a page starts: after this (namespace, name), in a list at this resourceVersion.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContinueToken {
    /// Marks tokens the hub issued; upstream tokens look different and are refused with 410.
    outpost: u8,
    rv: String,
    namespace: String,
    name: String,
}

impl ContinueToken {
    fn after(rv: &str, object: &ObjectKey) -> ContinueToken {
        ContinueToken {
            outpost: 1,
            rv: rv.to_owned(),
            namespace: object.namespace.clone(),
            name: object.name.clone(),
        }
    }

    pub fn encode(&self) -> String {
        URL_SAFE_NO_PAD.encode(serde_json::to_vec(self).expect("a token serializes"))
    }

    /// A token this hub did not issue (e.g. one from the apiserver before the outage) is
    /// expired, as the apiserver says of tokens it can no longer serve: the client starts over.
    pub fn decode(token: &str) -> Result<ContinueToken, ProxyError> {
        URL_SAFE_NO_PAD
            .decode(token.trim_end_matches('='))
            .ok()
            .and_then(|raw| serde_json::from_slice::<ContinueToken>(&raw).ok())
            .filter(|t| t.outpost == 1)
            .ok_or_else(|| {
                ProxyError::Expired(
                    "the provided continue parameter is too old to display a consistent list result; start a new list without it".into(),
                )
            })
    }
}

/// One page of a list result.
#[derive(Debug, PartialEq)]
struct Page {
    range: std::ops::Range<usize>,
    next: Option<ContinueToken>,
}

impl Page {
    fn of(result: &ListResult, start: Option<&ContinueToken>, limit: Option<u64>) -> Page {
        let items = &result.items;
        let first = start.map_or(0, |t| {
            items.partition_point(|o| {
                let (ns, name) = object_position(o);
                (&*ns, &*name) <= (t.namespace.as_str(), t.name.as_str())
            })
        });
        let limit = limit.filter(|&l| l > 0).map_or(usize::MAX, |l| l as usize);
        let end = first.saturating_add(limit).min(items.len());
        let next = (end < items.len() && end > first).then(|| {
            let last = &items[end - 1];
            let (namespace, name) = object_position(last);
            ContinueToken::after(
                result.resource_version.as_str(),
                &ObjectKey::new("", &Gvr::new("", "", ""), &namespace, &name),
            )
        });
        Page {
            range: first..end,
            next,
        }
    }

    /// Every item, no continue: the same bytes whatever the request's paging.
    fn is_whole(&self, result: &ListResult) -> bool {
        self.range == (0..result.items.len()) && self.next.is_none()
    }
}

/// (namespace, name) of a stored object, the order the store lists in.
fn object_position(object: &CachedObject) -> (Cow<'_, str>, Cow<'_, str>) {
    ObjectHead::parse(&object.bytes)
        .map(|head| (head.metadata.namespace, head.metadata.name))
        .unwrap_or_default()
}

/// `{"kind":"PodList","apiVersion":"v1","metadata":{…},"items":[…]}` from the stored bytes.
/// The list body as pieces: its head, then each item and the commas between them, each item
/// the cached `Bytes` itself (no copy of the items into one buffer).
fn list_chunks(kind: &KindInfo, result: &ListResult, page: &Page) -> Vec<Bytes> {
    let items = &result.items[page.range.clone()];
    let mut metadata = ListMeta {
        resource_version: result.resource_version.as_str().to_owned(),
        ..ListMeta::default()
    };
    if let Some(next) = &page.next {
        metadata.continue_token = next.encode();
        metadata.remaining_item_count = Some((result.items.len() - page.range.end) as u64);
    }
    let list_kind = if kind.kind.is_empty() {
        "List".to_owned()
    } else {
        kind.list_kind()
    };
    let head = list_head(&list_kind, &kind.api_version, &metadata);
    list_chunks_of(head, items.iter().map(|object| object.bytes.clone()))
}

#[cfg(test)]
fn list_body(kind: &KindInfo, result: &ListResult, page: &Page) -> Vec<u8> {
    list_chunks(kind, result, page).concat()
}

/// [`json_response`] for a body in pieces, with its Content-Length.
pub(crate) fn json_response_in_pieces(chunks: Vec<Bytes>) -> Response<ProxyBody> {
    use http_body_util::BodyExt;
    let len: usize = chunks.iter().map(Bytes::len).sum();
    let frames = chunks
        .into_iter()
        .map(|c| Ok::<_, body::BoxError>(http_body::Frame::data(c)));
    let stream = http_body_util::StreamBody::new(futures_util::stream::iter(frames));
    let mut resp = cache_response(stream.boxed(), "application/json");
    resp.headers_mut()
        .insert(header::CONTENT_LENGTH, len.into());
    resp
}

/// A discovery document as stored by the writer: the upstream content type, a newline, the body.
pub fn discovery_document(content_type: &str, body: &[u8]) -> Vec<u8> {
    let mut doc = Vec::with_capacity(content_type.len() + 1 + body.len());
    doc.extend_from_slice(content_type.as_bytes());
    doc.push(b'\n');
    doc.extend_from_slice(body);
    doc
}

/// The document names a discovery path is cached under: one per encoding variant.
pub fn discovery_names(path: &str) -> [String; 2] {
    [
        format!("discovery/aggregated{path}"),
        format!("discovery/plain{path}"),
    ]
}

/// The variant a discovery response is stored as, from its content type; `None` = not cached.
pub fn discovery_variant(content_type: &str) -> Option<usize> {
    let media = content_type.split(';').next().unwrap_or("").trim();
    if !media.eq_ignore_ascii_case("application/json") {
        return None;
    }
    if content_type.contains("as=APIGroupDiscoveryList") {
        Some(0)
    } else if !content_type.contains("as=") {
        Some(1)
    } else {
        None
    }
}

/// Discovery offline: the aggregated document when the client asks for it, else the plain one.
pub async fn discovery(
    store: &Arc<dyn Store>,
    path: &str,
    headers: &HeaderMap,
) -> Result<Response<ProxyBody>, ProxyError> {
    let accept = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let [aggregated, plain] = discovery_names(path);
    let mut candidates = Vec::new();
    if accept.contains("as=APIGroupDiscoveryList") {
        candidates.push(aggregated);
    }
    if super::negotiate::accepts_json(headers) {
        candidates.push(plain);
    }
    for name in candidates {
        let doc = blocking(store, move |s| s.get_document(&name)).await?;
        if let Some((content_type, body)) = doc.as_deref().and_then(split_document) {
            return Ok(json_response(Bytes::copy_from_slice(body), content_type));
        }
    }
    Err(ProxyError::Offline(format!(
        "discovery document {path} was not cached in an encoding the client accepts"
    )))
}

pub(crate) fn split_document(doc: &[u8]) -> Option<(&str, &[u8])> {
    let newline = doc.iter().position(|&b| b == b'\n')?;
    let content_type = std::str::from_utf8(&doc[..newline]).ok()?;
    Some((content_type, &doc[newline + 1..]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use outpost_cache::ResourceVersion;
    use serde_json::Value;
    use std::time::SystemTime;

    fn object(ns: &str, name: &str) -> CachedObject {
        let bytes = serde_json::json!({"kind":"Pod","apiVersion":"v1","metadata":{"namespace":ns,"name":name}});
        CachedObject {
            bytes: Bytes::from(bytes.to_string()),
            resource_version: ResourceVersion::new("1"),
            uid: String::new(),
            checksum: 0,
            written_at: SystemTime::now(),
        }
    }

    fn result(n: usize) -> ListResult {
        ListResult {
            served_from: Scope::unfiltered("kubelet", &Gvr::new("", "v1", "pods"), None).id(),
            resource_version: ResourceVersion::new("42"),
            items: (0..n).map(|i| object("d", &format!("p{i:02}"))).collect(),
            missing: Vec::new(),
            missed: None,
        }
    }

    fn pod_kind() -> KindInfo {
        KindInfo::from_list("PodList", "v1").unwrap()
    }

    async fn answer(memo: &ListMemo, store: &Arc<dyn Store>, query: &str) -> (Option<u64>, Bytes) {
        use http_body_util::BodyExt;
        let info =
            RequestInfo::classify(&http::Method::GET, &format!("/api/v1/pods?{query}"), None)
                .unwrap();
        let scope = Scope::unfiltered("kubelet", &Gvr::new("", "v1", "pods"), None);
        let resp = list(memo, store, &Overlay::default(), scope, &info)
            .await
            .unwrap();
        let length = http_body::Body::size_hint(resp.body()).exact();
        (length, resp.into_body().collect().await.unwrap().to_bytes())
    }

    #[tokio::test]
    async fn a_list_reused_from_memory_is_one_buffer_with_the_same_bytes() {
        let store: Arc<dyn Store> = Arc::new(outpost_cache::MemStore::new());
        let scope = Scope::unfiltered("kubelet", &Gvr::new("", "v1", "pods"), None);
        let pods: Vec<Vec<u8>> = (0..3)
            .map(|i| object("d", &format!("p{i}")).bytes.to_vec())
            .collect();
        let items: Vec<&[u8]> = pods.iter().map(Vec::as_slice).collect();
        store.replace_scope(&scope, "42", &items).unwrap();
        let memo = ListMemo::default();

        let (pieces, first) = answer(&memo, &store, "").await;
        assert_eq!(pieces, None, "read from the store: sent in pieces");
        let (whole, again) = answer(&memo, &store, "limit=500&resourceVersion=0").await;
        assert_eq!(whole, Some(first.len() as u64), "from memory: one buffer");
        assert_eq!(again, first);
        let (paged, page) = answer(&memo, &store, "limit=2").await;
        assert_eq!(paged, None, "a page is assembled from the items");
        let page: Value = serde_json::from_slice(&page).unwrap();
        assert_eq!(page["items"].as_array().unwrap().len(), 2);
        assert!(page["metadata"]["continue"].is_string());
    }

    #[test]
    fn pages_walk_the_whole_list_once() {
        let result = result(7);
        let mut seen = Vec::new();
        let mut token: Option<ContinueToken> = None;
        for _ in 0..10 {
            let page = Page::of(&result, token.as_ref(), Some(3));
            let body: Value =
                serde_json::from_slice(&list_body(&pod_kind(), &result, &page)).unwrap();
            assert_eq!(body["kind"], "PodList");
            assert_eq!(body["metadata"]["resourceVersion"], "42");
            for item in body["items"].as_array().unwrap() {
                seen.push(item["metadata"]["name"].as_str().unwrap().to_owned());
            }
            match body["metadata"]["continue"].as_str() {
                Some(t) => token = Some(ContinueToken::decode(t).unwrap()),
                None => break,
            }
        }
        let expected: Vec<String> = (0..7).map(|i| format!("p{i:02}")).collect();
        assert_eq!(seen, expected);
    }

    #[test]
    fn unlimited_lists_have_no_continue() {
        let result = result(3);
        let page = Page::of(&result, None, None);
        let body: Value = serde_json::from_slice(&list_body(&pod_kind(), &result, &page)).unwrap();
        assert_eq!(body["items"].as_array().unwrap().len(), 3);
        assert!(body["metadata"].get("continue").is_none());
        let empty = result_with_no_items();
        let page = Page::of(&empty, None, Some(5));
        let body: Value = serde_json::from_slice(&list_body(&pod_kind(), &empty, &page)).unwrap();
        assert_eq!(body["items"], serde_json::json!([]));
    }

    fn result_with_no_items() -> ListResult {
        result(0)
    }

    #[test]
    fn lists_from_any_version_are_not_paged() {
        let info = |q: &str| {
            RequestInfo::classify(&http::Method::GET, &format!("/api/v1/pods?{q}"), None).unwrap()
        };
        assert_eq!(page_limit(&info("limit=500&resourceVersion=0")), None);
        assert_eq!(page_limit(&info("limit=500")), Some(500));
        assert_eq!(page_limit(&info("limit=2&resourceVersion=10")), Some(2));
    }

    #[test]
    fn foreign_tokens_are_expired() {
        let upstream =
            URL_SAFE_NO_PAD.encode(br#"{"v":"meta.k8s.io/v1","rv":5,"start":"d/p\u0000"}"#);
        for token in [upstream.as_str(), "not base64 !!", ""] {
            let err = ContinueToken::decode(token).unwrap_err();
            assert_eq!(err.into_status().code, 410);
        }
    }

    #[test]
    fn discovery_variants() {
        assert_eq!(discovery_variant("application/json"), Some(1));
        assert_eq!(
            discovery_variant(
                "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
            ),
            Some(0)
        );
        assert_eq!(
            discovery_variant("application/vnd.kubernetes.protobuf"),
            None
        );
        let doc = discovery_document("application/json", b"{\"kind\":\"APIVersions\"}");
        assert_eq!(
            split_document(&doc),
            Some(("application/json", &b"{\"kind\":\"APIVersions\"}"[..]))
        );
    }
}
