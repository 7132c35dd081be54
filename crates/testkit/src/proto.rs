//! Decoding the Kubernetes protobuf request bodies kubectl's generators send
//! (`kubectl create configmap|secret|namespace|serviceaccount`, deletes with `DeleteOptions`).
//!
//! A body is the `k8s\0` magic followed by a `runtime.Unknown` envelope (`typeMeta`, `raw`); `raw`
//! is the object in the `generated.proto` encoding. Only the kinds in [`schema_for`] are known;
//! others are answered with 415 by the caller, which is where a JSON-only fake has to stop.

use base64::Engine;
use serde_json::{Map, Value, json};

use crate::util;

const MAGIC: &[u8] = b"k8s\0";

/// How one protobuf field maps to JSON.
#[derive(Clone, Copy)]
enum Kind {
    Str,
    Bytes,
    Int,
    Bool,
    Time,
    Msg(&'static [Field]),
    MapStr,
    MapBytes,
    RepeatedStr,
    RepeatedMsg(&'static [Field]),
}

type Field = (u64, &'static str, Kind);

const OWNER_REFERENCE: &[Field] = &[
    (1, "kind", Kind::Str),
    (3, "name", Kind::Str),
    (4, "uid", Kind::Str),
    (5, "apiVersion", Kind::Str),
    (6, "controller", Kind::Bool),
    (7, "blockOwnerDeletion", Kind::Bool),
];

const OBJECT_META: &[Field] = &[
    (1, "name", Kind::Str),
    (2, "generateName", Kind::Str),
    (3, "namespace", Kind::Str),
    (5, "uid", Kind::Str),
    (6, "resourceVersion", Kind::Str),
    (7, "generation", Kind::Int),
    (8, "creationTimestamp", Kind::Time),
    (9, "deletionTimestamp", Kind::Time),
    (10, "deletionGracePeriodSeconds", Kind::Int),
    (11, "labels", Kind::MapStr),
    (12, "annotations", Kind::MapStr),
    (13, "ownerReferences", Kind::RepeatedMsg(OWNER_REFERENCE)),
    (14, "finalizers", Kind::RepeatedStr),
];

const CONFIG_MAP: &[Field] = &[
    (1, "metadata", Kind::Msg(OBJECT_META)),
    (2, "data", Kind::MapStr),
    (3, "binaryData", Kind::MapBytes),
    (4, "immutable", Kind::Bool),
];

const SECRET: &[Field] = &[
    (1, "metadata", Kind::Msg(OBJECT_META)),
    (2, "data", Kind::MapBytes),
    (3, "type", Kind::Str),
    (4, "stringData", Kind::MapStr),
    (5, "immutable", Kind::Bool),
];

const NAMESPACE: &[Field] = &[
    (1, "metadata", Kind::Msg(OBJECT_META)),
    (
        2,
        "spec",
        Kind::Msg(&[(1, "finalizers", Kind::RepeatedStr)]),
    ),
    (3, "status", Kind::Msg(&[(1, "phase", Kind::Str)])),
];

const NAME_REF: &[Field] = &[(1, "name", Kind::Str)];

const SERVICE_ACCOUNT: &[Field] = &[
    (1, "metadata", Kind::Msg(OBJECT_META)),
    (2, "secrets", Kind::RepeatedMsg(NAME_REF)),
    (3, "imagePullSecrets", Kind::RepeatedMsg(NAME_REF)),
    (4, "automountServiceAccountToken", Kind::Bool),
];

const DELETE_OPTIONS: &[Field] = &[
    (1, "gracePeriodSeconds", Kind::Int),
    (
        2,
        "preconditions",
        Kind::Msg(&[(1, "uid", Kind::Str), (2, "resourceVersion", Kind::Str)]),
    ),
    (3, "orphanDependents", Kind::Bool),
    (4, "propagationPolicy", Kind::Str),
    (5, "dryRun", Kind::RepeatedStr),
];

const TYPE_META: &[Field] = &[(1, "apiVersion", Kind::Str), (2, "kind", Kind::Str)];
const UNKNOWN: &[Field] = &[
    (1, "typeMeta", Kind::Msg(TYPE_META)),
    (2, "raw", Kind::Bytes),
];

fn schema_for(kind: &str) -> Option<&'static [Field]> {
    Some(match kind {
        "ConfigMap" => CONFIG_MAP,
        "Secret" => SECRET,
        "Namespace" => NAMESPACE,
        "ServiceAccount" => SERVICE_ACCOUNT,
        "DeleteOptions" => DELETE_OPTIONS,
        _ => return None,
    })
}

/// Decodes a protobuf body into the equivalent JSON object (with `kind` / `apiVersion`).
pub fn decode(body: &[u8]) -> Result<Value, String> {
    let envelope = body
        .strip_prefix(MAGIC)
        .ok_or("missing k8s protobuf magic")?;
    let unknown = message(envelope, UNKNOWN)?;
    let kind = unknown
        .pointer("/typeMeta/kind")
        .and_then(Value::as_str)
        .unwrap_or("");
    let api_version = unknown
        .pointer("/typeMeta/apiVersion")
        .and_then(Value::as_str)
        .unwrap_or("");
    let schema = schema_for(kind).ok_or_else(|| format!("no protobuf schema for kind {kind:?}"))?;
    let raw = raw_bytes(envelope)?;
    let mut obj = message(&raw, schema)?;
    obj["kind"] = kind.into();
    obj["apiVersion"] = api_version.into();
    Ok(obj)
}

/// `Unknown.raw` as bytes (the generic decoder renders bytes as base64).
fn raw_bytes(envelope: &[u8]) -> Result<Vec<u8>, String> {
    let mut r = Reader {
        buf: envelope,
        pos: 0,
    };
    let mut raw = Vec::new();
    while !r.done() {
        let (field, wire) = r.key()?;
        match (field, wire) {
            (2, 2) => raw = r.bytes()?.to_vec(),
            _ => r.skip(wire)?,
        }
    }
    Ok(raw)
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn done(&self) -> bool {
        self.pos >= self.buf.len()
    }

    fn varint(&mut self) -> Result<u64, String> {
        let mut out = 0u64;
        for shift in (0..64).step_by(7) {
            let b = *self.buf.get(self.pos).ok_or("truncated varint")?;
            self.pos += 1;
            out |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(out);
            }
        }
        Err("varint too long".into())
    }

    fn key(&mut self) -> Result<(u64, u64), String> {
        let k = self.varint()?;
        Ok((k >> 3, k & 7))
    }

    fn bytes(&mut self) -> Result<&'a [u8], String> {
        let len = usize::try_from(self.varint()?).map_err(|e| e.to_string())?;
        let end = self
            .pos
            .checked_add(len)
            .filter(|e| *e <= self.buf.len())
            .ok_or("truncated field")?;
        let out = &self.buf[self.pos..end];
        self.pos = end;
        Ok(out)
    }

