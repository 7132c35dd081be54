//! The behaviour every `Store` must have, run against `MemStore` and `SledStore` alike.

mod common;

use common::{bookmark, field, pod, pods, refs, scope};
use outpost_cache::{
    EventType, Gvr, Lookup, ObjectKey, ReplaceOutcome, ReplayError, SledOptions, SledStore, Store,
    WriteOutcome,
};

/// Small on purpose, so trimming is exercised.
const LOG: usize = 4;

fn names(store: &dyn Store, query: &outpost_cache::Scope) -> Vec<String> {
    let list = store
        .list(query)
        .expect("list")
        .expect("a scope covers the query");
    list.items
        .iter()
        .map(|o| field(&o.bytes, "/metadata/name"))
        .collect()
}

fn found(store: &dyn Store, key: &ObjectKey) -> Option<String> {
    match store.get(key).expect("get") {
        Lookup::Found(o) => Some(o.resource_version.as_str().to_owned()),
        Lookup::NotCached => None,
        Lookup::Quarantined => panic!("{key} unexpectedly corrupt"),
    }
}

fn key(ns: &str, name: &str) -> ObjectKey {
    ObjectKey::new("kubelet", &pods(), ns, name)
}

fn replace_lists_items_in_key_order_with_the_list_rv(store: &dyn Store) {
    let s = scope("kubelet", &pods(), None, "", "spec.nodeName=n1");
    let items = [
        pod("b", "p2", "11", "n1", &[]),
        pod("a", "p9", "12", "n1", &[]),
        pod("a", "p1", "10", "n1", &[]),
    ];
    let outcome = store
        .replace_scope(&s, "20", &refs(&items))
        .expect("replace");
    assert_eq!(
        outcome,
        ReplaceOutcome {
            stored: 3,
            written_bytes: items.iter().map(Vec::len).sum(),
            kept_newer: 0,
            removed: 0,
            refused_older_than: None,
        }
    );
    let list = store.list(&s).expect("list").expect("cached");
    assert_eq!(list.resource_version.as_str(), "20");
    assert_eq!(list.served_from, s.id());
    assert!(list.missing.is_empty());
    assert_eq!(names(store, &s), ["p1", "p9", "p2"]);
    assert_eq!(
        store
            .scope_resource_version(&s)
            .expect("rv")
            .map(|r| r.to_string()),
        Some("20".into())
    );
}

fn bytes_are_stored_verbatim(store: &dyn Store) {
    let odd = br#"{ "status":{"phase":"Running"} , "metadata":{"resourceVersion":"5","name":"p","namespace":"a","uid":"u"},"x":1.50e0 }"#;
    store.put_object("kubelet", &pods(), odd).expect("put");
    let Lookup::Found(obj) = store.get(&key("a", "p")).expect("get") else {
        panic!("not found")
    };
    assert_eq!(&obj.bytes[..], &odd[..]);
    assert_eq!(
        (obj.uid.as_str(), obj.resource_version.number()),
        ("u", Some(5))
    );
}

fn a_relist_drops_missing_members_but_not_pinned_objects(store: &dyn Store) {
    let s = scope("kubelet", &pods(), None, "", "spec.nodeName=n1");
    let v1 = [
        pod("a", "p1", "10", "n1", &[]),
        pod("a", "p2", "11", "n1", &[]),
        pod("a", "p3", "12", "n1", &[]),
    ];
    store.replace_scope(&s, "12", &refs(&v1)).expect("replace");
    store
        .put_object("kubelet", &pods(), &pod("a", "p2", "11", "n1", &[]))
        .expect("GET p2");
    let v2 = [
        pod("a", "p1", "10", "n1", &[]),
        pod("a", "p4", "13", "n1", &[]),
    ];
    let outcome = store.replace_scope(&s, "13", &refs(&v2)).expect("replace");
    assert_eq!(outcome.removed, 2);
    assert_eq!(names(store, &s), ["p1", "p4"]);
    assert_eq!(
        found(store, &key("a", "p3")),
        None,
        "unreferenced object deleted"
    );
    assert_eq!(
        found(store, &key("a", "p2")),
        Some("11".into()),
        "pinned object kept"
    );
}

fn overlapping_scopes_share_one_copy_and_keep_their_own_members(store: &dyn Store) {
    let by_node = scope("kubelet", &pods(), None, "", "spec.nodeName=n1");
    let in_a = scope("kubelet", &pods(), Some("a"), "", "");
    store
        .replace_scope(&by_node, "10", &refs(&[pod("a", "p1", "5", "n1", &[])]))
        .expect("replace");
    store
        .replace_scope(
            &in_a,
            "11",
            &refs(&[
                pod("a", "p1", "6", "n1", &[]),
                pod("a", "p2", "7", "n2", &[]),
            ]),
        )
        .expect("replace");
    assert_eq!(
        found(store, &key("a", "p1")),
        Some("6".into()),
        "one copy, the newest"
    );
    store
        .replace_scope(&in_a, "12", &refs(&[pod("a", "p2", "7", "n2", &[])]))
        .expect("relist");
    assert_eq!(
        names(store, &by_node),
        ["p1"],
        "the other scope still holds p1"
    );
    assert_eq!(names(store, &in_a), ["p2"]);
}

fn an_older_resource_version_never_replaces_a_newer_one(store: &dyn Store) {
    let s = scope("kubelet", &pods(), None, "", "");
    store
        .replace_scope(&s, "5", &refs(&[pod("a", "p", "5", "n1", &[])]))
        .expect("replace");
    // A GET brought a newer version than this scope's watch has reached.
    store
        .put_object("kubelet", &pods(), &pod("a", "p", "10", "n1", &[]))
        .expect("put");
    let older = store
        .apply_event(&s, EventType::Modified, &pod("a", "p", "9", "n1", &[]))
        .expect("event");
    assert!(
        matches!(older, WriteOutcome::KeptNewer { ref stored } if stored.as_str() == "10"),
        "{older:?}"
    );
    let put = store
        .put_object("kubelet", &pods(), &pod("a", "p", "8", "n1", &[]))
        .expect("put");
    assert!(matches!(put, WriteOutcome::KeptNewer { .. }));
    let relist = store
        .replace_scope(&s, "11", &refs(&[pod("a", "p", "7", "n1", &[])]))
        .expect("replace");
    assert_eq!(relist.kept_newer, 1);
    assert_eq!(found(store, &key("a", "p")), Some("10".into()));
    let equal = store
        .apply_event(&s, EventType::Modified, &pod("a", "p", "11", "n9", &[]))
        .expect("event");
    assert_eq!(equal, WriteOutcome::Stored, "a newer version is accepted");
    let same = store
        .apply_event(&s, EventType::Modified, &pod("a", "p", "11", "n8", &[]))
        .expect("event");
    assert_eq!(same, WriteOutcome::Stored, "equal versions are accepted");
    let opaque = store
        .apply_event(
            &s,
            EventType::Modified,
            &pod("a", "p", "opaque-1", "n1", &[]),
        )
        .expect("event");
    assert_eq!(
        opaque,
        WriteOutcome::Stored,
        "unparseable versions are accepted"
    );
    assert_eq!(found(store, &key("a", "p")), Some("opaque-1".into()));
}

