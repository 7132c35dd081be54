//! One request, end to end: fault switches, classification (kube-apiserver's `RequestInfo`
//! rules), authentication, injected failures, authorization (Node + RBAC), NodeRestriction
//! admission, dispatch to discovery or a resource handler, and the request log.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http::request::Parts;
use http::{Method, Request, Response, header};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use rustls::pki_types::CertificateDer;

use crate::authn::UserInfo;
use crate::authz::{self, Attributes, Decision};
use crate::connections::ConnStats;
use crate::discovery;
use crate::graph::StoreGraph;
use crate::handlers::{self, Target};
use crate::query::ListOptions;
use crate::rbac::StorePolicy;
use crate::reply::{self, ApiError, Body, error_response, json_response, text_response};
use crate::resources::{self, ResourceDef};
use crate::state::{RequestRecord, Shared};
use crate::{compress, protobuf, table, watch};

/// What the TLS layer learned about the peer, shared by all requests of a connection, and the
/// connection's counters.
pub struct ConnInfo {
    pub peer_certs: Option<Vec<CertificateDer<'static>>>,
    pub stats: Arc<ConnStats>,
}

/// `RequestInfo`: how kube-apiserver classifies a request before authorizing it.
#[derive(Debug, Default, Clone)]
pub struct Info {
    pub resource_request: bool,
    pub path: String,
    pub query: String,
    pub verb: String,
    pub api_group: String,
    pub api_version: String,
    pub namespace: String,
    pub resource: String,
    pub subresource: String,
    /// For authorization: the path's name, or for list/watch a `metadata.name=` selector's.
    pub name: String,
    /// The name segment of the URL path only.
    pub path_name: String,
    /// More than `resource/name/subresource`: nothing serves such a path.
    pub extra_parts: bool,
    /// Came in through the deprecated `/watch/` prefix.
    pub watch_prefix: bool,
}

fn method_verb(method: &Method) -> String {
    match *method {
        Method::GET | Method::HEAD => "get".into(),
        Method::POST => "create".into(),
        Method::PUT => "update".into(),
        Method::PATCH => "patch".into(),
        Method::DELETE => "delete".into(),
        _ => method.as_str().to_ascii_lowercase(),
    }
}

fn percent_decode(s: &str) -> String {
    percent_encoding::percent_decode_str(s)
        .decode_utf8_lossy()
        .into_owned()
}

impl Info {
    pub fn classify(method: &Method, path: &str, query: &str) -> Info {
        let mut info = Info {
            path: path.to_owned(),
            query: query.to_owned(),
            verb: method.as_str().to_ascii_lowercase(),
            ..Info::default()
        };
        let segs: Vec<String> = path
            .trim_matches('/')
            .split('/')
            .filter(|s| !s.is_empty())
            .map(percent_decode)
            .collect();
        let rest = match segs.first().map(String::as_str) {
            Some("api") if segs.len() >= 3 => {
                info.api_version = segs[1].clone();
                &segs[2..]
            }
            Some("apis") if segs.len() >= 4 => {
                info.api_group = segs[1].clone();
                info.api_version = segs[2].clone();
                &segs[3..]
            }
            _ => return info,
        };
        info.resource_request = true;
        info.verb = method_verb(method);
        info.classify_parts(rest, method);
        info
    }

    fn classify_parts(&mut self, mut parts: &[String], method: &Method) {
        if parts.first().map(String::as_str) == Some("watch") && parts.len() >= 2 {
            self.verb = "watch".into();
            self.watch_prefix = true;
            parts = &parts[1..];
        }
        if parts.first().map(String::as_str) == Some("namespaces") && parts.len() > 1 {
            self.namespace = parts[1].clone();
            if parts.len() > 2 && !matches!(parts[2].as_str(), "status" | "finalize") {
                parts = &parts[2..];
            }
        }
        self.extra_parts = parts.len() > 3;
        self.resource = parts[0].clone();
        self.name = parts.get(1).cloned().unwrap_or_default();
        self.path_name = self.name.clone();
        self.subresource = parts.get(2).cloned().unwrap_or_default();
        let options = ListOptions::decode(&self.query).ok();
        if self.name.is_empty() && self.verb == "get" {
            let watch = options
                .as_ref()
                .map_or_else(|| self.lenient_watch(), |o| o.watch);
            self.verb = if watch { "watch" } else { "list" }.into();
        }
        if self.name.is_empty()
            && matches!(self.verb.as_str(), "list" | "watch")
            && let Some(name) = options.as_ref().and_then(|o| o.selected_name())
        {
            self.name = name.to_owned();
        }
        if self.name.is_empty() && *method == Method::DELETE {
            self.verb = "deletecollection".into();
        }
    }

