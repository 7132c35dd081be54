//! PATCH bodies: JSON patch (RFC 6902), JSON merge patch (RFC 7386) and a strategic-merge-patch
//! approximation.
//!
//! Strategic merge patch really needs each Go type's `patchMergeKey` tags. The approximation here
//! covers what clients send in practice: lists whose elements all carry a `name` (containers,
//! volumes, env, ports…) are merged by name, `conditions` (pods', nodes') by `type` as their
//! `patchMergeKey` says, `$patch: delete|replace` directives are honoured, and
//! other `$`-prefixed directives (`$setElementOrder/…`, `$retainKeys`, `$deleteFromPrimitiveList/…`)
//! are dropped. Everything else behaves as a merge patch.

use outpost_core::{Reason, Status};
use serde_json::{Map, Value};

/// The patch flavours kube-apiserver accepts, by `Content-Type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchType {
    Json,
    Merge,
    Strategic,
}

impl PatchType {
    /// `None` for any other media type (apply patches included), which the caller answers with 415.
    pub fn from_content_type(content_type: &str) -> Option<PatchType> {
        let media = content_type.split(';').next().unwrap_or("").trim();
        match media {
            "application/json-patch+json" => Some(PatchType::Json),
            "application/merge-patch+json" => Some(PatchType::Merge),
            "application/strategic-merge-patch+json" => Some(PatchType::Strategic),
            _ => None,
        }
    }
}

/// kube-apiserver's 415 for a patch media type it does not support for the resource.
pub fn unsupported_media_type(builtin: bool) -> Status {
    let accepted = if builtin {
        "application/json-patch+json, application/merge-patch+json, application/strategic-merge-patch+json"
    } else {
        "application/json-patch+json, application/merge-patch+json"
    };
    Status::new(
        Reason::UnsupportedMediaType,
        format!(
            "the body of the request was in an unknown format - accepted media types include: {accepted}"
        ),
    )
}

/// Applies `body` to `doc` in place.
pub fn apply(doc: &mut Value, kind: PatchType, body: &[u8]) -> Result<(), Status> {
    let patch: Value = serde_json::from_slice(body)
        .map_err(|e| Status::bad_request(format!("error decoding patch: {e}")))?;
    match kind {
        PatchType::Json => {
            let ops: json_patch::Patch = serde_json::from_value(patch)
                .map_err(|e| Status::bad_request(format!("error decoding patch: {e}")))?;
            json_patch::patch(doc, &ops.0).map_err(|e| invalid_patch(&e.to_string()))
        }
        PatchType::Merge => {
            require_object(&patch)?;
            json_patch::merge(doc, &patch);
            Ok(())
        }
        PatchType::Strategic => {
            require_object(&patch)?;
            strategic_merge(doc, &patch);
            Ok(())
        }
    }
}

fn require_object(patch: &Value) -> Result<(), Status> {
    if patch.is_object() {
        Ok(())
    } else {
        Err(Status::bad_request(
            "error decoding patch: a merge patch must be a JSON object",
        ))
    }
}

/// kube-apiserver answers a JSON patch that cannot be applied with a generic 422.
fn invalid_patch(detail: &str) -> Status {
    Status::new(
        Reason::Invalid,
        format!("the server rejected our request due to an error in our request: {detail}"),
    )
}

fn strategic_merge(doc: &mut Value, patch: &Value) {
    let Some(patch_map) = patch.as_object() else {
        *doc = patch.clone();
        return;
    };
    if patch_map.get("$patch").and_then(Value::as_str) == Some("replace") {
        *doc = Value::Object(without_directives(patch_map));
        return;
    }
    if !doc.is_object() {
        *doc = Value::Object(Map::new());
    }
    let Some(target) = doc.as_object_mut() else {
        return;
    };
    for (key, value) in patch_map {
        if key.starts_with('$') {
            continue;
        }
        match value {
            Value::Null => {
                target.shift_remove(key);
            }
            Value::Object(_) => {
                strategic_merge(target.entry(key.clone()).or_insert(Value::Null), value)
            }
            Value::Array(items) => {
                let merged = merge_list(merge_key(key), target.get(key), items);
                target.insert(key.clone(), merged);
            }
            _ => {
                target.insert(key.clone(), value.clone());
            }
        }
    }
}

fn without_directives(map: &Map<String, Value>) -> Map<String, Value> {
    map.iter()
        .filter(|(k, _)| !k.starts_with('$'))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// The `patchMergeKey` of a list field: `type` for status conditions, else `name`.
fn merge_key(field: &str) -> &'static str {
    match field {
        "conditions" => "type",
        _ => "name",
    }
}

