//! Kinds learned from responses, so that CRDs work like built-in types and an object that arrived
//! as a LIST item (which carries no `kind`/`apiVersion`) can be served on its own.
//!
//! Nothing is hard-coded per resource: every cached LIST, GET or watch event records its
//! resource's kind as a small document (`kinds/<resource>.<version>.<group>`), so an offline LIST
//! can name its `XxxList` even when it is empty, also after a restart.

use std::borrow::Cow;

use outpost_cache::Gvr;
use outpost_core::wire::ObjectHead;
use serde::{Deserialize, Serialize};

/// A resource's kind and the `apiVersion` its objects carry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KindInfo {
    pub kind: String,
    #[serde(rename = "apiVersion")]
    pub api_version: String,
}

impl KindInfo {
    /// From a list response's own `kind` (`PodList` → `Pod`).
    pub fn from_list(list_kind: &str, api_version: &str) -> Option<KindInfo> {
        let kind = list_kind.strip_suffix("List").filter(|k| !k.is_empty())?;
        Some(KindInfo {
            kind: kind.to_owned(),
            api_version: api_version.to_owned(),
        })
    }

    /// Read off a stored object, for when no kind document exists.
    pub fn from_object(object: &[u8]) -> Option<KindInfo> {
        let head = ObjectHead::parse(object).ok()?;
        Some(KindInfo {
            kind: head.kind?.into_owned(),
            api_version: head.api_version?.into_owned(),
        })
    }

    pub fn list_kind(&self) -> String {
        format!("{}List", self.kind)
    }

    /// What an apiserver would call the resource when nothing was ever learned about it.
    pub fn fallback(gvr: &Gvr) -> KindInfo {
        KindInfo {
            kind: String::new(),
            api_version: api_version(gvr),
        }
    }
}

/// `v1` for the core group, `group/version` otherwise.
pub fn api_version(gvr: &Gvr) -> String {
    if gvr.group.is_empty() {
        gvr.version.clone()
    } else {
        format!("{}/{}", gvr.group, gvr.version)
    }
}

/// Whether an answer of `kind` in `api_version` is an object of `gvr`, as asked for: its
/// `apiVersion` is the resource's group/version, and its kind is the one the resource is named
/// after (kube-apiserver's own plural rule: `Pod`/`pods`, `Endpoints`/`endpoints`,
/// `NetworkPolicy`/`networkpolicies`, `Ingress`/`ingresses`), or a known exception. An
/// upstream answer for another object (a `Secret` on a `configmaps` path) is not cached under
/// the requested key. A custom resource whose plural does not follow the rule is not cached.
pub fn check_kind(gvr: &Gvr, kind: &str, api_version: &str) -> Result<(), KindMismatch> {
    let expected = self::api_version(gvr);
    if api_version != expected {
        return Err(KindMismatch::ApiVersion {
            api_version: api_version.to_owned(),
            gvr: gvr.clone(),
            expected,
        });
    }
    let irregular = IRREGULAR
        .iter()
        .find(|(group, resource, _)| *group == gvr.group && *resource == gvr.resource);
    let fits = match irregular {
        Some((_, _, k)) => kind == *k,
        None => named_after(kind, &gvr.resource),
    };
    if !fits {
        return Err(KindMismatch::Kind {
            kind: kind.to_owned(),
            gvr: gvr.clone(),
        });
    }
    Ok(())
}

/// An answer that is not an object of the resource asked for ([`check_kind`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KindMismatch {
    #[error("apiVersion {api_version:?} answers a request for {gvr} ({expected})")]
    ApiVersion {
        api_version: String,
        gvr: Gvr,
        expected: String,
    },
    #[error("a {kind} answers a request for {gvr}")]
    Kind { kind: String, gvr: Gvr },
}

/// Resources not named after their kind by the plural rule.
const IRREGULAR: &[(&str, &str, &str)] = &[
    ("metrics.k8s.io", "pods", "PodMetrics"),
    ("metrics.k8s.io", "nodes", "NodeMetrics"),
];