    /// When the query does not parse, `RequestInfo` still honours `watch`.
    fn lenient_watch(&self) -> bool {
        crate::query::param(&crate::query::params(&self.query), "watch")
            .is_some_and(|v| !matches!(v.to_ascii_lowercase().as_str(), "false" | "0"))
    }

    fn attributes<'a>(&'a self, user: &'a UserInfo) -> Attributes<'a> {
        Attributes {
            user,
            verb: &self.verb,
            resource_request: self.resource_request,
            path: &self.path,
            api_group: &self.api_group,
            resource: &self.resource,
            subresource: &self.subresource,
            namespace: &self.namespace,
            name: &self.name,
            field_selector: None,
        }
    }
}

/// Why a connection was closed instead of answered: the `hang_up_under` fault. hyper closes a
/// connection whose service fails, without a response.
#[derive(Debug)]
pub struct HungUp;

impl std::fmt::Display for HungUp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("hung up on purpose (fault injection)")
    }
}

impl std::error::Error for HungUp {}

/// The hyper service function.
pub async fn serve(
    shared: Arc<Shared>,
    conn: Arc<ConnInfo>,
    mut req: Request<Incoming>,
) -> Result<Response<Body>, HungUp> {
    let arrived = Instant::now();
    conn.stats.count_request();
    if shared.faults.hangs_up(req.uri().path()) {
        return Err(HungUp);
    }
    if let Some(path) = shared.faults.answered_as(req.uri().path()) {
        let query = req
            .uri()
            .query()
            .map(|q| format!("?{q}"))
            .unwrap_or_default();
        if let Ok(uri) = format!("{path}{query}").parse() {
            *req.uri_mut() = uri;
        }
    }
    // exec / attach / port-forward switch protocols; the handle must be taken before the body.
    let on_upgrade = req
        .headers()
        .contains_key(header::UPGRADE)
        .then(|| hyper::upgrade::on(&mut req));
    let latency = shared.faults.delay(req.uri().path());
    if !latency.is_zero() {
        tokio::time::sleep(latency).await;
    }
    shared.faults.pass_blackhole().await;
    let (parts, body) = req.into_parts();
    let body = match body.collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => Bytes::new(),
    };
    let path = parts.uri.path().to_owned();
    let query = parts.uri.query().unwrap_or("").to_owned();
    let info = Info::classify(&parts.method, &path, &query);
    let (user, resp) = match shared.authn.authenticate(
        conn.peer_certs.as_deref(),
        header_str(&parts, header::AUTHORIZATION),
    ) {
        Ok(user) => {
            let resp = authorized(&shared, &info, &user, &parts, body).await;
            (user, resp)
        }
        Err(status) => (UserInfo::anonymous(), error_response(&status.into())),
    };
    conn.stats.claim_identity(&user.name);
    let accept = header_str(&parts, header::ACCEPT);
    let resp = if protobuf::wants_protobuf(&info, accept) {
        protobuf::encode_answer(resp).await
    } else {
        resp
    };
    let resp = if shared.config.gzip
        && compress::accepts_gzip(header_str(&parts, header::ACCEPT_ENCODING))
    {
        compress::large_answer(resp).await
    } else {
        resp
    };
    let resp = reply::framed_as_apiserver(resp);
    let arrival = Arrival {
        at: arrived,
        connection: conn.stats.id(),
    };
    shared.record(record(
        &parts,
        &info,
        &user,
        resp.status().as_u16(),
        arrival,
    ));
    if let Some(late) = shared.faults.lateness(&info.path, &info.verb) {
        tokio::time::sleep(late).await;
    }
    let resp = match shared.faults.body_pace(&path) {
        Some(pace) => slow_body(resp, pace).await,
        None => resp,
    };
    if resp.status() == hyper::StatusCode::SWITCHING_PROTOCOLS
        && let Some(on_upgrade) = on_upgrade
    {
        tokio::spawn(echo_session(on_upgrade));
    }
    Ok(resp)
}

