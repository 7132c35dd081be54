//! The `Autonomy` node condition, as yurthub reports it, with one fix: autonomy is on when the
//! node carries the deprecated `node.beta.openyurt.io/autonomy=true` *or* the recommended
//! `node.openyurt.io/autonomy-duration` (yurthub honours only the first, so a node configured the
//! recommended way reports `Autonomy=False`). A node labelled `openyurt.io/is-edge-worker=false`
//! is never autonomous. With autonomy on, the condition is `True` while the edge cache persists
//! writes, and `Unknown` ("cache failed") after more than three consecutive checks that found it
//! degraded. The wording matches yurthub's, so dashboards keep working.

use serde_json::{Value, json};

const DEPRECATED_ANNOTATION: &str = "node.beta.openyurt.io/autonomy";
const DURATION_ANNOTATION: &str = "node.openyurt.io/autonomy-duration";
const EDGE_WORKER_LABEL: &str = "openyurt.io/is-edge-worker";
/// yurthub's threshold before a failing cache turns the condition Unknown.
const MAX_CACHE_FAILURES: u32 = 3;

/// (status, reason, message) the node should carry.
pub fn desired(
    node: &Value,
    cache_failures: u32,
) -> Option<(&'static str, &'static str, &'static str)> {
    let annotations = &node["metadata"]["annotations"];
    let enabled = annotations[DEPRECATED_ANNOTATION] == "true"
        || annotations[DURATION_ANNOTATION]
            .as_str()
            .is_some_and(|d| !d.is_empty());
    let edge = node["metadata"]["labels"][EDGE_WORKER_LABEL] != "false";
    if !(enabled && edge) {
        return Some((
            "False",
            "autonomy disabled",
            "The autonomy is disabled or this node is not edge node",
        ));
    }
    if cache_failures == 0 {
        return Some((
            "True",
            "autonomy enabled successfully",
            "The autonomy is enabled and it works fine",
        ));
    }
    // Between the first failure and the threshold the condition keeps its value.
    (cache_failures > MAX_CACHE_FAILURES).then_some((
        "Unknown",
        "cache failed",
        "The edge cache cannot persist writes",
    ))
}

/// The node's conditions with `Autonomy` set as [`desired`] says, or `None` when it already is.
pub fn updated_conditions(node: &Value, cache_failures: u32) -> Option<Vec<Value>> {
    let (status, reason, message) = desired(node, cache_failures)?;
    let mut conditions: Vec<Value> = node["status"]["conditions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let now = crate::rfc3339_now();
    match conditions.iter_mut().find(|c| c["type"] == "Autonomy") {
        Some(c) if c["status"] == status && c["reason"] == reason && c["message"] == message => {
            None
        }
        Some(c) => {
            if c["status"] != status {
                c["lastTransitionTime"] = json!(now);
            }
            c["status"] = json!(status);
            c["reason"] = json!(reason);
            c["message"] = json!(message);
            c["lastHeartbeatTime"] = json!(now);
            Some(conditions)
        }
        None => {
            conditions.push(json!({
                "type": "Autonomy", "status": status, "reason": reason, "message": message,
                "lastHeartbeatTime": now, "lastTransitionTime": now,
            }));
            Some(conditions)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(annotations: Value, labels: Value) -> Value {
        json!({"metadata": {"name": "n", "annotations": annotations, "labels": labels},
               "status": {"conditions": [{"type": "Ready", "status": "True"}]}})
    }

    #[test]
    fn both_annotations_enable_autonomy() {
        let old = node(json!({DEPRECATED_ANNOTATION: "true"}), json!({}));
        let new = node(json!({DURATION_ANNOTATION: "0"}), json!({}));
        let none = node(json!({}), json!({}));
        let not_edge = node(
            json!({DURATION_ANNOTATION: "1h"}),
            json!({EDGE_WORKER_LABEL: "false"}),
        );
        assert_eq!(desired(&old, 0).unwrap().0, "True");
        assert_eq!(
            desired(&new, 0).unwrap().0,
            "True",
            "yurthub says False here"
        );
        assert_eq!(desired(&none, 0).unwrap().0, "False");
        assert_eq!(desired(&not_edge, 0).unwrap().0, "False");
    }

    #[test]
    fn a_failing_cache_turns_unknown_after_three_checks() {
        let n = node(json!({DURATION_ANNOTATION: "0"}), json!({}));
        assert!(desired(&n, 1).is_none(), "keeps its value at first");
        assert!(desired(&n, 3).is_none());
        assert_eq!(
            desired(&n, 4).unwrap(),
            (
                "Unknown",
                "cache failed",
                "The edge cache cannot persist writes"
            )
        );
    }

    #[test]
    fn updates_only_when_something_changes() {
        let n = node(json!({DURATION_ANNOTATION: "0"}), json!({}));
        let conditions = updated_conditions(&n, 0).expect("Autonomy added");
        assert_eq!(conditions.len(), 2);
        let mut with = n.clone();
        with["status"]["conditions"] = json!(conditions);
        assert!(updated_conditions(&with, 0).is_none(), "already right");
        let flipped = updated_conditions(&with, 5).expect("Unknown now");
        let autonomy = flipped.iter().find(|c| c["type"] == "Autonomy").unwrap();
        assert_eq!(autonomy["status"], "Unknown");
        assert!(
            autonomy["lastTransitionTime"]
                .as_str()
                .unwrap()
                .ends_with('Z')
        );
    }
}
