//! The REST strategies: what create, update, patch and delete do to an object before it is
//! stored, as kube-apiserver's `registry/*/strategy.go` and the generic registry do.
//!
//! Requests from clients ([`Origin::Client`]) get the full treatment (status reset on create,
//! status preserved on main-resource writes, generation bumps, NamespaceLifecycle). Writes
//! through the Rust API ([`Origin::Server`]) stand for controllers acting on the cluster: they
//! store the given object as-is (status included), but still get uid, timestamps, a new
//! resourceVersion, conflict checks and watch events.

use outpost_core::{Reason, Status};
use serde_json::{Map, Value, json};

use crate::patch::{self, PatchType};
use crate::resources::{CreateStatus, ResourceDef, by_gvr};
use crate::store::{Mutation, Store, object_key};
use crate::util;

/// Who is writing: a client over HTTP, or the test through the server-side API.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    Client,
    Server,
}

/// Adds `kind` and `apiVersion`, which single-object responses carry but list items do not.
pub fn typed(def: &ResourceDef, obj: &Value) -> Value {
    let mut out = obj.clone();
    if let Some(map) = out.as_object_mut() {
        map.insert("kind".into(), def.kind.into());
        map.insert("apiVersion".into(), def.api_version().into());
    }
    // Then where kube-apiserver writes them (first, or sorted in a custom resource).
    crate::store::in_apiserver_order(def, &mut out);
    out
}

/// Strips `kind` / `apiVersion` for storage (lists must not carry them per item).
pub(crate) fn untyped(mut obj: Value) -> Value {
    if let Some(map) = obj.as_object_mut() {
        map.shift_remove("kind");
        map.shift_remove("apiVersion");
    }
    obj
}

fn meta_str<'a>(obj: &'a Value, field: &str) -> &'a str {
    obj.get("metadata")
        .and_then(|m| m.get(field))
        .and_then(Value::as_str)
        .unwrap_or("")
}

fn metadata_mut(obj: &mut Value) -> &mut Map<String, Value> {
    if !obj.get("metadata").is_some_and(Value::is_object) {
        obj["metadata"] = json!({});
    }
    // Just ensured to be an object.
    obj["metadata"]
        .as_object_mut()
        .expect("metadata is an object")
}

fn qualified_kind(def: &ResourceDef) -> String {
    if def.group.is_empty() {
        def.kind.to_owned()
    } else {
        format!("{}.{}", def.kind, def.group)
    }
}

/// `Pod "x" is invalid: <field>: <detail>` (422), as `errors.NewInvalid` words it.
pub fn invalid(def: &ResourceDef, name: &str, field_error: &str) -> Status {
    Status::new(
        Reason::Invalid,
        format!(
            "{} \"{name}\" is invalid: {field_error}",
            qualified_kind(def)
        ),
    )
    .with_details(def.group, def.kind, name)
}

fn not_found(def: &ResourceDef, name: &str) -> Status {
    Status::not_found(def.group, def.name, name)
}

/// Checks the body's type, namespace and identity against the URL; returns the body as a map.
fn check_body(def: &ResourceDef, namespace: Option<&str>, obj: &mut Value) -> Result<(), Status> {
    if !obj.is_object() {
        return Err(Status::bad_request(
            "the body of the request was in an unknown format",
        ));
    }
    if let Some(v) = obj.get("apiVersion").and_then(Value::as_str)
        && v != def.api_version()
    {
        return Err(Status::bad_request(format!(
            "the API version in the data ({v}) does not match the expected API version ({})",
            def.api_version()
        )));
    }
    let body_ns = meta_str(obj, "namespace").to_owned();
    let meta = metadata_mut(obj);
    if !def.namespaced {
        meta.shift_remove("namespace");
        return Ok(());
    }
    let url_ns = namespace.unwrap_or("");
    if !body_ns.is_empty() && body_ns != url_ns {
        return Err(Status::bad_request(
            "the namespace of the provided object does not match the namespace sent on the request",
        ));
    }
    meta.insert("namespace".into(), url_ns.into());
    Ok(())
}

/// NamespaceLifecycle admission: namespaced objects need an existing namespace.
fn require_namespace(
    store: &Store,
    def: &ResourceDef,
    namespace: Option<&str>,
) -> Result<(), Status> {
    let (true, Some(ns)) = (def.namespaced, namespace) else {
        return Ok(());
    };
    let namespaces = by_gvr("v1/namespaces").expect("namespaces are registered");
    if store.get(namespaces, ns).is_some() {
        Ok(())
    } else {
        Err(Status::not_found("", "namespaces", ns))
    }
}

