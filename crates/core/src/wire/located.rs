//! [`LocatedList`]: a list body whose items are found, not read. For a cache that holds most of
//! a relisted scope already: an item it holds byte for byte needs no reading, and it reads the
//! others itself. [`List`](super::List) reads every item as JSON first, which for a 1 MB list
//! is most of the work of storing it.
//!
//! What lies outside the items (`kind`, `apiVersion`, `metadata`, any other key, the separators)
//! is read as strict JSON; an item is located by its braces, strings (and their escapes) hiding
//! the braces inside them. A body that is valid JSON splits exactly as a JSON parser reads it
//! (`tests::splits_as_serde_reads`); one that is not may still split, and then the caller's own
//! read of the odd item fails.

use std::borrow::Cow;
use std::ops::{ControlFlow, Range};

use serde::Deserialize;
use serde::de::IgnoredAny;

use super::ListMeta;

/// A list body's parts; every part but `items` read as JSON.
#[derive(Debug, Default)]
pub struct LocatedList<'a> {
    pub kind: Option<Cow<'a, str>>,
    pub api_version: Option<Cow<'a, str>>,
    pub metadata: ListMeta,
    /// Each item's bytes, `{` to `}`: located, **not validated** (empty when absent or `null`).
    pub items: Vec<&'a [u8]>,
}

/// A list body read up to its `items` key, as kube-apiserver writes it (`kind`, `apiVersion`,
/// `metadata`, then `items`): for a cache to tell a relist that repeats the last one by comparing
/// its bytes, all but `metadata`'s, with the last one's, before it locates a single item.
#[derive(Debug)]
pub struct ListHead<'a> {
    pub kind: Cow<'a, str>,
    pub api_version: Cow<'a, str>,
    pub metadata: ListMeta,
    /// Where `metadata`'s value lies in the body.
    pub metadata_at: Range<usize>,
}

impl<'a> ListHead<'a> {
    /// The head of `body`, or `None` when `items` does not follow `kind`, `apiVersion` and
    /// `metadata` (then only [`LocatedList::parse`] can tell). What follows `items` is not read.
    pub fn parse(body: &'a [u8]) -> Result<Option<ListHead<'a>>, LocateError> {
        Cursor { body, at: 0 }.head()
    }
}

/// Why a body is not a list.
#[derive(Debug, thiserror::Error)]
pub enum LocateError {
    #[error("{what} at byte {at}")]
    Syntax { what: &'static str, at: usize },
    #[error("at byte {at}: {source}")]
    Json {
        at: usize,
        #[source]
        source: serde_json::Error,
    },
    #[error("duplicate field `{0}`")]
    Duplicate(&'static str),
}

impl<'a> LocatedList<'a> {
    /// Splits a whole list body.
    pub fn parse(body: &'a [u8]) -> Result<LocatedList<'a>, LocateError> {
        let mut cursor = Cursor { body, at: 0 };
        let list = cursor.list()?;
        cursor.skip_whitespace();
        match cursor.at == body.len() {
            true => Ok(list),
            false => Err(cursor.syntax("trailing characters")),
        }
    }
}

/// Where the split has got to.
struct Cursor<'a> {
    body: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn list(&mut self) -> Result<LocatedList<'a>, LocateError> {
        let mut list = LocatedList::default();
        let mut seen = Seen::default();
        self.keys(|cursor, key| {
            match key.as_ref() {
                "kind" => list.kind = once(&mut seen.kind, "kind", cursor.value())?,
                "apiVersion" => {
                    list.api_version = once(&mut seen.api_version, "apiVersion", cursor.value())?;
                }
                "metadata" => {
                    list.metadata = once(&mut seen.metadata, "metadata", cursor.value())?;
                }
                "items" => list.items = once(&mut seen.items, "items", cursor.items())?,
                _ => {
                    cursor.value::<IgnoredAny>()?;
                }
            }
            Ok(ControlFlow::Continue(()))
        })?;
        Ok(list)
    }

    /// The keys before `items`, read as [`Cursor::list`] reads them.
    fn head(&mut self) -> Result<Option<ListHead<'a>>, LocateError> {
        let (mut kind, mut api_version, mut metadata) = (None, None, None);
        let mut seen = Seen::default();
        let reached_items = self.keys(|cursor, key| {
            match key.as_ref() {
                "kind" => kind = once(&mut seen.kind, "kind", cursor.value())?,
                "apiVersion" => {
                    api_version = once(&mut seen.api_version, "apiVersion", cursor.value())?;
                }
                "metadata" => {
                    cursor.skip_whitespace();
                    let start = cursor.at;
                    let meta = once(&mut seen.metadata, "metadata", cursor.value())?;
                    metadata = Some((meta, start..cursor.at));
                }
                "items" => return Ok(ControlFlow::Break(())),
                _ => {
                    cursor.value::<IgnoredAny>()?;
                }
            }
            Ok(ControlFlow::Continue(()))
        })?;
        let (true, Some(kind), Some(api_version), Some((metadata, metadata_at))) =
            (reached_items, kind, api_version, metadata)
        else {
            return Ok(None);
        };
        Ok(Some(ListHead {
            kind,
            api_version,
            metadata,
            metadata_at,
        }))
    }