fn named_after(kind: &str, resource: &str) -> bool {
    let singular = kind.to_ascii_lowercase();
    if singular.is_empty() {
        return false;
    }
    let plural = |suffix: &str| resource.strip_suffix(suffix) == Some(singular.as_str());
    resource == singular
        || plural("s")
        || plural("es")
        || singular
            .strip_suffix('y')
            .is_some_and(|stem| resource.strip_suffix("ies") == Some(stem))
}

/// An object's `kind` and `apiVersion`, read only as far as they go: kube-apiserver writes
/// both first, so a watch event's object is read about 40 bytes deep, not to its end.
pub fn type_meta(object: &[u8]) -> Option<(String, String)> {
    use serde::de::{Deserializer, IgnoredAny, MapAccess, Visitor};

    #[derive(Default)]
    struct Found {
        kind: Option<String>,
        api_version: Option<String>,
    }

    /// Records both, then stops the read with an error: serde has no early return.
    struct Keys<'a>(&'a mut Found);

    impl<'de> Visitor<'de> for Keys<'_> {
        type Value = ();

        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a JSON object")
        }

        fn visit_map<M: MapAccess<'de>>(self, mut map: M) -> Result<(), M::Error> {
            while let Some(key) = map.next_key::<Cow<'de, str>>()? {
                match key.as_ref() {
                    "kind" => self.0.kind = Some(map.next_value()?),
                    "apiVersion" => self.0.api_version = Some(map.next_value()?),
                    _ => {
                        map.next_value::<IgnoredAny>()?;
                        continue;
                    }
                }
                if self.0.kind.is_some() && self.0.api_version.is_some() {
                    return Err(serde::de::Error::custom("decided"));
                }
            }
            Ok(())
        }
    }

    let mut found = Found::default();
    let mut de = serde_json::Deserializer::from_slice(object);
    let _ = de.deserialize_map(Keys(&mut found));
    Some((found.kind?, found.api_version?))
}

/// The document name under which a resource's kind is kept.
pub fn document_name(gvr: &Gvr) -> String {
    format!("kinds/{gvr}")
}

/// How [`with_type_meta`] finds out whether an item already names its kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KindCheck {
    /// Reads the item's top-level keys only up to `metadata`. kube-apiserver writes `kind`
    /// before `metadata` in every object that has one (typed objects encode `TypeMeta` first,
    /// unstructured ones sort their keys), so a list item is read about 50 bytes deep instead
    /// of to its end. The cache rejects an object with two `kind`s, so a server that breaks
    /// that order costs a second pass ([`KindCheck::Whole`]), never a wrong object.
    UpToMetadata,
    /// Reads the whole item.
    Whole,
}

/// `{"kind":…,"apiVersion":…` (no closing brace), spelled once per list for
/// [`with_type_meta`]; nothing when the kind is unknown.
pub struct TypeMetaHead(Option<Vec<u8>>);

impl TypeMetaHead {
    pub fn of(kind: &KindInfo) -> TypeMetaHead {
        if kind.kind.is_empty() {
            return TypeMetaHead(None);
        }
        let head = serde_json::json!({"kind": kind.kind, "apiVersion": kind.api_version});
        let mut head = head.to_string().into_bytes();
        head.pop();
        TypeMetaHead(Some(head))
    }
}

/// The object with `kind` and `apiVersion` first, as a GET would return it. List items of
/// built-in types lack both; they are spliced in as text, the rest of the bytes untouched.
pub fn with_type_meta<'a>(item: &'a [u8], head: &TypeMetaHead, check: KindCheck) -> Cow<'a, [u8]> {
    let has_kind = match check {
        KindCheck::UpToMetadata => names_kind_before_metadata(item),
        KindCheck::Whole => ObjectHead::parse(item)
            .map(|head| head.kind.is_some())
            .unwrap_or(true),
    };
    let Some(rest) = item.strip_prefix(b"{") else {
        return Cow::Borrowed(item);
    };
    let Some(head) = head.0.as_deref().filter(|_| !has_kind) else {
        return Cow::Borrowed(item);
    };
    let mut out = Vec::with_capacity(item.len() + head.len() + 1);
    out.extend_from_slice(head);
    if !rest.trim_ascii_start().starts_with(b"}") {
        out.push(b',');
    }
    out.extend_from_slice(rest);
    Cow::Owned(out)
}