fn watch_events_upsert_delete_and_advance_the_scope(store: &dyn Store) {
    let s = scope("kubelet", &pods(), None, "", "spec.nodeName=n1");
    store
        .replace_scope(&s, "10", &refs(&[pod("a", "p1", "9", "n1", &[])]))
        .expect("replace");
    let added = store
        .apply_event(&s, EventType::Added, &pod("a", "p2", "11", "n1", &[]))
        .expect("add");
    assert_eq!(added, WriteOutcome::Stored);
    assert_eq!(names(store, &s), ["p1", "p2"]);
    let deleted = store
        .apply_event(&s, EventType::Deleted, &pod("a", "p1", "12", "n1", &[]))
        .expect("del");
    assert_eq!(deleted, WriteOutcome::Deleted);
    assert_eq!(names(store, &s), ["p2"]);
    assert_eq!(found(store, &key("a", "p1")), None);
    let mark = store
        .apply_event(&s, EventType::Bookmark, &bookmark("15"))
        .expect("bookmark");
    assert_eq!(mark, WriteOutcome::Bookmarked);
    let list = store.list(&s).expect("list").expect("cached");
    assert_eq!(list.resource_version.as_str(), "15");
    assert_eq!(list.items.len(), 1, "a bookmark changes no object");
    store
        .apply_event(&s, EventType::Bookmark, &bookmark("14"))
        .expect("old bookmark");
    assert_eq!(
        store
            .scope_resource_version(&s)
            .expect("rv")
            .expect("known")
            .as_str(),
        "15"
    );
}

fn deleted_removes_the_object_from_every_scope_and_its_pin(store: &dyn Store) {
    let by_node = scope("kubelet", &pods(), None, "", "spec.nodeName=n1");
    let in_a = scope("kubelet", &pods(), Some("a"), "", "");
    let p = pod("a", "p", "5", "n1", &[]);
    store
        .replace_scope(&by_node, "5", &[p.as_slice()])
        .expect("replace");
    store
        .replace_scope(&in_a, "5", &[p.as_slice()])
        .expect("replace");
    store.put_object("kubelet", &pods(), &p).expect("pin");
    store
        .apply_event(&by_node, EventType::Deleted, &pod("a", "p", "6", "n1", &[]))
        .expect("delete");
    assert!(names(store, &in_a).is_empty());
    assert_eq!(found(store, &key("a", "p")), None);
}

fn a_stale_delete_only_leaves_its_scope(store: &dyn Store) {
    let s = scope("kubelet", &pods(), None, "", "spec.nodeName=n1");
    store
        .replace_scope(&s, "5", &refs(&[pod("a", "p", "5", "n1", &[])]))
        .expect("replace");
    store
        .put_object("kubelet", &pods(), &pod("a", "p", "9", "n1", &[]))
        .expect("newer GET");
    let outcome = store
        .apply_event(&s, EventType::Deleted, &pod("a", "p", "6", "n1", &[]))
        .expect("delete");
    assert!(
        matches!(outcome, WriteOutcome::KeptNewer { .. }),
        "{outcome:?}"
    );
    assert!(names(store, &s).is_empty());
    assert_eq!(
        found(store, &key("a", "p")),
        Some("9".into()),
        "the pinned newer copy stays"
    );
}

fn events_replay_after_a_version_and_refuse_older_ones(store: &dyn Store) {
    let s = scope("kubelet", &pods(), None, "", "spec.nodeName=n1");
    store.replace_scope(&s, "100", &[]).expect("replace");
    for rv in 101..=103 {
        let p = pod("a", &format!("p{rv}"), &rv.to_string(), "n1", &[]);
        store.apply_event(&s, EventType::Added, &p).expect("add");
    }
    let rvs = |from: &str| -> Vec<String> {
        let events = store.events_since(&s, from).expect("replayable");
        events
            .iter()
            .map(|e| e.resource_version.to_string())
            .collect()
    };
    assert_eq!(rvs("100"), ["101", "102", "103"]);
    assert_eq!(rvs("101"), ["102", "103"]);
    assert!(rvs("103").is_empty());
    assert!(matches!(
        store.events_since(&s, "99"),
        Err(ReplayError::TooOld(_))
    ));
    for rv in 104..=106 {
        store
            .apply_event(
                &s,
                EventType::Modified,
                &pod("a", "p101", &rv.to_string(), "n1", &[]),
            )
            .expect("mod");
    }
    assert_eq!(
        rvs("102"),
        ["103", "106"],
        "the log holds the last {LOG} entries; p101's three changes replay as its latest version"
    );
    match store.events_since(&s, "101") {
        Err(ReplayError::TooOld(t)) => {
            assert_eq!(t.oldest_available.expect("floor").as_str(), "102")
        }
        other => panic!("trimmed history must be too old: {other:?}"),
    }
    store.replace_scope(&s, "200", &[]).expect("relist");
    assert!(
        matches!(store.events_since(&s, "106"), Err(ReplayError::TooOld(_))),
        "relist resets the log"
    );
    assert!(rvs("200").is_empty());
}

