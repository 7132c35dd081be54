//! `inclusterconfig`: kube-proxy on an edge node uses in-cluster configuration, which
//! masterservice has pointed at the hub, instead of the kubeconfig kubeadm gives it.

use outpost_core::Verb;
use serde_json::Value;

use crate::FilterContext;
use crate::filter::{Filter, Peek, Rule, Verdict};
use crate::head::Head;

const NAMESPACE: &str = "kube-system";
const NAME: &str = "kube-proxy";
const CONFIG_KEY: &str = "config.conf";
const KUBECONFIG_KEY: &str = "kubeconfig";

const CONFIGMAPS: Rule = Rule {
    group: "",
    versions: &["v1"],
    resource: "configmaps",
    kind: "ConfigMap",
    verbs: &[Verb::Get, Verb::List, Verb::Watch],
};

/// In the `kube-system/kube-proxy` ConfigMap, comments out the `kubeconfig:` line of
/// `config.conf` (`  kubeconfig: /var/lib/…` → `  #kubeconfig: /var/lib/…`).
///
/// yurthub only recognises the line when it holds exactly one `:`, so a value with a colon (a
/// Windows path, a quoted URL) kept the kubeconfig and bypassed the hub; any line whose YAML
/// key is `kubeconfig` is commented here.
pub struct InClusterConfig;

impl Filter for InClusterConfig {
    fn name(&self) -> &'static str {
        "inclusterconfig"
    }

    fn default_components(&self) -> &'static [&'static str] {
        &["kubelet"]
    }

    fn rules(&self) -> &'static [Rule] {
        &[CONFIGMAPS]
    }

    fn only_object(&self) -> Option<(&'static str, &'static str)> {
        Some((NAMESPACE, NAME))
    }

    fn peek(&self, head: &Head<'_>, _: &FilterContext) -> Peek {
        if head.is(NAMESPACE, NAME) {
            Peek::Inspect
        } else {
            Peek::Pass
        }
    }

    fn filter(&self, obj: &mut Value, _: &Head<'_>, _: &FilterContext) -> Verdict {
        let Some(conf) = obj.get_mut("data").and_then(|d| d.get_mut(CONFIG_KEY)) else {
            return Verdict::Keep;
        };
        match conf.as_str().and_then(comment_out_kubeconfig) {
            Some(new) => {
                *conf = Value::from(new);
                Verdict::Changed
            }
            None => Verdict::Keep,
        }
    }
}

/// `conf` with its `kubeconfig:` lines commented out, or `None` when it has none.
fn comment_out_kubeconfig(conf: &str) -> Option<String> {
    if !conf.lines().any(is_kubeconfig_line) {
        return None;
    }
    let lines: Vec<String> = conf
        .split('\n')
        .map(|line| {
            if is_kubeconfig_line(line) {
                line.replacen(KUBECONFIG_KEY, &format!("#{KUBECONFIG_KEY}"), 1)
            } else {
                line.to_owned()
            }
        })
        .collect();
    Some(lines.join("\n"))
}

fn is_kubeconfig_line(line: &str) -> bool {
    line.trim_start()
        .split_once(':')
        .is_some_and(|(key, _)| key.trim_end() == KUBECONFIG_KEY)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::testing::{KUBE_PROXY_CONFIGMAP, apply, edge_ctx};

    fn configmap() -> Value {
        serde_json::from_str(KUBE_PROXY_CONFIGMAP).unwrap()
    }

    #[test]
    fn comments_out_the_kubeconfig_line() {
        let cm = configmap();
        let (verdict, out) = apply(&InClusterConfig, &cm, &edge_ctx());
        assert_eq!(verdict, Verdict::Changed);
        let before = cm["data"][CONFIG_KEY].as_str().unwrap();
        let after = out["data"][CONFIG_KEY].as_str().unwrap();
        assert_eq!(
            after,
            before.replace(
                "  kubeconfig: /var/lib/kube-proxy/kubeconfig.conf",
                "  #kubeconfig: /var/lib/kube-proxy/kubeconfig.conf"
            )
        );
        assert_ne!(after, before);
        assert_eq!(
            out["data"]["kubeconfig.conf"],
            cm["data"]["kubeconfig.conf"]
        );
        assert_eq!(out["metadata"], cm["metadata"]);
    }

    #[test]
    fn is_idempotent() {
        let (_, once) = apply(&InClusterConfig, &configmap(), &edge_ctx());
        assert_eq!(apply(&InClusterConfig, &once, &edge_ctx()).0, Verdict::Keep);
    }

    #[test]
    fn values_with_colons_and_crlf_lines() {
        assert_eq!(
            comment_out_kubeconfig(
                "clientConnection:\r\n  kubeconfig: C:\\k\\kubeconfig.conf\r\n  qps: 5\r\n"
            )
            .as_deref(),
            Some("clientConnection:\r\n  #kubeconfig: C:\\k\\kubeconfig.conf\r\n  qps: 5\r\n")
        );
        assert_eq!(
            comment_out_kubeconfig("kubeconfig : \"https://x:6443\"").as_deref(),
            Some("#kubeconfig : \"https://x:6443\"")
        );
    }

    #[test]
    fn other_keys_and_configmaps_are_untouched() {
        for conf in [
            "mode: iptables",
            "kubeconfigs: x",
            "  # kubeconfig: x",
            "clientConnection:\n  burst: 0",
            "",
        ] {
            assert_eq!(comment_out_kubeconfig(conf), None, "{conf:?}");
        }
        let mut other = configmap();
        other["metadata"]["name"] = json!("kube-proxy-extra");
        assert_eq!(
            apply(&InClusterConfig, &other, &edge_ctx()).0,
            Verdict::Keep
        );
        let mut elsewhere = configmap();
        elsewhere["metadata"]["namespace"] = json!("default");
        assert_eq!(
            apply(&InClusterConfig, &elsewhere, &edge_ctx()).0,
            Verdict::Keep
        );
    }

    #[test]
    fn a_configmap_without_config_conf_is_kept() {
        let mut cm = configmap();
        cm["data"].as_object_mut().unwrap().remove(CONFIG_KEY);
        assert_eq!(apply(&InClusterConfig, &cm, &edge_ctx()).0, Verdict::Keep);
        cm.as_object_mut().unwrap().remove("data");
        assert_eq!(apply(&InClusterConfig, &cm, &edge_ctx()).0, Verdict::Keep);
    }
}