    fn skip(&mut self, wire: u64) -> Result<(), String> {
        match wire {
            0 => self.varint().map(drop),
            1 => self.advance(8),
            2 => self.bytes().map(drop),
            5 => self.advance(4),
            w => Err(format!("unsupported wire type {w}")),
        }
    }

    fn advance(&mut self, n: usize) -> Result<(), String> {
        if self.pos + n > self.buf.len() {
            return Err("truncated field".into());
        }
        self.pos += n;
        Ok(())
    }
}

fn utf8(b: &[u8]) -> Result<String, String> {
    String::from_utf8(b.to_vec()).map_err(|e| e.to_string())
}

fn message(buf: &[u8], schema: &[Field]) -> Result<Value, String> {
    let mut r = Reader { buf, pos: 0 };
    let mut out = Map::new();
    while !r.done() {
        let (number, wire) = r.key()?;
        match schema.iter().find(|(n, _, _)| *n == number) {
            Some((_, name, kind)) => field(&mut r, &mut out, name, *kind)?,
            None => r.skip(wire)?,
        }
    }
    Ok(Value::Object(out))
}

fn field(
    r: &mut Reader<'_>,
    out: &mut Map<String, Value>,
    name: &str,
    kind: Kind,
) -> Result<(), String> {
    let b64 = |b: &[u8]| Value::from(base64::engine::general_purpose::STANDARD.encode(b));
    let value = match kind {
        Kind::Str => utf8(r.bytes()?)?.into(),
        Kind::Bytes => b64(r.bytes()?),
        Kind::Int => (r.varint()? as i64).into(),
        Kind::Bool => (r.varint()? != 0).into(),
        Kind::Time => time(r.bytes()?)?,
        Kind::Msg(schema) => message(r.bytes()?, schema)?,
        Kind::MapStr | Kind::MapBytes => {
            let entry = message(r.bytes()?, &[(1, "k", Kind::Str), (2, "v", Kind::Bytes)])?;
            let key = entry["k"].as_str().unwrap_or("").to_owned();
            let raw = base64::engine::general_purpose::STANDARD
                .decode(entry["v"].as_str().unwrap_or(""))
                .map_err(|e| e.to_string())?;
            let v = if matches!(kind, Kind::MapStr) {
                utf8(&raw)?.into()
            } else {
                b64(&raw)
            };
            let map = out.entry(name).or_insert_with(|| json!({}));
            map[key] = v;
            return Ok(());
        }
        Kind::RepeatedStr | Kind::RepeatedMsg(_) => {
            let item = match kind {
                Kind::RepeatedMsg(schema) => message(r.bytes()?, schema)?,
                _ => utf8(r.bytes()?)?.into(),
            };
            let list = out.entry(name).or_insert_with(|| json!([]));
            if let Some(items) = list.as_array_mut() {
                items.push(item);
            }
            return Ok(());
        }
    };
    out.insert(name.to_owned(), value);
    Ok(())
}

