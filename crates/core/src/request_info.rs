//! Classify a request once, the way kube-apiserver's `RequestInfoFactory.NewRequestInfo` does.
//!
//! [`RequestInfo::classify`] takes the method, the path-and-query and the User-Agent and returns
//! everything later stages need: whether it is a resource request, the verb (with `list`/`watch`/
//! `deletecollection` derived from the collection form), group/version/resource/subresource,
//! namespace, name (also from `fieldSelector=metadata.name=`), the parsed query options and the
//! caller's component (yurthub's rule: the User-Agent, lower-cased, up to the first `/`).
//!
//! A query kube-apiserver would reject (bad selector, non-boolean `watch`, non-numeric `limit`…)
//! is a [`ClassifyError`], which the proxy answers with `400 BadRequest` before touching upstream.

use std::fmt;

use http::Method;

use crate::selector::{FieldSelector, LabelSelector};

/// The Kubernetes verb of a request (for non-resource requests, the lower-cased HTTP method).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Verb {
    Get,
    List,
    Watch,
    Create,
    Update,
    Patch,
    Delete,
    DeleteCollection,
    Proxy,
    /// Non-resource requests only: `head`, `options`, `post`, `put`… kept as-is.
    Other(NonResourceVerb),
}

/// HTTP methods that have no resource verb (kube-apiserver lower-cases the method for them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NonResourceVerb {
    Head,
    Options,
    Connect,
    Trace,
    Unknown,
}

impl Verb {
    pub fn as_str(self) -> &'static str {
        match self {
            Verb::Get => "get",
            Verb::List => "list",
            Verb::Watch => "watch",
            Verb::Create => "create",
            Verb::Update => "update",
            Verb::Patch => "patch",
            Verb::Delete => "delete",
            Verb::DeleteCollection => "deletecollection",
            Verb::Proxy => "proxy",
            Verb::Other(NonResourceVerb::Head) => "head",
            Verb::Other(NonResourceVerb::Options) => "options",
            Verb::Other(NonResourceVerb::Connect) => "connect",
            Verb::Other(NonResourceVerb::Trace) => "trace",
            Verb::Other(NonResourceVerb::Unknown) => "unknown",
        }
    }

    /// Reads never change server state, so they may be retried or answered from a cache.
    pub fn is_read(self) -> bool {
        matches!(self, Verb::Get | Verb::List | Verb::Watch)
    }

    fn from_method(method: &Method) -> Verb {
        match *method {
            Method::GET | Method::HEAD => Verb::Get,
            Method::POST => Verb::Create,
            Method::PUT => Verb::Update,
            Method::PATCH => Verb::Patch,
            Method::DELETE => Verb::Delete,
            Method::OPTIONS => Verb::Other(NonResourceVerb::Options),
            Method::CONNECT => Verb::Other(NonResourceVerb::Connect),
            Method::TRACE => Verb::Other(NonResourceVerb::Trace),
            _ => Verb::Other(NonResourceVerb::Unknown),
        }
    }
}

impl fmt::Display for Verb {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The list/watch options of the query string that later stages act on, already validated.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct QueryOptions {
    pub watch: bool,
    pub label_selector: LabelSelector,
    pub field_selector: FieldSelector,
    /// Raw, because resourceVersions are opaque strings to clients.
    pub resource_version: Option<String>,
    pub resource_version_match: Option<String>,
    pub timeout_seconds: Option<u64>,
    pub limit: Option<u64>,
    pub continue_token: Option<String>,
    pub allow_watch_bookmarks: bool,
    pub send_initial_events: Option<bool>,
    /// `?timeout=` (a Go duration) in whole seconds, used for request deadlines.
    pub timeout: Option<std::time::Duration>,
}

/// Everything the pipeline needs to know about one request, computed once.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestInfo {
    pub is_resource_request: bool,
    /// The URL path, percent-decoding not applied (as received).
    pub path: String,
    pub verb: Verb,
    /// `api` or `apis` for resource requests, empty otherwise.
    pub api_prefix: &'static str,
    pub api_group: String,
    pub api_version: String,
    pub namespace: String,
    pub resource: String,
    pub subresource: String,
    pub name: String,
    pub query: QueryOptions,
    /// Lower-cased User-Agent up to the first `/` (`kubelet`, `kube-proxy`…); `None` without a UA.
    pub component: Option<String>,
}