/// A replay sends each object's latest version at its last entry; a DELETED entry is always
/// sent, so a delete followed by a re-creation replays as both.
fn a_replay_sends_each_objects_latest_version(store: &dyn Store) {
    let s = scope("kubelet", &pods(), None, "", "spec.nodeName=n1");
    store.replace_scope(&s, "100", &[]).expect("replace");
    let events = [
        (EventType::Added, pod("a", "p1", "101", "n1", &[("v", "1")])),
        (
            EventType::Modified,
            pod("a", "p1", "102", "n1", &[("v", "2")]),
        ),
        (EventType::Added, pod("a", "p2", "103", "n1", &[("v", "1")])),
        (
            EventType::Deleted,
            pod("a", "p2", "104", "n1", &[("v", "gone")]),
        ),
        (
            EventType::Added,
            pod("a", "p2", "105", "n1", &[("v", "again")]),
        ),
        (
            EventType::Modified,
            pod("a", "p1", "106", "n1", &[("v", "3")]),
        ),
    ];
    for (event_type, bytes) in &events {
        store.apply_event(&s, *event_type, bytes).expect("event");
    }
    let replay = |from: &str| -> Vec<(EventType, String, String, String)> {
        store
            .events_since(&s, from)
            .expect("replayable")
            .into_iter()
            .map(|e| {
                (
                    e.event_type,
                    e.resource_version.to_string(),
                    field(&e.object, "/metadata/name"),
                    field(&e.object, "/metadata/labels/v"),
                )
            })
            .collect()
    };
    let event =
        |t, rv: &str, name: &str, v: &str| (t, rv.to_owned(), name.to_owned(), v.to_owned());
    assert_eq!(
        replay("102"),
        [
            event(EventType::Deleted, "104", "p2", "gone"),
            event(EventType::Added, "105", "p2", "again"),
            event(EventType::Modified, "106", "p1", "3"),
        ],
        "the log of {LOG} holds 103..106"
    );
    assert_eq!(
        replay("105"),
        [event(EventType::Modified, "106", "p1", "3")]
    );
}

/// An entry whose version the store no longer holds, with no later entry to stand for it,
/// cannot be replayed exactly: the watch gets 410 and the client relists.
fn a_replay_refuses_when_a_logged_version_is_gone(store: &dyn Store) {
    let s = scope("kubelet", &pods(), None, "", "spec.nodeName=n1");
    store.replace_scope(&s, "100", &[]).expect("replace");
    store
        .apply_event(&s, EventType::Added, &pod("a", "p1", "101", "n1", &[]))
        .expect("add");
    assert_eq!(store.events_since(&s, "100").expect("replayable").len(), 1);
    store
        .put_object("kubelet", &pods(), &pod("a", "p1", "107", "n1", &[]))
        .expect("a GET saw a newer version");
    match store.events_since(&s, "100") {
        Err(ReplayError::TooOld(t)) => {
            assert_eq!(t.oldest_available.expect("scope rv").as_str(), "101")
        }
        other => panic!("the logged version is gone: {other:?}"),
    }
    store
        .apply_event(&s, EventType::Modified, &pod("a", "p1", "107", "n1", &[]))
        .expect("the watch catches up");
    let rvs: Vec<String> = store
        .events_since(&s, "100")
        .expect("replayable again")
        .iter()
        .map(|e| e.resource_version.to_string())
        .collect();
    assert_eq!(rvs, ["107"]);
}

fn a_query_is_served_by_the_most_specific_covering_scope(store: &dyn Store) {
    let all = scope("kubelet", &pods(), None, "", "");
    let items = [
        pod("a", "p1", "1", "n1", &[("app", "web")]),
        pod("a", "p2", "2", "n2", &[("app", "web")]),
        pod("b", "p3", "3", "n1", &[("app", "db")]),
    ];
    store
        .replace_scope(&all, "10", &refs(&items))
        .expect("replace");
    let by_node = scope("kubelet", &pods(), None, "", "spec.nodeName=n1");
    assert_eq!(
        names(store, &by_node),
        ["p1", "p3"],
        "field selector evaluated on JSON"
    );
    let web_in_a = scope("kubelet", &pods(), Some("a"), "app=web", "");
    assert_eq!(names(store, &web_in_a), ["p1", "p2"]);
    let db = scope(
        "kubelet",
        &pods(),
        None,
        "app in (db)",
        "status.phase=Running",
    );
    assert_eq!(names(store, &db), ["p3"]);

    store
        .replace_scope(
            &by_node,
            "20",
            &refs(&[pod("a", "p1", "1", "n1", &[("app", "web")])]),
        )
        .expect("exact");
    let list = store.list(&by_node).expect("list").expect("cached");
    assert_eq!(
        (list.served_from, list.resource_version.as_str()),
        (by_node.id(), "20")
    );
    assert_eq!(
        store.list(&all).expect("list").expect("cached").served_from,
        all.id()
    );
}

fn a_query_without_a_covering_scope_is_not_cached(store: &dyn Store) {
    let in_a = scope("kubelet", &pods(), Some("a"), "", "");
    store
        .replace_scope(&in_a, "10", &refs(&[pod("a", "p1", "1", "n1", &[])]))
        .expect("replace");
    assert!(
        store
            .list(&scope("kubelet", &pods(), None, "", ""))
            .expect("list")
            .is_none()
    );
    assert!(
        store
            .list(&scope("kubelet", &pods(), Some("b"), "", ""))
            .expect("list")
            .is_none()
    );
    let narrower = scope("kubelet", &pods(), Some("a"), "", "spec.nodeName=n1");
    assert_eq!(names(store, &narrower), ["p1"]);
    let empty = scope("kubelet", &pods(), Some("c"), "", "");
    store.replace_scope(&empty, "11", &[]).expect("replace");
    assert!(
        names(store, &empty).is_empty(),
        "an empty LIST is cached as known-empty"
    );
}

fn components_only_see_what_they_cached(store: &dyn Store) {
    let s = scope("kubelet", &pods(), None, "", "");
    store
        .replace_scope(&s, "10", &refs(&[pod("a", "p1", "1", "n1", &[])]))
        .expect("replace");
    assert!(
        store
            .list(&scope("kube-proxy", &pods(), None, "", ""))
            .expect("list")
            .is_none()
    );
    let other = ObjectKey::new("kube-proxy", &pods(), "a", "p1");
    assert_eq!(store.get(&other).expect("get"), Lookup::NotCached);
    assert!(
        store
            .events_since(&scope("kube-proxy", &pods(), None, "", ""), "10")
            .is_err()
    );
}