fn require_namespace_error(namespace: Option<&str>) -> Result<(), Status> {
    Err(Status::not_found("", "namespaces", namespace.unwrap_or("")))
}

/// `PrepareForCreate` plus the generic registry's `BeforeCreate`.
fn prepare_create(def: &ResourceDef, obj: &mut Value, origin: Origin) {
    let name = meta_str(obj, "name").to_owned();
    let meta = metadata_mut(obj);
    meta.insert("uid".into(), util::new_uid().into());
    meta.insert("creationTimestamp".into(), util::now_rfc3339().into());
    for field in ["deletionTimestamp", "deletionGracePeriodSeconds"] {
        meta.shift_remove(field);
    }
    if def.generation {
        meta.insert("generation".into(), 1.into());
    }
    if origin == Origin::Server {
        return;
    }
    match def.create_status {
        CreateStatus::Keep => {}
        CreateStatus::Clear => {
            obj.as_object_mut().map(|m| m.shift_remove("status"));
        }
        CreateStatus::Empty => obj["status"] = json!({}),
        CreateStatus::Pending => obj["status"] = json!({"phase": "Pending"}),
        CreateStatus::Active => obj["status"] = json!({"phase": "Active"}),
    }
    if def.kind == "Namespace" {
        let labels = metadata_mut(obj)
            .entry("labels")
            .or_insert_with(|| json!({}));
        labels["kubernetes.io/metadata.name"] = name.into();
        obj["spec"] = json!({"finalizers": ["kubernetes"]});
    }
}

/// Resolves `generateName`, or fails like `ValidateObjectMeta` when there is no name at all.
fn resolve_name(def: &ResourceDef, obj: &mut Value) -> Result<String, Status> {
    let name = meta_str(obj, "name");
    if !name.is_empty() {
        return Ok(name.to_owned());
    }
    let generate = meta_str(obj, "generateName");
    if generate.is_empty() {
        return Err(invalid(
            def,
            "",
            "metadata.name: Required value: name or generateName is required",
        ));
    }
    let name = format!("{generate}{}", util::name_suffix());
    metadata_mut(obj).insert("name".into(), name.clone().into());
    Ok(name)
}

/// POST: stores a new object. The namespace comes from the URL (or, for the server-side API,
/// from the object).
pub fn create(
    store: &Store,
    def: &'static ResourceDef,
    namespace: Option<&str>,
    obj: Value,
    origin: Origin,
) -> Result<Value, Status> {
    let mut obj = untyped(obj);
    check_body(def, namespace, &mut obj)?;
    let name = resolve_name(def, &mut obj)?;
    require_namespace(store, def, namespace)?;
    prepare_create(def, &mut obj, origin);
    let key = object_key(def, namespace, &name);
    let stored = store.mutate(def, &key, |current, _| match current {
        Some(_) => Err(Status::already_exists(def.group, def.name, &name)),
        None => Ok(Mutation::Put(obj)),
    })?;
    Ok(typed(
        def,
        &stored.expect("a put returns the stored object"),
    ))
}

/// Which part of the object a write may change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    Main,
    Status,
    /// A CSR's `approval` subresource: only `status.conditions`.
    Approval,
}

/// What a PUT or PATCH ended up doing.
pub struct Written {
    pub object: Value,
    pub created: bool,
}

/// PUT: replaces an object (optionally only its status), with optimistic concurrency.
pub fn update(
    store: &Store,
    def: &'static ResourceDef,
    namespace: Option<&str>,
    name: &str,
    obj: Value,
    part: Part,
    origin: Origin,
) -> Result<Written, Status> {
    let mut body = untyped(obj);
    check_body(def, namespace, &mut body)?;
    let body_name = meta_str(&body, "name");
    if body_name != name {
        return Err(Status::bad_request(format!(
            "the name of the object ({body_name}) does not match the name on the URL ({name})"
        )));
    }
    let key = object_key(def, namespace, name);
    // Checked outside `mutate`: the store lock is not reentrant.
    let namespace_ok = !def.create_on_update || require_namespace(store, def, namespace).is_ok();
    let mut created = false;
    let result = store.mutate(def, &key, |current, _| match current {
        Some(cur) => next_version(def, cur, body, part, origin),
        None if def.create_on_update && part == Part::Main => {
            if !namespace_ok {
                require_namespace_error(namespace)?;
            }
            prepare_create(def, &mut body, origin);
            created = true;
            Ok(Mutation::Put(body))
        }
        None => Err(not_found(def, name)),
    })?;
    Ok(Written {
        object: result.map(|o| typed(def, &o)).unwrap_or(Value::Null),
        created,
    })
}

