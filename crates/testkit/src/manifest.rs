//! Kubernetes YAML manifests (`---`-separated documents) as JSON values, so tests can load the
//! repository's manifests into the fake (for instance with [`FakeApiServer::apply_rbac`]).
//!
//! [`FakeApiServer::apply_rbac`]: crate::FakeApiServer::apply_rbac

use std::path::Path;

use serde_json::Value;

use crate::TestkitError;

/// The documents of a multi-document YAML text, in order. Empty documents (a leading or trailing
/// `---`, comments only) are skipped by the parser, and `kind: List` documents are flattened into
/// their items, as kubectl does.
pub fn parse_yaml(text: &str) -> Result<Vec<Value>, TestkitError> {
    let documents: Vec<Value> =
        serde_saphyr::from_multiple(text).map_err(|e| TestkitError::Manifest(e.to_string()))?;
    let mut out = Vec::new();
    for (i, value) in documents.into_iter().enumerate() {
        if !value.is_object() {
            return Err(TestkitError::Manifest(format!(
                "document {}: not an object: {value}",
                i + 1
            )));
        }
        match value.get("items").and_then(Value::as_array) {
            Some(items) if value["kind"] == "List" => out.extend(items.iter().cloned()),
            _ => out.push(value),
        }
    }
    Ok(out)
}

/// [`parse_yaml`] of a file.
pub fn load_yaml(path: impl AsRef<Path>) -> Result<Vec<Value>, TestkitError> {
    let path = path.as_ref();
    let text = std::fs::read_to_string(path)
        .map_err(|e| TestkitError::Manifest(format!("{}: {e}", path.display())))?;
    parse_yaml(&text).map_err(|e| TestkitError::Manifest(format!("{}: {e}", path.display())))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn multi_document_yaml_becomes_json_objects() {
        let text = "---\n# just a comment\n---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a\n  labels: {x: \"1\"}\ndata:\n  n: \"2\"\n---\nkind: List\nitems:\n- {kind: Namespace, metadata: {name: b}}\n- kind: Namespace\n  metadata: {name: c}\n---\n";
        let docs = parse_yaml(text).unwrap();
        assert_eq!(
            docs,
            [
                json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a", "labels": {"x": "1"}}, "data": {"n": "2"}}),
                json!({"kind": "Namespace", "metadata": {"name": "b"}}),
                json!({"kind": "Namespace", "metadata": {"name": "c"}}),
            ]
        );
        assert!(parse_yaml("a: [\n").is_err());
        assert!(parse_yaml("- 1\n- 2\n").is_err());
        assert!(load_yaml("/nonexistent/manifest.yaml").is_err());
    }

    #[test]
    fn loads_the_repository_rbac_manifest() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../manifests/cluster/rbac.yaml"
        );
        let docs = load_yaml(path).unwrap();
        let kinds: Vec<&str> = docs.iter().map(|d| d["kind"].as_str().unwrap()).collect();
        assert_eq!(kinds, ["ClusterRole", "ClusterRoleBinding"]);
        assert_eq!(docs[0]["rules"][0]["apiGroups"], json!([""]));
    }
}