/// Why a request could not be classified; the proxy turns this into a 400 Status.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClassifyError {
    #[error("invalid query string: {0}")]
    Query(String),
    #[error("unable to parse requirement: {0}")]
    LabelSelector(String),
    #[error("invalid field selector: {0}")]
    FieldSelector(String),
    #[error("invalid path: {0}")]
    Path(String),
}

/// The path segments classification reads at most: `apis`, group, version, `watch`,
/// `namespaces`, namespace, resource, name, subresource; those after tell nothing more.
const PATH_SEGMENTS_READ: usize = 9;

/// Namespace subresources: `/api/v1/namespaces/<ns>/status` is about the namespace itself.
const NAMESPACE_SUBRESOURCES: [&str; 2] = ["status", "finalize"];

impl RequestInfo {
    /// Classifies `method` + `path_and_query` as kube-apiserver would; `user_agent` gives the component.
    pub fn classify(
        method: &Method,
        path_and_query: &str,
        user_agent: Option<&str>,
    ) -> Result<RequestInfo, ClassifyError> {
        let (path, raw_query) = match path_and_query.split_once('?') {
            Some((p, q)) => (p, q),
            None => (path_and_query, ""),
        };
        if !path.starts_with('/') {
            return Err(ClassifyError::Path(format!("{path:?} is not absolute")));
        }
        let query = parse_query(raw_query)?;
        let mut info = RequestInfo {
            is_resource_request: false,
            path: path.to_owned(),
            verb: Verb::from_method(method),
            api_prefix: "",
            api_group: String::new(),
            api_version: String::new(),
            namespace: String::new(),
            resource: String::new(),
            subresource: String::new(),
            name: String::new(),
            query,
            component: user_agent.and_then(component_of),
        };
        info.resolve_resource_parts(method, path);
        Ok(info)
    }

    /// The part of `NewRequestInfo` that walks `/api[s]/<group>/<version>/...`.
    fn resolve_resource_parts(&mut self, method: &Method, path: &str) {
        let mut kept = [""; PATH_SEGMENTS_READ];
        let mut count = 0;
        for segment in path.split('/').filter(|s| !s.is_empty()) {
            kept[count] = segment;
            count += 1;
            if count == kept.len() {
                break;
            }
        }
        let segments = &kept[..count];
        let Some((&prefix, mut rest)) = segments.split_first() else {
            return self.mark_non_resource(method);
        };
        if prefix != "api" && prefix != "apis" {
            return self.mark_non_resource(method);
        }
        // `/apis/<group>` alone, and `/api` or `/apis` alone, are discovery documents.
        let needed = if prefix == "api" { 2 } else { 3 };
        if segments.len() < needed {
            return self.mark_non_resource(method);
        }
        self.api_prefix = if prefix == "api" { "api" } else { "apis" };
        if prefix == "apis" {
            self.api_group = rest[0].to_owned();
            rest = &rest[1..];
        }
        self.api_version = rest[0].to_owned();
        rest = &rest[1..];
        if rest.is_empty() {
            // `/api/v1` and `/apis/<g>/<v>`: the group-version's resource list.
            return self.mark_non_resource(method);
        }
        self.is_resource_request = true;
        // Legacy `/api/v1/watch/...` and `/api/v1/proxy/...` forms carry the verb in the path.
        if matches!(rest[0], "watch" | "proxy") {
            self.verb = if rest[0] == "watch" {
                Verb::Watch
            } else {
                Verb::Proxy
            };
            rest = &rest[1..];
        }
        rest = self.take_namespace(rest);
        self.assign_resource_name_subresource(rest);
        self.derive_collection_verb();
    }