/// PATCH: applies the patch to the current object, then stores it like an update.
#[allow(clippy::too_many_arguments)]
pub fn patch(
    store: &Store,
    def: &'static ResourceDef,
    namespace: Option<&str>,
    name: &str,
    kind: PatchType,
    body: &[u8],
    part: Part,
) -> Result<Value, Status> {
    if kind == PatchType::Strategic && !def.builtin {
        return Err(patch::unsupported_media_type(false));
    }
    let key = object_key(def, namespace, name);
    let result = store.mutate(def, &key, |current, _| {
        let cur = current.ok_or_else(|| not_found(def, name))?;
        let mut doc = typed(def, cur);
        patch::apply(&mut doc, kind, body)?;
        let mut doc = untyped(doc);
        check_identity_unchanged(def, cur, &doc)?;
        check_body(def, namespace, &mut doc)?;
        next_version(def, cur, doc, part, Origin::Client)
    })?;
    Ok(result.map(|o| typed(def, &o)).unwrap_or(Value::Null))
}

/// A patch may not rename or move the object.
fn check_identity_unchanged(def: &ResourceDef, cur: &Value, doc: &Value) -> Result<(), Status> {
    let (old, new) = (meta_str(cur, "name"), meta_str(doc, "name"));
    if old != new {
        return Err(invalid(
            def,
            old,
            &format!("metadata.name: Invalid value: \"{new}\": field is immutable"),
        ));
    }
    Ok(())
}

/// The object an update stores, from the current one and the request body.
fn next_version(
    def: &ResourceDef,
    cur: &Value,
    body: Value,
    part: Part,
    origin: Origin,
) -> Result<Mutation, Status> {
    let name = meta_str(cur, "name");
    let wanted = meta_str(&body, "resourceVersion");
    if !wanted.is_empty() && wanted != meta_str(cur, "resourceVersion") {
        return Err(Status::conflict(def.group, def.name, name));
    }
    let mut next = match part {
        Part::Status => with_status_of(cur, &body),
        Part::Approval => crate::csr::with_conditions_of(cur, &body),
        Part::Main => body,
    };
    keep_system_metadata(cur, &mut next);
    if part == Part::Main && def.status && origin == Origin::Client {
        copy_field(cur, &mut next, "status");
    }
    if crate::csr::is_csr(def) && origin == Origin::Client {
        crate::csr::prepare_update(def, part, cur, &mut next)?;
    }
    if def.generation && spec_changed(cur, &next) {
        let generation = cur
            .pointer("/metadata/generation")
            .and_then(Value::as_i64)
            .unwrap_or(0);
        metadata_mut(&mut next).insert("generation".into(), (generation + 1).into());
    }
    if is_finalized(&next) {
        return Ok(Mutation::Delete);
    }
    // etcd would not be written: same revision, no event.
    let mut same = next.clone();
    metadata_mut(&mut same).insert(
        "resourceVersion".into(),
        meta_str(cur, "resourceVersion").into(),
    );
    if &same == cur {
        return Ok(Mutation::Noop);
    }
    Ok(Mutation::Put(next))
}

/// A status write: everything from the current object except `.status`.
fn with_status_of(cur: &Value, body: &Value) -> Value {
    let mut next = cur.clone();
    copy_field(body, &mut next, "status");
    next
}

fn copy_field(from: &Value, to: &mut Value, field: &str) {
    let Some(map) = to.as_object_mut() else {
        return;
    };
    match from.get(field) {
        Some(v) => map.insert(field.into(), v.clone()),
        None => map.shift_remove(field),
    };
}

/// Fields clients cannot change through an update (`BeforeUpdate`).
fn keep_system_metadata(cur: &Value, next: &mut Value) {
    let old_meta = cur.get("metadata").cloned().unwrap_or_default();
    let meta = metadata_mut(next);
    for field in [
        "uid",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "generation",
    ] {
        match old_meta.get(field) {
            Some(v) => meta.insert(field.into(), v.clone()),
            None => meta.shift_remove(field),
        };
    }
}

