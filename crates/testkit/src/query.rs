//! List/watch query options: decoding (with apimachinery's lenient conversions), defaulting and
//! validation (`SetListOptionsDefaults`, `ValidateListOptions` with WatchList on, as in 1.32),
//! selector filters, and etcd3-style `continue` tokens.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use outpost_core::selector::{FieldSelector, LabelSelector};
use outpost_core::{Reason, Status};
use serde_json::{Value, json};

use crate::reply::ApiError;
use crate::resources::ResourceDef;

/// The subset of `metav1.ListOptions` the fake acts on.
#[derive(Debug, Clone, Default)]
pub struct ListOptions {
    pub label_selector: LabelSelector,
    pub field_selector: FieldSelector,
    pub resource_version: String,
    pub resource_version_match: String,
    pub limit: u64,
    pub continue_token: String,
    pub watch: bool,
    pub allow_watch_bookmarks: bool,
    pub send_initial_events: Option<bool>,
    pub timeout_seconds: Option<u64>,
}

/// `Convert_Slice_string_To_bool`: anything but `0` / `false` (any case) is true.
fn go_bool(v: &str) -> bool {
    !(v == "0" || v.eq_ignore_ascii_case("false"))
}

fn go_int(key: &str, v: &str) -> Result<u64, ApiError> {
    let n: i64 = v.parse().map_err(|_| {
        Status::bad_request(format!(
            "{key}: strconv.ParseInt: parsing {v:?}: invalid syntax"
        ))
    })?;
    Ok(n.max(0) as u64)
}

/// Query parameters in order; repeated keys keep the first value, like Go's `url.Values.Get`.
pub fn params(query: &str) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for (k, v) in form_urlencoded::parse(query.as_bytes()) {
        if !out.iter().any(|(seen, _)| *seen == k) {
            out.push((k.into_owned(), v.into_owned()));
        }
    }
    out
}

pub fn param<'a>(params: &'a [(String, String)], key: &str) -> Option<&'a str> {
    params
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

impl ListOptions {
    /// Decodes the query; selector syntax errors are 400s with apimachinery's message.
    pub fn decode(query: &str) -> Result<ListOptions, ApiError> {
        let mut o = ListOptions::default();
        for (k, v) in params(query) {
            match k.as_str() {
                "labelSelector" => {
                    o.label_selector =
                        LabelSelector::parse(&v).map_err(|e| Status::bad_request(e.0))?
                }
                "fieldSelector" => {
                    o.field_selector =
                        FieldSelector::parse(&v).map_err(|e| Status::bad_request(e.0))?
                }
                "resourceVersion" => o.resource_version = v,
                "resourceVersionMatch" => o.resource_version_match = v,
                "limit" => o.limit = go_int("limit", &v)?,
                "continue" => o.continue_token = v,
                "watch" => o.watch = go_bool(&v),
                "allowWatchBookmarks" => o.allow_watch_bookmarks = go_bool(&v),
                "sendInitialEvents" => o.send_initial_events = Some(go_bool(&v)),
                "timeoutSeconds" => o.timeout_seconds = Some(go_int("timeoutSeconds", &v)?),
                _ => {}
            }
        }
        Ok(o)
    }

    /// The name a `metadata.name=` field selector pins, as `RequestInfo` reads it for authz.
    pub fn selected_name(&self) -> Option<&str> {
        self.field_selector
            .requires_exact_match("metadata.name")
            .filter(|n| {
                !n.is_empty() && !n.contains('/') && !n.contains('%') && *n != "." && *n != ".."
            })
    }

    /// `SetListOptionsDefaults` (WatchList on): a legacy watch from "now" becomes a
    /// `sendInitialEvents=true` watch.
    pub fn apply_defaults(&mut self) {
        if self.send_initial_events.is_some() || !self.resource_version_match.is_empty() {
            return;
        }
        let legacy = self.resource_version.is_empty() || self.resource_version == "0";
        if self.watch && legacy {
            self.send_initial_events = Some(true);
            self.resource_version_match = "NotOlderThan".into();
        }
    }

    /// `ValidateListOptions`; violations are a 422 on `ListOptions.meta.k8s.io`.
    pub fn validate(&self) -> Result<(), ApiError> {
        let errs = if self.watch {
            self.watch_errors()
        } else {
            self.list_errors()
        };
        if errs.is_empty() {
            return Ok(());
        }
        let details: Vec<String> = errs.iter().map(FieldError::to_string).collect();
        let aggregate = if details.len() == 1 {
            details[0].clone()
        } else {
            format!("[{}]", details.join(", "))
        };
        let status = Status::new(
            Reason::Invalid,
            format!("ListOptions.meta.k8s.io \"\" is invalid: {aggregate}"),
        )
        .with_details("meta.k8s.io", "ListOptions", "");
        let mut err = ApiError::from(status);
        for e in &errs {
            err = err.with_cause(e.cause, &e.body(), e.field);
        }
        Err(err)
    }

