//! `serviceenvupdater`: containers that set the apiserver address explicitly in their env (CNI
//! agents often do) reach the hub instead.

use outpost_core::Verb;
use serde_json::Value;

use super::replace;
use crate::FilterContext;
use crate::filter::{Filter, Peek, Rule, Verdict};
use crate::head::Head;

const HOST_VAR: &str = "KUBERNETES_SERVICE_HOST";
const PORT_VAR: &str = "KUBERNETES_SERVICE_PORT";
/// Common prefix of both names: a pod whose JSON lacks it cannot need a rewrite.
const VAR_PREFIX: &str = "KUBERNETES_SERVICE_";

const PODS: Rule = Rule {
    group: "",
    versions: &["v1"],
    resource: "pods",
    kind: "Pod",
    verbs: &[Verb::Get, Verb::List, Verb::Watch, Verb::Patch],
};

/// Overwrites the value of every `KUBERNETES_SERVICE_HOST` / `KUBERNETES_SERVICE_PORT` env var
/// already present in `spec.containers` with the hub's address and HTTPS port; never adds one.
///
/// Like yurthub: only `spec.containers`, and a `valueFrom` next to the rewritten value is left
/// in place. kubelet hashes each container's spec to decide restarts, so rewriting differently
/// from yurthub (init containers, dropping `valueFrom`) would restart pods when a node switches
/// from yurthub to this hub. Unlike yurthub, a name listed twice is rewritten every time (yurthub
/// stops once it has seen both names, and kubelet uses the last duplicate).
pub struct ServiceEnvUpdater;

impl Filter for ServiceEnvUpdater {
    fn name(&self) -> &'static str {
        "serviceenvupdater"
    }

    fn default_components(&self) -> &'static [&'static str] {
        &["kubelet"]
    }

    fn rules(&self) -> &'static [Rule] {
        &[PODS]
    }

    fn off_in_cloud_mode(&self) -> bool {
        true
    }

    /// Both names share it: a node's pods rarely set these variables, and a list without them
    /// needs no parse at all.
    fn marker(&self) -> Option<&'static [u8]> {
        Some(VAR_PREFIX.as_bytes())
    }

    fn peek(&self, head: &Head<'_>, _: &FilterContext) -> Peek {
        if head.raw.contains(VAR_PREFIX) {
            Peek::Inspect
        } else {
            Peek::Pass
        }
    }

    fn filter(&self, obj: &mut Value, _: &Head<'_>, ctx: &FilterContext) -> Verdict {
        let Some(containers) = obj
            .pointer_mut("/spec/containers")
            .and_then(Value::as_array_mut)
        else {
            return Verdict::Keep;
        };
        let host = Value::from(ctx.hub_host().to_string());
        let port = Value::from(ctx.hub_port().to_string());
        let mut changed = false;
        let vars = containers
            .iter_mut()
            .filter_map(|c| c.get_mut("env").and_then(Value::as_array_mut))
            .flatten();
        for var in vars {
            let new = match var.get("name").and_then(Value::as_str) {
                Some(HOST_VAR) => &host,
                Some(PORT_VAR) => &port,
                _ => continue,
            };
            changed |= replace(&mut var["value"], new.clone());
        }
        Verdict::changed_if(changed)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::testing::{PODS as FIXTURE, apply, edge_ctx};

    /// The fixture's kindnet pod, whose container sets four env vars of its own.
    fn kindnet() -> Value {
        let list: Value = serde_json::from_str(FIXTURE).unwrap();
        let mut pod = list["items"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| {
                p["metadata"]["name"]
                    .as_str()
                    .unwrap()
                    .starts_with("kindnet-")
            })
            .unwrap()
            .clone();
        pod["kind"] = json!("Pod");
        pod
    }

    fn env(pod: &Value) -> &Vec<Value> {
        pod["spec"]["containers"][0]["env"].as_array().unwrap()
    }

    #[test]
    fn rewrites_the_apiserver_env_vars_a_container_sets() {
        let mut pod = kindnet();
        let vars = pod["spec"]["containers"][0]["env"].as_array_mut().unwrap();
        vars.push(json!({"name": HOST_VAR, "value": "172.18.0.2"}));
        vars.push(json!({"name": PORT_VAR, "value": "6443"}));
        let (verdict, out) = apply(&ServiceEnvUpdater, &pod, &edge_ctx());
        assert_eq!(verdict, Verdict::Changed);
        let vars = env(&out);
        assert_eq!(vars[4], json!({"name": HOST_VAR, "value": "169.254.2.1"}));
        assert_eq!(vars[5], json!({"name": PORT_VAR, "value": "10268"}));
        assert_eq!(vars[..4], env(&pod)[..4], "other vars are untouched");
    }

    #[test]
    fn never_adds_the_vars() {
        let (verdict, out) = apply(&ServiceEnvUpdater, &kindnet(), &edge_ctx());
        assert_eq!(verdict, Verdict::Keep);
        assert_eq!(env(&out).len(), 4);
        let list: Value = serde_json::from_str(FIXTURE).unwrap();
        for pod in list["items"].as_array().unwrap() {
            let mut pod = pod.clone();
            pod["kind"] = json!("Pod");
            assert_eq!(
                apply(&ServiceEnvUpdater, &pod, &edge_ctx()).0,
                Verdict::Keep
            );
        }
    }

    #[test]
    fn each_var_alone_duplicates_and_every_container() {
        let mut pod = kindnet();
        pod["spec"]["containers"] = json!([
            {"name": "a", "image": "a", "env": [{"name": PORT_VAR, "value": "443"}]},
            {"name": "b", "image": "b"},
            {"name": "c", "image": "c", "env": [
                {"name": HOST_VAR, "value": "10.96.0.1"},
                {"name": PORT_VAR, "value": "443"},
                {"name": HOST_VAR, "value": "10.96.0.1"}
            ]}
        ]);
        let (_, out) = apply(&ServiceEnvUpdater, &pod, &edge_ctx());
        let containers = &out["spec"]["containers"];
        assert_eq!(
            containers[0]["env"],
            json!([{"name": PORT_VAR, "value": "10268"}])
        );
        assert_eq!(containers[1].get("env"), None);
        assert_eq!(
            containers[2]["env"][2]["value"], "169.254.2.1",
            "the duplicate kubelet would use"
        );
    }

    #[test]
    fn value_from_stays_and_init_containers_are_untouched() {
        let mut pod = kindnet();
        let from = json!({"fieldRef": {"apiVersion": "v1", "fieldPath": "status.hostIP"}});
        pod["spec"]["containers"][0]["env"] = json!([{"name": HOST_VAR, "valueFrom": from}]);
        pod["spec"]["initContainers"] = json!([{"name": "init", "image": "i", "env": [{"name": HOST_VAR, "value": "10.96.0.1"}]}]);
        let (verdict, out) = apply(&ServiceEnvUpdater, &pod, &edge_ctx());
        assert_eq!(verdict, Verdict::Changed);
        assert_eq!(
            out["spec"]["containers"][0]["env"],
            json!([{"name": HOST_VAR, "value": "169.254.2.1", "valueFrom": from}])
        );
        assert_eq!(out["spec"]["initContainers"], pod["spec"]["initContainers"]);
    }

    #[test]
    fn an_already_rewritten_pod_is_kept() {
        let mut pod = kindnet();
        pod["spec"]["containers"][0]["env"] = json!([{"name": HOST_VAR, "value": "169.254.2.1"}, {"name": PORT_VAR, "value": "10268"}]);
        assert_eq!(
            apply(&ServiceEnvUpdater, &pod, &edge_ctx()).0,
            Verdict::Keep
        );
    }
}
