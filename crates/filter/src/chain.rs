//! [`Chain`]: the filters for one request, applied to response bytes.
//!
//! Three entry points, one per body shape: [`Chain::filter_object`] (GET, PATCH),
//! [`Chain::filter_list`] (LIST) and [`Chain::filter_event`] (one line of a WATCH stream). Each
//! object is first read as a [`Head`]; only when a filter asks for it is it decoded into a
//! `serde_json::Value`. The result is [`Outcome::Unchanged`] unless some object really changed or
//! was dropped, and a rebuilt list or event keeps every untouched object as its original bytes.

use std::fmt;

use bytes::Bytes;
use outpost_core::wire::{EventType, List, WatchEvent, split_event};
use serde_json::Value;

use crate::filter::{Filter, Peek, Verdict};
use crate::head::Head;
use crate::splice::{Rewrite, splice, splice_items};
use crate::{DecodeError, FilterContext};

/// What became of a response body.
#[derive(Debug)]
pub enum Outcome {
    /// Send the original bytes.
    Unchanged,
    /// Send these bytes instead.
    Replaced(Bytes),
    /// The body is not the JSON the chain expects: send the original bytes (and count it).
    Undecodable(DecodeError),
}

impl Outcome {
    /// The bytes to send, given the original body.
    pub fn into_bytes(self, original: Bytes) -> Bytes {
        match self {
            Outcome::Replaced(bytes) => bytes,
            Outcome::Unchanged | Outcome::Undecodable(_) => original,
        }
    }
}

/// The filters that apply to one request, in application order, and the kind of object its
/// responses carry. Cheap to clone; holds no side data (pass a [`FilterContext`] per call, so a
/// long watch sees side-data changes).
#[derive(Clone)]
pub struct Chain {
    filters: Vec<&'static dyn Filter>,
    kind: &'static str,
    /// Whether some filter peeks at `spec.type`, so heads are read up to `spec`, not just up to
    /// `metadata`.
    reads_spec: bool,
}

impl Chain {
    /// At most this many filters: [`Chain::apply`] tracks them in a bit mask.
    const MAX_FILTERS: usize = 32;

    pub(crate) fn new(kind: &'static str) -> Chain {
        Chain {
            filters: Vec::new(),
            kind,
            reads_spec: false,
        }
    }

    pub(crate) fn push(&mut self, filter: &'static dyn Filter) {
        assert!(
            self.filters.len() < Self::MAX_FILTERS,
            "too many filters in one chain"
        );
        self.reads_spec |= filter.peeks_at_spec_type();
        self.filters.push(filter);
    }

