//! Values of the main tree. Every non-empty value is *sealed*: a format byte, then a CRC-32 of
//! everything after it, then the payload. A read that fails the seal is corruption (a flipped bit
//! on disk, a torn page sled did not catch) and the entry is quarantined, never served.
//!
//! Object and document bytes are stored verbatim at the end of their record; nothing is
//! re-encoded.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::model::{CachedObject, EventType, ResourceVersion};

const FORMAT: u8 = 1;
const HEADER: usize = 5;

/// Why a stored value cannot be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Corrupt(pub(crate) String);

/// A sealed record whose payload `write` appends in place (an object's bytes are copied once).
fn sealed_with(capacity: usize, write: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER + capacity);
    out.push(FORMAT);
    out.extend_from_slice(&[0; HEADER - 1]);
    write(&mut out);
    let checksum = crc32fast::hash(&out[HEADER..]);
    out[1..HEADER].copy_from_slice(&checksum.to_le_bytes());
    out
}

fn seal(payload: &[u8]) -> Vec<u8> {
    sealed_with(payload.len(), |out| out.extend_from_slice(payload))
}

/// The payload and its checksum, if the seal holds.
fn unseal(raw: &[u8]) -> Result<(&[u8], u32), Corrupt> {
    if raw.len() < HEADER || raw[0] != FORMAT {
        return Err(Corrupt("bad record header".into()));
    }
    let stored = u32::from_le_bytes([raw[1], raw[2], raw[3], raw[4]]);
    let payload = &raw[HEADER..];
    let actual = crc32fast::hash(payload);
    if actual != stored {
        return Err(Corrupt(format!(
            "checksum mismatch: stored {stored:08x}, computed {actual:08x}"
        )));
    }
    Ok((payload, stored))
}

/// Little cursor over a payload; every read can fail on truncated input.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], Corrupt> {
        if self.0.len() < n {
            return Err(Corrupt("record truncated".into()));
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Ok(head)
    }

    fn u64(&mut self) -> Result<u64, Corrupt> {
        let b = self.take(8)?;
        Ok(u64::from_be_bytes(b.try_into().expect("8 bytes")))
    }

    fn str(&mut self) -> Result<&'a str, Corrupt> {
        let len = self.take(2)?;
        let len = u16::from_be_bytes([len[0], len[1]]) as usize;
        std::str::from_utf8(self.take(len)?).map_err(|_| Corrupt("string not UTF-8".into()))
    }
}

/// Short strings (RV, uid) are length-prefixed with a u16; the caller checks the bound.
fn push_str(buf: &mut Vec<u8>, s: &str) {
    let len = u16::try_from(s.len()).expect("checked by json::MAX_META_LEN");
    buf.extend_from_slice(&len.to_be_bytes());
    buf.extend_from_slice(s.as_bytes());
}

pub(crate) fn now_millis() -> u64 {
    let since = SystemTime::now().duration_since(UNIX_EPOCH);
    since.map(|d| d.as_millis() as u64).unwrap_or(0)
}

fn millis_to_time(ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms)
}

/// Object record payload: written-at millis, RV, uid, then the JSON bytes.
pub(crate) fn encode_object(rv: &str, uid: &str, json: &[u8], written_ms: u64) -> Vec<u8> {
    sealed_with(12 + rv.len() + uid.len() + json.len(), |payload| {
        payload.extend_from_slice(&written_ms.to_be_bytes());
        push_str(payload, rv);
        push_str(payload, uid);
        payload.extend_from_slice(json);
    })
}

/// The rest of `raw` from where `rest` (a tail of it) starts, sharing `raw`'s buffer.
fn tail_of(raw: &Bytes, rest: &[u8]) -> Bytes {
    raw.slice(raw.len() - rest.len()..)
}

pub(crate) fn decode_object(raw: &Bytes) -> Result<CachedObject, Corrupt> {
    let (payload, checksum) = unseal(raw)?;
    let mut r = Reader(payload);
    let written_ms = r.u64()?;
    let rv = ResourceVersion::new(r.str()?);
    let uid = r.str()?.to_owned();
    Ok(CachedObject {
        bytes: tail_of(raw, r.0),
        resource_version: rv,
        uid,
        checksum,
        written_at: millis_to_time(written_ms),
    })
}