    /// Reads a JSON object's keys, `value` reading each one's value; whether `value` stopped it
    /// (at the value of the key it was given).
    fn keys(
        &mut self,
        mut value: impl FnMut(&mut Self, Cow<'a, str>) -> Result<ControlFlow<()>, LocateError>,
    ) -> Result<bool, LocateError> {
        self.expect(b'{', "expected a JSON object")?;
        if self.next_is(b'}') {
            return Ok(false);
        }
        loop {
            let key: Cow<'a, str> = self.value()?;
            self.expect(b':', "expected `:`")?;
            if value(self, key)?.is_break() {
                return Ok(true);
            }
            if !self.next_is(b',') {
                self.expect(b'}', "expected `,` or `}`")?;
                return Ok(false);
            }
        }
    }

    /// `items`: `null`, or an array of objects.
    fn items(&mut self) -> Result<Vec<&'a [u8]>, LocateError> {
        self.skip_whitespace();
        if self.body.get(self.at) == Some(&b'n') {
            self.value::<()>()?;
            return Ok(Vec::new());
        }
        self.expect(b'[', "expected the items array")?;
        let mut items = Vec::new();
        if self.next_is(b']') {
            return Ok(items);
        }
        loop {
            self.skip_whitespace();
            if self.body.get(self.at) != Some(&b'{') {
                return Err(self.syntax("a list item that is not an object"));
            }
            let end = object_end(self.body, self.at)
                .ok_or_else(|| self.syntax("a list item that does not end"))?;
            items.push(&self.body[self.at..end]);
            self.at = end;
            if !self.next_is(b',') {
                self.expect(b']', "expected `,` or `]` after a list item")?;
                return Ok(items);
            }
        }
    }

    /// One JSON value, read strictly, from here.
    fn value<T: Deserialize<'a>>(&mut self) -> Result<T, LocateError> {
        let mut values = serde_json::Deserializer::from_slice(&self.body[self.at..]).into_iter();
        let value = match values.next() {
            Some(Ok(value)) => value,
            Some(Err(source)) => {
                return Err(LocateError::Json {
                    at: self.at,
                    source,
                });
            }
            None => return Err(self.syntax("unexpected end")),
        };
        self.at += values.byte_offset();
        Ok(value)
    }

    /// Takes `byte` (after any whitespace) if it comes next.
    fn next_is(&mut self, byte: u8) -> bool {
        self.skip_whitespace();
        let found = self.body.get(self.at) == Some(&byte);
        self.at += usize::from(found);
        found
    }

    fn expect(&mut self, byte: u8, what: &'static str) -> Result<(), LocateError> {
        match self.next_is(byte) {
            true => Ok(()),
            false => Err(self.syntax(what)),
        }
    }

    fn skip_whitespace(&mut self) {
        while let Some(b' ' | b'\n' | b'\r' | b'\t') = self.body.get(self.at) {
            self.at += 1;
        }
    }

    fn syntax(&self, what: &'static str) -> LocateError {
        LocateError::Syntax { what, at: self.at }
    }
}