    /// The chain for a request that names `namespace` and `name` (empty: any): without the
    /// filters that can only change another object ([`Filter::only_object`]); `None` when
    /// none is left, and the response then streams through untouched.
    pub(crate) fn for_object(mut self, namespace: &str, name: &str) -> Option<Chain> {
        let may_change = |f: &&'static dyn Filter| {
            f.only_object().is_none_or(|(ns, n)| {
                (namespace.is_empty() || namespace == ns) && (name.is_empty() || name == n)
            })
        };
        self.filters.retain(may_change);
        self.reads_spec = self.filters.iter().any(|f| f.peeks_at_spec_type());
        (!self.filters.is_empty()).then_some(self)
    }

    /// The filters' names, in application order (for logs and metrics).
    pub fn names(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.filters.iter().map(|f| f.name())
    }

    /// The kind of the objects the chain filters (`Service`, `EndpointSlice`…).
    pub fn kind(&self) -> &'static str {
        self.kind
    }

    /// Whether some filter could change an object in `body`: `false` only when every filter
    /// names a [`Filter::marker`] and none occurs.
    pub fn may_change(&self, body: &[u8]) -> bool {
        self.filters.iter().any(|f| {
            f.marker()
                .is_none_or(|m| memchr::memmem::find(body, m).is_some())
        })
    }

    /// Every filter's [`Filter::marker`], or `None` when some filter names none.
    pub fn markers(&self) -> Option<Vec<&'static [u8]>> {
        self.filters.iter().map(|f| f.marker()).collect()
    }

    /// Filters a single-object body (GET, PATCH). An object a filter drops is sent unchanged,
    /// as yurthub does: a GET has no way to say "filtered out" short of a made-up 404.
    pub fn filter_object(&self, body: &[u8], ctx: &FilterContext) -> Outcome {
        let result = std::str::from_utf8(body)
            .map_err(DecodeError::from)
            .and_then(|raw| self.apply(raw, ctx));
        match result {
            Ok(Rewrite::Replace(new)) => Outcome::Replaced(Bytes::from(new)),
            Ok(Rewrite::Keep | Rewrite::Drop) => Outcome::Unchanged,
            Err(e) => Outcome::Undecodable(e),
        }
    }

    /// Filters a list body (LIST): each item is kept, rewritten or removed. Untouched items,
    /// and everything around `items`, are copied as they came.
    pub fn filter_list(&self, body: &[u8], ctx: &FilterContext) -> Outcome {
        if !self.may_change(body) {
            return Outcome::Unchanged;
        }
        match std::str::from_utf8(body)
            .map_err(DecodeError::from)
            .and_then(|raw| self.list(raw, ctx))
        {
            Ok(Some(new)) => Outcome::Replaced(Bytes::from(new)),
            Ok(None) => Outcome::Unchanged,
            Err(e) => Outcome::Undecodable(e),
        }
    }

    /// Filters one watch event line (`{"type":…,"object":…}`, with or without its trailing
    /// newline, which a replacement keeps). A dropped `ADDED`/`MODIFIED` object becomes a
    /// `DELETED` event carrying the object as received, so the client forgets it; `BOOKMARK`
    /// and `ERROR` events pass untouched.
    pub fn filter_event(&self, line: &[u8], ctx: &FilterContext) -> Outcome {
        match std::str::from_utf8(line)
            .map_err(DecodeError::from)
            .and_then(|raw| self.event(raw, ctx))
        {
            Ok(Some(new)) => Outcome::Replaced(Bytes::from(new)),
            Ok(None) => Outcome::Unchanged,
            Err(e) => Outcome::Undecodable(e),
        }
    }

    /// One object through every filter: peeks first, then decode only if a filter inspects.
    fn apply(&self, raw: &str, ctx: &FilterContext) -> Result<Rewrite, DecodeError> {
        let head = Head::parse_until(raw, self.kind, self.reads_spec)?;
        let inspect = match self.peek(&head, ctx) {
            Peeked::Pass => return Ok(Rewrite::Keep),
            Peeked::Drop => return Ok(Rewrite::Drop),
            Peeked::Inspect(mask) => mask,
        };
        if inspect.count_ones() == 1 {
            let only = self.filters[inspect.trailing_zeros() as usize];
            if let Some(rewrite) = only.filter_text(raw, &head, ctx) {
                return Ok(rewrite);
            }
        }
        let mut obj: Value = serde_json::from_str(raw)?;
        let mut changed = false;
        for (i, filter) in self.filters.iter().enumerate() {
            if inspect & (1 << i) == 0 {
                continue;
            }
            match filter.filter(&mut obj, &head, ctx) {
                Verdict::Keep => {}
                Verdict::Changed => changed = true,
                Verdict::Drop => return Ok(Rewrite::Drop),
            }
        }
        Ok(if changed {
            Rewrite::Replace(serde_json::to_string(&obj)?)
        } else {
            Rewrite::Keep
        })
    }

    /// Every filter's peek at `head`, combined.
    fn peek(&self, head: &Head<'_>, ctx: &FilterContext) -> Peeked {
        if head.kind != self.kind {
            // A Status, Table or PartialObjectMetadata: not what the filters are written for.
            return Peeked::Pass;
        }
        let mut inspect = 0u32;
        for (i, filter) in self.filters.iter().enumerate() {
            match filter.peek(head, ctx) {
                Peek::Pass => {}
                Peek::Drop => return Peeked::Drop,
                Peek::Inspect => inspect |= 1 << i,
            }
        }
        if inspect == 0 {
            Peeked::Pass
        } else {
            Peeked::Inspect(inspect)
        }
    }

    /// The rebuilt list, or `None` when every item is kept as is.
    fn list(&self, raw: &str, ctx: &FilterContext) -> Result<Option<String>, DecodeError> {
        let list = List::parse_str(raw)?;
        if list
            .kind
            .as_deref()
            .is_some_and(|k| k.strip_suffix("List") != Some(self.kind))
        {
            return Ok(None);
        }
        let items = list.items.unwrap_or_default();
        let mut edits = Vec::new();
        for (i, item) in items.iter().enumerate() {
            match self.apply(item.get(), ctx)? {
                Rewrite::Keep => {}
                edit => edits.push((i, edit)),
            }
        }
        if edits.is_empty() {
            return Ok(None);
        }
        Ok(Some(splice_items(raw, &items, edits)))
    }

    /// The rebuilt event line, or `None` when it goes out as is.
    fn event(&self, raw: &str, ctx: &FilterContext) -> Result<Option<String>, DecodeError> {
        if raw.trim().is_empty() {
            return Ok(None);
        }
        // The common case, kube-apiserver's layout, decided from the type and the object's head
        // alone; anything else is read in full.
        let event_type = EventType::of_line(raw.as_bytes());
        if event_type.is_some_and(|t| !t.changes_an_object()) {
            // BOOKMARK, ERROR: not objects of the kind filtered.
            return Ok(None);
        }
        if let Some((_, object)) = split_event(raw)
            && let Ok(head) = Head::parse_until(object, self.kind, self.reads_spec)
            && self.peek(&head, ctx) == Peeked::Pass
        {
            return Ok(None);
        }
        self.event_in_full(raw, ctx)
    }

    /// An event some filter acts on (or an unusually ordered one), read in full.
    fn event_in_full(&self, raw: &str, ctx: &FilterContext) -> Result<Option<String>, DecodeError> {
        // kube-apiserver's own layout: the object is found without scanning the line once more.
        // Any rewrite re-reads the object to its end, which rejects a wrong cut; then, and for
        // any other layout, the event is read as JSON.
        if let Some((kind, object)) = split_event(raw)
            && let Ok(rewrite) = self.apply(object, ctx)
        {
            return Ok(rebuild_event(raw, kind, object, rewrite));
        }
        let event = WatchEvent::parse_str(raw)?;
        let (Ok(event_type), Ok(object)) = (event.event_type(), event.object()) else {
            return Ok(None);
        };
        if !event_type.changes_an_object() {
            return Ok(None);
        }
        let rewrite = self.apply(object, ctx)?;
        Ok(rebuild_event(raw, event_type, object, rewrite))
    }
}

