//! List bodies: `{"kind":"PodList","apiVersion":"v1","metadata":{…},"items":[…]}`.
//!
//! [`List`] reads one (the items as raw JSON text, borrowed), [`ListMeta`] is its `metadata`,
//! and [`list_chunks`] writes one from items kept as bytes, without copying them.

use std::borrow::Cow;

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

/// A list's `metadata`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
pub struct ListMeta {
    #[serde(default, rename = "resourceVersion")]
    pub resource_version: String,
    /// Set on every page of a chunked list but the last.
    #[serde(default, rename = "continue", skip_serializing_if = "String::is_empty")]
    pub continue_token: String,
    #[serde(
        default,
        rename = "remainingItemCount",
        skip_serializing_if = "Option::is_none"
    )]
    pub remaining_item_count: Option<u64>,
}

/// A list body, its items borrowed as JSON text. Every part is optional here: what a caller
/// requires (a kind, a resourceVersion) it checks itself.
#[derive(Debug, Deserialize)]
pub struct List<'a> {
    #[serde(borrow)]
    pub kind: Option<Cow<'a, str>>,
    #[serde(borrow, rename = "apiVersion")]
    pub api_version: Option<Cow<'a, str>>,
    #[serde(default)]
    pub metadata: ListMeta,
    /// `None` when absent or `null`.
    #[serde(borrow)]
    pub items: Option<Vec<&'a RawValue>>,
}

impl<'a> List<'a> {
    /// Reads a whole list body.
    pub fn parse(body: &'a [u8]) -> Result<List<'a>, serde_json::Error> {
        serde_json::from_slice(body)
    }

    /// [`List::parse`] of a body held as text.
    pub fn parse_str(body: &'a str) -> Result<List<'a>, serde_json::Error> {
        serde_json::from_str(body)
    }

    /// The items (none when absent).
    pub fn items(&self) -> &[&'a RawValue] {
        self.items.as_deref().unwrap_or_default()
    }
}

/// What precedes a list's first item: `{"kind":…,"apiVersion":…,"metadata":{…},"items":[`.
pub fn list_head(kind: &str, api_version: &str, metadata: &ListMeta) -> String {
    #[derive(Serialize)]
    struct Head<'h> {
        kind: &'h str,
        #[serde(rename = "apiVersion")]
        api_version: &'h str,
        metadata: &'h ListMeta,
    }
    let mut head = serde_json::to_string(&Head {
        kind,
        api_version,
        metadata,
    })
    .expect("a list head serializes");
    head.pop(); // the closing brace: `items` follows
    head.push_str(",\"items\":[");
    head
}

/// What follows a list's last item.
pub const LIST_END: &[u8] = b"]}";

/// A list body as pieces: its head ([`list_head`]), each item and the commas between them, and
/// [`LIST_END`]; the items are the given `Bytes` themselves (no copy into one buffer).
pub fn list_chunks(head: String, items: impl ExactSizeIterator<Item = Bytes>) -> Vec<Bytes> {
    const COMMA: Bytes = Bytes::from_static(b",");
    let mut chunks = Vec::with_capacity(2 * items.len() + 2);
    chunks.push(Bytes::from(head));
    for (i, item) in items.enumerate() {
        if i > 0 {
            chunks.push(COMMA);
        }
        chunks.push(item);
    }
    chunks.push(Bytes::from_static(LIST_END));
    chunks
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_are_written_and_read_back() {
        let meta = ListMeta {
            resource_version: "9".into(),
            continue_token: "next".into(),
            remaining_item_count: Some(3),
        };
        let items = [Bytes::from_static(b"{\"a\":1}"), Bytes::from_static(b"{}")];
        let body = list_chunks(list_head("PodList", "v1", &meta), items.into_iter()).concat();
        assert_eq!(
            std::str::from_utf8(&body).unwrap(),
            r#"{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"9","continue":"next","remainingItemCount":3},"items":[{"a":1},{}]}"#
        );
        let list = List::parse(&body).unwrap();
        assert_eq!(list.kind.as_deref(), Some("PodList"));
        assert_eq!(list.metadata, meta);
        assert_eq!(list.items().len(), 2);
        let plain = list_head("List", "v1", &ListMeta::default());
        assert_eq!(
            plain,
            r#"{"kind":"List","apiVersion":"v1","metadata":{"resourceVersion":""},"items":["#
        );
    }

    #[test]
    fn missing_parts_are_absent_not_errors() {
        let list = List::parse(br#"{"items":null}"#).unwrap();
        assert!(list.kind.is_none() && list.items().is_empty());
        assert!(List::parse(br#"{"items":[1]}"#).is_ok());
        assert!(List::parse(b"nope").is_err());
    }
}