/// `resp` with its body sent `PACED_BYTES` at a time, one piece per `pace`, or (`None`) never:
/// the `slow_bodies_under` fault. The headers go out at once, without a length.
async fn slow_body(resp: Response<Body>, pace: Option<std::time::Duration>) -> Response<Body> {
    const PACED_BYTES: usize = 16;
    type Frames = std::pin::Pin<
        Box<
            dyn futures_util::Stream<Item = Result<http_body::Frame<Bytes>, reply::BoxError>>
                + Send
                + Sync,
        >,
    >;
    let (mut parts, body) = resp.into_parts();
    parts.headers.remove(header::CONTENT_LENGTH);
    let bytes = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let frames: Frames = match pace {
        None => Box::pin(futures_util::stream::pending()),
        Some(pace) => Box::pin(futures_util::stream::unfold(0, move |sent| {
            let bytes = bytes.clone();
            async move {
                if sent >= bytes.len() {
                    return None;
                }
                tokio::time::sleep(pace).await;
                let end = (sent + PACED_BYTES).min(bytes.len());
                Some((Ok(http_body::Frame::data(bytes.slice(sent..end))), end))
            }
        })),
    };
    Response::from_parts(parts, http_body_util::StreamBody::new(frames).boxed())
}

/// Stands in for the container side of exec/attach/port-forward: echoes every byte back, like
/// `cat` attached to the stream. The framing of SPDY/websocket channels is not interpreted.
async fn echo_session(on_upgrade: hyper::upgrade::OnUpgrade) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(upgraded) = on_upgrade.await else {
        return;
    };
    let mut io = hyper_util::rt::TokioIo::new(upgraded);
    let mut buf = [0u8; 4096];
    while let Ok(n) = io.read(&mut buf).await {
        if n == 0 || io.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
}

/// The subresources that switch protocols.
fn is_streaming_subresource(subresource: &str) -> bool {
    matches!(subresource, "exec" | "attach" | "portforward")
}

fn header_str(parts: &Parts, name: header::HeaderName) -> Option<&str> {
    parts.headers.get(name).and_then(|v| v.to_str().ok())
}

/// When and on which connection a request came.
struct Arrival {
    at: Instant,
    connection: u64,
}

fn record(
    parts: &Parts,
    info: &Info,
    user: &UserInfo,
    status: u16,
    arrival: Arrival,
) -> RequestRecord {
    RequestRecord {
        method: parts.method.as_str().to_owned(),
        path: info.path.clone(),
        query: info.query.clone(),
        user: user.name.clone(),
        groups: user.groups.clone(),
        user_agent: header_str(parts, header::USER_AGENT).map(str::to_owned),
        status,
        verb: info.verb.clone(),
        resource: info.resource.clone(),
        subresource: info.subresource.clone(),
        namespace: info.namespace.clone(),
        name: info.name.clone(),
        at: arrival.at,
        connection: arrival.connection,
    }
}

/// Everything after authentication; errors become Status responses.
async fn authorized(
    shared: &Arc<Shared>,
    info: &Info,
    user: &UserInfo,
    parts: &Parts,
    body: Bytes,
) -> Response<Body> {
    if let Some(code) = shared.faults.fail_code(parts.uri.path()) {
        let retry_after = shared.faults.retry_after();
        return error_response(&reply::injected_failure(code, retry_after));
    }
    match authorize_and_dispatch(shared, info, user, parts, body).await {
        Ok(resp) => resp,
        Err(err) => error_response(&err),
    }
}

async fn authorize_and_dispatch(
    shared: &Arc<Shared>,
    info: &Info,
    user: &UserInfo,
    parts: &Parts,
    body: Bytes,
) -> Result<Response<Body>, ApiError> {
    let field_selector = ListOptions::decode(&info.query)
        .ok()
        .map(|o| o.field_selector);
    let attrs = Attributes {
        field_selector: field_selector.as_ref(),
        ..info.attributes(user)
    };
    let graph = StoreGraph(&shared.store);
    let policy = StorePolicy(&shared.store);
    if let Decision::Deny(reason) = authz::authorize(&attrs, &graph, &policy) {
        return Err(authz::forbidden(&attrs, &reason).into());
    }
    if !info.resource_request {
        return non_resource(shared, info, &parts.method);
    }
    let body = json_body(info, parts, body)?;
    admit(&attrs, &body, &graph)?;
    let approval = (
        info.api_group.as_str(),
        info.resource.as_str(),
        info.subresource.as_str(),
    ) == (crate::csr::GROUP, crate::csr::RESOURCE, "approval");
    if approval && matches!(info.verb.as_str(), "update" | "patch") {
        crate::csr::admit_approval(shared, &attrs)?;
    }
    protobuf::check_accept(info, header_str(parts, header::ACCEPT))?;
    resource(shared, info, user, parts, body).await
}

