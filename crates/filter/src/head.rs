//! [`Head`]: the few fields every filter decides on, read from an object's JSON without decoding
//! the rest.
//!
//! Most objects in a filtered response are ones no filter touches (every Service but
//! `default/kubernetes` for masterservice, every EndpointSlice whose Service has no topology
//! annotation…). Reading kind, namespace, name, labels, annotations and `spec.type` as borrowed
//! strings is enough to tell, so those objects are never decoded into a `serde_json::Value` nor
//! re-encoded: they go out as their original bytes.
//!
//! Reading stops as soon as the head is complete: kube-apiserver writes `kind`, `apiVersion`,
//! `metadata` and `spec` first, so the endpoints of an EndpointSlice or the spec and status of
//! a Pod are never scanned here.

use std::borrow::Cow;
use std::fmt;

use serde::Deserialize;
use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, Visitor};

use crate::DecodeError;

/// An object's identity and the metadata filters look at, borrowed from its JSON.
#[derive(Debug, Clone, Default)]
pub struct Head<'a> {
    /// `kind`; list items carry none, so the chain fills in the kind the request implies.
    pub kind: Cow<'a, str>,
    pub namespace: Cow<'a, str>,
    pub name: Cow<'a, str>,
    pub labels: Pairs<'a>,
    pub annotations: Pairs<'a>,
    /// `spec.type` (Services: `ClusterIP`, `NodePort`, `LoadBalancer`…); empty when absent, and
    /// when the head was read without it.
    pub spec_type: Cow<'a, str>,
    /// The JSON text the object was read from (for a watch event, possibly the whole line): a
    /// filter may rule an object out by the absence of a substring.
    pub raw: &'a str,
}

impl<'a> Head<'a> {
    /// Reads the head of `raw` (one JSON object), `spec.type` included; `default_kind` stands
    /// in for a missing `kind`.
    pub fn parse(raw: &'a str, default_kind: &'a str) -> Result<Head<'a>, DecodeError> {
        Head::parse_until(raw, default_kind, true)
    }

    /// [`Head::parse`], reading `spec` only when `reads_spec`: without it, reading ends right
    /// after `metadata`.
    pub(crate) fn parse_until(
        raw: &'a str,
        default_kind: &'a str,
        reads_spec: bool,
    ) -> Result<Head<'a>, DecodeError> {
        let mut parts = Parts::default();
        let mut de = serde_json::Deserializer::from_str(raw);
        let read = ObjectSeed {
            parts: &mut parts,
            reads_spec,
        }
        .deserialize(&mut de);
        finish(read, &mut de, parts.complete)?;
        Ok(parts.into_head(raw, default_kind))
    }

    /// True for the object `namespace/name`.
    pub fn is(&self, namespace: &str, name: &str) -> bool {
        self.namespace == namespace && self.name == name
    }
}

/// Reading stops early by failing on purpose once the head is complete; that failure is success.
fn finish(
    read: Result<(), serde_json::Error>,
    de: &mut serde_json::Deserializer<serde_json::de::StrRead<'_>>,
    complete: bool,
) -> Result<(), DecodeError> {
    match read {
        Ok(()) => Ok(de.end()?),
        Err(_) if complete => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// The head's fields as they are read.
#[derive(Default)]
struct Parts<'a> {
    kind: Option<Str<'a>>,
    metadata: Option<MetaDe<'a>>,
    spec: Option<SpecDe<'a>>,
    /// Everything needed has been read (and reading was cut short on purpose).
    complete: bool,
}

impl<'a> Parts<'a> {
    fn into_head(self, raw: &'a str, default_kind: &'a str) -> Head<'a> {
        let metadata = self.metadata.unwrap_or_default();
        Head {
            kind: self.kind.map_or(Cow::Borrowed(default_kind), |k| k.0),
            namespace: metadata.namespace.unwrap_or_default().0,
            name: metadata.name.unwrap_or_default().0,
            labels: metadata.labels.unwrap_or_default(),
            annotations: metadata.annotations.unwrap_or_default(),
            spec_type: self.spec.and_then(|s| s.type_).unwrap_or_default().0,
            raw,
        }
    }
}

/// Reads one object's `kind`, `metadata` and (if asked) `spec`, then stops.
struct ObjectSeed<'p, 'a> {
    parts: &'p mut Parts<'a>,
    reads_spec: bool,
}