/// The list's own keys met so far: JSON allows a key twice, a list does not (as serde's derive
/// refuses it for [`List`](super::List)).
#[derive(Default)]
struct Seen {
    kind: bool,
    api_version: bool,
    metadata: bool,
    items: bool,
}

/// `value`, unless the key was seen before.
fn once<T>(
    seen: &mut bool,
    name: &'static str,
    value: Result<T, LocateError>,
) -> Result<T, LocateError> {
    let value = value?;
    match std::mem::replace(seen, true) {
        true => Err(LocateError::Duplicate(name)),
        false => Ok(value),
    }
}

/// The end (one past the `}`) of the object whose `{` is at `start`, or `None` if the body ends
/// first. Only strings and braces matter: brackets, numbers and literals cannot hide a brace.
///
/// Kubernetes JSON is mostly short strings (a pod's managed fields: hundreds of `"f:…"` keys),
/// which a byte-by-byte scan mispredicts at every quote. So, as simdjson's first stage does, the
/// bytes are read in blocks of 64 into bit masks (quotes, backslashes, braces), the strings found
/// by a prefix XOR of the quotes, and only the braces outside them visited one by one.
fn object_end(body: &[u8], start: usize) -> Option<usize> {
    let mut scan = BlockScan::default();
    let mut base = start;
    while base < body.len() {
        let end = (base + BLOCK).min(body.len());
        if let Some(found) = scan.block(&body[base..end]) {
            return Some(base + found + 1);
        }
        base = end;
    }
    None
}

const BLOCK: usize = 64;

/// What a block leaves to the next.
#[derive(Default)]
struct BlockScan {
    depth: usize,
    /// The block ended inside a string.
    in_string: bool,
    /// The block ended with a backslash that escapes the next block's first byte.
    escape_next: bool,
}

/// One bit per byte of a block (bit `i` for byte `i`).
struct Masks {
    quotes: u64,
    backslashes: u64,
    /// `{` and `}` (told apart by their byte: few are visited).
    braces: u64,
}

impl Masks {
    /// A block shorter than [`BLOCK`] (a body's last) is read as if padded with zeros.
    fn of(block: &[u8]) -> Masks {
        if let Ok(whole) = block.try_into() {
            return Masks::of_whole(whole);
        }
        let mut padded = [0u8; BLOCK];
        padded[..block.len()].copy_from_slice(block);
        Masks::of_whole(&padded)
    }

    fn of_whole(block: &[u8; BLOCK]) -> Masks {
        Masks {
            quotes: bits_where(block, |byte| byte == b'"'),
            backslashes: bits_where(block, |byte| byte == b'\\'),
            braces: bits_where(block, |byte| byte == b'{' || byte == b'}'),
        }
    }
}

/// Bit `i` set where `block[i]` matches. Written for the compiler to vectorize: a compare per
/// byte into 0 or 1, then each eight of those gathered into a byte by one multiplication (the
/// 1 of byte `k` lands on bit `56 + k`, no two partial products meeting), skipped for a block
/// without a match (most blocks have no backslash).
fn bits_where(block: &[u8; BLOCK], matches: impl Fn(u8) -> bool) -> u64 {
    const GATHER: u64 = 0x0102_0408_1020_4080;
    let ones: [u8; BLOCK] = std::array::from_fn(|i| u8::from(matches(block[i])));
    if ones.iter().all(|&one| one == 0) {
        return 0;
    }
    let mut bits = 0;
    for (k, eight) in ones.chunks_exact(8).enumerate() {
        let eight = u64::from_le_bytes(eight.try_into().expect("eight bytes"));
        bits |= (eight.wrapping_mul(GATHER) >> 56) << (8 * k);
    }
    bits
}

