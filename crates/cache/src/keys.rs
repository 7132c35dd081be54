//! Key layout of the main tree. Every key is a one-byte tag followed by escaped segments, so one
//! sorted keyspace holds objects, scopes, memberships, pins, event logs and documents, and every
//! "all X of Y" question is a prefix scan.
//!
//! | tag | key (segments after the tag)                                     | value             |
//! |-----|------------------------------------------------------------------|-------------------|
//! | `o` | component, group, version, resource, namespace, name             | object record     |
//! | `p` | same as `o`                                                       | empty (a pin)     |
//! | `s` | component, group, version, resource, ns-spec, labels, fields     | scope meta record |
//! | `m` | scope segments (as `s`), namespace, name                         | empty (member)    |
//! | `e` | scope segments (as `s`), then an 8-byte big-endian sequence      | event record      |
//! | `d` | document name (e.g. `/apis`, `kinds/pods.v1.core`)               | document record   |
//!
//! Documents are whole responses that belong to no component or scope (discovery, kind records):
//! every component shares them, and nothing but [`crate::Store::put_document`] replaces them.
//!
//! ns-spec is `*` for all namespaces or `/` + namespace. Segments escape `0x00` as `00 FF` and end
//! with `00 01`: unambiguous for any bytes (component names come from user agents) and
//! order-preserving, so a member scan yields objects in (namespace, name) order.

use crate::model::{Gvr, ObjectKey, ScopeId};

pub(crate) const OBJECT: u8 = b'o';
pub(crate) const PIN: u8 = b'p';
pub(crate) const SCOPE: u8 = b's';
pub(crate) const MEMBER: u8 = b'm';
pub(crate) const EVENT: u8 = b'e';
pub(crate) const DOCUMENT: u8 = b'd';

const ESCAPE: u8 = 0x00;
const ESCAPED_ZERO: u8 = 0xFF;
const TERMINATOR: u8 = 0x01;

fn push_segment(buf: &mut Vec<u8>, segment: &[u8]) {
    for &b in segment {
        buf.push(b);
        if b == ESCAPE {
            buf.push(ESCAPED_ZERO);
        }
    }
    buf.extend_from_slice(&[ESCAPE, TERMINATOR]);
}

/// Steps over one segment at the front of `input`: its bytes as escaped, or `None` if it is
/// malformed.
fn skip_segment<'k>(input: &mut &'k [u8]) -> Option<&'k [u8]> {
    let whole: &'k [u8] = input;
    let mut i = 0;
    while i < whole.len() {
        if whole[i] != ESCAPE {
            i += 1;
            continue;
        }
        match whole.get(i + 1) {
            Some(&ESCAPED_ZERO) => i += 2,
            Some(&TERMINATOR) => {
                *input = &whole[i + 2..];
                return Some(&whole[..i]);
            }
            _ => return None,
        }
    }
    None
}

/// Reads one segment off the front of `input`; `None` if it is malformed.
fn take_segment(input: &mut &[u8]) -> Option<Vec<u8>> {
    let escaped = skip_segment(input)?;
    let mut out = Vec::with_capacity(escaped.len());
    let mut bytes = escaped.iter();
    while let Some(&b) = bytes.next() {
        out.push(b);
        if b == ESCAPE {
            // Its `ESCAPED_ZERO`, which `skip_segment` checked.
            bytes.next();
        }
    }
    Some(out)
}

fn take_string(input: &mut &[u8]) -> Option<String> {
    String::from_utf8(take_segment(input)?).ok()
}

fn push_resource(buf: &mut Vec<u8>, component: &str, gvr: &Gvr) {
    push_segment(buf, component.as_bytes());
    push_segment(buf, gvr.group.as_bytes());
    push_segment(buf, gvr.version.as_bytes());
    push_segment(buf, gvr.resource.as_bytes());
}

fn take_resource(input: &mut &[u8]) -> Option<(String, Gvr)> {
    let component = take_string(input)?;
    let group = take_string(input)?;
    let version = take_string(input)?;
    let resource = take_string(input)?;
    Some((component, Gvr::new(&group, &version, &resource)))
}

/// Prefix of every `tag` entry of one component's resource.
pub(crate) fn resource_prefix(tag: u8, component: &str, gvr: &Gvr) -> Vec<u8> {
    let mut buf = vec![tag];
    push_resource(&mut buf, component, gvr);
    buf
}

/// The resource (component and GVR, as encoded) that a key of an object, pin, membership or
/// watch-log entry belongs to: what [`crate::Store::renew_scope`] checks for writes since.
/// `None` for scope records and documents, which hold no item.
pub(crate) fn item_resource(key: &[u8]) -> Option<&[u8]> {
    let (&tag, rest) = key.split_first()?;
    if ![OBJECT, PIN, MEMBER, EVENT].contains(&tag) {
        return None;
    }
    let mut after = rest;
    for _ in 0..4 {
        skip_segment(&mut after)?;
    }
    Some(&rest[..rest.len() - after.len()])
}