    fn take_namespace<'a>(&mut self, parts: &'a [&'a str]) -> &'a [&'a str] {
        if parts.first() != Some(&"namespaces") || parts.len() < 2 {
            return parts;
        }
        self.namespace = parts[1].to_owned();
        if parts.len() > 2 && !NAMESPACE_SUBRESOURCES.contains(&parts[2]) {
            return &parts[2..];
        }
        parts
    }

    fn assign_resource_name_subresource(&mut self, parts: &[&str]) {
        if let Some(r) = parts.first() {
            self.resource = (*r).to_owned();
        }
        if let Some(n) = parts.get(1) {
            self.name = (*n).to_owned();
        }
        // The proxy verb keeps the rest of the path for the proxied URL, not as a subresource.
        if self.verb != Verb::Proxy
            && let Some(s) = parts.get(2)
        {
            self.subresource = (*s).to_owned();
        }
    }

    fn derive_collection_verb(&mut self) {
        if self.name.is_empty() && self.verb == Verb::Get {
            self.verb = if self.query.watch {
                Verb::Watch
            } else {
                Verb::List
            };
        }
        if matches!(self.verb, Verb::List | Verb::Watch)
            && self.name.is_empty()
            && let Some(name) = self
                .query
                .field_selector
                .requires_exact_match("metadata.name")
            && is_valid_path_segment_name(name)
        {
            self.name = name.to_owned();
        }
        if self.name.is_empty() && self.verb == Verb::Delete {
            self.verb = Verb::DeleteCollection;
        }
    }

    fn mark_non_resource(&mut self, method: &Method) {
        self.is_resource_request = false;
        self.verb = match *method {
            Method::GET => Verb::Get,
            Method::POST => Verb::Create,
            Method::PUT => Verb::Update,
            Method::PATCH => Verb::Patch,
            Method::DELETE => Verb::Delete,
            Method::HEAD => Verb::Other(NonResourceVerb::Head),
            _ => Verb::from_method(method),
        };
    }

    /// `pods`, `pods/status`: the RBAC-style resource name used in logs and metrics labels.
    pub fn resource_label(&self) -> std::borrow::Cow<'_, str> {
        match (self.resource.is_empty(), self.subresource.is_empty()) {
            (true, _) => "".into(),
            (false, true) => self.resource.as_str().into(),
            (false, false) => format!("{}/{}", self.resource, self.subresource).into(),
        }
    }

    /// A long-running request whose response is a stream (no overall deadline applies).
    pub fn is_long_running(&self) -> bool {
        self.verb == Verb::Watch
            || self.verb == Verb::Proxy
            || matches!(
                self.subresource.as_str(),
                "exec" | "attach" | "portforward" | "log" | "proxy"
            )
    }
}

/// yurthub's component rule: the User-Agent, lower-cased, up to the first `/`.
pub fn component_of(user_agent: &str) -> Option<String> {
    let head = user_agent.split('/').next().unwrap_or_default().trim();
    (!head.is_empty()).then(|| head.to_ascii_lowercase())
}

/// apimachinery's `path.IsValidPathSegmentName`: a name that can stand in a URL path segment.
fn is_valid_path_segment_name(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains('/') && !name.contains('%')
}

fn parse_query(raw: &str) -> Result<QueryOptions, ClassifyError> {
    let mut opts = QueryOptions::default();
    for (key, value) in form_urlencoded::parse(raw.as_bytes()) {
        apply_query_param(&mut opts, &key, &value)?;
    }
    if raw.contains('%') {
        reject_invalid_percent_encoding(raw)?;
    }
    Ok(opts)
}

fn apply_query_param(opts: &mut QueryOptions, key: &str, value: &str) -> Result<(), ClassifyError> {
    match key {
        "watch" => opts.watch = parse_bool(key, value)?,
        "allowWatchBookmarks" => opts.allow_watch_bookmarks = parse_bool(key, value)?,
        "sendInitialEvents" => opts.send_initial_events = Some(parse_bool(key, value)?),
        "labelSelector" => {
            opts.label_selector = LabelSelector::parse(value)
                .map_err(|e| ClassifyError::LabelSelector(e.to_string()))?
        }
        "fieldSelector" => {
            opts.field_selector = FieldSelector::parse(value)
                .map_err(|e| ClassifyError::FieldSelector(e.to_string()))?
        }
        "resourceVersion" => opts.resource_version = Some(value.to_owned()),
        "resourceVersionMatch" => opts.resource_version_match = Some(value.to_owned()),
        "timeoutSeconds" => opts.timeout_seconds = Some(parse_u64(key, value)?),
        "limit" => opts.limit = Some(parse_u64(key, value)?),
        "continue" => opts.continue_token = Some(value.to_owned()),
        "timeout" => opts.timeout = Some(parse_go_duration(value)?),
        _ => {}
    }
    Ok(())
}

/// `form_urlencoded` silently keeps malformed escapes; kube-apiserver (Go's url.ParseQuery) rejects them.
fn reject_invalid_percent_encoding(raw: &str) -> Result<(), ClassifyError> {
    let bytes = raw.as_bytes();
    for (i, b) in bytes.iter().enumerate() {
        if *b == b'%' {
            let hex = bytes.get(i + 1..i + 3);
            let ok = hex.is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit));
            if !ok {
                return Err(ClassifyError::Query(format!(
                    "invalid URL escape {:?}",
                    String::from_utf8_lossy(&bytes[i..(i + 3).min(bytes.len())])
                )));
            }
        }
    }
    Ok(())
}

