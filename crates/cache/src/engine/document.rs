//! Whole documents under a name (discovery responses, per-resource kind records): no component,
//! no scope, no resourceVersion, so the last write wins. They are still sealed records, so a
//! damaged one is quarantined like any other entry, and `verify` and compaction see them because
//! they live in the same main tree (tag `d`, see `keys`).

use bytes::Bytes;

use crate::engine::{Engine, Suspect};
use crate::error::CacheError;
use crate::keys;
use crate::kv::{Kv, WriteBatch};
use crate::record;

impl<K: Kv> Engine<K> {
    /// One single-key batch, so the document is its old or its new version, even across a crash.
    pub(crate) fn put_document(&self, name: &str, bytes: &[u8]) -> Result<(), CacheError> {
        let key = keys::document_key(name);
        let value = record::encode_document(bytes);
        self.write(|_| {
            let mut batch = WriteBatch::default();
            batch.put(key, value);
            Ok((batch, ()))
        })
    }

    /// A corrupt document is quarantined and answered as absent: the caller refetches it.
    pub(crate) fn get_document(&self, name: &str) -> Result<Option<Bytes>, CacheError> {
        self.read(|kv, suspects| {
            let key = keys::document_key(name);
            let Some(raw) = kv.get(&key)? else {
                return Ok(None);
            };
            match record::decode_document(&raw) {
                Ok(bytes) => Ok(Some(bytes)),
                Err(e) => {
                    suspects.push(Suspect {
                        key,
                        raw,
                        reason: e.0,
                    });
                    Ok(None)
                }
            }
        })
    }

    /// Removes a document (absent already is fine).
    pub(crate) fn delete_document(&self, name: &str) -> Result<(), CacheError> {
        let key = keys::document_key(name);
        self.write(|_| {
            let mut batch = WriteBatch::default();
            batch.remove(key);
            Ok((batch, ()))
        })
    }

    /// Every document whose name starts with `prefix`, by name; corrupt ones are quarantined
    /// and left out.
    pub(crate) fn documents(&self, prefix: &str) -> Result<Vec<(String, Bytes)>, CacheError> {
        self.read(|kv, suspects| {
            let mut found = Vec::new();
            for entry in kv.scan(&keys::document_prefix(prefix)) {
                let (key, raw) = entry?;
                let Some(name) = keys::decode_document_key(&key) else {
                    continue;
                };
                match record::decode_document(&raw) {
                    Ok(bytes) => found.push((name, bytes)),
                    Err(e) => suspects.push(Suspect {
                        key,
                        raw,
                        reason: e.0,
                    }),
                }
            }
            Ok(found)
        })
    }
}