/// Key of an object (`OBJECT`) or of its pin (`PIN`).
pub(crate) fn object_key(tag: u8, key: &ObjectKey) -> Vec<u8> {
    let mut buf = resource_prefix(tag, &key.component, &key.gvr);
    push_segment(&mut buf, key.namespace.as_bytes());
    push_segment(&mut buf, key.name.as_bytes());
    buf
}

pub(crate) fn decode_object_key(key: &[u8]) -> Option<ObjectKey> {
    let mut rest = key.get(1..)?;
    let (component, gvr) = take_resource(&mut rest)?;
    let namespace = take_string(&mut rest)?;
    let name = take_string(&mut rest)?;
    rest.is_empty().then_some(ObjectKey {
        component,
        gvr,
        namespace,
        name,
    })
}

/// Key of a scope's meta (`SCOPE`), or prefix of its members (`MEMBER`) or events (`EVENT`).
pub(crate) fn scope_key(tag: u8, scope: &ScopeId) -> Vec<u8> {
    let mut buf = resource_prefix(tag, &scope.component, &scope.gvr);
    match &scope.namespace {
        None => push_segment(&mut buf, b"*"),
        Some(ns) => push_segment(&mut buf, &[b"/", ns.as_bytes()].concat()),
    }
    push_segment(&mut buf, scope.label_selector.as_bytes());
    push_segment(&mut buf, scope.field_selector.as_bytes());
    buf
}

/// Decodes the scope segments at the front of `key` (after the tag); returns what follows.
fn take_scope(key: &[u8]) -> Option<(ScopeId, &[u8])> {
    let mut rest = key.get(1..)?;
    let (component, gvr) = take_resource(&mut rest)?;
    let ns_spec = take_string(&mut rest)?;
    let namespace = match ns_spec.as_str() {
        "*" => None,
        s => Some(s.strip_prefix('/')?.to_owned()),
    };
    let label_selector = take_string(&mut rest)?;
    let field_selector = take_string(&mut rest)?;
    let id = ScopeId {
        component,
        gvr,
        namespace,
        label_selector,
        field_selector,
    };
    Some((id, rest))
}

pub(crate) fn decode_scope_key(key: &[u8]) -> Option<ScopeId> {
    take_scope(key).and_then(|(id, rest)| rest.is_empty().then_some(id))
}

/// The scope an event key belongs to.
pub(crate) fn decode_event_scope(key: &[u8]) -> Option<ScopeId> {
    take_scope(key).and_then(|(id, rest)| (rest.len() == 8).then_some(id))
}

pub(crate) fn member_key(scope: &ScopeId, namespace: &str, name: &str) -> Vec<u8> {
    let mut buf = scope_key(MEMBER, scope);
    push_segment(&mut buf, namespace.as_bytes());
    push_segment(&mut buf, name.as_bytes());
    buf
}

/// The (namespace, name) a member key names, given the scope's member prefix length.
pub(crate) fn decode_member(key: &[u8], prefix_len: usize) -> Option<(String, String)> {
    let mut rest = key.get(prefix_len..)?;
    let namespace = take_string(&mut rest)?;
    let name = take_string(&mut rest)?;
    rest.is_empty().then_some((namespace, name))
}

pub(crate) fn event_key(scope: &ScopeId, seq: u64) -> Vec<u8> {
    let mut buf = scope_key(EVENT, scope);
    buf.extend_from_slice(&seq.to_be_bytes());
    buf
}

pub(crate) fn document_key(name: &str) -> Vec<u8> {
    let mut buf = vec![DOCUMENT];
    push_segment(&mut buf, name.as_bytes());
    buf
}

/// The start every key of a document whose name begins with `prefix` shares.
pub(crate) fn document_prefix(prefix: &str) -> Vec<u8> {
    let mut buf = document_key(prefix);
    buf.truncate(buf.len() - 2); // the segment's end (escape, terminator)
    buf
}

pub(crate) fn decode_document_key(key: &[u8]) -> Option<String> {
    let mut rest = key.get(1..)?;
    let name = take_string(&mut rest)?;
    rest.is_empty().then_some(name)
}