impl<'de> DeserializeSeed<'de> for ObjectSeed<'_, 'de> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for ObjectSeed<'_, 'de> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a Kubernetes object")
    }

    fn visit_map<M: MapAccess<'de>>(self, mut map: M) -> Result<(), M::Error> {
        while let Some(key) = map.next_key::<Str<'de>>()? {
            match &*key.0 {
                "kind" => self.parts.kind = map.next_value()?,
                "metadata" => self.parts.metadata = map.next_value()?,
                "spec" if self.reads_spec => self.parts.spec = map.next_value()?,
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
            if self.parts.metadata.is_some() && (!self.reads_spec || self.parts.spec.is_some()) {
                self.parts.complete = true;
                return Err(de::Error::custom("head complete"));
            }
        }
        Ok(())
    }
}

/// A string map (labels, annotations) as borrowed pairs: objects carry a handful, so a linear
/// scan beats building a map.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pairs<'a>(Vec<(Cow<'a, str>, Cow<'a, str>)>);

impl<'a> Pairs<'a> {
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0.iter().find(|(k, _)| k == key).map(|(_, v)| &**v)
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Pairs<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(PairsVisitor(std::marker::PhantomData))
    }
}

struct PairsVisitor<'a>(std::marker::PhantomData<&'a ()>);

impl<'de: 'a, 'a> Visitor<'de> for PairsVisitor<'a> {
    type Value = Pairs<'a>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a map of strings")
    }

    fn visit_map<M: MapAccess<'de>>(self, mut map: M) -> Result<Self::Value, M::Error> {
        let mut pairs = Vec::with_capacity(map.size_hint().unwrap_or(4));
        while let Some((k, v)) = map.next_entry::<Str<'a>, Str<'a>>()? {
            pairs.push((k.0, v.0));
        }
        Ok(Pairs(pairs))
    }
}

/// A string that borrows from the input unless it holds escapes.
#[derive(Debug, Default, Deserialize)]
#[serde(transparent)]
struct Str<'a>(#[serde(borrow)] Cow<'a, str>);

#[derive(Default, Deserialize)]
struct MetaDe<'a> {
    #[serde(borrow)]
    namespace: Option<Str<'a>>,
    #[serde(borrow)]
    name: Option<Str<'a>>,
    #[serde(borrow)]
    labels: Option<Pairs<'a>>,
    #[serde(borrow)]
    annotations: Option<Pairs<'a>>,
}

#[derive(Deserialize)]
struct SpecDe<'a> {
    #[serde(borrow, rename = "type")]
    type_: Option<Str<'a>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_identity_and_metadata_borrowed() {
        let raw = r#"{"kind":"Service","apiVersion":"v1","metadata":{"name":"web","namespace":"shop",
            "labels":{"app":"web"},"annotations":{"a":"1","b":"2"}},"spec":{"ports":[],"type":"NodePort"}}"#;
        let head = Head::parse(raw, "ignored").unwrap();
        assert_eq!(head.kind, "Service");
        assert!(head.is("shop", "web"));
        assert_eq!(head.labels.get("app"), Some("web"));
        assert_eq!(head.annotations.get("b"), Some("2"));
        assert_eq!(head.annotations.get("c"), None);
        assert_eq!(head.spec_type, "NodePort");
        assert!(matches!(head.name, Cow::Borrowed(_)));
    }

    #[test]
    fn list_items_take_the_default_kind_and_tolerate_missing_parts() {
        let head = Head::parse(r#"{"metadata":{"name":"x"}}"#, "Pod").unwrap();
        assert_eq!(head.kind, "Pod");
        assert_eq!(head.namespace, "");
        assert_eq!(head.spec_type, "");
        let head = Head::parse(r#"{"metadata":{"labels":null},"spec":null}"#, "Pod").unwrap();
        assert_eq!(head.labels, Pairs::default());
    }

    #[test]
    fn escaped_strings_are_unescaped() {
        let head = Head::parse(
            r#"{"metadata":{"annotations":{"k":"a\"b","last":"{\"x\":1}"}}}"#,
            "Service",
        )
        .unwrap();
        assert_eq!(head.annotations.get("k"), Some("a\"b"));
        assert_eq!(head.annotations.get("last"), Some("{\"x\":1}"));
    }

    #[test]
    fn malformed_metadata_is_an_error() {
        assert!(Head::parse(r#"{"metadata":{"labels":{"a":1}}}"#, "Pod").is_err());
        assert!(Head::parse(r#"{"metadata":"#, "Pod").is_err());
        assert!(Head::parse("[]", "Pod").is_err());
    }
}