impl BlockScan {
    /// Reads a block (at most [`BLOCK`] bytes); the index of the `}` that closes the object.
    fn block(&mut self, block: &[u8]) -> Option<usize> {
        let masks = Masks::of(block);
        let quotes = masks.quotes & !self.escaped(masks.backslashes);
        // Bits from each opening quote up to (not including) its closing one.
        let mut strings = prefix_xor(quotes);
        if self.in_string {
            strings = !strings;
        }
        let last = block.len() - 1;
        self.in_string = strings >> last & 1 == 1;
        let mut braces = masks.braces & !strings;
        while braces != 0 {
            let at = braces.trailing_zeros() as usize;
            braces &= braces - 1;
            if block[at] == b'{' {
                self.depth += 1;
                continue;
            }
            self.depth = self.depth.checked_sub(1)?;
            if self.depth == 0 {
                return Some(at);
            }
        }
        None
    }

    /// The bytes escaped by a backslash (itself not escaped); notes an escape into the next block.
    fn escaped(&mut self, mut backslashes: u64) -> u64 {
        let mut escaped = u64::from(std::mem::take(&mut self.escape_next));
        while backslashes != 0 {
            let at = backslashes.trailing_zeros();
            backslashes &= backslashes - 1;
            if escaped >> at & 1 == 1 {
                continue;
            }
            match at as usize + 1 {
                BLOCK => self.escape_next = true,
                next => escaped |= 1 << next,
            }
        }
        escaped
    }
}