/// Lists whose elements all carry the merge key merge by it; any other list is replaced.
fn merge_list(key: &str, current: Option<&Value>, patch: &[Value]) -> Value {
    let key_of = |v: &Value| v.get(key).and_then(Value::as_str).map(str::to_owned);
    let keyed = !patch.is_empty() && patch.iter().all(|v| key_of(v).is_some());
    let Some(Value::Array(existing)) = current.filter(|_| keyed) else {
        return Value::Array(patch.iter().filter(|v| !is_delete(v)).cloned().collect());
    };
    let mut out = existing.clone();
    for item in patch {
        let name = key_of(item);
        let pos = out.iter().position(|e| key_of(e) == name);
        match (pos, is_delete(item)) {
            (Some(i), true) => {
                out.remove(i);
            }
            (None, true) => {}
            (Some(i), false) => strategic_merge(&mut out[i], item),
            (None, false) => {
                let mut fresh = Value::Object(Map::new());
                strategic_merge(&mut fresh, item);
                out.push(fresh);
            }
        }
    }
    Value::Array(out)
}

fn is_delete(v: &Value) -> bool {
    v.get("$patch").and_then(Value::as_str) == Some("delete")
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn patched(doc: Value, kind: PatchType, patch: Value) -> Result<Value, Status> {
        let mut doc = doc;
        apply(&mut doc, kind, patch.to_string().as_bytes())?;
        Ok(doc)
    }

    #[test]
    fn content_types_map_to_patch_types() {
        assert_eq!(
            PatchType::from_content_type("application/merge-patch+json; charset=utf-8"),
            Some(PatchType::Merge)
        );
        assert_eq!(
            PatchType::from_content_type("application/apply-patch+yaml"),
            None
        );
        assert_eq!(PatchType::from_content_type("application/json"), None);
        assert_eq!(unsupported_media_type(false).code, 415);
    }

    #[test]
    fn merge_patch_replaces_lists_and_deletes_nulls() {
        let doc = json!({"a": {"b": 1, "c": 2}, "l": [1, 2]});
        let out = patched(doc, PatchType::Merge, json!({"a": {"c": null}, "l": [3]})).unwrap();
        assert_eq!(out, json!({"a": {"b": 1}, "l": [3]}));
    }

    #[test]
    fn json_patch_applies_and_reports_failures_as_422() {
        let doc = json!({"metadata": {"labels": {"a": "1"}}});
        let ops = json!([{"op": "add", "path": "/metadata/labels/b", "value": "2"}]);
        let out = patched(doc.clone(), PatchType::Json, ops).unwrap();
        assert_eq!(out["metadata"]["labels"]["b"], "2");
        let bad = json!([{"op": "test", "path": "/metadata/labels/a", "value": "9"}]);
        assert_eq!(patched(doc, PatchType::Json, bad).unwrap_err().code, 422);
    }

    #[test]
    fn strategic_merge_merges_conditions_by_type() {
        let doc = json!({"status": {"conditions": [
            {"type": "Ready", "status": "True"},
            {"type": "PodNeedUpgrade", "status": "True", "message": "rev-2"}
        ]}});
        let patch = json!({"status": {"conditions": [
            {"type": "PodImageReady", "status": "False"},
            {"type": "Ready", "status": "False"}
        ]}});
        let out = patched(doc, PatchType::Strategic, patch).unwrap();
        assert_eq!(
            out["status"]["conditions"],
            json!([
                {"type": "Ready", "status": "False"},
                {"type": "PodNeedUpgrade", "status": "True", "message": "rev-2"},
                {"type": "PodImageReady", "status": "False"}
            ])
        );
    }

    #[test]
    fn strategic_merge_merges_named_lists() {
        let doc = json!({"spec": {"containers": [{"name": "a", "image": "x"}, {"name": "b", "image": "y"}]}});
        let patch = json!({"spec": {
            "$setElementOrder/containers": [{"name": "a"}, {"name": "b"}],
            "containers": [{"name": "b", "image": "z"}, {"name": "c", "image": "w"}]
        }});
        let out = patched(doc, PatchType::Strategic, patch).unwrap();
        assert_eq!(
            out["spec"]["containers"],
            json!([{"name": "a", "image": "x"}, {"name": "b", "image": "z"}, {"name": "c", "image": "w"}])
        );
        assert!(out["spec"].get("$setElementOrder/containers").is_none());
    }

    #[test]
    fn strategic_merge_honours_delete_and_replace() {
        let doc = json!({"l": [{"name": "a"}, {"name": "b"}], "m": {"x": 1, "y": 2}});
        let patch =
            json!({"l": [{"name": "a", "$patch": "delete"}], "m": {"$patch": "replace", "z": 3}});
        let out = patched(doc, PatchType::Strategic, patch).unwrap();
        assert_eq!(out, json!({"l": [{"name": "b"}], "m": {"z": 3}}));
    }

    #[test]
    fn non_object_merge_patches_are_rejected() {
        let err = patched(json!({}), PatchType::Merge, json!([1])).unwrap_err();
        assert_eq!(err.code, 400);
    }
}