/// Generation tracks changes to anything but metadata and status.
fn spec_changed(cur: &Value, next: &Value) -> bool {
    let strip = |v: &Value| {
        let mut v = v.clone();
        if let Some(m) = v.as_object_mut() {
            m.remove("metadata");
            m.remove("status");
        }
        v
    };
    strip(cur) != strip(next)
}

/// An object being deleted whose last finalizer was just removed goes away.
fn is_finalized(obj: &Value) -> bool {
    let deleting = obj.pointer("/metadata/deletionTimestamp").is_some();
    let finalizers = obj
        .pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .is_some_and(|f| !f.is_empty());
    deleting && !finalizers
}

/// The result of a DELETE: the object, and whether it is gone (200) or pending finalizers (202).
pub struct Deleted {
    pub object: Value,
    pub gone: bool,
}

/// DELETE: removes the object, honouring `DeleteOptions.preconditions` and finalizers.
pub fn delete(
    store: &Store,
    def: &'static ResourceDef,
    namespace: Option<&str>,
    name: &str,
    options: &Value,
) -> Result<Deleted, Status> {
    let key = object_key(def, namespace, name);
    let mut gone = true;
    let result = store.mutate(def, &key, |current, _| {
        let cur = current.ok_or_else(|| not_found(def, name))?;
        check_preconditions(def, cur, options)?;
        if !has_finalizers(cur) {
            return Ok(Mutation::Delete);
        }
        gone = false;
        if cur.pointer("/metadata/deletionTimestamp").is_some() {
            return Ok(Mutation::Noop);
        }
        let mut next = cur.clone();
        let meta = metadata_mut(&mut next);
        meta.insert("deletionTimestamp".into(), util::now_rfc3339().into());
        meta.insert("deletionGracePeriodSeconds".into(), 0.into());
        Ok(Mutation::Put(next))
    })?;
    if gone && def.kind == "Namespace" {
        delete_namespace_contents(store, name);
    }
    Ok(Deleted {
        object: result.map(|o| typed(def, &o)).unwrap_or(Value::Null),
        gone,
    })
}

fn has_finalizers(obj: &Value) -> bool {
    obj.pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .is_some_and(|f| !f.is_empty())
}

fn check_preconditions(def: &ResourceDef, cur: &Value, options: &Value) -> Result<(), Status> {
    for (field, label) in [("uid", "UID"), ("resourceVersion", "ResourceVersion")] {
        let Some(want) = options
            .pointer(&format!("/preconditions/{field}"))
            .and_then(Value::as_str)
        else {
            continue;
        };
        let have = meta_str(cur, field);
        if want != have {
            return Err(Status::new(
                Reason::Conflict,
                format!(
                    "Operation cannot be fulfilled on {}: Precondition failed: {label} in precondition: {want}, {label} in object meta: {have}",
                    qualified_resource(def)
                ),
            )
            .with_details(def.group, def.name, meta_str(cur, "name")));
        }
    }
    Ok(())
}

fn qualified_resource(def: &ResourceDef) -> String {
    if def.group.is_empty() {
        def.name.to_owned()
    } else {
        format!("{}.{}", def.name, def.group)
    }
}

/// The namespace controller's job, done synchronously: delete everything in the namespace.
fn delete_namespace_contents(store: &Store, namespace: &str) {
    for def in crate::resources::RESOURCES.iter().filter(|d| d.namespaced) {
        let (_, items) = store.list(def, &format!("{namespace}/"));
        for (key, _) in items {
            let _ = store.mutate(def, &key, |_, _| Ok(Mutation::Delete));
        }
    }
}