fn event_type_byte(t: EventType) -> u8 {
    match t {
        EventType::Added => b'A',
        EventType::Modified => b'M',
        EventType::Deleted => b'D',
        EventType::Bookmark => b'B',
        // Never logged: the write path refuses an ERROR event before it gets here.
        EventType::Error => b'E',
    }
}

fn event_type_from(b: u8) -> Result<EventType, Corrupt> {
    match b {
        b'A' => Ok(EventType::Added),
        b'M' => Ok(EventType::Modified),
        b'D' => Ok(EventType::Deleted),
        b'B' => Ok(EventType::Bookmark),
        other => Err(Corrupt(format!("unknown event type byte {other}"))),
    }
}

/// One entry of a scope's event log. An ADDED or MODIFIED entry names its object and carries no
/// bytes: the object's record holds them, so each version is written once (a copy per event
/// was ~40 % of a cache write). A DELETED entry carries the object as deleted, since its record
/// is gone.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct LogEntry {
    pub event_type: EventType,
    pub resource_version: ResourceVersion,
    /// `(namespace, name)`; `None` in entries of the first format, which carried every object.
    pub object_name: Option<(String, String)>,
    /// The event's object as upstream sent it; `None` when the object's record holds it.
    pub object: Option<Bytes>,
}

/// Entry payloads start with one of these; entries of the first format started with the event
/// type byte (`A`, `M`, `D`, `B`) and still decode.
const LOG_NAMED: u8 = b'n';
const LOG_CARRIED: u8 = b'c';

/// A log entry: kind, type byte, RV, namespace, name, then the object JSON if it is `carried`.
pub(crate) fn encode_event(
    event_type: EventType,
    rv: &str,
    namespace: &str,
    name: &str,
    carried: Option<&[u8]>,
) -> Vec<u8> {
    let json = carried.unwrap_or_default();
    let len = 8 + rv.len() + namespace.len() + name.len() + json.len();
    sealed_with(len, |payload| {
        payload.push(if carried.is_some() {
            LOG_CARRIED
        } else {
            LOG_NAMED
        });
        payload.push(event_type_byte(event_type));
        push_str(payload, rv);
        push_str(payload, namespace);
        push_str(payload, name);
        payload.extend_from_slice(json);
    })
}

pub(crate) fn decode_event(raw: &Bytes) -> Result<LogEntry, Corrupt> {
    let (payload, _) = unseal(raw)?;
    let mut r = Reader(payload);
    let kind = r.take(1)?[0];
    if kind != LOG_NAMED && kind != LOG_CARRIED {
        // The first format: type byte, RV, the object JSON.
        let event_type = event_type_from(kind)?;
        let rv = ResourceVersion::new(r.str()?);
        return Ok(LogEntry {
            event_type,
            resource_version: rv,
            object_name: None,
            object: Some(tail_of(raw, r.0)),
        });
    }
    let event_type = event_type_from(r.take(1)?[0])?;
    let rv = ResourceVersion::new(r.str()?);
    let namespace = r.str()?.to_owned();
    let name = r.str()?.to_owned();
    let object = match kind {
        LOG_CARRIED => Some(tail_of(raw, r.0)),
        _ if r.0.is_empty() => None,
        _ => return Err(Corrupt("trailing bytes after a named event".into())),
    };
    Ok(LogEntry {
        event_type,
        resource_version: rv,
        object_name: Some((namespace, name)),
        object,
    })
}

/// Per-scope bookkeeping. The event log holds sequence numbers `log_first..log_next`; a watch
/// can resume from `log_floor_rv` or any logged version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ScopeMeta {
    /// The scope's last known resourceVersion (LIST RV, then watch events and bookmarks).
    pub rv: String,
    /// Incremented by every replace; lets tests (and operators) tell relists apart.
    pub generation: u64,
    pub updated_ms: u64,
    pub log_first: u64,
    pub log_next: u64,
    /// The version just before the first logged event: the list RV of the last replace, or the
    /// RV of the last event trimmed from the log.
    pub log_floor_rv: String,
}

pub(crate) fn encode_scope(meta: &ScopeMeta) -> Vec<u8> {
    seal(&serde_json::to_vec(meta).expect("plain struct serializes"))
}

pub(crate) fn decode_scope(raw: &[u8]) -> Result<ScopeMeta, Corrupt> {
    let (payload, _) = unseal(raw)?;
    serde_json::from_slice(payload).map_err(|e| Corrupt(format!("scope meta: {e}")))
}