fn cluster_scoped_and_custom_resources_need_nothing_special(store: &dyn Store) {
    let nodes = Gvr::new("", "v1", "nodes");
    let node = br#"{"kind":"Node","metadata":{"name":"n1","resourceVersion":"3","labels":{"role":"edge"}}}"#;
    store
        .replace_scope(
            &scope("kubelet", &nodes, None, "", "metadata.name=n1"),
            "3",
            &[node],
        )
        .expect("nodes");
    assert!(matches!(
        store.get(&ObjectKey::new("kubelet", &nodes, "", "n1")),
        Ok(Lookup::Found(_))
    ));
    let widgets = Gvr::new("example.com", "v1alpha1", "widgets");
    let w = br#"{"apiVersion":"example.com/v1alpha1","kind":"Widget","metadata":{"name":"w","namespace":"x","resourceVersion":"4"},"spec":{"size":"L"}}"#;
    let s = scope("my-operator", &widgets, None, "", "");
    store.replace_scope(&s, "4", &[w]).expect("crd");
    let big = scope("my-operator", &widgets, None, "", "spec.size=L");
    assert_eq!(
        store
            .list(&big)
            .expect("list")
            .expect("covered")
            .items
            .len(),
        1
    );
}

fn invalid_input_changes_nothing(store: &dyn Store) {
    let s = scope("kubelet", &pods(), Some("a"), "", "");
    store
        .replace_scope(&s, "10", &refs(&[pod("a", "p1", "1", "n1", &[])]))
        .expect("replace");
    let bad_json = [pod("a", "p2", "2", "n1", &[]), b"{not json".to_vec()];
    assert!(store.replace_scope(&s, "11", &refs(&bad_json)).is_err());
    let other_ns = [pod("b", "p3", "3", "n1", &[])];
    assert!(store.replace_scope(&s, "12", &refs(&other_ns)).is_err());
    let nameless = br#"{"metadata":{"namespace":"a","resourceVersion":"4"}}"#;
    assert!(store.apply_event(&s, EventType::Added, nameless).is_err());
    assert_eq!(names(store, &s), ["p1"]);
    assert_eq!(
        store
            .scope_resource_version(&s)
            .expect("rv")
            .expect("known")
            .as_str(),
        "10"
    );
    assert!(
        !store.health().degraded,
        "bad input is not a storage problem"
    );
}