/// Bit `i` of the result is the XOR of bits `0..=i` of `bits`: set inside each pair of quotes.
fn prefix_xor(mut bits: u64) -> u64 {
    for shift in [1, 2, 4, 8, 16, 32] {
        bits ^= bits << shift;
    }
    bits
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::{Map, Value, json};

    use super::*;
    use crate::wire::List;

    /// Any JSON value; strings favour what could fool a splitter: braces, quotes, backslashes.
    fn any_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(Value::from),
            "[{}\\[\\]\"\\\\a-z\u{e9}\u{1F600}\n]{0,12}".prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 40, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                prop::collection::btree_map("[{}\"a-z]{0,6}", inner, 0..6)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    fn any_item() -> impl Strategy<Value = Value> {
        prop::collection::btree_map("[{}\"a-z]{0,6}", any_value(), 0..6)
            .prop_map(|m| Value::Object(m.into_iter().collect::<Map<_, _>>()))
    }

    /// A list body as kube-apiserver or anyone else could write it: keys in any order, other
    /// keys beside them, items absent, `null` or an array, compact or indented.
    fn any_list() -> impl Strategy<Value = String> {
        (
            prop::option::of(prop::collection::vec(any_item(), 0..5)),
            any::<bool>(),
            any::<bool>(),
            prop::option::of(any_value()),
            any::<bool>(),
        )
            .prop_map(|(items, items_null, kind_last, extra, pretty)| {
                let mut list = Map::new();
                if !kind_last {
                    list.insert("kind".into(), json!("PodList"));
                }
                if let Some(extra) = extra {
                    list.insert("extra".into(), extra);
                }
                list.insert(
                    "metadata".into(),
                    json!({"resourceVersion": "12", "continue": "x{\"}"}),
                );
                match items {
                    Some(items) => list.insert("items".into(), Value::Array(items)),
                    None if items_null => list.insert("items".into(), Value::Null),
                    None => None,
                };
                if kind_last {
                    list.insert("kind".into(), json!("PodList"));
                }
                list.insert("apiVersion".into(), json!("v1"));
                let list = Value::Object(list);
                match pretty {
                    true => serde_json::to_string_pretty(&list).unwrap(),
                    false => list.to_string(),
                }
            })
    }

    proptest! {
        #[test]
        fn splits_as_serde_reads(body in any_list()) {
            let read = List::parse(body.as_bytes()).unwrap();
            let located = LocatedList::parse(body.as_bytes()).unwrap();
            let read_items: Vec<&[u8]> = read.items().iter().map(|i| i.get().as_bytes()).collect();
            prop_assert_eq!(located.items, read_items);
            prop_assert_eq!(located.kind, read.kind);
            prop_assert_eq!(located.api_version, read.api_version);
            prop_assert_eq!(located.metadata, read.metadata);
        }

        #[test]
        fn a_head_reads_as_the_whole_list_reads(body in any_list()) {
            let whole = LocatedList::parse(body.as_bytes()).unwrap();
            if let Some(head) = ListHead::parse(body.as_bytes()).unwrap() {
                prop_assert_eq!(Some(head.kind), whole.kind);
                prop_assert_eq!(Some(head.api_version), whole.api_version);
                prop_assert_eq!(&head.metadata, &whole.metadata);
                let span: ListMeta = serde_json::from_slice(&body.as_bytes()[head.metadata_at]).unwrap();
                prop_assert_eq!(span, whole.metadata);
            }
        }

        #[test]
        fn the_head_of_a_list_as_kube_apiserver_writes_it_is_read(
            items in prop::collection::vec(any_item(), 0..4),
            rv in "[0-9]{1,6}",
        ) {
            let items = Value::Array(items);
            let body = format!(
                r#"{{"kind":"PodList","apiVersion":"v1","metadata":{{"resourceVersion":"{rv}"}},"items":{items}}}"#
            );
            let head = ListHead::parse(body.as_bytes()).unwrap().expect("a head");
            prop_assert_eq!(head.metadata.resource_version, rv.clone());
            prop_assert_eq!(
                &body[head.metadata_at],
                format!(r#"{{"resourceVersion":"{rv}"}}"#)
            );
        }

        #[test]
        fn no_cut_of_a_list_splits(body in any_list(), cut in any::<prop::sample::Index>()) {
            let cut = cut.index(body.len());
            prop_assert!(LocatedList::parse(&body.as_bytes()[..cut]).is_err(), "{}", &body[..cut]);
        }
    }

    #[test]
    fn what_is_not_a_list_is_refused() {
        for body in [
            "",
            "[]",
            r#"{"kind":"PodList","kind":"PodList"}"#,
            r#"{"items":[],"items":[]}"#,
            r#"{"items":[1]}"#,
            r#"{"items":[{}}"#,
            r#"{"items":[{}]"#,
            r#"{"items":[{} {}]}"#,
            r#"{"items":{}}"#,
            r#"{"metadata":null}"#,
            r#"{"metadata":{"resourceVersion":7}}"#,
            r#"{"kind":"PodList"} x"#,
            r#"{"kind":"PodList",}"#,
            r#"{"kind" "PodList"}"#,
            r#"{"other":[1,]}"#,
        ] {
            assert!(LocatedList::parse(body.as_bytes()).is_err(), "{body}");
            assert!(
                List::parse(body.as_bytes()).is_err() || body.contains("[1]"),
                "{body}"
            );
        }
    }

    #[test]
    fn a_head_is_only_what_comes_before_items() {
        for body in [
            r#"{"items":[],"kind":"PodList","apiVersion":"v1","metadata":{}}"#,
            r#"{"kind":"PodList","apiVersion":"v1","items":[],"metadata":{}}"#,
            r#"{"kind":"PodList","metadata":{},"items":[]}"#,
            r#"{"kind":"PodList","apiVersion":"v1","metadata":{}}"#,
            r#"{}"#,
        ] {
            assert!(
                ListHead::parse(body.as_bytes()).unwrap().is_none(),
                "{body}"
            );
        }
        for body in [
            "",
            r#"{"kind":"PodList","kind":"PodList"}"#,
            r#"{"kind":"PodList" "apiVersion":"v1"}"#,
            r#"{"metadata":{"resourceVersion":7},"items":[]}"#,
        ] {
            assert!(ListHead::parse(body.as_bytes()).is_err(), "{body}");
        }
        let head = ListHead::parse(br#"{ "kind" : "PodList", "x":[1], "apiVersion":"v1", "metadata": {"resourceVersion":"3"} , "items": not read"#)
            .unwrap()
            .expect("a head");
        assert_eq!((&*head.kind, &*head.api_version), ("PodList", "v1"));
        assert_eq!(head.metadata.resource_version, "3");
    }

    #[test]
    fn an_item_is_located_not_read() {
        // Its caller reads it (the cache, before storing anything it does not hold already).
        let list = LocatedList::parse(br#" {"items": [ {"a":x} , {"b":"}\"{"} ] } "#).unwrap();
        assert_eq!(list.items, [&br#"{"a":x}"#[..], br#"{"b":"}\"{"}"#]);
        assert!(List::parse(br#"{"items":[{"a":x}]}"#).is_err());
    }
}