/// Document record payload: the document's bytes, nothing else. They are not checked as JSON:
/// a discovery response may be any content type the client asked for.
pub(crate) fn encode_document(bytes: &[u8]) -> Vec<u8> {
    seal(bytes)
}

pub(crate) fn decode_document(raw: &Bytes) -> Result<Bytes, Corrupt> {
    let (payload, _) = unseal(raw)?;
    Ok(tail_of(raw, payload))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shared(raw: &[u8]) -> Bytes {
        Bytes::copy_from_slice(raw)
    }

    #[test]
    fn object_records_keep_bytes_verbatim() {
        let json = br#"{"metadata":{"name":"a"},  "x":1.50}"#;
        let raw = encode_object("42", "u-1", json, 1_700_000_000_123);
        let obj = decode_object(&shared(&raw)).expect("decodes");
        assert_eq!(&obj.bytes[..], json);
        assert_eq!(obj.resource_version.number(), Some(42));
        assert_eq!(obj.uid, "u-1");
        assert_eq!(obj.written_at, millis_to_time(1_700_000_000_123));
    }

    #[test]
    fn any_flipped_bit_is_detected() {
        let raw = encode_object("7", "u", br#"{"metadata":{"name":"a"}}"#, 1);
        for i in 0..raw.len() {
            for bit in 0..8 {
                let mut bad = raw.clone();
                bad[i] ^= 1 << bit;
                assert!(
                    decode_object(&shared(&bad)).is_err(),
                    "byte {i} bit {bit} went unnoticed"
                );
            }
        }
    }

    /// An entry as the first format wrote it: type byte, RV, object JSON.
    fn first_format_event(event_type: EventType, rv: &str, json: &[u8]) -> Vec<u8> {
        sealed_with(3 + rv.len() + json.len(), |payload| {
            payload.push(event_type_byte(event_type));
            push_str(payload, rv);
            payload.extend_from_slice(json);
        })
    }

    #[test]
    fn truncated_records_are_corrupt_not_panics() {
        for raw in [
            encode_event(EventType::Modified, "9", "ns", "p", None),
            encode_event(EventType::Deleted, "9", "ns", "p", Some(b"{}")),
            first_format_event(EventType::Modified, "9", b"{}"),
        ] {
            for len in 0..raw.len() {
                assert!(decode_event(&shared(&raw[..len])).is_err());
            }
            assert!(decode_event(&shared(&raw)).is_ok());
        }
    }

    #[test]
    fn log_entries_name_or_carry_their_object_and_the_first_format_still_decodes() {
        let named = decode_event(&shared(&encode_event(
            EventType::Added,
            "12",
            "",
            "node-1",
            None,
        )));
        assert_eq!(
            named,
            Ok(LogEntry {
                event_type: EventType::Added,
                resource_version: ResourceVersion::new("12"),
                object_name: Some((String::new(), "node-1".into())),
                object: None,
            })
        );
        let json = br#"{"metadata":{"name":"p"}}"#;
        let carried = decode_event(&shared(&encode_event(
            EventType::Deleted,
            "13",
            "ns",
            "p",
            Some(json),
        )))
        .expect("carried");
        assert_eq!(carried.object_name, Some(("ns".into(), "p".into())));
        assert_eq!(carried.object.as_deref(), Some(&json[..]));
        let first = decode_event(&shared(&first_format_event(EventType::Modified, "9", json)))
            .expect("first format");
        assert_eq!(first.event_type, EventType::Modified);
        assert_eq!(first.resource_version.as_str(), "9");
        assert_eq!(first.object_name, None);
        assert_eq!(first.object.as_deref(), Some(&json[..]));
    }

    #[test]
    fn documents_keep_bytes_verbatim_and_fail_their_seal_when_damaged() {
        let doc = br#"{"kind":"Pod","listKind":"PodList"}"#;
        let raw = encode_document(doc);
        assert_eq!(decode_document(&shared(&raw)).as_deref(), Ok(&doc[..]));
        assert_eq!(
            decode_document(&shared(&encode_document(b""))).as_deref(),
            Ok(&b""[..])
        );
        let mut bad = raw.clone();
        bad[HEADER + 3] ^= 0x01;
        assert!(decode_document(&shared(&bad)).is_err());
        assert!(decode_document(&shared(&raw[..HEADER - 1])).is_err());
    }
}