    fn watch_errors(&self) -> Vec<FieldError> {
        let m = self.resource_version_match.as_str();
        let mut errs = Vec::new();
        if self.send_initial_events.is_some() && m != "NotOlderThan" {
            errs.push(FieldError::forbidden(
                "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
            ));
        }
        if !m.is_empty() {
            if self.send_initial_events.is_none() {
                errs.push(FieldError::forbidden(
                    "resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided",
                ));
            }
            if m != "NotOlderThan" {
                errs.push(FieldError::not_supported(m, "\"NotOlderThan\""));
            }
            if !self.continue_token.is_empty() {
                errs.push(FieldError::forbidden(
                    "resourceVersionMatch is forbidden when continue is provided",
                ));
            }
        }
        errs
    }

    fn list_errors(&self) -> Vec<FieldError> {
        let m = self.resource_version_match.as_str();
        let mut errs = Vec::new();
        if !m.is_empty() {
            if self.resource_version.is_empty() {
                errs.push(FieldError::forbidden(
                    "resourceVersionMatch is forbidden unless resourceVersion is provided",
                ));
            }
            if !self.continue_token.is_empty() {
                errs.push(FieldError::forbidden(
                    "resourceVersionMatch is forbidden when continue is provided",
                ));
            }
            if m != "Exact" && m != "NotOlderThan" {
                errs.push(FieldError::not_supported(
                    m,
                    "\"Exact\", \"NotOlderThan\", \"\"",
                ));
            }
            if m == "Exact" && self.resource_version == "0" {
                errs.push(FieldError::forbidden(
                    "resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\"",
                ));
            }
        }
        if self.send_initial_events.is_some() {
            errs.push(FieldError {
                field: "sendInitialEvents",
                cause: "FieldValueForbidden",
                detail: "Forbidden: sendInitialEvents is forbidden for list".into(),
            });
        }
        errs
    }

    /// Rejects field selector labels the type has no conversion for (400, as the handler does).
    pub fn check_fields(&self, def: &ResourceDef) -> Result<(), ApiError> {
        for field in self.field_selector.fields() {
            if !def.supports_field(field) {
                return Err(Status::bad_request(def.unsupported_field_message(field)).into());
            }
        }
        Ok(())
    }

    pub fn filter<'a>(&'a self, def: &'a ResourceDef) -> Filter<'a> {
        Filter {
            def,
            labels: &self.label_selector,
            fields: &self.field_selector,
        }
    }

    pub fn has_selectors(&self) -> bool {
        !self.label_selector.is_empty() || !self.field_selector.is_empty()
    }
}

/// One `field.Error` of the validation.
struct FieldError {
    field: &'static str,
    cause: &'static str,
    detail: String,
}

impl FieldError {
    fn forbidden(detail: &str) -> Self {
        FieldError {
            field: "resourceVersionMatch",
            cause: "FieldValueForbidden",
            detail: format!("Forbidden: {detail}"),
        }
    }

    fn not_supported(value: &str, supported: &str) -> Self {
        FieldError {
            field: "resourceVersionMatch",
            cause: "FieldValueNotSupported",
            detail: format!("Unsupported value: {value:?}: supported values: {supported}"),
        }
    }

    fn body(&self) -> String {
        self.detail.clone()
    }
}

impl std::fmt::Display for FieldError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.detail)
    }
}

/// Label and field selectors applied to stored objects.
pub struct Filter<'a> {
    def: &'a ResourceDef,
    labels: &'a LabelSelector,
    fields: &'a FieldSelector,
}

impl Filter<'_> {
    pub fn matches(&self, obj: &Value) -> bool {
        let labels = obj.pointer("/metadata/labels").and_then(Value::as_object);
        self.labels.matches_json(labels) && self.fields.matches(&|f| self.def.field_value(obj, f))
    }
}

/// A decoded `continue` token: the snapshot revision (-1 = "latest") and the first key to return.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Continue {
    pub rv: i64,
    pub start: String,
}

