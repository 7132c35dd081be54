//! Resource handlers: GET, LIST (resourceVersion semantics, paging), POST, PUT, PATCH, DELETE,
//! deletecollection, and the create-only virtual resources (TokenRequest, TokenReview,
//! SubjectAccessReview).
//!
//! resourceVersion follows kube-apiserver 1.32 with the watch cache and consistent reads:
//! unset = latest; `0` = any (served whole: the cache ignores `limit`); `N` = not older than `N`
//! (waiting up to 3 s for the store to catch up, then `504 Too large resource version`), except
//! `resourceVersionMatch=Exact`, or `limit` without a match (the legacy rule), which read the
//! snapshot at exactly `N`. Continue tokens read the snapshot of the first page.

use std::sync::Arc;
use std::time::Duration;

use http::Response;
use outpost_core::{Reason, Status};
use serde_json::{Value, json};

use crate::authn::UserInfo;
use crate::authz::{self, Attributes, Decision};
use crate::graph::StoreGraph;
use crate::patch::{self, PatchType};
use crate::query::{self, ListOptions};
use crate::rbac::StorePolicy;
use crate::registry::{self, Origin, Part};
use crate::reply::{ApiError, Body, json_response};
use crate::resources::ResourceDef;
use crate::state::Shared;
use crate::store::{Store, TooOld};
use crate::util;

/// How long a read with a future resourceVersion waits (the watch cache's `blockTimeout`).
pub const TOO_LARGE_WAIT: Duration = Duration::from_secs(3);

/// The object a request addresses.
#[derive(Debug, Clone, Copy)]
pub struct Target<'a> {
    pub def: &'static ResourceDef,
    pub namespace: Option<&'a str>,
    pub name: &'a str,
    pub subresource: &'a str,
}

impl Target<'_> {
    fn prefix(&self) -> String {
        match self.namespace {
            Some(ns) if self.def.namespaced => format!("{ns}/"),
            _ => String::new(),
        }
    }

    fn part(&self) -> Part {
        match self.subresource {
            "status" => Part::Status,
            "approval" => Part::Approval,
            _ => Part::Main,
        }
    }
}

/// `storage.NewTooLargeResourceVersionError`: 504 with a retry hint and a typed cause.
fn too_large(wanted: u64, current: u64) -> ApiError {
    let status = Status::new(
        Reason::Timeout,
        format!("Too large resource version: {wanted}, current: {current}"),
    )
    .with_retry_after(1);
    ApiError::from(status).with_cause("ResourceVersionTooLarge", "Too large resource version", "")
}

/// Waits until the store has reached `wanted`, like `waitUntilFreshAndBlock`.
pub async fn wait_for_rv(store: &Store, wanted: u64) -> Result<(), ApiError> {
    let mut changes = store.subscribe();
    let deadline = tokio::time::sleep(TOO_LARGE_WAIT);
    tokio::pin!(deadline);
    loop {
        if store.current_rv() >= wanted {
            return Ok(());
        }
        tokio::select! {
            _ = &mut deadline => return Err(too_large(wanted, store.current_rv())),
            changed = changes.changed() => {
                if changed.is_err() {
                    return Err(too_large(wanted, store.current_rv()));
                }
            }
        }
    }
}

pub fn parse_rv(rv: &str) -> Result<u64, ApiError> {
    rv.parse().map_err(|_| {
        Status::bad_request(format!(
            "resourceVersion: Invalid value: {rv:?}: strconv.ParseUint: parsing {rv:?}: invalid syntax"
        ))
        .into()
    })
}

/// GET of one object.
pub async fn get(
    shared: &Shared,
    t: Target<'_>,
    resource_version: &str,
) -> Result<Value, ApiError> {
    if !resource_version.is_empty() && resource_version != "0" {
        wait_for_rv(&shared.store, parse_rv(resource_version)?).await?;
    }
    let key = crate::store::object_key(t.def, t.namespace, t.name);
    let obj = shared
        .store
        .get(t.def, &key)
        .ok_or_else(|| Status::not_found(t.def.group, t.def.name, t.name))?;
    Ok(registry::typed(t.def, &obj))
}

