//! [`ItemSizes`]: follows a LIST body as it streams through the tee, to tell as soon as one of
//! its `items` grows past the cache's object limit. A list holding such an item is not cached
//! (a scope must never silently lack an item), so the tee stops copying it there instead of
//! holding the whole body (tens of MB) until the writer finds out. The tee starts the scan only
//! once a body is larger than the limit (no item of a smaller one can be): a node's lists never
//! pay for it.
//!
//! Only as much JSON as that takes is understood: strings (with escapes, so braces inside them
//! do not count), nesting depth, and which top-level key an array belongs to. Anything the
//! scanner does not expect only makes it count less, never stop a list that fits: the writer
//! still checks every item's size when it parses the list.

/// The state of the scan between chunks.
#[derive(Debug)]
pub struct ItemSizes {
    limit: usize,
    in_string: bool,
    escaped: bool,
    /// Before `items`: the nesting depth, the top-level key being read (its first bytes), and
    /// whether the last one was `items`.
    depth: u32,
    key: Vec<u8>,
    after_items_key: bool,
    /// Inside the top-level `items` array.
    in_items: bool,
    /// Inside `items`: the depth of braces within the current item (0 between items), and the
    /// item's bytes so far.
    item_depth: u32,
    item: usize,
}

impl ItemSizes {
    pub fn new(limit: usize) -> ItemSizes {
        ItemSizes {
            limit,
            in_string: false,
            escaped: false,
            depth: 0,
            key: Vec::new(),
            after_items_key: false,
            in_items: false,
            item_depth: 0,
            item: 0,
        }
    }

    /// Reads on through `chunk`; `false` once an item is larger than the limit.
    pub fn fits(&mut self, chunk: &[u8]) -> bool {
        let mut rest = chunk;
        while !rest.is_empty() {
            if self.in_items {
                return self.items_fit(rest);
            }
            let taken = match self.in_string {
                true => self.string_bytes(rest),
                false => {
                    self.header_byte(rest[0]);
                    1
                }
            };
            rest = &rest[taken..];
        }
        true
    }

    /// Inside `items`, byte by byte (the state kept in locals: most of a list is here). An item
    /// is an object: brackets inside it do not change where it ends. Whatever follows the array
    /// (`]}`, or a key kube-apiserver never writes after `items`) is read as items too, which
    /// can only count more, for a small object.
    fn items_fit(&mut self, bytes: &[u8]) -> bool {
        let (mut in_string, mut escaped) = (self.in_string, self.escaped);
        let (mut depth, mut item) = (self.item_depth, self.item);
        let mut at = 0;
        while at < bytes.len() {
            let start = at;
            if in_string && !escaped {
                // The bulk of a list: skip to the string's end at memchr's pace.
                match memchr::memchr2(b'"', b'\\', &bytes[at..]) {
                    None => at = bytes.len(),
                    Some(n) => {
                        at += n + 1;
                        match bytes[at - 1] {
                            b'"' => in_string = false,
                            _ => escaped = true,
                        }
                    }
                }
            } else {
                let b = bytes[at];
                at += 1;
                if in_string {
                    escaped = false;
                } else {
                    match b {
                        b'"' => in_string = true,
                        b'{' => {
                            if depth == 0 {
                                item = 0;
                            }
                            depth += 1;
                        }
                        b'}' => depth = depth.saturating_sub(1),
                        _ => {}
                    }
                }
            }
            if depth > 0 {
                item += at - start;
                if item > self.limit {
                    return false;
                }
            }
        }
        (self.in_string, self.escaped) = (in_string, escaped);
        (self.item_depth, self.item) = (depth, item);
        true
    }

    /// Inside a string: skips to its end (or the chunk's); returns the bytes taken.
    fn string_bytes(&mut self, bytes: &[u8]) -> usize {
        if self.escaped {
            self.escaped = false;
            return 1;
        }
        let Some(at) = memchr::memchr2(b'"', b'\\', bytes) else {
            self.note_key(bytes);
            return bytes.len();
        };
        self.note_key(&bytes[..at]);
        if bytes[at] == b'\\' {
            self.escaped = true;
        } else {
            self.in_string = false;
            if !self.in_items && self.depth == 1 {
                self.after_items_key = self.key == b"items";
            }
        }
        at + 1
    }

    /// Keeps the first bytes of a top-level key (enough to tell `items`).
    fn note_key(&mut self, bytes: &[u8]) {
        if !self.in_items && self.depth == 1 && self.key.len() <= 8 {
            let room = 9 - self.key.len();
            self.key.extend_from_slice(&bytes[..bytes.len().min(room)]);
        }
    }

    /// Before `items` (kind, apiVersion, the list's metadata: a few hundred bytes).
    fn header_byte(&mut self, byte: u8) {
        match byte {
            b'"' => {
                self.in_string = true;
                if self.depth == 1 {
                    self.key.clear();
                }
            }
            b'[' if self.depth == 1 && self.after_items_key => self.in_items = true,
            b'{' | b'[' => self.depth += 1,
            b'}' | b']' => self.depth = self.depth.saturating_sub(1),
            b',' if self.depth == 1 => self.after_items_key = false,
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan(body: &[u8], limit: usize, chunk: usize) -> bool {
        let mut sizes = ItemSizes::new(limit);
        body.chunks(chunk).all(|c| sizes.fits(c))
    }

    #[test]
    fn an_item_over_the_limit_is_found_in_any_chunking() {
        let big = format!(
            r#"{{"metadata":{{"name":"b"}},"data":{{"x":"{}"}}}}"#,
            "y".repeat(500)
        );
        let body = format!(
            r#"{{"kind":"ConfigMapList","apiVersion":"v1","metadata":{{"resourceVersion":"7"}},"items":[{{"metadata":{{"name":"a"}}}},{big}]}}"#
        );
        for chunk in [1, 3, 64, body.len()] {
            assert!(!scan(body.as_bytes(), 400, chunk), "chunks of {chunk}");
            assert!(scan(body.as_bytes(), 600, chunk), "fits, chunks of {chunk}");
        }
    }

    #[test]
    fn only_items_count_and_strings_hide_their_braces() {
        // A long metadata, braces and an escaped quote inside strings, an `items` key inside
        // an item: none of them is an item over the limit.
        let body = format!(
            r#"{{"kind":"List","metadata":{{"continue":"{}"}},"items":[{{"metadata":{{"name":"}}]{{\"items\":[","labels":{{"items":"[[[["}}}}}}],"extra":[{}]}}"#,
            "c".repeat(300),
            "1,".repeat(200) + "1"
        );
        assert!(
            serde_json::from_str::<serde_json::Value>(&body).is_ok(),
            "{body}"
        );
        for chunk in [1, 2, 7, body.len()] {
            assert!(scan(body.as_bytes(), 120, chunk), "chunks of {chunk}");
        }
        assert!(
            !scan(body.as_bytes(), 40, 5),
            "the item itself is ~100 bytes"
        );
    }
}