/// etcd3's `EncodeContinue`: URL-safe base64 of `{"v":"meta.k8s.io/v1","rv":N,"start":"<key>\0"}`.
pub fn encode_continue(rv: i64, last_key: &str) -> String {
    let token = json!({"v": "meta.k8s.io/v1", "rv": rv, "start": format!("{last_key}\u{0}")});
    URL_SAFE_NO_PAD.encode(token.to_string())
}

pub fn decode_continue(token: &str) -> Result<Continue, ApiError> {
    let invalid = |why: &str| -> ApiError {
        Status::bad_request(format!(
            "invalid continue token: continue key is not valid: {why}"
        ))
        .into()
    };
    let raw = URL_SAFE_NO_PAD
        .decode(token.trim_end_matches('='))
        .map_err(|e| invalid(&e.to_string()))?;
    let v: Value = serde_json::from_slice(&raw).map_err(|e| invalid(&e.to_string()))?;
    if v["v"] != "meta.k8s.io/v1" {
        return Err(invalid("server does not recognize this encoded key"));
    }
    let rv = v["rv"].as_i64().unwrap_or(0);
    if rv == 0 {
        return Err(invalid(
            "incorrect encoded start resourceVersion (version meta.k8s.io/v1)",
        ));
    }
    let start = v["start"].as_str().unwrap_or("");
    if start.is_empty() {
        return Err(invalid("encoded start key empty"));
    }
    Ok(Continue {
        rv,
        start: start.to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::by_gvr;

    #[test]
    fn booleans_are_lenient_like_apimachinery() {
        let o =
            ListOptions::decode("watch=yes&allowWatchBookmarks=0&sendInitialEvents=False").unwrap();
        assert!(o.watch);
        assert!(!o.allow_watch_bookmarks);
        assert_eq!(o.send_initial_events, Some(false));
        assert!(ListOptions::decode("limit=x").is_err());
    }

    #[test]
    fn selectors_are_parsed_and_checked() {
        let o = ListOptions::decode("fieldSelector=spec.nodeName%3Dedge-1&labelSelector=app%3Dweb")
            .unwrap();
        let pods = by_gvr("v1/pods").unwrap();
        assert!(o.check_fields(pods).is_ok());
        let cms = by_gvr("v1/configmaps").unwrap();
        let err = o.check_fields(cms).unwrap_err();
        assert_eq!(err.status.code, 400);
        let bad = ListOptions::decode("labelSelector=a%20b").unwrap_err();
        assert_eq!(bad.status.code, 400);
        let named = ListOptions::decode("fieldSelector=metadata.name%3Dcfg").unwrap();
        assert_eq!(named.selected_name(), Some("cfg"));
    }

    #[test]
    fn watch_defaults_turn_on_initial_events() {
        let mut o = ListOptions::decode("watch=1&resourceVersion=0").unwrap();
        o.apply_defaults();
        assert_eq!(o.send_initial_events, Some(true));
        assert!(o.validate().is_ok());
        let mut o = ListOptions::decode("watch=1&resourceVersion=10").unwrap();
        o.apply_defaults();
        assert_eq!(o.send_initial_events, None);
    }

    #[test]
    fn send_initial_events_requires_not_older_than() {
        let mut o = ListOptions::decode("watch=1&sendInitialEvents=true").unwrap();
        o.apply_defaults();
        let err = o.validate().unwrap_err();
        assert_eq!(err.status.code, 422);
        assert_eq!(
            err.status.message,
            "ListOptions.meta.k8s.io \"\" is invalid: resourceVersionMatch: Forbidden: sendInitialEvents requires setting resourceVersionMatch to NotOlderThan"
        );
        assert_eq!(err.causes[0].2, "resourceVersionMatch");
    }

    #[test]
    fn list_validation() {
        let o = ListOptions::decode("resourceVersionMatch=Exact").unwrap();
        assert!(o.validate().is_err());
        let o = ListOptions::decode("resourceVersionMatch=Exact&resourceVersion=5").unwrap();
        assert!(o.validate().is_ok());
        let o = ListOptions::decode("sendInitialEvents=true").unwrap();
        assert!(o.validate().is_err());
    }

    #[test]
    fn continue_tokens_round_trip() {
        let token = encode_continue(42, "kube-system/coredns");
        let c = decode_continue(&token).unwrap();
        assert_eq!(
            c,
            Continue {
                rv: 42,
                start: "kube-system/coredns\u{0}".into()
            }
        );
        assert_eq!(decode_continue("!!").unwrap_err().status.code, 400);
        let zero = URL_SAFE_NO_PAD.encode(r#"{"v":"meta.k8s.io/v1","rv":0,"start":"a"}"#);
        assert!(decode_continue(&zero).is_err());
    }
}