/// `metav1.Time` is `{seconds, nanos}`; the zero time is JSON `null`.
fn time(buf: &[u8]) -> Result<Value, String> {
    let t = message(buf, &[(1, "s", Kind::Int)])?;
    match t["s"].as_i64().unwrap_or(0) {
        0 => Ok(Value::Null),
        s => Ok(util::rfc3339(std::time::Duration::from_secs(s.max(0) as u64)).into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn varint(mut n: u64, out: &mut Vec<u8>) {
        loop {
            let b = (n & 0x7f) as u8;
            n >>= 7;
            if n == 0 {
                out.push(b);
                return;
            }
            out.push(b | 0x80);
        }
    }

    fn len_field(number: u64, payload: &[u8], out: &mut Vec<u8>) {
        varint(number << 3 | 2, out);
        varint(payload.len() as u64, out);
        out.extend_from_slice(payload);
    }

    fn entry(k: &str, v: &str) -> Vec<u8> {
        let mut e = Vec::new();
        len_field(1, k.as_bytes(), &mut e);
        len_field(2, v.as_bytes(), &mut e);
        e
    }

    /// What client-go sends for `kubectl create configmap kc --from-literal=a=b`.
    fn config_map_body() -> Vec<u8> {
        let mut meta = Vec::new();
        len_field(1, b"kc", &mut meta);
        len_field(11, &entry("app", "web"), &mut meta);
        let mut time = Vec::new();
        len_field(8, &time, &mut meta);
        time.clear();
        let mut cm = Vec::new();
        len_field(1, &meta, &mut cm);
        len_field(2, &entry("a", "b"), &mut cm);
        len_field(2, &entry("c", "d"), &mut cm);
        let mut type_meta = Vec::new();
        len_field(1, b"v1", &mut type_meta);
        len_field(2, b"ConfigMap", &mut type_meta);
        let mut unknown = Vec::new();
        len_field(1, &type_meta, &mut unknown);
        len_field(2, &cm, &mut unknown);
        len_field(4, b"", &mut unknown);
        let mut body = MAGIC.to_vec();
        body.extend(unknown);
        body
    }

    #[test]
    fn decodes_a_config_map() {
        let obj = decode(&config_map_body()).unwrap();
        assert_eq!(
            obj,
            json!({"kind": "ConfigMap", "apiVersion": "v1",
                   "metadata": {"name": "kc", "labels": {"app": "web"}, "creationTimestamp": null},
                   "data": {"a": "b", "c": "d"}})
        );
    }

    #[test]
    fn rejects_unknown_kinds_and_garbage() {
        assert!(decode(b"{}").is_err());
        let mut body = config_map_body();
        let pos = body.windows(9).position(|w| w == b"ConfigMap").unwrap();
        body[pos..pos + 9].copy_from_slice(b"ConfigMaX");
        assert!(decode(&body).is_err());
        assert!(decode(b"k8s\0\x0a\xff").is_err());
    }
}
