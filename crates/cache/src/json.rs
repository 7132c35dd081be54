//! Reading just enough of an object's JSON: its identity on the way in, and label / field values
//! when a LIST or replayed WATCH has to filter what a broader scope holds.

use std::collections::BTreeMap;
use std::fmt;

use outpost_core::selector::{FieldSelector, LabelSelector};
use outpost_core::wire::{ObjectHead, ObjectMeta, PeekError};
use serde::Deserialize;
use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

use crate::error::CacheError;
use crate::model::ResourceVersion;

/// Names, namespaces, RVs and uids are length-prefixed with a u16 in records; real ones are tiny.
const MAX_META_LEN: usize = u16::MAX as usize;

/// The identity of an incoming object.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Identity {
    pub namespace: String,
    pub name: String,
    pub rv: ResourceVersion,
    pub uid: String,
}

/// Parses (and so validates) the whole document while keeping only `metadata`'s identity.
fn head(bytes: &[u8]) -> Result<ObjectMeta<'_>, CacheError> {
    let head = ObjectHead::parse(bytes)
        .map_err(|e| CacheError::InvalidObject(format!("not a JSON object: {e}")))?;
    checked_lengths(head.metadata)
}

fn checked_lengths(m: ObjectMeta<'_>) -> Result<ObjectMeta<'_>, CacheError> {
    let fields = [&m.name, &m.namespace, &m.resource_version, &m.uid];
    if fields.iter().any(|f| f.len() > MAX_META_LEN) {
        return Err(CacheError::InvalidObject(
            "oversized name, namespace, resourceVersion or uid".into(),
        ));
    }
    Ok(m)
}

/// Reads and validates the whole object.
pub(crate) fn identity(bytes: &[u8]) -> Result<Identity, CacheError> {
    identity_of(head(bytes)?)
}

fn identity_of(m: ObjectMeta<'_>) -> Result<Identity, CacheError> {
    if m.name.is_empty() {
        return Err(CacheError::InvalidObject("metadata.name is missing".into()));
    }
    Ok(Identity {
        namespace: m.namespace.into_owned(),
        name: m.name.into_owned(),
        rv: ResourceVersion::new(&m.resource_version),
        uid: m.uid.into_owned(),
    })
}

/// The identity an object would be stored under, read only as deep as that needs
/// ([`ObjectMeta::peek`]), so this says where an object goes, not whether it may be stored:
/// [`identity`] decides that. A relist of unchanged objects needs only this and a byte
/// comparison with what is stored.
pub(crate) fn identity_prefix(bytes: &[u8]) -> Result<Identity, CacheError> {
    let meta = ObjectMeta::peek(bytes).map_err(|e| {
        CacheError::InvalidObject(match e {
            PeekError::Json(e) => format!("not a JSON object: {e}"),
            PeekError::NoMetadata => "metadata.name is missing".into(),
        })
    })?;
    identity_of(checked_lengths(meta)?)
}

/// A BOOKMARK carries only `metadata.resourceVersion`.
pub(crate) fn bookmark_rv(bytes: &[u8]) -> Result<ResourceVersion, CacheError> {
    Ok(ResourceVersion::new(&head(bytes)?.resource_version))
}

/// Whether stored bytes still decode as JSON (the second corruption check after the checksum).
pub(crate) fn is_valid(bytes: &[u8]) -> bool {
    serde_json::from_slice::<serde::de::IgnoredAny>(bytes).is_ok()
}

/// A field selector's view of a value: strings as is, scalars spelled as Go's `fmt` would, and
/// objects or arrays as absent (no apiserver field label selects on them).
fn field_string(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Bool(b) => Some(b.to_string()),
        Value::Number(n) => Some(n.to_string()),
        Value::Null | Value::Array(_) | Value::Object(_) => None,
    }
}

/// Looks `spec.nodeName`-style dotted paths up in the object.
fn field_value(object: &Value, path: &str) -> Option<String> {
    path.split('.')
        .try_fold(object, |v, part| v.get(part))
        .and_then(field_string)
}

/// The filters a query applies on top of what its scope holds; `None` = no filter needed.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Filter<'a> {
    pub namespace: Option<&'a str>,
    pub labels: Option<&'a LabelSelector>,
    pub fields: Option<&'a FieldSelector>,
}