/// A readable name for any main-tree key, for logs and [`crate::VerifyReport`].
pub(crate) fn describe(key: &[u8]) -> String {
    let decoded = match key.first() {
        Some(&OBJECT) => decode_object_key(key).map(|k| format!("object {k}")),
        Some(&PIN) => decode_object_key(key).map(|k| format!("pin {k}")),
        Some(&SCOPE) => decode_scope_key(key).map(|s| format!("scope {s}")),
        Some(&MEMBER) => take_scope(key).map(|(s, _)| format!("member of {s}")),
        Some(&EVENT) => take_scope(key).and_then(|(s, rest)| {
            let seq = u64::from_be_bytes(rest.try_into().ok()?);
            Some(format!("event #{seq} of {s}"))
        }),
        Some(&DOCUMENT) => decode_document_key(key).map(|name| format!("document {name}")),
        _ => None,
    };
    decoded.unwrap_or_else(|| format!("undecodable key {key:02x?}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn key(ns: &str, name: &str) -> ObjectKey {
        ObjectKey::new("kubelet", &Gvr::new("", "v1", "pods"), ns, name)
    }

    proptest! {
        #[test]
        fn object_keys_round_trip(ns in "\\PC*", name in ".*", component in "[\\x00-\\x02a/]*") {
            let k = ObjectKey::new(&component, &Gvr::new("g\0", "v1", "r"), &ns, &name);
            prop_assert_eq!(decode_object_key(&object_key(OBJECT, &k)), Some(k));
        }

        #[test]
        fn an_item_key_names_its_resource(ns in "\\PC*", name in ".*", component in "[\\x00-\\x02a/]*") {
            let gvr = Gvr::new("g\0", "v1", "r");
            let k = ObjectKey::new(&component, &gvr, &ns, &name);
            let resource = resource_prefix(OBJECT, &component, &gvr);
            let scope = ScopeId {
                component: component.clone(),
                gvr: gvr.clone(),
                namespace: Some(ns.clone()),
                label_selector: name.clone(),
                field_selector: String::new(),
            };
            let items = [
                object_key(OBJECT, &k),
                object_key(PIN, &k),
                member_key(&scope, &ns, &name),
                event_key(&scope, 7),
            ];
            for key in &items {
                prop_assert_eq!(item_resource(key), Some(&resource[1..]));
            }
            let record = scope_key(SCOPE, &scope);
            prop_assert_eq!(item_resource(&record), None);
        }

        #[test]
        fn segment_order_matches_string_order(a in "[\\x00-\\x02ab]{0,6}", b in "[\\x00-\\x02ab]{0,6}") {
            let (ka, kb) = (object_key(OBJECT, &key(&a, "x")), object_key(OBJECT, &key(&b, "x")));
            prop_assert_eq!(a.cmp(&b), ka.cmp(&kb));
        }

        #[test]
        fn scope_keys_round_trip(ns in proptest::option::of("[a-z\\x00*/]{0,5}"), l in ".*", f in ".*") {
            let id = ScopeId {
                component: "kube-proxy".into(),
                gvr: Gvr::new("discovery.k8s.io", "v1", "endpointslices"),
                namespace: ns,
                label_selector: l,
                field_selector: f,
            };
            prop_assert_eq!(decode_scope_key(&scope_key(SCOPE, &id)), Some(id));
        }

        #[test]
        fn document_keys_round_trip(name in "\\PC*") {
            prop_assert_eq!(decode_document_key(&document_key(&name)), Some(name));
        }
    }

    #[test]
    fn one_namespace_is_not_a_prefix_of_another() {
        let a = object_key(OBJECT, &key("kube", "p"));
        let b = object_key(OBJECT, &key("kube-system", "p"));
        let prefix_of_a = &a[..a.len() - "p".len() - 2];
        assert!(!b.starts_with(prefix_of_a));
    }

    #[test]
    fn members_decode_after_their_scope_prefix() {
        let id = ScopeId {
            component: "kubelet".into(),
            gvr: Gvr::new("", "v1", "pods"),
            namespace: None,
            label_selector: String::new(),
            field_selector: "spec.nodeName=n1".into(),
        };
        let prefix = scope_key(MEMBER, &id);
        let m = member_key(&id, "kube-system", "coredns");
        assert_eq!(
            decode_member(&m, prefix.len()),
            Some(("kube-system".into(), "coredns".into()))
        );
        assert!(describe(&event_key(&id, 7)).starts_with("event #7 of kubelet/pods.v1.core/*"));
    }

    #[test]
    fn a_document_prefix_starts_exactly_the_names_that_start_with_it() {
        let prefix = document_prefix("local/pod-status/");
        for (name, under) in [
            ("local/pod-status/ns/a", true),
            ("local/pod-status/", true),
            ("local/pod-status", false),
            ("local/pod-statuses/x", false),
            ("kinds/pods.v1.core", false),
        ] {
            assert_eq!(document_key(name).starts_with(&prefix), under, "{name}");
        }
    }

    #[test]
    fn documents_describe_by_name_and_reject_trailing_bytes() {
        let key = document_key("kinds/pods.v1.core");
        assert_eq!(describe(&key), "document kinds/pods.v1.core");
        assert_eq!(decode_document_key(&[key.as_slice(), b"x"].concat()), None);
    }

    #[test]
    fn a_malformed_segment_is_refused_by_every_reader() {
        let k = ObjectKey::new("kube\0let", &Gvr::new("", "v1", "pods"), "a", "p");
        let good = object_key(OBJECT, &k);
        assert_eq!(decode_object_key(&good), Some(k));
        assert!(item_resource(&good).is_some());
        // An escape (in the component) that is neither an escaped zero nor a terminator, and a
        // key cut short inside its resource.
        let at = good
            .windows(2)
            .position(|w| w == [ESCAPE, ESCAPED_ZERO])
            .unwrap();
        let mut odd = good.clone();
        odd[at + 1] = 0x02;
        for bad in [odd.as_slice(), &good[..at + 4]] {
            assert_eq!(decode_object_key(bad), None);
            assert_eq!(item_resource(bad), None);
        }
    }
}
