//! Kubeconfig files for real clients (kubectl, kube-rs) talking to the fake directly, and the
//! kubeconfig kubeadm publishes for bootstrap-token discovery.

use std::path::{Path, PathBuf};

use crate::pki::TestPki;

/// A YAML double-quoted scalar (a JSON string is one).
fn quoted(s: &str) -> String {
    serde_json::Value::from(s).to_string()
}

/// File-name-safe form of a user name (`system:node:edge-1` → `system-node-edge-1`).
fn file_stem(user: &str) -> String {
    user.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c
            } else {
                '-'
            }
        })
        .collect()
}

/// Issues a client certificate for `user` and writes it, its key, the CA and a kubeconfig into
/// `dir` (absolute paths inside). Returns the kubeconfig's path.
pub fn write(
    dir: &Path,
    server: &str,
    pki: &TestPki,
    user: &str,
    groups: &[&str],
) -> std::io::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let dir = std::path::absolute(dir)?;
    let pair = pki.client(user, groups).map_err(std::io::Error::other)?;
    let stem = file_stem(user);
    let (cert, key, ca) = (
        dir.join(format!("{stem}.crt")),
        dir.join(format!("{stem}.key")),
        dir.join("ca.crt"),
    );
    std::fs::write(&cert, &pair.cert_pem)?;
    std::fs::write(&key, &pair.key_pem)?;
    std::fs::write(&ca, &pki.ca_pem)?;
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: outpost-fake\n  cluster:\n    server: {server}\n    certificate-authority: {ca}\nusers:\n- name: {user}\n  user:\n    client-certificate: {cert}\n    client-key: {key}\ncontexts:\n- name: outpost-fake\n  context:\n    cluster: outpost-fake\n    user: {user}\n    namespace: default\ncurrent-context: outpost-fake\n",
        server = quoted(server),
        ca = quoted(&ca.to_string_lossy()),
        user = quoted(user),
        cert = quoted(&cert.to_string_lossy()),
        key = quoted(&key.to_string_lossy()),
    );
    let path = dir.join(format!("kubeconfig-{stem}"));
    std::fs::write(&path, text)?;
    Ok(path)
}

/// The kubeconfig `kubeadm init` publishes in `kube-public/cluster-info`: only the cluster, with
/// an empty name, the CA inline, `server` the apiserver's URL; byte for byte what Go's
/// `clientcmd.Write` makes of it (keys sorted, `null` for the empty lists, `{}` preferences).
pub fn cluster_info(server: &str, ca_pem: &str) -> String {
    use base64::Engine;
    let ca = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    format!(
        "apiVersion: v1\nclusters:\n- cluster:\n    certificate-authority-data: {ca}\n    server: {server}\n  name: \"\"\ncontexts: null\ncurrent-context: \"\"\nkind: Config\npreferences: {{}}\nusers: null\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_absolute_paths_and_quoted_names() {
        let dir = tempfile::tempdir().unwrap();
        let pki = TestPki::new().unwrap();
        let path = write(
            dir.path(),
            "https://127.0.0.1:1",
            &pki,
            "system:node:edge-1",
            &["system:nodes"],
        )
        .unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains("user: \"system:node:edge-1\""));
        assert!(text.contains("server: \"https://127.0.0.1:1\""));
        assert!(dir.path().join("system-node-edge-1.crt").exists());
        assert!(dir.path().join("ca.crt").exists());
    }

    #[test]
    fn cluster_info_is_what_kubeadm_publishes() {
        let text = cluster_info("https://127.0.0.1:6443", "PEM\n");
        assert_eq!(
            text,
            "apiVersion: v1\nclusters:\n- cluster:\n    certificate-authority-data: UEVNCg==\n    server: https://127.0.0.1:6443\n  name: \"\"\ncontexts: null\ncurrent-context: \"\"\nkind: Config\npreferences: {}\nusers: null\n"
        );
        let parsed = crate::manifest::parse_yaml(&text).unwrap();
        let cluster = &parsed[0]["clusters"][0];
        assert_eq!(cluster["name"], "");
        assert_eq!(cluster["cluster"]["server"], "https://127.0.0.1:6443");
        assert_eq!(parsed[0]["contexts"], serde_json::Value::Null);
    }
}