/// NodeRestriction for writes by nodes.
fn admit(attrs: &Attributes<'_>, body: &[u8], graph: &StoreGraph<'_>) -> Result<(), ApiError> {
    if !matches!(attrs.verb, "create" | "update" | "patch" | "delete") {
        return Ok(());
    }
    let parsed = serde_json::from_slice(body).ok();
    let Some(message) = authz::node_restriction(attrs, parsed.as_ref(), graph) else {
        return Ok(());
    };
    let body_name = parsed
        .as_ref()
        .and_then(|b: &serde_json::Value| b.pointer("/metadata/name"))
        .and_then(|n| n.as_str())
        .unwrap_or("");
    let named = Attributes {
        name: if attrs.name.is_empty() {
            body_name
        } else {
            attrs.name
        },
        ..*attrs
    };
    Err(authz::forbidden_for(&named, &message).into())
}

fn non_resource(shared: &Shared, info: &Info, method: &Method) -> Result<Response<Body>, ApiError> {
    if *method != Method::GET && *method != Method::HEAD {
        return Err(reply::path_not_found());
    }
    let path = info.path.trim_end_matches('/');
    let segs: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let doc = match segs.as_slice() {
        ["version"] => discovery::version(&shared.config.git_version),
        ["healthz" | "livez" | "readyz", ..] => return Ok(text_response(200, "ok")),
        ["api"] => discovery::api_versions(shared.addr),
        ["api", version] => {
            discovery::api_resource_list("", version).ok_or_else(reply::path_not_found)?
        }
        ["apis"] => discovery::api_group_list(),
        ["apis", group] => discovery::api_group(group).ok_or_else(reply::path_not_found)?,
        ["apis", group, version] => {
            discovery::api_resource_list(group, version).ok_or_else(reply::path_not_found)?
        }
        _ => return Err(reply::path_not_found()),
    };
    Ok(json_response(200, &doc))
}

/// Resolves the resource and checks the request shape against what it serves.
fn target<'a>(info: &'a Info) -> Result<Target<'a>, ApiError> {
    let def = resources::find(&info.api_group, &info.api_version, &info.resource)
        .ok_or_else(reply::path_not_found)?;
    let sub_ok = match info.subresource.as_str() {
        "" => true,
        "status" => def.status,
        "approval" => crate::csr::is_csr(def),
        "token" => def.kind == "ServiceAccount",
        sub if is_streaming_subresource(sub) => def.kind == "Pod",
        _ => false,
    };
    if info.extra_parts || !sub_ok {
        return Err(reply::path_not_found());
    }
    let namespace = scope(def, info)?;
    Ok(Target {
        def,
        namespace,
        name: &info.path_name,
        subresource: &info.subresource,
    })
}

/// Namespaced resources are addressed under `namespaces/<ns>/`, except list/watch across all.
fn scope<'a>(def: &ResourceDef, info: &'a Info) -> Result<Option<&'a str>, ApiError> {
    if def.kind == "Namespace" {
        return Ok(None);
    }
    match (def.namespaced, info.namespace.is_empty()) {
        (true, false) => Ok(Some(info.namespace.as_str())),
        (false, true) => Ok(None),
        (false, false) => Err(reply::path_not_found()),
        (true, true) if !info.path_name.is_empty() && !info.watch_prefix => {
            Err(reply::path_not_found())
        }
        (true, true) if matches!(info.verb.as_str(), "list" | "watch") => Ok(None),
        (true, true) => Err(reply::method_not_allowed()),
    }
}

fn verb_allowed(def: &ResourceDef, info: &Info) -> bool {
    match info.subresource.as_str() {
        "status" | "approval" => matches!(info.verb.as_str(), "get" | "update" | "patch"),
        "token" => info.verb == "create",
        // SPDY clients POST, websocket clients GET.
        sub if is_streaming_subresource(sub) => matches!(info.verb.as_str(), "create" | "get"),
        _ => def.verbs.contains(&info.verb.as_str()),
    }
}

