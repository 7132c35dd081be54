//! Whole-cache passes: [`Engine::verify`] (find and quarantine every corrupt entry) and
//! [`Engine::stats`] (the numbers behind `outpost cache ls`).

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::engine::{Engine, Suspect};
use crate::error::CacheError;
use crate::json;
use crate::keys::{self, DOCUMENT, EVENT, MEMBER, OBJECT, PIN, SCOPE};
use crate::kv::Kv;
use crate::model::{Gvr, ResourceStats, ResourceVersion, VerifyReport};
use crate::record;
use bytes::Bytes;

/// Why one main-tree entry is unusable, if it is.
fn check_entry(key: &[u8], raw: &Bytes) -> Option<String> {
    let err = |e: record::Corrupt| Some(e.0);
    match key.first() {
        Some(&OBJECT) if keys::decode_object_key(key).is_some() => match record::decode_object(raw)
        {
            Ok(o) if json::is_valid(&o.bytes) => None,
            Ok(_) => Some("stored bytes are not valid JSON".into()),
            Err(e) => err(e),
        },
        Some(&SCOPE) if keys::decode_scope_key(key).is_some() => {
            record::decode_scope(raw).err().and_then(err)
        }
        Some(&EVENT) => match record::decode_event(raw) {
            Ok(e) if e.object.as_deref().is_none_or(json::is_valid) => None,
            Ok(_) => Some("event bytes are not valid JSON".into()),
            Err(e) => err(e),
        },
        Some(&DOCUMENT) if keys::decode_document_key(key).is_some() => {
            record::decode_document(raw).err().and_then(err)
        }
        Some(&PIN | &MEMBER) if raw.is_empty() => None,
        _ => Some("unknown key or unexpected value".into()),
    }
}

impl<K: Kv> Engine<K> {
    pub(crate) fn verify(&self) -> Result<VerifyReport, CacheError> {
        let mut report = VerifyReport::default();
        let suspects = {
            let kv = self.read_kv();
            let mut suspects = Vec::new();
            for entry in kv.scan(&[]) {
                let (key, raw) = entry?;
                report.checked += 1;
                if let Some(reason) = check_entry(&key, &raw) {
                    suspects.push(Suspect { key, raw, reason });
                }
            }
            suspects
        };
        report.corrupt = suspects
            .iter()
            .map(|s| crate::model::CorruptEntry {
                key: keys::describe(&s.key),
                reason: s.reason.clone(),
            })
            .collect();
        self.quarantine(suspects)?;
        Ok(report)
    }

    /// Per component and resource, so documents (which have neither) are not counted.
    pub(crate) fn stats(&self) -> Result<Vec<ResourceStats>, CacheError> {
        let kv = self.read_kv();
        let mut rows = BTreeMap::new();
        // Corrupt entries are skipped here; `verify` is the tool that reports them.
        for entry in kv.scan(&[OBJECT]) {
            let (key, raw) = entry?;
            let (Some(k), Ok(o)) = (keys::decode_object_key(&key), record::decode_object(&raw))
            else {
                continue;
            };
            let row = row(&mut rows, &k.component, &k.gvr);
            row.objects += 1;
            row.bytes += raw.len() as u64;
            touch(row, o.resource_version, o.written_at);
        }
        for entry in kv.scan(&[SCOPE]) {
            let (key, raw) = entry?;
            let (Some(id), Ok(meta)) = (keys::decode_scope_key(&key), record::decode_scope(&raw))
            else {
                continue;
            };
            let row = row(&mut rows, &id.component, &id.gvr);
            row.scopes += 1;
            row.bytes += raw.len() as u64;
            let written = UNIX_EPOCH + Duration::from_millis(meta.updated_ms);
            touch(row, ResourceVersion::new(&meta.rv), written);
        }
        for entry in kv.scan(&[EVENT]) {
            let (key, raw) = entry?;
            let Some(id) = keys::decode_event_scope(&key) else {
                continue;
            };
            let row = row(&mut rows, &id.component, &id.gvr);
            row.events += 1;
            row.bytes += raw.len() as u64;
        }
        Ok(rows.into_values().collect())
    }
}

type Rows = BTreeMap<(String, Gvr), ResourceStats>;

fn row<'a>(rows: &'a mut Rows, component: &str, gvr: &Gvr) -> &'a mut ResourceStats {
    rows.entry((component.to_owned(), gvr.clone()))
        .or_insert_with(|| ResourceStats {
            component: component.to_owned(),
            gvr: gvr.clone(),
            objects: 0,
            events: 0,
            bytes: 0,
            scopes: 0,
            last_resource_version: None,
            last_write: None,
        })
}

/// Keeps the highest parseable version and the latest write time.
fn touch(row: &mut ResourceStats, rv: ResourceVersion, written: SystemTime) {
    let newer = row
        .last_resource_version
        .as_ref()
        .is_none_or(|seen| seen.is_older_than(&rv));
    if rv.number().is_some() && newer {
        row.last_resource_version = Some(rv);
    }
    row.last_write = row.last_write.max(Some(written));
}