impl Filter<'_> {
    pub(crate) fn needs_json(&self) -> bool {
        self.labels.is_some() || self.fields.is_some()
    }

    /// Evaluates the selectors on a parsed object; the namespace is checked by the caller from
    /// the key, which is cheaper and authoritative.
    pub(crate) fn matches_json(&self, object: &Value) -> bool {
        let labels_ok = self.labels.is_none_or(|sel| {
            sel.matches_json(
                object
                    .pointer("/metadata/labels")
                    .and_then(Value::as_object),
            )
        });
        labels_ok
            && self
                .fields
                .is_none_or(|sel| sel.matches(&|f| field_value(object, f)))
    }

    pub(crate) fn matches_namespace(&self, namespace: &str) -> bool {
        self.namespace.is_none_or(|ns| ns == namespace)
    }

    /// The JSON paths this filter reads (`metadata.namespace` included for replays).
    fn wanted(&self) -> Wanted {
        let mut wanted = Wanted::default();
        wanted.add(["metadata", "namespace"].into_iter());
        if self.labels.is_some() {
            wanted.add(["metadata", "labels"].into_iter());
        }
        for field in self.fields.iter().flat_map(|f| f.fields()) {
            wanted.add(field.split('.'));
        }
        wanted
    }

    /// Parses (and validates) `bytes`, keeping only what the filter reads: skipping the rest
    /// without building it makes filtering a LIST several times cheaper than a full parse.
    pub(crate) fn parts(&self, bytes: &[u8]) -> Result<Value, serde_json::Error> {
        let mut de = serde_json::Deserializer::from_slice(bytes);
        let parts = Prune(&self.wanted()).deserialize(&mut de)?;
        de.end()?;
        Ok(parts)
    }
}

/// A trie of JSON object paths; a node without children keeps its whole value.
#[derive(Debug, Default)]
struct Wanted(BTreeMap<String, Wanted>);

impl Wanted {
    fn add<'a>(&mut self, path: impl Iterator<Item = &'a str>) {
        let mut node = self;
        for part in path {
            node = node.0.entry(part.to_owned()).or_default();
        }
    }
}

/// Deserializes only the wanted paths; everything else is skipped as `IgnoredAny`, and a
/// wanted path through a non-object reads as `null` (absent).
struct Prune<'w>(&'w Wanted);