/// The items a LIST reads, the revision it reports, and where a continued list resumes.
struct Source {
    rv: u64,
    items: Vec<(String, Arc<Value>)>,
    start: Option<String>,
    limit: u64,
}

async fn list_source(store: &Store, t: &Target<'_>, o: &ListOptions) -> Result<Source, ApiError> {
    let prefix = t.prefix();
    if !o.continue_token.is_empty() {
        return continued_source(store, t, o, &prefix);
    }
    let current = |limit| {
        let (rv, items) = store.list(t.def, &prefix);
        Source {
            rv,
            items,
            start: None,
            limit,
        }
    };
    match o.resource_version.as_str() {
        "" => Ok(current(o.limit)),
        // Served from the watch cache, which does not paginate.
        "0" => Ok(current(0)),
        rv => {
            let wanted = parse_rv(rv)?;
            wait_for_rv(store, wanted).await?;
            let exact = o.resource_version_match == "Exact"
                || (o.resource_version_match.is_empty() && o.limit > 0);
            if !exact {
                return Ok(current(o.limit));
            }
            let items = store.snapshot(t.def, &prefix, wanted).map_err(|_| {
                ApiError::from(Status::expired(
                    "The resourceVersion for the provided list is too old.",
                ))
            })?;
            Ok(Source {
                rv: wanted,
                items,
                start: None,
                limit: o.limit,
            })
        }
    }
}

fn continued_source(
    store: &Store,
    t: &Target<'_>,
    o: &ListOptions,
    prefix: &str,
) -> Result<Source, ApiError> {
    if !o.resource_version.is_empty() && o.resource_version != "0" {
        return Err(Status::bad_request(
            "specifying resource version is not allowed when using continue",
        )
        .into());
    }
    let c = query::decode_continue(&o.continue_token)?;
    let start = Some(c.start.clone());
    if c.rv < 0 {
        let (rv, items) = store.list(t.def, prefix);
        return Ok(Source {
            rv,
            items,
            start,
            limit: o.limit,
        });
    }
    let rv = c.rv as u64;
    match store.snapshot(t.def, prefix, rv) {
        Ok(items) => Ok(Source {
            rv,
            items,
            start,
            limit: o.limit,
        }),
        Err(TooOld { .. }) => Err(expired_continue(&c.start)),
    }
}

/// etcd3's `handleCompactedErrorForPaging`: 410 plus a token to continue inconsistently.
fn expired_continue(start: &str) -> ApiError {
    let mut err = ApiError::from(Status::expired(
        "The provided continue parameter is too old to display a consistent list result. You can \
         start a new list without the continue parameter, or use the continue token in this \
         response to retrieve the remainder of the results. Continuing with the provided token \
         results in an inconsistent list - objects that were created, modified, or deleted \
         between the time the first chunk was returned and now may show up in the list.",
    ));
    err.continue_token = Some(query::encode_continue(-1, start.trim_end_matches('\u{0}')));
    err
}

/// LIST: `XxxList` with items untyped, as the real apiserver serialises lists.
pub async fn list(shared: &Shared, t: Target<'_>, o: &ListOptions) -> Result<Value, ApiError> {
    o.validate()?;
    o.check_fields(t.def)?;
    let src = list_source(&shared.store, &t, o).await?;
    let filter = o.filter(t.def);
    let matching: Vec<&(String, Arc<Value>)> = src
        .items
        .iter()
        .filter(|(k, _)| src.start.as_deref().is_none_or(|s| k.as_str() >= s))
        .filter(|(_, v)| filter.matches(v))
        .collect();
    let mut metadata = json!({"resourceVersion": src.rv.to_string()});
    let page: Vec<Value> = if src.limit > 0 && matching.len() as u64 > src.limit {
        let page = &matching[..src.limit as usize];
        let last_key = &page[page.len() - 1].0;
        metadata["continue"] = query::encode_continue(src.rv as i64, last_key).into();
        if !o.has_selectors() {
            metadata["remainingItemCount"] = (matching.len() - page.len()).into();
        }
        page.iter().map(|(_, v)| (**v).clone()).collect()
    } else {
        matching.iter().map(|(_, v)| (**v).clone()).collect()
    };
    Ok(json!({
        "kind": t.def.list_kind(),
        "apiVersion": t.def.api_version(),
        "metadata": metadata,
        "items": page,
    }))
}

