//! What kubeadm sets up for bootstrap-token discovery and TLS bootstrap (`kubeadm join
//! --token`, yurthub's `--join-token`), for `FakeApiServer::add_bootstrap_token`:
//!
//! - the token `<id>.<secret>` authenticates as `system:bootstrap:<id>` in `system:bootstrappers`
//!   (the bootstrap token authenticator);
//! - ConfigMap `kube-public/cluster-info` holds `kubeconfig` (the cluster's CA and URL, as
//!   `kubeadm init` writes it) and `jws-kubeconfig-<id>`, a detached JWS of it keyed with the
//!   token's secret (kube-controller-manager's bootstrap-signer, `k8s.io/cluster-bootstrap`'s
//!   `jws.ComputeDetachedSignature`);
//! - Role and RoleBinding `kube-public/kubeadm:bootstrap-signer-clusterinfo` let
//!   `system:anonymous` get that one ConfigMap.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use outpost_core::Status;
use serde_json::{Value, json};

pub const KUBE_PUBLIC: &str = "kube-public";
/// `bootstrapapi.ConfigMapClusterInfo`.
pub const CLUSTER_INFO: &str = "cluster-info";
/// `bootstrapapi.KubeConfigKey`.
pub const KUBECONFIG_KEY: &str = "kubeconfig";
/// `bootstrapapi.JWSSignatureKeyPrefix`.
pub const JWS_KEY_PREFIX: &str = "jws-kubeconfig-";
/// kubeadm's `BootstrapSignerClusterRoleName`, the name of both the Role and the RoleBinding.
pub const CLUSTER_INFO_ROLE: &str = "kubeadm:bootstrap-signer-clusterinfo";
/// `bootstrapapi.BootstrapUserPrefix`.
pub const USER_PREFIX: &str = "system:bootstrap:";
/// `bootstrapapi.BootstrapDefaultGroup`.
pub const BOOTSTRAPPERS: &str = "system:bootstrappers";

/// `<id>.<secret>` split, if the token has kubeadm's shape `[a-z0-9]{6}\.[a-z0-9]{16}`
/// (`bootstrapapi.BootstrapTokenPattern`); a 400 Status otherwise.
pub fn parse_token(token: &str) -> Result<(&str, &str), Status> {
    let well_formed = |part: &str, len: usize| {
        part.len() == len
            && part
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
    };
    match token.split_once('.') {
        Some((id, secret)) if well_formed(id, 6) && well_formed(secret, 16) => Ok((id, secret)),
        // The secret stays out of the message.
        _ => Err(Status::bad_request(
            "a bootstrap token must match [a-z0-9]{6}\\.[a-z0-9]{16}",
        )),
    }
}

/// The detached compact JWS `ComputeDetachedSignature` makes: header `{"alg":"HS256","kid":id}`,
/// HMAC-SHA256 keyed with the secret over `header.payload` (both base64url without padding),
/// written as `header..signature`.
pub fn detached_jws(id: &str, secret: &str, payload: &[u8]) -> String {
    let header = json!({"alg": "HS256", "kid": id}).to_string();
    let header_b64 = URL_SAFE_NO_PAD.encode(header);
    let signing_input = format!("{header_b64}.{}", URL_SAFE_NO_PAD.encode(payload));
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret.as_bytes());
    let tag = ring::hmac::sign(&key, signing_input.as_bytes());
    format!("{header_b64}..{}", URL_SAFE_NO_PAD.encode(tag.as_ref()))
}

