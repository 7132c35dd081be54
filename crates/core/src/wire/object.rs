//! An object's head: its `kind`, `apiVersion` and identity (`metadata.namespace`, `name`,
//! `resourceVersion`, `uid`), borrowed from its JSON.
//!
//! [`ObjectHead::parse`] reads (and so validates) the whole document; [`ObjectMeta::peek`]
//! reads only as far as the identity goes: kube-apiserver writes `metadata` first and its
//! identity first within it, so an object is read a few dozen bytes deep, not to its end.

use std::borrow::Cow;
use std::fmt;

use serde::Deserialize;
use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, Visitor};

/// An object's type and identity.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ObjectHead<'a> {
    #[serde(borrow)]
    pub kind: Option<Cow<'a, str>>,
    #[serde(borrow, rename = "apiVersion")]
    pub api_version: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub metadata: ObjectMeta<'a>,
}

impl<'a> ObjectHead<'a> {
    /// Reads the whole document, keeping only the head. Empty strings stand for what is absent.
    pub fn parse(object: &'a [u8]) -> Result<ObjectHead<'a>, serde_json::Error> {
        serde_json::from_slice(object)
    }
}

/// An object's identity; an absent field is empty.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct ObjectMeta<'a> {
    #[serde(borrow, default)]
    pub namespace: Cow<'a, str>,
    #[serde(borrow, default)]
    pub name: Cow<'a, str>,
    #[serde(borrow, default, rename = "resourceVersion")]
    pub resource_version: Cow<'a, str>,
    #[serde(borrow, default)]
    pub uid: Cow<'a, str>,
}

/// Why [`ObjectMeta::peek`] found no identity.
#[derive(Debug, thiserror::Error)]
pub enum PeekError {
    #[error("not a JSON object: {0}")]
    Json(#[source] serde_json::Error),
    #[error("the object has no metadata")]
    NoMetadata,
}

impl<'a> ObjectMeta<'a> {
    /// `namespace/name` (`/name` for a cluster-scoped object).
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// The identity, read only as deep as it goes: the read stops once `name`, `namespace`,
    /// `uid` and `resourceVersion` are all known or at the end of `metadata`. Nothing after that
    /// point is looked at, so this does not say that the whole object is well-formed.
    pub fn peek(object: &'a [u8]) -> Result<ObjectMeta<'a>, PeekError> {
        let mut found = Prefix::default();
        let mut de = serde_json::Deserializer::from_slice(object);
        let read = de.deserialize_map(TopLevel(&mut found));
        if !found.metadata_read {
            return Err(match read {
                Err(e) => PeekError::Json(e),
                Ok(()) => PeekError::NoMetadata,
            });
        }
        Ok(found.meta)
    }
}

/// What [`ObjectMeta::peek`] has read so far.
#[derive(Default)]
struct Prefix<'a> {
    meta: ObjectMeta<'a>,
    /// Which of the four identity fields were seen (one bit each).
    seen: u8,
    metadata_read: bool,
}

const ALL_IDENTITY_FIELDS: u8 = 0b1111;

#[derive(Deserialize)]
#[serde(field_identifier, rename_all = "camelCase")]
enum MetaKey {
    Name,
    Namespace,
    Uid,
    ResourceVersion,
    #[serde(other)]
    Other,
}

#[derive(Deserialize, PartialEq)]
#[serde(field_identifier, rename_all = "camelCase")]
enum TopKey {
    Metadata,
    #[serde(other)]
    Other,
}

/// serde has no early return: a visitor that has what it needs stops the read with this error.
fn stop<E: serde::de::Error>() -> E {
    E::custom("identity read")
}

struct TopLevel<'p, 'a>(&'p mut Prefix<'a>);

impl<'de> Visitor<'de> for TopLevel<'_, 'de> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(key) = map.next_key::<TopKey>()? {
            if key == TopKey::Metadata {
                map.next_value_seed(MetaFields(&mut *self.0))?;
                self.0.metadata_read = true;
                return Err(stop());
            }
            map.next_value::<IgnoredAny>()?;
        }
        Ok(())
    }
}

struct MetaFields<'p, 'a>(&'p mut Prefix<'a>);

impl<'de> DeserializeSeed<'de> for MetaFields<'_, 'de> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for MetaFields<'_, 'de> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object's metadata")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let found = self.0;
        while let Some(key) = map.next_key::<MetaKey>()? {
            let (slot, bit) = match key {
                MetaKey::Name => (&mut found.meta.name, 0b0001),
                MetaKey::Namespace => (&mut found.meta.namespace, 0b0010),
                MetaKey::Uid => (&mut found.meta.uid, 0b0100),
                MetaKey::ResourceVersion => (&mut found.meta.resource_version, 0b1000),
                MetaKey::Other => {
                    map.next_value::<IgnoredAny>()?;
                    continue;
                }
            };
            *slot = map.next_value::<Str<'de>>()?.0;
            found.seen |= bit;
            if found.seen == ALL_IDENTITY_FIELDS {
                found.metadata_read = true;
                return Err(stop());
            }
        }
        Ok(())
    }
}

/// A string that borrows from the input unless it holds escapes.
#[derive(Deserialize)]
#[serde(transparent)]
struct Str<'a>(#[serde(borrow)] Cow<'a, str>);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_head_is_read_from_the_whole_document() {
        let head = ObjectHead::parse(
            br#"{"kind":"Pod","apiVersion":"v1","metadata":{"name":"a","namespace":"d","resourceVersion":"7","uid":"u"},"spec":{}}"#,
        )
        .unwrap();
        assert_eq!(head.kind.as_deref(), Some("Pod"));
        assert_eq!(head.api_version.as_deref(), Some("v1"));
        assert_eq!(head.metadata.key(), "d/a");
        assert_eq!(head.metadata.resource_version, "7");
        assert_eq!(head.metadata.uid, "u");
        assert!(
            ObjectHead::parse(br#"{"metadata":{}}"#)
                .unwrap()
                .kind
                .is_none()
        );
        assert!(ObjectHead::parse(br#"{"metadata":{"name":"a"},"spec":"#).is_err());
    }

    #[test]
    fn a_peek_stops_once_the_identity_is_known() {
        let meta = ObjectMeta::peek(
            br#"{"metadata":{"name":"a","namespace":"d","uid":"u","resourceVersion":"7"},"spec":"#,
        )
        .unwrap();
        assert_eq!(
            (&*meta.namespace, &*meta.name, &*meta.resource_version),
            ("d", "a", "7")
        );
        let partial = ObjectMeta::peek(br#"{"metadata":{"name":"a\"b"},"spec":{}}"#).unwrap();
        assert_eq!(partial.name, "a\"b");
        assert!(matches!(
            ObjectMeta::peek(br#"{"spec":{}}"#),
            Err(PeekError::NoMetadata)
        ));
        assert!(matches!(ObjectMeta::peek(b"nope"), Err(PeekError::Json(_))));
    }
}