/// Go's `strconv.ParseBool`, which is what the apiserver's query decoding uses.
fn parse_bool(key: &str, value: &str) -> Result<bool, ClassifyError> {
    match value {
        "" | "1" | "t" | "T" | "true" | "TRUE" | "True" => Ok(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Ok(false),
        _ => Err(ClassifyError::Query(format!(
            "{key}: invalid boolean value {value:?}"
        ))),
    }
}

fn parse_u64(key: &str, value: &str) -> Result<u64, ClassifyError> {
    value
        .parse()
        .map_err(|_| ClassifyError::Query(format!("{key}: invalid integer value {value:?}")))
}

/// A Go duration such as `32s`, `5m0s`, `1h2m3.5s`, `250ms`, as client-go writes `?timeout=`.
pub fn parse_go_duration(value: &str) -> Result<std::time::Duration, ClassifyError> {
    let bad = || ClassifyError::Query(format!("timeout: invalid duration {value:?}"));
    if value == "0" {
        return Ok(std::time::Duration::ZERO);
    }
    let mut total = 0f64;
    let mut rest = value;
    if rest.is_empty() {
        return Err(bad());
    }
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(bad)?;
        let number: f64 = rest[..num_len].parse().map_err(|_| bad())?;
        rest = &rest[num_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(bad()),
        };
        total += number * scale;
        rest = &rest[unit_len..];
    }
    Ok(std::time::Duration::from_secs_f64(total))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn classify(method: Method, url: &str) -> RequestInfo {
        RequestInfo::classify(
            &method,
            url,
            Some("kubelet/v1.32.4 (linux/amd64) kubernetes/abc"),
        )
        .expect("classifies")
    }

    #[test]
    fn namespaced_get() {
        let i = classify(Method::GET, "/api/v1/namespaces/kube-system/pods/coredns");
        assert!(i.is_resource_request);
        assert_eq!(
            (i.verb, i.api_group.as_str(), i.api_version.as_str()),
            (Verb::Get, "", "v1")
        );
        assert_eq!(
            (i.namespace.as_str(), i.resource.as_str(), i.name.as_str()),
            ("kube-system", "pods", "coredns")
        );
        assert_eq!(i.component.as_deref(), Some("kubelet"));
    }

    #[test]
    fn collection_get_is_list_or_watch() {
        assert_eq!(classify(Method::GET, "/api/v1/pods").verb, Verb::List);
        let w = classify(Method::GET, "/api/v1/pods?watch=true&resourceVersion=10");
        assert_eq!(w.verb, Verb::Watch);
        assert_eq!(w.query.resource_version.as_deref(), Some("10"));
        assert_eq!(
            classify(Method::GET, "/api/v1/watch/pods").verb,
            Verb::Watch
        );
        assert_eq!(
            classify(Method::GET, "/api/v1/pods?watch=1").verb,
            Verb::Watch
        );
        assert_eq!(
            classify(Method::GET, "/api/v1/pods?watch=false").verb,
            Verb::List
        );
    }

    #[test]
    fn field_selector_name_becomes_name() {
        let i = classify(
            Method::GET,
            "/api/v1/namespaces/default/configmaps?fieldSelector=metadata.name%3Dkube-root-ca.crt&limit=500&resourceVersion=0",
        );
        assert_eq!(i.verb, Verb::List);
        assert_eq!(i.name, "kube-root-ca.crt");
        assert_eq!(i.query.limit, Some(500));
    }

    #[test]
    fn group_resources_and_subresources() {
        let i = classify(
            Method::PUT,
            "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/edge-1?timeout=10s",
        );
        assert_eq!(i.verb, Verb::Update);
        assert_eq!(i.api_group, "coordination.k8s.io");
        assert_eq!(i.resource_label(), "leases");
        assert_eq!(i.query.timeout, Some(std::time::Duration::from_secs(10)));
        let s = classify(Method::PATCH, "/api/v1/nodes/edge-1/status");
        assert_eq!(
            (
                s.verb,
                s.resource.as_str(),
                s.subresource.as_str(),
                s.namespace.as_str()
            ),
            (Verb::Patch, "nodes", "status", "")
        );
        let e = classify(
            Method::POST,
            "/api/v1/namespaces/default/pods/p1/exec?command=ls",
        );
        assert!(e.is_long_running());
    }

    #[test]
    fn namespaces_themselves() {
        // kube-apiserver sets the namespace of a namespace object to the object's own name.
        let i = classify(Method::GET, "/api/v1/namespaces/default");
        assert_eq!(
            (i.resource.as_str(), i.name.as_str()),
            ("namespaces", "default")
        );
        assert_eq!(i.namespace, "default");
        let s = classify(Method::PUT, "/api/v1/namespaces/default/finalize");
        assert_eq!(
            (s.resource.as_str(), s.name.as_str(), s.subresource.as_str()),
            ("namespaces", "default", "finalize")
        );
        assert_eq!(classify(Method::GET, "/api/v1/namespaces").verb, Verb::List);
    }

    #[test]
    fn delete_collection() {
        let i = classify(
            Method::DELETE,
            "/api/v1/namespaces/default/pods?labelSelector=app%3Dx",
        );
        assert_eq!(i.verb, Verb::DeleteCollection);
    }

    #[test]
    fn non_resource_paths() {
        for p in [
            "/version",
            "/api",
            "/apis",
            "/api/v1",
            "/apis/apps",
            "/apis/apps/v1",
            "/healthz",
            "/",
        ] {
            let i = classify(Method::GET, p);
            assert!(!i.is_resource_request, "{p}");
            assert_eq!(i.verb, Verb::Get, "{p}");
        }
    }

    #[test]
    fn component_rule() {
        assert_eq!(component_of("Kube-Proxy/v1.32"), Some("kube-proxy".into()));
        assert_eq!(component_of("coredns"), Some("coredns".into()));
        assert_eq!(component_of(""), None);
        assert_eq!(component_of("/x"), None);
    }

    #[test]
    fn malformed_queries_are_rejected() {
        let bad = [
            "/api/v1/pods?watch=maybe",
            "/api/v1/pods?limit=ten",
            "/api/v1/pods?labelSelector=a%3D%3D%3Db",
            "/api/v1/pods?fieldSelector=%zz",
            "/api/v1/pods?timeout=5parsecs",
            "/api/v1/pods?timeoutSeconds=-1",
        ];
        for url in bad {
            assert!(
                RequestInfo::classify(&Method::GET, url, None).is_err(),
                "{url} should be rejected"
            );
        }
        assert!(RequestInfo::classify(&Method::GET, "relative", None).is_err());
    }

    #[test]
    fn go_durations() {
        assert_eq!(parse_go_duration("5m0s").unwrap().as_secs(), 300);
        assert_eq!(parse_go_duration("1h2m3s").unwrap().as_secs(), 3723);
        assert_eq!(parse_go_duration("250ms").unwrap().as_millis(), 250);
        assert!(parse_go_duration("").is_err());
        assert!(parse_go_duration("10").is_err());
    }

    mod props {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            #[test]
            fn never_panics(path in "(/[a-z0-9.%?=&-]{0,12}){0,8}", ua in proptest::option::of(".{0,20}")) {
                let _ = RequestInfo::classify(&Method::GET, &path, ua.as_deref());
            }

            #[test]
            fn namespaced_object_paths_round_trip(
                ns in "[a-z][a-z0-9-]{0,10}",
                res in "[a-z]{1,10}",
                name in "[a-z][a-z0-9.-]{0,10}",
            ) {
                prop_assume!(res != "watch" && res != "proxy" && !NAMESPACE_SUBRESOURCES.contains(&res.as_str()));
                let url = format!("/api/v1/namespaces/{ns}/{res}/{name}");
                let i = RequestInfo::classify(&Method::GET, &url, None).unwrap();
                prop_assert!(i.is_resource_request);
                prop_assert_eq!(i.namespace, ns);
                prop_assert_eq!(i.resource, res);
                prop_assert_eq!(i.name, name);
                prop_assert_eq!(i.verb, Verb::Get);
            }

            #[test]
            fn group_collections_are_lists(
                group in "[a-z]{1,8}\\.[a-z]{2,5}",
                res in "[a-z]{1,10}",
            ) {
                prop_assume!(res != "watch" && res != "proxy" && res != "namespaces");
                let url = format!("/apis/{group}/v1/{res}");
                let i = RequestInfo::classify(&Method::GET, &url, None).unwrap();
                prop_assert_eq!(i.api_group, group);
                prop_assert_eq!(i.verb, Verb::List);
                prop_assert!(i.name.is_empty());
            }
        }
    }
}