/// `cluster-info` with `signature` added under `jws-kubeconfig-<id>` to `current` (if any): the
/// `kubeconfig` already there is kept, as kubeadm creates the ConfigMap only if it is missing and
/// the signer signs what it holds. `data` keys are sorted, as kube-apiserver writes a map.
pub fn cluster_info(current: Option<Value>, kubeconfig: &str, id: &str, secret: &str) -> Value {
    let mut obj = current
        .unwrap_or_else(|| json!({"metadata": {"name": CLUSTER_INFO, "namespace": KUBE_PUBLIC}}));
    let mut data: Vec<(String, Value)> = obj
        .get("data")
        .and_then(Value::as_object)
        .map(|d| d.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
        .unwrap_or_default();
    let signed = match data.iter().find(|(k, _)| k == KUBECONFIG_KEY) {
        Some((_, Value::String(existing))) => existing.clone(),
        _ => {
            data.retain(|(k, _)| k != KUBECONFIG_KEY);
            data.push((KUBECONFIG_KEY.to_owned(), kubeconfig.into()));
            kubeconfig.to_owned()
        }
    };
    let jws_key = format!("{JWS_KEY_PREFIX}{id}");
    data.retain(|(k, _)| *k != jws_key);
    data.push((jws_key, detached_jws(id, secret, signed.as_bytes()).into()));
    data.sort_by(|a, b| a.0.cmp(&b.0));
    obj["data"] = Value::Object(data.into_iter().collect());
    obj
}

/// kubeadm's `CreateClusterInfoRBACRules`: anonymous may get `kube-public/cluster-info`.
pub fn cluster_info_rbac() -> [Value; 2] {
    let metadata = json!({"name": CLUSTER_INFO_ROLE, "namespace": KUBE_PUBLIC});
    [
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": metadata,
            "rules": [{
                "verbs": ["get"],
                "apiGroups": [""],
                "resources": ["configmaps"],
                "resourceNames": [CLUSTER_INFO],
            }],
        }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": metadata,
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": CLUSTER_INFO_ROLE,
            },
            "subjects": [{
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "User",
                "name": crate::authn::ANONYMOUS,
            }],
        }),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_must_have_the_kubeadm_shape() {
        assert_eq!(
            parse_token("abcdef.0123456789abcdef").unwrap(),
            ("abcdef", "0123456789abcdef")
        );
        for bad in [
            "",
            "abcdef",
            "abcdef.",
            "abcde.0123456789abcdef",
            "abcdefg.0123456789abcdef",
            "ABCDEF.0123456789abcdef",
            "abcdef.0123456789ABCDEF",
            "abcdef.0123456789abcde",
            "abcdef.0123456789abcdef0",
            "abcdef:0123456789abcdef",
            "abc-ef.0123456789abcdef",
            "abcdef.0123456789abcdef.x",
            " abcdef.0123456789abcdef",
        ] {
            let err = parse_token(bad).unwrap_err();
            assert_eq!(err.code, 400, "{bad:?}");
            assert!(!err.message.contains("0123456789"), "{}", err.message);
        }
    }

    /// Pinned against a value computed independently (Python's `hmac` and `base64`).
    #[test]
    fn the_detached_signature_is_compute_detached_signature() {
        let jws = detached_jws("abcdef", "0123456789abcdef", b"hello");
        assert_eq!(
            jws,
            "eyJhbGciOiJIUzI1NiIsImtpZCI6ImFiY2RlZiJ9..MxsnbCjBaYzcbNIFa06F-wuF9LX26rhMlrL4zA1511s"
        );
        let (header, _) = jws.split_once("..").unwrap();
        assert_eq!(
            URL_SAFE_NO_PAD.decode(header).unwrap(),
            br#"{"alg":"HS256","kid":"abcdef"}"#
        );
    }

    #[test]
    fn cluster_info_keeps_its_kubeconfig_and_adds_one_signature_per_token() {
        let first = cluster_info(None, "kc", "aaaaaa", "0123456789abcdef");
        assert_eq!(first["metadata"]["namespace"], KUBE_PUBLIC);
        let keys: Vec<&String> = first["data"].as_object().unwrap().keys().collect();
        assert_eq!(keys, ["jws-kubeconfig-aaaaaa", "kubeconfig"]);
        let mut edited = first.clone();
        edited["data"]["kubeconfig"] = "edited".into();
        let second = cluster_info(Some(edited), "kc", "zzzzzz", "fedcba9876543210");
        let data = second["data"].as_object().unwrap();
        let keys: Vec<&String> = data.keys().collect();
        assert_eq!(
            keys,
            [
                "jws-kubeconfig-aaaaaa",
                "jws-kubeconfig-zzzzzz",
                "kubeconfig"
            ]
        );
        assert_eq!(data["kubeconfig"], "edited");
        assert_eq!(
            data["jws-kubeconfig-zzzzzz"],
            detached_jws("zzzzzz", "fedcba9876543210", b"edited")
        );
        assert_eq!(
            data["jws-kubeconfig-aaaaaa"],
            first["data"]["jws-kubeconfig-aaaaaa"]
        );
    }
}