pub fn parse_body(body: &[u8]) -> Result<Value, ApiError> {
    if body.is_empty() {
        return Ok(Value::Null);
    }
    serde_json::from_slice(body).map_err(|e| {
        Status::bad_request(format!(
            "the object provided is unrecognized or could not be decoded: json parse error: {e}"
        ))
        .into()
    })
}

pub(crate) fn object_body(body: &[u8]) -> Result<Value, ApiError> {
    match parse_body(body)? {
        v @ Value::Object(_) => Ok(v),
        _ => Err(Status::bad_request("the body of the request was in an unknown format").into()),
    }
}

/// POST on a collection (or `serviceaccounts/<n>/token`).
pub fn create(shared: &Shared, t: Target<'_>, body: &[u8]) -> Result<Response<Body>, ApiError> {
    let obj = object_body(body)?;
    if t.subresource == "token" {
        return token(shared, t, &obj);
    }
    let out = registry::create(&shared.store, t.def, t.namespace, obj, Origin::Client)?;
    Ok(json_response(201, &out))
}

fn token(shared: &Shared, t: Target<'_>, body: &Value) -> Result<Response<Body>, ApiError> {
    let ns = t.namespace.unwrap_or("default");
    let token = fake_jwt(ns, t.name);
    let out = registry::token_request(&shared.store, ns, t.name, body, &token)?;
    // Issued tokens authenticate as the service account, as bound SA tokens do.
    let user = format!("system:serviceaccount:{ns}:{}", t.name);
    let ns_group = format!("system:serviceaccounts:{ns}");
    shared
        .authn
        .add_token(&token, &user, &["system:serviceaccounts", &ns_group]);
    Ok(json_response(201, &out))
}

