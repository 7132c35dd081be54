//! [`ItemSizes`]: follows a LIST body as it streams through the tee, to tell as soon as one of
//! its `items` grows past the cache's object limit. A list holding such an item is not cached
//! (a scope must never silently lack an item), so the tee stops copying it there instead of
//! holding the whole body (tens of MB) until the writer finds out.
//!
//! Only as much JSON as that takes is understood: strings (with escapes, so braces inside them
//! do not count), nesting depth, and which top-level key an array belongs to. Anything the
//! scanner does not expect only makes it count less, never stop a list that fits: the writer
//! still checks every item's size when it parses the list.

/// The state of the scan between chunks.
#[derive(Debug)]
pub struct ItemSizes {
    limit: usize,
    depth: u32,
    in_string: bool,
    escaped: bool,
    /// The top-level key being read (its first bytes), and whether the last one was `items`.
    key: Vec<u8>,
    after_items_key: bool,
    /// Inside the top-level `items` array.
    in_items: bool,
    /// Bytes of the item being read, if one is.
    item: Option<usize>,
}

impl ItemSizes {
    pub fn new(limit: usize) -> ItemSizes {
        ItemSizes {
            limit,
            depth: 0,
            in_string: false,
            escaped: false,
            key: Vec::new(),
            after_items_key: false,
            in_items: false,
            item: None,
        }
    }

    /// Reads on through `chunk`; `false` once an item is larger than the limit.
    pub fn fits(&mut self, chunk: &[u8]) -> bool {
        let mut rest = chunk;
        while !rest.is_empty() {
            let taken = if self.in_string {
                self.string_bytes(rest)
            } else {
                self.structural(rest[0]);
                1
            };
            if let Some(n) = self.item.as_mut() {
                *n += taken;
                if *n > self.limit {
                    return false;
                }
            }
            rest = &rest[taken..];
        }
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
            if self.depth == 1 {
                self.after_items_key = self.key == b"items";
            }
        }
        at + 1
    }

    /// Keeps the first bytes of a top-level key (enough to tell `items`).
    fn note_key(&mut self, bytes: &[u8]) {
        if self.depth == 1 && self.key.len() <= 8 {
            let room = 9 - self.key.len();
            self.key.extend_from_slice(&bytes[..bytes.len().min(room)]);
        }
    }

    fn structural(&mut self, byte: u8) {
        match byte {
            b'"' => {
                self.in_string = true;
                if self.depth == 1 {
                    self.key.clear();
                }
            }
            b'{' | b'[' => {
                if byte == b'[' && self.depth == 1 && self.after_items_key {
                    self.in_items = true;
                }
                self.depth += 1;
                if self.in_items && self.depth == 3 && self.item.is_none() {
                    self.item = Some(0);
                }
            }
            b'}' | b']' => {
                self.depth = self.depth.saturating_sub(1);
                if self.in_items && self.depth == 2 {
                    self.item = None;
                }
                if self.depth <= 1 {
                    self.in_items = false;
                }
            }
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