/// The event line after its object's rewrite, or `None` when it goes out as is.
fn rebuild_event(
    raw: &str,
    event_type: EventType,
    object: &str,
    rewrite: Rewrite,
) -> Option<String> {
    match rewrite {
        Rewrite::Keep => None,
        Rewrite::Replace(new) => Some(splice(raw, object, &new)),
        // Deleted anyway; its last state needs no filtering.
        Rewrite::Drop if event_type == EventType::Deleted => None,
        Rewrite::Drop => {
            let newline = &raw[raw.trim_end().len()..];
            let line = outpost_core::wire::event_line(EventType::Deleted, object.as_bytes());
            let line = std::str::from_utf8(&line[..line.len() - 1]).expect("UTF-8 in, UTF-8 out");
            Some(format!("{line}{newline}"))
        }
    }
}

/// The filters' combined peek at one object.
#[derive(Debug, PartialEq, Eq)]
enum Peeked {
    Pass,
    Drop,
    /// A bit per filter (by position) that asked to inspect.
    Inspect(u32),
}

impl fmt::Debug for Chain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Chain")
            .field("kind", &self.kind)
            .field("filters", &self.names().collect::<Vec<_>>())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::filters::ServiceTopology;

    #[test]
    fn a_wrong_cut_falls_back_to_reading_the_event() {
        let mut chain = Chain::new("EndpointSlice");
        chain.push(&ServiceTopology);
        let ctx = FilterContext::new("edge-1").with_service(
            "shop",
            "web",
            &[("openyurt.io/topologyKeys", "kubernetes.io/hostname")],
        );
        let object = r#"{"metadata":{"name":"web-1","namespace":"shop","labels":{"kubernetes.io/service-name":"web"}},"endpoints":[{"addresses":["10.0.0.1"],"nodeName":"edge-1"},{"addresses":["10.0.0.2"],"nodeName":"edge-2"}]}"#;
        let kept = r#"{"metadata":{"name":"web-1","namespace":"shop","labels":{"kubernetes.io/service-name":"web"}},"endpoints":[{"addresses":["10.0.0.1"],"nodeName":"edge-1"}]}"#;
        for (line, want) in [
            (
                format!("{{\"type\":\"ADDED\",\"object\":{object}}}\n"),
                format!("{{\"type\":\"ADDED\",\"object\":{kept}}}\n"),
            ),
            // A key after the object: the cut is not the object, the full read is.
            (
                format!("{{\"type\":\"ADDED\",\"object\":{object},\"extra\":{{}}}}\n"),
                format!("{{\"type\":\"ADDED\",\"object\":{kept},\"extra\":{{}}}}\n"),
            ),
        ] {
            let Outcome::Replaced(got) = chain.filter_event(line.as_bytes(), &ctx) else {
                panic!("not replaced: {line}");
            };
            assert_eq!(std::str::from_utf8(&got).unwrap(), want);
        }
    }
}