impl<'de> DeserializeSeed<'de> for Prune<'_> {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        if self.0.0.is_empty() {
            return Value::deserialize(d);
        }
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Prune<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            match self.0.0.get(&key) {
                Some(wanted) => {
                    out.insert(key, map.next_value_seed(Prune(wanted))?);
                }
                None => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(Value::Object(out))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Value::Null)
    }

    fn visit_bool<E>(self, _: bool) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_i64<E>(self, _: i64) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_u64<E>(self, _: u64) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_f64<E>(self, _: f64) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_str<E>(self, _: &str) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn identity_reads_metadata_and_rejects_nameless_objects() {
        let id = identity(br#"{"metadata":{"name":"n1","resourceVersion":"12","uid":"u"}}"#)
            .expect("valid");
        assert_eq!((id.namespace.as_str(), id.name.as_str()), ("", "n1"));
        assert_eq!(id.rv.number(), Some(12));
        assert!(identity(br#"{"metadata":{"namespace":"a"}}"#).is_err());
        assert!(identity(b"{\"metadata\":").is_err());
        assert!(
            identity(br#"{"kind":"Pod","metadata":{"name":"n1"},"kind":"Pod"}"#).is_err(),
            "two kinds: malformed"
        );
        assert!(identity(br#"{"kind":"Pod","metadata":{"name":"n1"}}"#).is_ok());
    }

    #[test]
    fn identity_prefix_stops_once_it_knows_where_the_object_goes() {
        let id = identity_prefix(
            br#"{"kind":"Pod","metadata":{"name":"p","namespace":"a","uid":"u",
                "resourceVersion":"7"},"spec":{"nodeName": BROKEN"#,
        )
        .expect("the identity comes before the damage");
        assert_eq!((id.namespace.as_str(), id.name.as_str()), ("a", "p"));
        assert_eq!((id.uid.as_str(), id.rv.as_str()), ("u", "7"));
        let cluster_scoped =
            br#"{"metadata":{"uid":"u","name":"n1","labels":{"x":"y"}},"spec":{}}"#;
        let id = identity_prefix(cluster_scoped).expect("valid");
        assert_eq!(id, identity(cluster_scoped).expect("valid"));
        assert!(identity_prefix(br#"{"metadata":{"namespace":"a"}}"#).is_err());
        assert!(identity_prefix(br#"{"spec":{}}"#).is_err());
        assert!(identity_prefix(br#"{"metadata":{"name":"n1","uid":"#).is_err());
        assert!(identity_prefix(b"[1,2]").is_err());
        assert!(identity_prefix(br#"{"metadata":{"name":7}}"#).is_err());
    }

    #[test]
    fn identity_prefix_agrees_with_the_whole_read_of_real_objects() {
        #[derive(Deserialize)]
        struct RawItems<'a> {
            #[serde(borrow)]
            items: Vec<&'a serde_json::value::RawValue>,
        }
        let fixture = include_str!("../../testkit/fixtures/kube-system-pods.json");
        let list: RawItems<'_> = serde_json::from_str(fixture).expect("fixture");
        assert!(list.items.len() >= 8);
        for raw in list.items {
            // kube-apiserver's own key order (the fixture's), and sorted (serde_json::Value's).
            let real_order = raw.get().as_bytes();
            let value: Value = serde_json::from_slice(real_order).expect("a pod");
            let sorted = value.to_string();
            for bytes in [real_order, sorted.as_bytes()] {
                let whole = identity(bytes).expect("a real pod");
                assert_eq!(identity_prefix(bytes).expect("a real pod"), whole);
            }
        }
    }

    #[test]
    fn field_selectors_see_nested_strings_bools_and_missing_fields() {
        let pod = json!({"metadata": {"name": "p", "namespace": "ns"},
            "spec": {"nodeName": "n1", "hostNetwork": true}, "status": {"phase": "Running"}});
        let check = |s: &str| {
            let sel = FieldSelector::parse(s).expect("valid selector");
            Filter {
                fields: Some(&sel),
                ..Filter::default()
            }
            .matches_json(&pod)
        };
        assert!(check(
            "spec.nodeName=n1,status.phase=Running,metadata.namespace=ns"
        ));
        assert!(check("spec.hostNetwork=true"));
        assert!(!check("spec.nodeName=n2"));
        assert!(
            check("spec.schedulerName="),
            "a missing field reads as empty"
        );
        assert!(check("spec.schedulerName!=x"));
    }

    #[test]
    fn parts_keep_exactly_what_the_filter_reads() {
        let fields = FieldSelector::parse("spec.nodeName=n1,status.phase=Running").expect("valid");
        let labels = LabelSelector::parse("app").expect("valid");
        let f = Filter {
            labels: Some(&labels),
            fields: Some(&fields),
            ..Filter::default()
        };
        let pod = br#"{"metadata":{"name":"p","namespace":"a","labels":{"app":"x"},"uid":"u"},
            "spec":{"nodeName":"n1","containers":[{"name":"c"}]},"status":"weird"}"#;
        let parts = f.parts(pod).expect("valid JSON");
        let expected = json!({"metadata": {"namespace": "a", "labels": {"app": "x"}},
            "spec": {"nodeName": "n1"}, "status": null});
        assert_eq!(parts, expected);
        assert!(f.parts(br#"{"metadata":{}} trailing"#).is_err());
        assert!(f.parts(br#"{"spec":{"nodeName":"n1""#).is_err());
    }

    #[test]
    fn label_selectors_read_metadata_labels() {
        let svc = json!({"metadata": {"name": "s", "labels": {"app": "web"}}});
        let sel = LabelSelector::parse("app=web,!service.kubernetes.io/headless").expect("valid");
        let f = Filter {
            labels: Some(&sel),
            ..Filter::default()
        };
        assert!(f.matches_json(&svc));
        assert!(!f.matches_json(&json!({"metadata": {"name": "s"}})));
    }
}
