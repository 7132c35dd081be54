//! What convert writes: the hub's static pod and kubelet's kubeconfig for the hub. Both are fixed
//! text with a few substituted values; every value is emitted as a YAML scalar that reads back as
//! exactly that string.

use crate::args::ConvertArgs;
use crate::error::NodeError;

const STATIC_POD: &str = include_str!("static-pod.yaml");

/// kubelet's kubeconfig after conversion: the hub's plain-HTTP port and no credentials (the hub
/// adds the node's identity upstream). Byte for byte what yurthub's node-servant writes.
const HUB_KUBECONFIG: &str = "apiVersion: v1
clusters:
- cluster:
    server: http://127.0.0.1:10261
  name: default-cluster
contexts:
- context:
    cluster: default-cluster
    namespace: default
    user: default-auth
  name: default-context
current-context: default-context
kind: Config
preferences: {}
";

/// The kubeconfig convert writes to `/var/lib/openyurt/kubelet.conf`.
pub fn hub_kubeconfig() -> &'static str {
    HUB_KUBECONFIG
}

/// The static pod manifest convert writes to `/etc/kubernetes/manifests/outpost.yaml`.
pub fn static_pod(args: &ConvertArgs) -> Result<String, NodeError> {
    args.validate()?;
    let path = |p: &std::path::Path| p.to_string_lossy().into_owned();
    let values = [
        ("image", args.image.clone()),
        ("server_addr", format!("--server-addr={}", args.server_addr)),
        ("node_name", format!("--node-name={}", args.node_name)),
        (
            "nodepool_name",
            format!("--nodepool-name={}", args.nodepool_name),
        ),
        (
            "working_mode",
            format!("--working-mode={}", args.working_mode.as_str()),
        ),
        (
            "disk_cache_path",
            format!("--disk-cache-path={}", path(&args.disk_cache_path)),
        ),
        ("root_dir", format!("--root-dir={}", path(&args.root_dir))),
        ("disk_cache_mount", path(&args.disk_cache_path)),
        ("root_dir_mount", path(&args.root_dir)),
    ];
    let mut text = STATIC_POD.to_owned();
    for (name, value) in values {
        text = text.replace(&format!("{{{{{name}}}}}"), &yaml_scalar(&value));
    }
    Ok(text)
}

/// `value` as a YAML scalar: plain when it can only read back as that string, else double-quoted.
fn yaml_scalar(value: &str) -> String {
    if is_plain_string(value) {
        value.to_owned()
    } else {
        double_quoted(value)
    }
}

fn is_plain_string(value: &str) -> bool {
    let safe = |c: char| c.is_ascii_alphanumeric() || "._/:=,@+~-".contains(c);
    let first_ok = match value.as_bytes() {
        [b'-', b'-', ..] => true,
        [b, ..] => b.is_ascii_alphabetic() || *b == b'/',
        [] => false,
    };
    // Words YAML 1.1 resolvers read as booleans or null.
    const RESERVED: &[&str] = &["true", "false", "yes", "no", "on", "off", "y", "n", "null"];
    first_ok
        && value.chars().all(safe)
        && !value.ends_with(':')
        && !RESERVED.contains(&value.to_ascii_lowercase().as_str())
}

/// A JSON string literal, which is also a valid YAML double-quoted scalar.
fn double_quoted(value: &str) -> String {
    let mut out = String::with_capacity(value.len() + 2);
    out.push('"');
    for c in value.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04x}", u32::from(c))),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_only_when_unambiguous() {
        assert_eq!(
            yaml_scalar("--server-addr=https://10.0.0.1:6443"),
            "--server-addr=https://10.0.0.1:6443"
        );
        assert_eq!(
            yaml_scalar("/etc/kubernetes/cache/"),
            "/etc/kubernetes/cache/"
        );
        assert_eq!(
            yaml_scalar("ghcr.io/outpost/outpost:0.1.0"),
            "ghcr.io/outpost/outpost:0.1.0"
        );
        assert_eq!(yaml_scalar("1.2"), "\"1.2\"");
        assert_eq!(yaml_scalar("yes"), "\"yes\"");
        assert_eq!(yaml_scalar("reg:"), "\"reg:\"");
        assert_eq!(yaml_scalar("/a b#c"), "\"/a b#c\"");
        assert_eq!(yaml_scalar("-x"), "\"-x\"");
        assert_eq!(yaml_scalar("a\"b\\c\u{1}"), "\"a\\\"b\\\\c\\u0001\"");
    }

    #[test]
    fn every_placeholder_is_filled() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            args: ConvertArgs,
        }
        let cli = Cli::try_parse_from([
            "t",
            "--server-addr=https://10.0.0.1:6443",
            "--node-name=n1",
            "--nodepool-name=p1",
        ])
        .unwrap();
        let text = static_pod(&cli.args).unwrap();
        assert!(!text.contains("{{"), "{text}");
        assert!(text.contains("    - --nodepool-name=p1\n"), "{text}");
        assert!(
            text.contains("      path: /etc/kubernetes/cache/\n"),
            "{text}"
        );
    }
}