async fn resource(
    shared: &Arc<Shared>,
    info: &Info,
    user: &UserInfo,
    parts: &Parts,
    body: Bytes,
) -> Result<Response<Body>, ApiError> {
    let t = target(info)?;
    if !verb_allowed(t.def, info) {
        return Err(reply::method_not_allowed());
    }
    if is_streaming_subresource(t.subresource) {
        return switch_protocols(shared, t, parts).await;
    }
    let content_type = header_str(parts, header::CONTENT_TYPE).unwrap_or("");
    match info.verb.as_str() {
        "get" => {
            let rv = crate::query::param(&crate::query::params(&info.query), "resourceVersion")
                .unwrap_or("")
                .to_owned();
            let obj = handlers::get(shared, t, &rv).await?;
            let table = table::wants_table(header_str(parts, header::ACCEPT));
            let doc = if table {
                table::from_object(t.def, &obj)
            } else {
                obj
            };
            Ok(json_response(200, &doc))
        }
        "list" => {
            let o = ListOptions::decode(&info.query)?;
            let list = handlers::list(shared, t, &o).await?;
            let table = table::wants_table(header_str(parts, header::ACCEPT));
            let doc = if table {
                table::from_list(t.def, &list)
            } else {
                list
            };
            Ok(json_response(200, &doc))
        }
        "watch" => {
            let mut o = ListOptions::decode(&info.query)?;
            o.watch = true;
            let named = Target {
                name: if info.watch_prefix { t.name } else { "" },
                ..t
            };
            watch::watch(shared.clone(), named, o).await
        }
        "create" => create(shared, t, info, user, &body),
        "update" => handlers::update(shared, t, &body),
        "patch" => handlers::patch(shared, t, content_type, &body),
        "delete" => handlers::delete(shared, t, &body),
        "deletecollection" => {
            let o = ListOptions::decode(&info.query)?;
            handlers::delete_collection(shared, t, &o, &body)
        }
        _ => Err(reply::method_not_allowed()),
    }
}

/// `101 Switching Protocols` for a pod that exists, echoing the requested protocol; 400 without
/// an `Upgrade` header, as kube-apiserver answers "Upgrade request required".
async fn switch_protocols(
    shared: &Arc<Shared>,
    t: Target<'_>,
    parts: &Parts,
) -> Result<Response<Body>, ApiError> {
    let pod = Target {
        subresource: "",
        ..t
    };
    handlers::get(shared, pod, "").await?;
    let Some(protocol) = parts.headers.get(header::UPGRADE).cloned() else {
        return Ok(text_response(400, "Upgrade request required"));
    };
    let mut resp = Response::new(reply::full(Bytes::new()));
    *resp.status_mut() = hyper::StatusCode::SWITCHING_PROTOCOLS;
    resp.headers_mut().insert(header::UPGRADE, protocol);
    resp.headers_mut().insert(
        header::CONNECTION,
        header::HeaderValue::from_static("Upgrade"),
    );
    Ok(resp)
}

fn create(
    shared: &Shared,
    t: Target<'_>,
    info: &Info,
    user: &UserInfo,
    body: &[u8],
) -> Result<Response<Body>, ApiError> {
    if !info.path_name.is_empty() && t.subresource != "token" {
        return Err(reply::method_not_allowed());
    }
    match (t.def.group, t.def.name) {
        ("authentication.k8s.io", "tokenreviews") => handlers::token_review(shared, body),
        ("authorization.k8s.io", "subjectaccessreviews") => {
            handlers::subject_access_review(shared, body)
        }
        (crate::csr::GROUP, crate::csr::RESOURCE) => crate::csr::create(shared, t.def, user, body),
        _ => handlers::create(shared, t, body),
    }
}