/// The service account a TokenRequest is for must exist; returns the TokenRequest response.
pub fn token_request(
    store: &Store,
    namespace: &str,
    service_account: &str,
    body: &Value,
    token: &str,
) -> Result<Value, Status> {
    let sas = by_gvr("v1/serviceaccounts").expect("serviceaccounts are registered");
    if store
        .get(sas, &object_key(sas, Some(namespace), service_account))
        .is_none()
    {
        return Err(Status::not_found("", "serviceaccounts", service_account));
    }
    let mut spec = body.get("spec").cloned().unwrap_or_else(|| json!({}));
    if spec.get("audiences").is_none_or(Value::is_null) {
        spec["audiences"] = json!(["https://kubernetes.default.svc.cluster.local"]);
    }
    let seconds = spec
        .get("expirationSeconds")
        .and_then(Value::as_u64)
        .unwrap_or(3600);
    spec["expirationSeconds"] = seconds.into();
    let expires = util::rfc3339(util::unix_now() + std::time::Duration::from_secs(seconds));
    Ok(json!({
        "kind": "TokenRequest",
        "apiVersion": "authentication.k8s.io/v1",
        "metadata": {"name": service_account, "namespace": namespace, "creationTimestamp": null},
        "spec": spec,
        "status": {"token": token, "expirationTimestamp": expires},
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::resource_version_of;

    fn rv_of(obj: &Value) -> u64 {
        resource_version_of(obj).unwrap_or(0)
    }

    fn store_with_default_ns() -> Store {
        let store = Store::new(100, 1);
        let ns = by_gvr("v1/namespaces").unwrap();
        create(
            &store,
            ns,
            None,
            json!({"metadata": {"name": "default"}}),
            Origin::Client,
        )
        .unwrap();
        store
    }

    fn pods() -> &'static ResourceDef {
        by_gvr("v1/pods").unwrap()
    }

    fn pod(name: &str) -> Value {
        json!({"metadata": {"name": name}, "spec": {"containers": [{"name": "c", "image": "i"}]}, "status": {"phase": "Running"}})
    }

    #[test]
    fn client_create_sets_metadata_and_resets_status() {
        let store = store_with_default_ns();
        let out = create(&store, pods(), Some("default"), pod("p"), Origin::Client).unwrap();
        assert_eq!(out["kind"], "Pod");
        assert_eq!(out["metadata"]["namespace"], "default");
        assert_eq!(out["status"], json!({"phase": "Pending"}));
        assert_eq!(out["metadata"]["uid"].as_str().unwrap().len(), 36);
        assert_eq!(rv_of(&out), store.current_rv());
        let again = create(&store, pods(), Some("default"), pod("p"), Origin::Client);
        assert_eq!(again.unwrap_err().reason, Reason::AlreadyExists);
    }

    #[test]
    fn server_create_keeps_status() {
        let store = store_with_default_ns();
        let out = create(&store, pods(), Some("default"), pod("p"), Origin::Server).unwrap();
        assert_eq!(out["status"]["phase"], "Running");
    }

    #[test]
    fn create_needs_existing_namespace_and_a_name() {
        let store = store_with_default_ns();
        let err = create(&store, pods(), Some("nope"), pod("p"), Origin::Client).unwrap_err();
        assert_eq!(err.message, "namespaces \"nope\" not found");
        let err = create(
            &store,
            pods(),
            Some("default"),
            json!({"metadata": {}}),
            Origin::Client,
        )
        .unwrap_err();
        assert_eq!(err.code, 422);
        let generated = create(
            &store,
            pods(),
            Some("default"),
            json!({"metadata": {"generateName": "web-"}}),
            Origin::Client,
        )
        .unwrap();
        assert!(
            generated["metadata"]["name"]
                .as_str()
                .unwrap()
                .starts_with("web-")
        );
        assert_eq!(generated["metadata"]["name"].as_str().unwrap().len(), 9);
    }

    #[test]
    fn update_checks_resource_version_and_keeps_status() {
        let store = store_with_default_ns();
        let created = create(&store, pods(), Some("default"), pod("p"), Origin::Server).unwrap();
        let mut stale = created.clone();
        stale["metadata"]["resourceVersion"] = "1".into();
        let err = update(
            &store,
            pods(),
            Some("default"),
            "p",
            stale,
            Part::Main,
            Origin::Client,
        );
        assert_eq!(err.err().map(|e| e.code), Some(409));
        let mut body = created.clone();
        body["metadata"]["labels"] = json!({"a": "b"});
        body["status"] = json!({"phase": "Failed"});
        let out = update(
            &store,
            pods(),
            Some("default"),
            "p",
            body,
            Part::Main,
            Origin::Client,
        )
        .unwrap();
        assert_eq!(out.object["metadata"]["labels"]["a"], "b");
        assert_eq!(out.object["status"]["phase"], "Running");
        assert!(rv_of(&out.object) > rv_of(&created));
    }

    #[test]
    fn status_update_changes_only_status() {
        let store = store_with_default_ns();
        let created = create(&store, pods(), Some("default"), pod("p"), Origin::Server).unwrap();
        let mut body = created.clone();
        body["status"] = json!({"phase": "Succeeded"});
        body["metadata"]["labels"] = json!({"ignored": "yes"});
        let out = update(
            &store,
            pods(),
            Some("default"),
            "p",
            body,
            Part::Status,
            Origin::Client,
        )
        .unwrap();
        assert_eq!(out.object["status"]["phase"], "Succeeded");
        assert!(out.object["metadata"].get("labels").is_none());
    }

    #[test]
    fn identical_update_is_a_noop() {
        let store = store_with_default_ns();
        let created = create(&store, pods(), Some("default"), pod("p"), Origin::Server).unwrap();
        let rv = store.current_rv();
        let out = update(
            &store,
            pods(),
            Some("default"),
            "p",
            created,
            Part::Main,
            Origin::Client,
        )
        .unwrap();
        assert_eq!(store.current_rv(), rv);
        assert_eq!(rv_of(&out.object), rv);
    }

    #[test]
    fn update_of_missing_object_is_404_unless_create_on_update() {
        let store = store_with_default_ns();
        let err = update(
            &store,
            pods(),
            Some("default"),
            "p",
            pod("p"),
            Part::Main,
            Origin::Client,
        );
        assert_eq!(err.err().map(|e| e.code), Some(404));
        let svc = by_gvr("v1/services").unwrap();
        let out = update(
            &store,
            svc,
            Some("default"),
            "s",
            json!({"metadata": {"name": "s"}}),
            Part::Main,
            Origin::Client,
        )
        .unwrap();
        assert!(out.created);
    }

    #[test]
    fn deployments_track_generation() {
        let store = store_with_default_ns();
        let deploys = by_gvr("apps/v1/deployments").unwrap();
        let d = json!({"metadata": {"name": "d"}, "spec": {"replicas": 1}});
        let created = create(&store, deploys, Some("default"), d, Origin::Client).unwrap();
        assert_eq!(created["metadata"]["generation"], 1);
        let p = br#"{"spec":{"replicas":2}}"#;
        let out = patch(
            &store,
            deploys,
            Some("default"),
            "d",
            PatchType::Merge,
            p,
            Part::Main,
        )
        .unwrap();
        assert_eq!(out["metadata"]["generation"], 2);
        let p = br#"{"metadata":{"labels":{"x":"y"}}}"#;
        let out = patch(
            &store,
            deploys,
            Some("default"),
            "d",
            PatchType::Merge,
            p,
            Part::Main,
        )
        .unwrap();
        assert_eq!(out["metadata"]["generation"], 2);
    }

    #[test]
    fn patch_with_stale_resource_version_conflicts() {
        let store = store_with_default_ns();
        create(&store, pods(), Some("default"), pod("p"), Origin::Client).unwrap();
        let p = br#"{"metadata":{"resourceVersion":"1","labels":{"a":"b"}}}"#;
        let err = patch(
            &store,
            pods(),
            Some("default"),
            "p",
            PatchType::Merge,
            p,
            Part::Main,
        )
        .unwrap_err();
        assert_eq!(err.code, 409);
    }

    #[test]
    fn delete_honours_finalizers_and_preconditions() {
        let store = store_with_default_ns();
        let cms = by_gvr("v1/configmaps").unwrap();
        let cm = json!({"metadata": {"name": "c", "finalizers": ["x/y"]}});
        let created = create(&store, cms, Some("default"), cm, Origin::Client).unwrap();
        let bad = json!({"preconditions": {"uid": "nope"}});
        assert_eq!(
            delete(&store, cms, Some("default"), "c", &bad)
                .err()
                .map(|e| e.code),
            Some(409)
        );
        let pending = delete(&store, cms, Some("default"), "c", &Value::Null).unwrap();
        assert!(!pending.gone);
        assert!(pending.object["metadata"]["deletionTimestamp"].is_string());
        let mut body = pending.object.clone();
        body["metadata"]["finalizers"] = json!([]);
        update(
            &store,
            cms,
            Some("default"),
            "c",
            body,
            Part::Main,
            Origin::Client,
        )
        .unwrap();
        assert!(store.get(cms, "default/c").is_none());
        assert!(rv_of(&created) < store.current_rv());
    }

    #[test]
    fn deleting_a_namespace_deletes_its_contents() {
        let store = store_with_default_ns();
        create(&store, pods(), Some("default"), pod("p"), Origin::Client).unwrap();
        let ns = by_gvr("v1/namespaces").unwrap();
        let out = delete(&store, ns, None, "default", &Value::Null).unwrap();
        assert!(out.gone);
        assert!(store.get(pods(), "default/p").is_none());
    }
}