/// Whether `kind` is a top-level key before `metadata`; what cannot be read counts as having
/// one (the item is then left as it is, and the cache's own parse judges it).
fn names_kind_before_metadata(item: &[u8]) -> bool {
    use serde::de::{Deserializer, IgnoredAny, MapAccess, Visitor};

    /// Records the answer, then stops the read with an error: serde has no early return.
    struct TopKeys<'a>(&'a mut Option<bool>);

    impl<'de> Visitor<'de> for TopKeys<'_> {
        type Value = ();

        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a JSON object")
        }

        fn visit_map<M: MapAccess<'de>>(self, mut map: M) -> Result<(), M::Error> {
            while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                match key.as_ref() {
                    "kind" => *self.0 = Some(true),
                    "metadata" => *self.0 = Some(false),
                    _ => {
                        map.next_value::<IgnoredAny>()?;
                        continue;
                    }
                }
                return Err(serde::de::Error::custom("decided"));
            }
            *self.0 = Some(false);
            Ok(())
        }
    }

    let mut answer = None;
    let mut de = serde_json::Deserializer::from_slice(item);
    let _ = de.deserialize_map(TopKeys(&mut answer));
    answer.unwrap_or(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn pod_kind() -> KindInfo {
        KindInfo::from_list("PodList", "v1").unwrap()
    }

    fn pod_head() -> TypeMetaHead {
        TypeMetaHead::of(&pod_kind())
    }

    #[test]
    fn list_items_get_their_type_meta() {
        let item = br#"{"metadata":{"name":"p","namespace":"d"},"spec":{}}"#;
        let out = with_type_meta(item, &pod_head(), KindCheck::UpToMetadata);
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["kind"], "Pod");
        assert_eq!(v["apiVersion"], "v1");
        assert_eq!(v["metadata"]["name"], "p");
        assert!(out.ends_with(br#""spec":{}}"#), "the rest is untouched");
    }

    #[test]
    fn objects_with_a_kind_are_untouched() {
        let item = br#"{"kind":"Widget","apiVersion":"x.io/v1","metadata":{"name":"w"}}"#;
        assert!(matches!(
            with_type_meta(item, &pod_head(), KindCheck::UpToMetadata),
            Cow::Borrowed(_)
        ));
        let unknown = TypeMetaHead::of(&KindInfo::fallback(&Gvr::new("", "v1", "pods")));
        let item = br#"{"metadata":{"name":"p"}}"#;
        assert!(matches!(
            with_type_meta(item, &unknown, KindCheck::Whole),
            Cow::Borrowed(_)
        ));
        let empty = with_type_meta(b"{}", &pod_head(), KindCheck::UpToMetadata);
        let v: Value = serde_json::from_slice(&empty).unwrap();
        assert_eq!(v["kind"], "Pod");
    }

    #[test]
    fn both_checks_agree_on_apiserver_shapes() {
        let typed = br#"{"metadata":{"name":"p","labels":{"kind":"x"}},"spec":{"kind":"y"}}"#;
        let unstructured = br#"{"apiVersion":"x.io/v1","kind":"Widget","metadata":{"name":"w"}}"#;
        let late = br#"{"metadata":{"name":"w"},"kind":"Widget"}"#;
        for (item, spliced) in [(&typed[..], true), (&unstructured[..], false)] {
            for check in [KindCheck::UpToMetadata, KindCheck::Whole] {
                let out = with_type_meta(item, &pod_head(), check);
                assert_eq!(matches!(out, Cow::Owned(_)), spliced, "{check:?}");
            }
        }
        // Out of apiserver order: only the whole read sees the kind (the cache then rejects
        // the spliced copy for its two kinds, and the writer reads again in whole).
        assert!(matches!(
            with_type_meta(late, &pod_head(), KindCheck::UpToMetadata),
            Cow::Owned(_)
        ));
        assert!(matches!(
            with_type_meta(late, &pod_head(), KindCheck::Whole),
            Cow::Borrowed(_)
        ));
        assert!(matches!(
            with_type_meta(b"not json", &pod_head(), KindCheck::UpToMetadata),
            Cow::Borrowed(_)
        ));
    }

    #[test]
    fn an_answer_must_be_an_object_of_the_resource_asked_for() {
        let core = |r: &str| Gvr::new("", "v1", r);
        for (resource, kind) in [
            ("pods", "Pod"),
            ("configmaps", "ConfigMap"),
            ("endpoints", "Endpoints"),
            ("services", "Service"),
            ("componentstatuses", "ComponentStatus"),
        ] {
            assert_eq!(check_kind(&core(resource), kind, "v1"), Ok(()), "{kind}");
        }
        let grouped = [
            ("networking.k8s.io", "networkpolicies", "NetworkPolicy"),
            ("networking.k8s.io", "ingresses", "Ingress"),
            ("networking.k8s.io", "ingressclasses", "IngressClass"),
            (
                "storage.k8s.io",
                "csistoragecapacities",
                "CSIStorageCapacity",
            ),
            ("apps.openyurt.io", "nodepools", "NodePool"),
            ("metrics.k8s.io", "pods", "PodMetrics"),
            ("x.io", "widgets", "Widget"),
        ];
        for (group, resource, kind) in grouped {
            let gvr = Gvr::new(group, "v1", resource);
            assert_eq!(check_kind(&gvr, kind, &format!("{group}/v1")), Ok(()));
        }
        let err = check_kind(&core("configmaps"), "Secret", "v1")
            .unwrap_err()
            .to_string();
        assert!(err.contains("Secret"), "{err}");
        assert!(check_kind(&core("pods"), "Pod", "apps/v1").is_err());
        assert!(check_kind(&Gvr::new("apps", "v1", "deployments"), "Deployment", "v1").is_err());
        assert!(check_kind(&core("pods"), "", "v1").is_err());
        assert!(check_kind(&core("pods"), "Status", "v1").is_err());
        assert!(
            check_kind(
                &Gvr::new("metrics.k8s.io", "v1beta1", "pods"),
                "Pod",
                "metrics.k8s.io/v1beta1"
            )
            .is_err()
        );
    }

    #[test]
    fn type_meta_is_read_in_any_order() {
        let first = br#"{"kind":"Pod","apiVersion":"v1","metadata":{"name":"p"}}"#;
        let last =
            br#"{"metadata":{"name":"p","labels":{"kind":"x"}},"apiVersion":"v1","kind":"Pod"}"#;
        for object in [&first[..], &last[..]] {
            assert_eq!(type_meta(object), Some(("Pod".into(), "v1".into())));
        }
        assert_eq!(type_meta(br#"{"metadata":{}}"#), None);
        assert_eq!(type_meta(b"not json"), None);
    }

    #[test]
    fn kinds_from_lists_and_objects() {
        assert_eq!(pod_kind().list_kind(), "PodList");
        assert!(KindInfo::from_list("List", "v1").is_none());
        assert!(KindInfo::from_list("Status", "v1").is_none());
        let k = KindInfo::from_object(br#"{"kind":"Lease","apiVersion":"coordination.k8s.io/v1"}"#);
        assert_eq!(k.unwrap().api_version, "coordination.k8s.io/v1");
        assert_eq!(
            api_version(&Gvr::new("apps", "v1", "deployments")),
            "apps/v1"
        );
        assert_eq!(
            document_name(&Gvr::new("", "v1", "pods")),
            "kinds/pods.v1.core"
        );
    }
}