/// A JWT-shaped opaque token (header.payload.signature), unique per call.
fn fake_jwt(namespace: &str, service_account: &str) -> String {
    use base64::Engine;
    let b64 = |s: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
    let header = b64(r#"{"alg":"RS256","kid":"fake"}"#);
    let payload = b64(&json!({
        "sub": format!("system:serviceaccount:{namespace}:{service_account}"),
        "jti": util::new_uid(),
    })
    .to_string());
    format!("{header}.{payload}.{}", b64(&util::new_uid()))
}

/// PUT.
pub fn update(shared: &Shared, t: Target<'_>, body: &[u8]) -> Result<Response<Body>, ApiError> {
    let obj = object_body(body)?;
    let written = registry::update(
        &shared.store,
        t.def,
        t.namespace,
        t.name,
        obj,
        t.part(),
        Origin::Client,
    )?;
    Ok(json_response(
        if written.created { 201 } else { 200 },
        &written.object,
    ))
}

/// PATCH, by `Content-Type`.
pub fn patch(
    shared: &Shared,
    t: Target<'_>,
    content_type: &str,
    body: &[u8],
) -> Result<Response<Body>, ApiError> {
    let kind = PatchType::from_content_type(content_type)
        .ok_or_else(|| patch::unsupported_media_type(t.def.builtin))?;
    let out = registry::patch(
        &shared.store,
        t.def,
        t.namespace,
        t.name,
        kind,
        body,
        t.part(),
    )?;
    Ok(json_response(200, &out))
}

/// DELETE of one object: 200 when gone, 202 while finalizers hold it.
pub fn delete(shared: &Shared, t: Target<'_>, body: &[u8]) -> Result<Response<Body>, ApiError> {
    let options = parse_body(body)?;
    let out = registry::delete(&shared.store, t.def, t.namespace, t.name, &options)?;
    Ok(json_response(if out.gone { 200 } else { 202 }, &out.object))
}

/// DELETE on a collection: deletes what the selectors match, returns them as a list.
pub fn delete_collection(
    shared: &Shared,
    t: Target<'_>,
    o: &ListOptions,
    body: &[u8],
) -> Result<Response<Body>, ApiError> {
    o.check_fields(t.def)?;
    let options = parse_body(body)?;
    let (_, items) = shared.store.list(t.def, &t.prefix());
    let filter = o.filter(t.def);
    let mut deleted = Vec::new();
    for (_, obj) in items.iter().filter(|(_, v)| filter.matches(v)) {
        let ns = obj.pointer("/metadata/namespace").and_then(Value::as_str);
        let name = obj
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or("");
        if let Ok(out) = registry::delete(&shared.store, t.def, ns, name, &options) {
            deleted.push(registry::untyped(out.object));
        }
    }
    let list = json!({
        "kind": t.def.list_kind(),
        "apiVersion": t.def.api_version(),
        "metadata": {"resourceVersion": shared.store.current_rv().to_string()},
        "items": deleted,
    });
    Ok(json_response(200, &list))
}

/// TokenReview: tokens the fake knows authenticate; others do not.
pub fn token_review(shared: &Shared, body: &[u8]) -> Result<Response<Body>, ApiError> {
    let mut review = object_body(body)?;
    let token = review
        .pointer("/spec/token")
        .and_then(Value::as_str)
        .unwrap_or("");
    let status = match shared.authn.token_user(token) {
        Some(user) => json!({
            "authenticated": true,
            "user": {"username": user.name, "groups": user.groups},
            "audiences": review.pointer("/spec/audiences").cloned().unwrap_or(json!([])),
        }),
        None => json!({"authenticated": false, "error": "invalid bearer token"}),
    };
    review["status"] = status;
    review["metadata"] = json!({"creationTimestamp": null});
    Ok(json_response(201, &review))
}

/// SubjectAccessReview: evaluated with the fake's own authorizer.
pub fn subject_access_review(shared: &Shared, body: &[u8]) -> Result<Response<Body>, ApiError> {
    let mut review = object_body(body)?;
    let spec = review.get("spec").cloned().unwrap_or_default();
    let s = |p: &str| {
        spec.pointer(p)
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned()
    };
    let groups: Vec<String> = spec
        .get("groups")
        .and_then(Value::as_array)
        .map(|g| {
            g.iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    let user = UserInfo {
        name: s("/user"),
        groups,
    };
    let resource_request = spec.get("resourceAttributes").is_some();
    let (verb, path) = if resource_request {
        (s("/resourceAttributes/verb"), String::new())
    } else {
        (
            s("/nonResourceAttributes/verb"),
            s("/nonResourceAttributes/path"),
        )
    };
    let (group, resource, sub, ns, name) = (
        s("/resourceAttributes/group"),
        s("/resourceAttributes/resource"),
        s("/resourceAttributes/subresource"),
        s("/resourceAttributes/namespace"),
        s("/resourceAttributes/name"),
    );
    let attrs = Attributes {
        user: &user,
        verb: &verb,
        resource_request,
        path: &path,
        api_group: &group,
        resource: &resource,
        subresource: &sub,
        namespace: &ns,
        name: &name,
        field_selector: None,
    };
    let (graph, policy) = (StoreGraph(&shared.store), StorePolicy(&shared.store));
    review["status"] = match authz::authorize(&attrs, &graph, &policy) {
        Decision::Allow => json!({"allowed": true}),
        Decision::Deny(reason) => json!({"allowed": false, "reason": reason}),
    };
    review["metadata"] = json!({"creationTimestamp": null});
    Ok(json_response(201, &review))
}