/// A relist reads only the identity of objects it already holds byte for byte; everything it
/// writes, or keeps as the newer version, it reads whole, so damage past `metadata` still fails.
fn a_relist_reads_whole_every_object_it_does_not_hold(store: &dyn Store) {
    let s = scope("kubelet", &pods(), Some("a"), "", "");
    let p1 = pod("a", "p1", "10", "n1", &[]);
    store
        .replace_scope(&s, "10", &refs(std::slice::from_ref(&p1)))
        .expect("replace");
    let identity = |name: &str, rv: &str| {
        format!(
            r#"{{"metadata":{{"name":"{name}","namespace":"a","uid":"u-{name}","resourceVersion":"{rv}"}}"#
        )
    };
    let broken_tail = format!(r#"{},"spec":{{"nodeName":}}"#, identity("p2", "11"));
    let second_metadata = format!(r#"{},"metadata":{{"name":"p9"}}}}"#, identity("p2", "11"));
    let stale_and_broken = format!(r#"{},"spec":tru}}"#, identity("p1", "9"));
    for bad in [broken_tail, second_metadata, stale_and_broken] {
        let items = [p1.clone(), bad.clone().into_bytes()];
        let err = store
            .replace_scope(&s, "11", &refs(&items))
            .expect_err(&bad);
        assert!(err.to_string().contains("list item 1"), "{err}");
        assert!(
            store
                .put_object("kubelet", &pods(), bad.as_bytes())
                .is_err(),
            "{bad}"
        );
    }
    assert_eq!(names(store, &s), ["p1"]);
    assert_eq!(found(store, &key("a", "p1")), Some("10".into()));
    let rv = store
        .scope_resource_version(&s)
        .expect("rv")
        .expect("known");
    assert_eq!(rv.as_str(), "10");
    let outcome = store
        .replace_scope(&s, "12", &refs(&[p1, pod("a", "p2", "11", "n1", &[])]))
        .expect("a relist of sound objects");
    assert_eq!(outcome.stored, 2);
    assert_eq!(names(store, &s), ["p1", "p2"]);
}

fn events_for_an_unlisted_scope_only_refresh_cached_objects(store: &dyn Store) {
    let s = scope("kubelet", &pods(), None, "", "spec.nodeName=n1");
    let outcome = store
        .apply_event(&s, EventType::Added, &pod("a", "p", "5", "n1", &[]))
        .expect("add");
    assert_eq!(outcome, WriteOutcome::ScopeUnknown);
    assert_eq!(found(store, &key("a", "p")), None);
    store
        .put_object("kubelet", &pods(), &pod("a", "p", "5", "n1", &[]))
        .expect("GET");
    let outcome = store
        .apply_event(&s, EventType::Modified, &pod("a", "p", "6", "n1", &[]))
        .expect("mod");
    assert_eq!(outcome, WriteOutcome::Stored);
    assert_eq!(found(store, &key("a", "p")), Some("6".into()));
    assert!(
        store.list(&s).expect("list").is_none(),
        "events alone never make a LIST"
    );
}

fn replays_from_a_broader_scope_are_filtered_like_the_list(store: &dyn Store) {
    let all = scope("kubelet", &pods(), None, "", "");
    store.replace_scope(&all, "10", &[]).expect("replace");
    store
        .apply_event(&all, EventType::Added, &pod("a", "p1", "11", "n1", &[]))
        .expect("add");
    store
        .apply_event(&all, EventType::Added, &pod("b", "p2", "12", "n2", &[]))
        .expect("add");
    store
        .apply_event(&all, EventType::Added, &pod("b", "p3", "13", "n1", &[]))
        .expect("add");
    let by_node_in_b = scope("kubelet", &pods(), Some("b"), "", "spec.nodeName=n1");
    let events = store.events_since(&by_node_in_b, "10").expect("replay");
    let names: Vec<String> = events
        .iter()
        .map(|e| field(&e.object, "/metadata/name"))
        .collect();
    assert_eq!(names, ["p3"]);
}

/// A broader scope answering a narrower watch sends DELETED for an object that left the
/// query's selector (as kube-apiserver does), and nothing for one that entered the scope after
/// the client's version without ever matching.
fn a_replay_through_a_broader_scope_deletes_what_left_the_selector(store: &dyn Store) {
    let all = scope("kubelet", &pods(), None, "", "");
    let at_10 = [
        pod("a", "p1", "7", "n1", &[("app", "web")]),
        pod("a", "p4", "8", "n1", &[("app", "web")]),
        pod("a", "p5", "9", "n1", &[("app", "web")]),
    ];
    store
        .replace_scope(&all, "10", &refs(&at_10))
        .expect("replace");
    let events = [
        (
            EventType::Modified,
            pod("a", "p1", "11", "n1", &[("app", "db")]),
        ),
        (
            EventType::Added,
            pod("a", "p2", "12", "n1", &[("app", "db")]),
        ),
        (
            EventType::Deleted,
            pod("a", "p4", "13", "n1", &[("app", "db")]),
        ),
        (
            EventType::Modified,
            pod("a", "p5", "14", "n1", &[("app", "web")]),
        ),
    ];
    for (event_type, bytes) in &events {
        store.apply_event(&all, *event_type, bytes).expect("event");
    }
    let web = scope("kubelet", &pods(), None, "app=web", "");
    let replay = |from: &str| -> Vec<(EventType, String, String)> {
        store
            .events_since(&web, from)
            .expect("replayable")
            .into_iter()
            .map(|e| {
                let name = field(&e.object, "/metadata/name");
                (e.event_type, e.resource_version.to_string(), name)
            })
            .collect()
    };
    let event = |t, rv: &str, name: &str| (t, rv.to_owned(), name.to_owned());
    assert_eq!(
        replay("10"),
        [
            event(EventType::Deleted, "11", "p1"),
            event(EventType::Deleted, "13", "p4"),
            event(EventType::Modified, "14", "p5"),
        ],
        "p1 left app=web; p2 never matched"
    );
    store
        .apply_event(
            &all,
            EventType::Added,
            &pod("a", "p6", "15", "n1", &[("app", "web")]),
        )
        .expect("event");
    assert_eq!(
        replay("11"),
        [
            event(EventType::Deleted, "13", "p4"),
            event(EventType::Modified, "14", "p5"),
            event(EventType::Added, "15", "p6"),
        ],
        "the log of {LOG} holds 12..15"
    );
}

fn delete_object_forgets_it_everywhere(store: &dyn Store) {
    let s = scope("kubelet", &pods(), None, "", "");
    store
        .replace_scope(&s, "10", &refs(&[pod("a", "p1", "1", "n1", &[])]))
        .expect("replace");
    store
        .put_object("kubelet", &pods(), &pod("a", "p1", "1", "n1", &[]))
        .expect("pin");
    assert!(store.delete_object(&key("a", "p1")).expect("delete"));
    assert!(!store.delete_object(&key("a", "p1")).expect("delete again"));
    assert!(names(store, &s).is_empty());
}

fn stats_summarise_each_component_resource(store: &dyn Store) {
    let before = std::time::SystemTime::now() - std::time::Duration::from_secs(1);
    let s = scope("kubelet", &pods(), None, "", "");
    let items = [
        pod("a", "p1", "7", "n1", &[]),
        pod("a", "p2", "30", "n1", &[]),
    ];
    store
        .replace_scope(&s, "25", &refs(&items))
        .expect("replace");
    store
        .put_object(
            "kube-proxy",
            &Gvr::new("", "v1", "services"),
            br#"{"metadata":{"name":"s","namespace":"a","resourceVersion":"3"}}"#,
        )
        .expect("put");
    let stats = store.stats().expect("stats");
    assert_eq!(stats.len(), 2);
    let kubelet = stats
        .iter()
        .find(|r| r.component == "kubelet")
        .expect("kubelet row");
    assert_eq!(
        (
            kubelet.objects,
            kubelet.scopes,
            kubelet.gvr.to_string().as_str()
        ),
        (2, 1, "pods.v1.core")
    );
    assert!(kubelet.bytes >= items.iter().map(|i| i.len() as u64).sum::<u64>());
    assert_eq!(
        kubelet.last_resource_version.as_ref().map(|r| r.as_str()),
        Some("30")
    );
    assert!(kubelet.last_write.expect("written") >= before);
    assert!(kubelet.age().expect("age") < std::time::Duration::from_secs(60));
}

fn verify_passes_a_healthy_cache(store: &dyn Store) {
    let s = scope("kubelet", &pods(), None, "", "");
    store
        .replace_scope(&s, "10", &refs(&[pod("a", "p1", "1", "n1", &[])]))
        .expect("replace");
    store
        .apply_event(&s, EventType::Modified, &pod("a", "p1", "11", "n1", &[]))
        .expect("event");
    let report = store.verify().expect("verify");
    assert!(report.corrupt.is_empty(), "{:?}", report.corrupt);
    assert_eq!(report.checked, 4, "object, scope, member, event");
    assert_eq!(store.health().quarantined, 0);
}

const POD_KIND: &[u8] = br#"{"kind":"Pod","listKind":"PodList"}"#;

fn documents_round_trip_and_the_last_write_wins(store: &dyn Store) {
    assert_eq!(store.get_document("/api").expect("get"), None);
    store
        .put_document("kinds/pods.v1.core", POD_KIND)
        .expect("put");
    let versions = br#"{"kind":"APIVersions","versions":["v1"]}"#;
    store.put_document("/api", versions).expect("put");
    let got = store.get_document("kinds/pods.v1.core").expect("get");
    assert_eq!(got.as_deref(), Some(POD_KIND));
    let replaced = br#"{"kind":"APIVersions","versions":["v1"],"serverAddressByClientCIDRs":[]}"#;
    store.put_document("/api", replaced).expect("overwrite");
    assert_eq!(
        store.get_document("/api").expect("get").as_deref(),
        Some(&replaced[..])
    );
    assert_eq!(
        store.get_document("/apis").expect("get"),
        None,
        "no prefix match"
    );
    store.put_document("/version", b"").expect("empty document");
    assert_eq!(
        store.get_document("/version").expect("get").as_deref(),
        Some(&b""[..])
    );
    let not_json = b"\x0a\x03k8s\x00";
    store
        .put_document("/apis/protobuf", not_json)
        .expect("any bytes");
    assert_eq!(
        store
            .get_document("/apis/protobuf")
            .expect("get")
            .as_deref(),
        Some(&not_json[..])
    );
}

fn documents_are_listed_by_prefix_and_deleted_by_name(store: &dyn Store) {
    for name in [
        "local/pods/a/x",
        "local/pods/b/y",
        "local/podsx",
        "kinds/pods.v1.core",
    ] {
        store.put_document(name, name.as_bytes()).expect("put");
    }
    let listed = |prefix: &str| -> Vec<String> {
        store
            .documents(prefix)
            .expect("documents")
            .into_iter()
            .map(|(name, bytes)| {
                assert_eq!(bytes, name.as_bytes());
                name
            })
            .collect()
    };
    assert_eq!(listed("local/pods/"), ["local/pods/a/x", "local/pods/b/y"]);
    store.delete_document("local/pods/a/x").expect("delete");
    store
        .delete_document("local/pods/none")
        .expect("deleting nothing is fine");
    assert_eq!(store.get_document("local/pods/a/x").expect("get"), None);
    assert_eq!(listed("local/pods/"), ["local/pods/b/y"]);
    assert_eq!(listed("local/"), ["local/pods/b/y", "local/podsx"]);
}

fn documents_are_verified_survive_compaction_and_stay_out_of_stats(store: &dyn Store) {
    let s = scope("kubelet", &pods(), None, "", "");
    store
        .replace_scope(&s, "10", &refs(&[pod("a", "p1", "1", "n1", &[])]))
        .expect("replace");
    store
        .put_document("kinds/pods.v1.core", POD_KIND)
        .expect("put");
    store.put_document("/api", b"{}").expect("put");
    let report = store.verify().expect("verify");
    assert!(report.corrupt.is_empty(), "{:?}", report.corrupt);
    assert_eq!(report.checked, 5, "object, scope, member, two documents");
    assert_eq!(store.compact().expect("compact").entries, 5);
    let got = store.get_document("kinds/pods.v1.core").expect("get");
    assert_eq!(got.as_deref(), Some(POD_KIND));
    assert_eq!(
        store.get_document("/api").expect("get").as_deref(),
        Some(&b"{}"[..])
    );
    let stats = store.stats().expect("stats");
    assert_eq!(stats.len(), 1, "{stats:?}");
    assert_eq!((stats[0].objects, stats[0].scopes), (1, 1));
    assert!(!store.health().degraded);
}

fn a_get_of_the_stored_version_writes_nothing(store: &dyn Store) {
    let holds = |name: &str, rv: &str, node: &str| {
        store
            .holds_pinned(&key("a", name), &pod("a", name, rv, node, &[]))
            .expect("holds_pinned")
    };
    assert!(!holds("p", "10", "n1"), "nothing stored yet");
    let first = store
        .put_object("kubelet", &pods(), &pod("a", "p", "10", "n1", &[]))
        .expect("put");
    assert_eq!(first, WriteOutcome::Stored);
    assert!(holds("p", "10", "n1"));
    let again = store
        .put_object("kubelet", &pods(), &pod("a", "p", "10", "n1", &[]))
        .expect("put");
    assert_eq!(again, WriteOutcome::Unchanged);
    // The hub's own change at the same version (kubelet's offline status) is written.
    assert!(!holds("p", "10", "n2"), "other bytes at the same version");
    let patched = store
        .put_object("kubelet", &pods(), &pod("a", "p", "10", "n2", &[]))
        .expect("put");
    assert_eq!(patched, WriteOutcome::Stored);
    assert!(holds("p", "10", "n2") && !holds("p", "10", "n1"));
    // Held only by a scope (not pinned by a GET): the GET still pins it.
    let s = scope("kubelet", &pods(), None, "", "");
    store
        .replace_scope(&s, "20", &refs(&[pod("a", "q", "15", "n1", &[])]))
        .expect("replace");
    assert!(!holds("q", "15", "n1"), "stored, but by a LIST: not pinned");
    let pinned = store
        .put_object("kubelet", &pods(), &pod("a", "q", "15", "n1", &[]))
        .expect("put");
    assert_eq!(pinned, WriteOutcome::Stored);
    assert!(holds("q", "15", "n1"));
    store.replace_scope(&s, "21", &[]).expect("relist empty");
    assert_eq!(
        found(store, &key("a", "q")),
        Some("15".into()),
        "the GET's pin keeps it"
    );
    let newer = store
        .put_object("kubelet", &pods(), &pod("a", "p", "11", "n1", &[]))
        .expect("put");
    assert_eq!(newer, WriteOutcome::Stored);
    assert_eq!(found(store, &key("a", "p")), Some("11".into()));
    store.delete_object(&key("a", "q")).expect("delete");
    assert!(!holds("q", "15", "n1"), "forgotten");
}

/// A group commit (`apply_events`) must end exactly where the same events applied one by one
/// end: each event of a group sees the writes of those before it, including the log trimming
/// past `LOG` and a delete of an object added earlier in the same group.
fn a_group_of_events_ends_where_one_by_one_ends(store: &dyn Store) {
    let nameless = br#"{"metadata":{"namespace":"a","resourceVersion":"20"}}"#.to_vec();
    let events: Vec<(EventType, Vec<u8>)> = vec![
        (EventType::Added, pod("a", "p2", "11", "n1", &[])),
        (
            EventType::Modified,
            pod("a", "p2", "12", "n1", &[("v", "2")]),
        ),
        (EventType::Deleted, pod("a", "p1", "13", "n1", &[])),
        (EventType::Added, nameless),
        (
            EventType::Modified,
            pod("a", "p2", "10", "n1", &[("v", "old")]),
        ),
        (EventType::Bookmark, bookmark("14")),
        (EventType::Added, pod("a", "p3", "15", "n1", &[])),
        (
            EventType::Modified,
            pod("a", "p2", "16", "n1", &[("v", "3")]),
        ),
        (EventType::Deleted, pod("a", "p3", "17", "n1", &[])),
        (EventType::Added, pod("a", "p4", "18", "n1", &[])),
    ];
    let events: Vec<(EventType, &[u8])> = events.iter().map(|(t, b)| (*t, b.as_slice())).collect();
    let [one_by_one, grouped] = ["kubelet", "kube-proxy"].map(|component| {
        let s = scope(component, &pods(), None, "", "spec.nodeName=n1");
        store
            .replace_scope(&s, "10", &refs(&[pod("a", "p1", "9", "n1", &[])]))
            .expect("replace");
        store
            .put_object(component, &pods(), &pod("a", "p1", "9", "n1", &[]))
            .expect("pin");
        s
    });
    let singly: Vec<String> = events
        .iter()
        .map(|(t, b)| {
            format!(
                "{:?}",
                store
                    .apply_event(&one_by_one, *t, b)
                    .map_err(|e| e.to_string())
            )
        })
        .collect();
    let together: Vec<String> = store
        .apply_events(&grouped, &events)
        .expect("one write")
        .into_iter()
        .map(|o| format!("{:?}", o.map_err(|e| e.to_string())))
        .collect();
    assert_eq!(singly, together);
    assert!(
        together[3].starts_with("Err("),
        "the nameless event alone fails: {together:?}"
    );

    let view = |s: &outpost_cache::Scope| {
        let list = store.list(s).expect("list").expect("cached");
        let items: Vec<(String, String, String)> = list
            .items
            .iter()
            .map(|o| {
                (
                    field(&o.bytes, "/metadata/name"),
                    o.resource_version.to_string(),
                    field(&o.bytes, "/metadata/labels/v"),
                )
            })
            .collect();
        let replay: Vec<(EventType, String)> = store
            .events_since(s, "14")
            .expect("replayable")
            .into_iter()
            .map(|e| (e.event_type, e.resource_version.to_string()))
            .collect();
        let too_old = matches!(store.events_since(s, "11"), Err(ReplayError::TooOld(_)));
        let pinned = ObjectKey::new(&s.component, &pods(), "a", "p1");
        (
            list.resource_version.to_string(),
            items,
            replay,
            too_old,
            store.get(&pinned).expect("get"),
        )
    };
    let expected = view(&one_by_one);
    assert_eq!(expected.0, "18");
    assert_eq!(
        expected.1,
        [
            ("p2".to_owned(), "16".to_owned(), "3".to_owned()),
            ("p4".into(), "18".into(), String::new())
        ]
    );
    assert!(expected.3, "the log of {LOG} was trimmed past 11");
    assert_eq!(
        expected.4,
        Lookup::NotCached,
        "the delete took the pinned p1 too"
    );
    assert_eq!(view(&grouped), expected);
}

/// Two clients of one component list and watch the same pods. The first one's LIST answer
/// (at 10) lands after the second one's watch moved the scope to 13: it must not roll the scope
/// back, and the first one's watch, replaying 11..13 behind the other, must not undo them.
fn a_slow_list_never_rolls_the_scope_back(store: &dyn Store) {
    let s = scope("kubelet", &pods(), None, "", "");
    store
        .replace_scope(&s, "9", &refs(&[pod("a", "old", "8", "n1", &[])]))
        .expect("first list");
    // The second client's watch: p1 created at 11, `old` deleted at 12, p2 created at 13.
    for (t, object) in [
        (EventType::Added, pod("a", "p1", "11", "n1", &[])),
        (EventType::Deleted, pod("a", "old", "12", "n1", &[])),
        (EventType::Added, pod("a", "p2", "13", "n1", &[])),
    ] {
        store.apply_event(&s, t, &object).expect("event");
    }
    // The first client's LIST, taken at 10, arrives now.
    let slow = store
        .replace_scope(
            &s,
            "10",
            &refs(&[
                pod("a", "old", "8", "n1", &[]),
                pod("a", "p0", "10", "n1", &[]),
            ]),
        )
        .expect("slow list");
    assert_eq!(
        slow.refused_older_than.as_ref().map(|rv| rv.as_str()),
        Some("13")
    );
    let list = store.list(&s).expect("list").expect("cached");
    assert_eq!(list.resource_version.as_str(), "13");
    assert_eq!(names(store, &s), ["p1", "p2"], "alive at 13, nothing else");
    // Its watch from 10 replays what the scope already holds; a late ADDED of `old` (as a
    // re-creation would look) and the DELETED of p1 at 11 are older than the scope.
    for (t, object) in [
        (EventType::Added, pod("a", "p1", "11", "n1", &[])),
        (EventType::Deleted, pod("a", "p2", "12", "n1", &[])),
        (EventType::Added, pod("a", "old", "12", "n1", &[])),
    ] {
        let outcome = store.apply_event(&s, t, &object).expect("event");
        assert!(
            matches!(outcome, WriteOutcome::Superseded { ref scope } if scope.as_str() == "13"),
            "{outcome:?}"
        );
    }
    assert_eq!(names(store, &s), ["p1", "p2"]);
    // Both watches go on together: a newer event applies once, its repeat changes nothing.
    let p3 = pod("a", "p3", "14", "n1", &[]);
    assert_eq!(
        store.apply_event(&s, EventType::Added, &p3).expect("event"),
        WriteOutcome::Stored
    );
    assert_eq!(
        store
            .apply_event(&s, EventType::Added, &p3)
            .expect("repeat"),
        WriteOutcome::Stored
    );
    assert_eq!(names(store, &s), ["p1", "p2", "p3"]);
    // A list at the scope's version or newer replaces it as always.
    let fresh = store
        .replace_scope(&s, "14", &refs(&[pod("a", "p3", "14", "n1", &[])]))
        .expect("list");
    assert_eq!(fresh.refused_older_than, None);
    assert_eq!(names(store, &s), ["p3"]);
    // Versions that do not parse are never ordered: the list is taken.
    let opaque = store
        .replace_scope(&s, "x1", &refs(&[pod("a", "p4", "x1", "n1", &[])]))
        .expect("list");
    assert_eq!(opaque.refused_older_than, None);
    assert_eq!(names(store, &s), ["p4"]);
}

/// A list that repeats the last one renews its scope from the write sequence that replace left,
/// while no item of the scope's resource has been written since; after such a write the caller
/// must replace the scope. A bookmark, or a write to another resource, changes no item.
fn a_repeated_list_renews_its_scope_only_while_its_items_are_unchanged(store: &dyn Store) {
    let s = scope("kubelet", &pods(), None, "", "spec.nodeName=n1");
    let items = [
        pod("a", "p1", "10", "n1", &[]),
        pod("a", "p2", "11", "n1", &[]),
    ];
    store.replace_scope(&s, "20", &refs(&items)).expect("list");
    let seq = store.write_seq();
    let renewed = store.renew_scope(&s, "25", seq).expect("renew");
    assert_eq!(renewed.map(|o| o.refused_older_than), Some(None));
    assert_eq!(store.write_seq(), seq + 1, "one commit");
    let list = store.list(&s).expect("list").expect("cached");
    assert_eq!(list.resource_version.as_str(), "25");
    assert_eq!(names(store, &s), ["p1", "p2"]);
    assert!(
        matches!(store.events_since(&s, "20"), Err(ReplayError::TooOld(_))),
        "the log restarts at the renewed version, as after a replace"
    );
    assert!(store.events_since(&s, "25").expect("replayable").is_empty());

    // Older than the scope: refused, nothing written.
    let older = store.renew_scope(&s, "22", seq).expect("renew");
    assert_eq!(
        older
            .and_then(|o| o.refused_older_than)
            .map(|rv| rv.to_string()),
        Some("25".into())
    );
    assert_eq!(store.write_seq(), seq + 1);

    // An event commits: the same sequence no longer renews, and nothing is written.
    store
        .apply_event(&s, EventType::Deleted, &pod("a", "p2", "26", "n1", &[]))
        .expect("event");
    let after_event = store.write_seq();
    assert_eq!(store.renew_scope(&s, "27", seq).expect("renew"), None);
    assert_eq!(store.write_seq(), after_event);
    assert_eq!(names(store, &s), ["p1"], "the event's state stays");

    // A bookmark and another resource's writes leave the items as they were.
    store.replace_scope(&s, "27", &refs(&items)).expect("list");
    let seq = store.write_seq();
    store
        .apply_event(&s, EventType::Bookmark, &bookmark("30"))
        .expect("bookmark");
    let nodes = Gvr::new("", "v1", "nodes");
    store
        .put_object("kubelet", &nodes, &pod("", "n1", "5", "n1", &[]))
        .expect("a node");
    let older = store.renew_scope(&s, "29", seq).expect("renew");
    assert_eq!(
        older
            .and_then(|o| o.refused_older_than)
            .map(|rv| rv.to_string()),
        Some("30".into()),
        "the bookmark's version is the scope's"
    );
    let renewed = store.renew_scope(&s, "31", seq).expect("renew");
    assert_eq!(renewed.map(|o| o.refused_older_than), Some(None));
    assert_eq!(names(store, &s), ["p1", "p2"]);
    // Any object of the resource written since: replace.
    store
        .put_object("kubelet", &pods(), &pod("b", "other", "3", "n2", &[]))
        .expect("GET elsewhere");
    assert_eq!(store.renew_scope(&s, "32", seq).expect("renew"), None);
    let unlisted = scope("kubelet", &pods(), Some("b"), "", "");
    let now = store.write_seq();
    assert_eq!(
        store.renew_scope(&unlisted, "28", now).expect("renew"),
        None
    );
}

/// A scope marked as having missed events is reported by every read until the mark is cleared.
fn a_scope_that_missed_events_is_reported_until_cleared(store: &dyn Store) {
    let s = scope("kubelet", &pods(), None, "", "");
    store
        .replace_scope(&s, "10", &refs(&[pod("a", "p1", "9", "n1", &[])]))
        .expect("list");
    assert_eq!(store.list(&s).expect("list").expect("cached").missed, None);
    assert!(
        store
            .mark_missed(&s.id(), "the writer queue was full")
            .expect("mark")
    );
    assert!(
        !store.mark_missed(&s.id(), "again").expect("mark"),
        "marked once"
    );
    assert_eq!(store.health().missed_scopes, 1);
    let narrower = scope("kubelet", &pods(), Some("a"), "", "");
    let list = store.list(&narrower).expect("list").expect("covered");
    assert_eq!(list.missed.as_deref(), Some("the writer queue was full"));
    match store.events_since(&narrower, "10") {
        Err(ReplayError::Missed(reason)) => assert_eq!(reason, "the writer queue was full"),
        other => panic!("{other:?}"),
    }
    assert!(store.clear_missed(&s.id()).expect("clear"));
    assert!(!store.clear_missed(&s.id()).expect("clear"), "cleared once");
    assert_eq!(store.list(&s).expect("list").expect("cached").missed, None);
    assert_eq!(store.health().missed_scopes, 0);
    assert!(store.events_since(&s, "10").expect("replay").is_empty());
}

macro_rules! suite {
    ($($case:ident),* $(,)?) => {
        mod mem {
            $(#[test] fn $case() { super::$case(&outpost_cache::MemStore::with_max_events(super::LOG)); })*
        }
        mod sled {
            $(#[test] fn $case() {
                let dir = tempfile::tempdir().expect("tempdir");
                let store = super::sled_store(dir.path());
                super::$case(&store);
            })*
        }
    };
}

fn sled_store(dir: &std::path::Path) -> SledStore {
    let options = SledOptions {
        max_events_per_scope: LOG,
        ..SledOptions::default()
    };
    SledStore::open(dir, options).expect("open")
}

suite!(
    replace_lists_items_in_key_order_with_the_list_rv,
    a_slow_list_never_rolls_the_scope_back,
    a_repeated_list_renews_its_scope_only_while_its_items_are_unchanged,
    a_scope_that_missed_events_is_reported_until_cleared,
    bytes_are_stored_verbatim,
    a_relist_drops_missing_members_but_not_pinned_objects,
    overlapping_scopes_share_one_copy_and_keep_their_own_members,
    an_older_resource_version_never_replaces_a_newer_one,
    watch_events_upsert_delete_and_advance_the_scope,
    deleted_removes_the_object_from_every_scope_and_its_pin,
    a_stale_delete_only_leaves_its_scope,
    events_replay_after_a_version_and_refuse_older_ones,
    a_replay_sends_each_objects_latest_version,
    a_replay_refuses_when_a_logged_version_is_gone,
    a_query_is_served_by_the_most_specific_covering_scope,
    a_query_without_a_covering_scope_is_not_cached,
    components_only_see_what_they_cached,
    cluster_scoped_and_custom_resources_need_nothing_special,
    invalid_input_changes_nothing,
    a_relist_reads_whole_every_object_it_does_not_hold,
    events_for_an_unlisted_scope_only_refresh_cached_objects,
    replays_from_a_broader_scope_are_filtered_like_the_list,
    a_replay_through_a_broader_scope_deletes_what_left_the_selector,
    delete_object_forgets_it_everywhere,
    a_get_of_the_stored_version_writes_nothing,
    a_group_of_events_ends_where_one_by_one_ends,
    stats_summarise_each_component_resource,
    verify_passes_a_healthy_cache,
    documents_round_trip_and_the_last_write_wins,
    documents_are_listed_by_prefix_and_deleted_by_name,
    documents_are_verified_survive_compaction_and_stay_out_of_stats,
);