/// Object bodies arrive as JSON or, from kubelet and client-go's typed clients (kubectl's
/// generators), as Kubernetes protobuf, which is converted here; YAML and other types are 415.
fn json_body(info: &Info, parts: &Parts, body: Bytes) -> Result<Bytes, ApiError> {
    if !matches!(
        info.verb.as_str(),
        "create" | "update" | "delete" | "deletecollection"
    ) {
        return Ok(body);
    }
    let content_type = header_str(parts, header::CONTENT_TYPE).unwrap_or("");
    let media = content_type.split(';').next().unwrap_or("").trim();
    match media {
        "" | "application/json" | "*/*" => Ok(body),
        // A DELETE without options.
        _ if outpost_core::wire::is_protobuf(media) && body.is_empty() => Ok(body),
        _ if outpost_core::wire::is_protobuf(media) => protobuf::decode_body(info, &body),
        _ => Err(protobuf::unsupported_body(media, "not decoded by the fake")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn classify(method: Method, path_and_query: &str) -> Info {
        let (path, query) = path_and_query
            .split_once('?')
            .unwrap_or((path_and_query, ""));
        Info::classify(&method, path, query)
    }

    #[test]
    fn classifies_like_request_info() {
        let i = classify(Method::GET, "/api/v1/namespaces/kube-system/pods/p1");
        assert_eq!(
            (
                i.verb.as_str(),
                i.namespace.as_str(),
                i.resource.as_str(),
                i.name.as_str()
            ),
            ("get", "kube-system", "pods", "p1")
        );
        let i = classify(
            Method::GET,
            "/api/v1/pods?watch=true&fieldSelector=spec.nodeName%3Dn1",
        );
        assert_eq!((i.verb.as_str(), i.name.as_str()), ("watch", ""));
        let i = classify(
            Method::GET,
            "/api/v1/namespaces/default/configmaps?fieldSelector=metadata.name%3Dcfg",
        );
        assert_eq!((i.verb.as_str(), i.name.as_str()), ("list", "cfg"));
        let i = classify(Method::PATCH, "/api/v1/nodes/n1/status");
        assert_eq!(
            (i.verb.as_str(), i.resource.as_str(), i.subresource.as_str()),
            ("patch", "nodes", "status")
        );
        let i = classify(Method::GET, "/api/v1/namespaces/default");
        assert_eq!(
            (i.resource.as_str(), i.name.as_str(), i.namespace.as_str()),
            ("namespaces", "default", "default")
        );
        let i = classify(
            Method::DELETE,
            "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases",
        );
        assert_eq!(
            (i.verb.as_str(), i.api_group.as_str()),
            ("deletecollection", "coordination.k8s.io")
        );
        let i = classify(Method::GET, "/api/v1/watch/namespaces/default/pods/p");
        assert_eq!(
            (i.verb.as_str(), i.name.as_str(), i.watch_prefix),
            ("watch", "p", true)
        );
        let i = classify(Method::GET, "/api/v1/namespaces/default/pods/p/log/extra");
        assert!(i.extra_parts);
        let i = classify(Method::GET, "/version");
        assert!(!i.resource_request);
        assert_eq!(i.verb, "get");
        let i = classify(Method::GET, "/apis/apps/v1");
        assert!(!i.resource_request);
    }

    #[test]
    fn scope_rules() {
        let info = classify(Method::POST, "/api/v1/pods");
        let pods = resources::by_gvr("v1/pods").unwrap();
        assert_eq!(scope(pods, &info).unwrap_err().status.code, 405);
        let info = classify(Method::GET, "/api/v1/pods/x");
        assert_eq!(scope(pods, &info).unwrap_err().status.code, 404);
        let info = classify(Method::GET, "/api/v1/pods");
        assert_eq!(scope(pods, &info).unwrap(), None);
        let nodes = resources::by_gvr("v1/nodes").unwrap();
        let info = classify(Method::GET, "/api/v1/namespaces/default/nodes");
        assert!(scope(nodes, &info).is_err());
    }

    #[test]
    fn body_types() {
        let req = |ct: &str| {
            http::Request::post("/api/v1/namespaces/default/configmaps")
                .header("content-type", ct)
                .body(())
                .unwrap()
                .into_parts()
                .0
        };
        let info = classify(Method::POST, "/api/v1/namespaces/default/configmaps");
        let json = Bytes::from_static(b"{}");
        assert!(json_body(&info, &req("application/json; charset=utf-8"), json.clone()).is_ok());
        let yaml = json_body(&info, &req("application/yaml"), json.clone()).unwrap_err();
        assert_eq!(yaml.status.code, 415);
        // Not protobuf at all (no magic): 400, as kube-apiserver answers an undecodable object.
        let garbage = json_body(&info, &req("application/vnd.kubernetes.protobuf"), json);
        assert_eq!(garbage.unwrap_err().status.code, 400);
    }
}
