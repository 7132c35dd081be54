//! `wire::protobuf` against objects Go marshalled: the `testdata/HEAD/<group>.<version>.<Kind>`
//! `.pb` / `.json` pairs of the `kubernetes/api` repository (kept in `k8s.io/api/testdata/` of the
//! Kubernetes source too), read at run time from the directory `OUTPOST_K8S_TESTDATA` names:
//! fetched fixtures are not committed here. `.ci/run` extracts Kubernetes 1.20's from Debian's
//! source package; any later release's work the same. Unset, each test says it was skipped.
//!
//! Per kind: Go's `.pb` decodes to Go's `.json` (same keys, values and key order); the `.json`
//! encodes and decodes back to itself; and the encoding equals the protobuf Go wrote, byte for
//! byte, wherever k8s-pb knows every field of the fixture (otherwise it equals Go's bytes less
//! the fields k8s-pb lacks).

use std::io::Write;
use std::path::PathBuf;

use outpost_core::wire::protobuf::{
    Envelope, decode_envelope, decode_object, encode_envelope, encode_object,
};
use prost::Message;
use serde_json::Value;

/// Fields the fixtures of some Kubernetes release carry and k8s-pb 0.8's protos (Kubernetes
/// 1.34) do not: decoding drops them, as a Go apiserver of that release drops unknown fields,
/// so they are taken out of the expected JSON. A path absent from a fixture is skipped.
const UNKNOWN_TO_K8S_PB: &[&str] = &[
    // Removed in 1.25; the 1.20 fixtures have it.
    "/metadata/clusterName",
    // Added after 1.34 (the `kubernetes/api` HEAD fixtures have them).
    "/metadata/shardInfo",
    "/spec/podPreemptionPolicy",
    "/status/declaredFeatures",
    "/spec/attestations",
];

/// Kinds whose whole `status` is newer than k8s-pb (CSINode's, after 1.34).
const STATUS_UNKNOWN_TO_K8S_PB: &[&str] = &["CSINode"];

fn testdata() -> Option<PathBuf> {
    std::env::var_os("OUTPOST_K8S_TESTDATA").map(PathBuf::from)
}

fn skipped(test: &str) {
    // Straight to stderr: the test harness captures `eprintln!`.
    let _ = writeln!(
        std::io::stderr(),
        "{test}: skipped: set OUTPOST_K8S_TESTDATA to a directory of Kubernetes' \
         testdata/HEAD fixtures (kubernetes/api) to run it"
    );
}

fn read(dir: &std::path::Path, file: &str) -> Vec<u8> {
    let path = dir.join(file);
    std::fs::read(&path).unwrap_or_else(|e| panic!("fixture {}: {e}", path.display()))
}

fn without_unknown_fields(mut object: Value) -> Value {
    for path in UNKNOWN_TO_K8S_PB {
        let (parent, field) = path.rsplit_once('/').expect("a JSON pointer");
        if let Some(Value::Object(fields)) = object.pointer_mut(parent) {
            fields.shift_remove(field);
        }
    }
    if STATUS_UNKNOWN_TO_K8S_PB.contains(&object["kind"].as_str().unwrap_or(""))
        && let Value::Object(fields) = &mut object
    {
        fields.shift_remove("status");
    }
    object
}

/// Compared as text so that key order counts too (serde_json keeps it: `preserve_order`).
fn assert_same_json(ours: &Value, go: &Value, what: &str) {
    let (a, b) = (
        serde_json::to_string_pretty(ours).unwrap(),
        serde_json::to_string_pretty(go).unwrap(),
    );
    assert!(a == b, "{what}\n--- ours\n{a}\n--- Go's\n{b}");
}

/// A fixture kind's prost message.
trait Fixture: Message + Default {
    /// Kubernetes before 1.22 had no `managedFields[].subresource`; Go 1.22 and later, like this
    /// crate, write it even when empty. Clearing the empty ones lets the bytes of an older
    /// release's fixture be compared.
    fn drop_empty_subresources(&mut self) {}
}

/// Whether the fixture comes from a release without `managedFields[].subresource`.
fn before_subresource(go_json: &Value) -> bool {
    go_json
        .pointer("/metadata/managedFields")
        .and_then(Value::as_array)
        .is_some_and(|entries| entries.iter().any(|e| e.get("subresource").is_none()))
}

/// The fixture's object as prost re-encodes it: Go's bytes less the fields k8s-pb does not
/// know (equal to Go's bytes when there are none).
fn known_fields<M: Fixture>(go_body: &[u8]) -> Vec<u8> {
    let envelope = decode_envelope(go_body).expect("Go's envelope");
    let message = M::decode(envelope.raw.as_slice()).expect("Go's object decodes");
    reencode(&envelope, &message)
}

fn reencode<M: Fixture>(envelope: &Envelope, message: &M) -> Vec<u8> {
    encode_envelope(
        &envelope.api_version,
        &envelope.kind,
        &message.encode_to_vec(),
    )
}

fn check<M: Fixture>(test: &str, stem: &str) {
    let Some(dir) = testdata() else {
        return skipped(test);
    };
    let go_pb = read(&dir, &format!("{stem}.pb"));
    let go_json: Value = serde_json::from_slice(&read(&dir, &format!("{stem}.json")))
        .unwrap_or_else(|e| panic!("{stem}.json: {e}"));
    let old_release = before_subresource(&go_json);
    let expected = without_unknown_fields(go_json);

    let decoded = decode_object(&go_pb).unwrap_or_else(|e| panic!("{stem}.pb: {e}"));
    assert_same_json(
        &decoded,
        &expected,
        &format!("{stem}.pb decodes to {stem}.json"),
    );

    let mut ours = encode_object(&expected).unwrap_or_else(|e| panic!("{stem}.json: {e}"));
    let back = decode_object(&ours).unwrap();
    assert_same_json(&back, &expected, &format!("{stem}.json round trip"));

    let byte_identical = ours == go_pb;
    let go_known = known_fields::<M>(&go_pb);
    if old_release {
        let envelope = decode_envelope(&ours).unwrap();
        let mut message = M::decode(envelope.raw.as_slice()).unwrap();
        message.drop_empty_subresources();
        ours = reencode(&envelope, &message);
    }
    let _ = writeln!(
        std::io::stderr(),
        "{stem}: our encoding is {} Go's .pb ({} bytes){}",
        if byte_identical {
            "byte-identical to"
        } else {
            "not"
        },
        go_pb.len(),
        match (go_known == go_pb, old_release) {
            (true, _) => "",
            (false, false) => "; Go's carries fields k8s-pb lacks",
            (false, true) =>
                "; Go's carries fields k8s-pb lacks and lacks managedFields[].subresource",
        },
    );
    assert!(
        ours == go_known,
        "{stem}: our encoding differs from Go's bytes (less fields k8s-pb lacks)"
    );
    if go_known == go_pb && !old_release {
        assert!(byte_identical, "{stem}: not byte-identical to Go's .pb");
    }
}

macro_rules! fixture_tests {
    ($($test:ident: $stem:literal => $message:ty $(, $metadata:ident)?;)*) => {$(
        impl Fixture for $message {
            $(fn drop_empty_subresources(&mut self) {
                for entry in self.$metadata.iter_mut().flat_map(|m| &mut m.managed_fields) {
                    if entry.subresource.as_deref() == Some("") {
                        entry.subresource = None;
                    }
                }
            })?
        }

        #[test]
        fn $test() {
            check::<$message>(stringify!($test), $stem);
        }
    )*};
}

use k8s_pb::api::storage::v1 as storage_v1;
use k8s_pb::api::{authentication::v1 as authn, coordination::v1 as coord, core::v1 as core_v1};
use k8s_pb::apimachinery::pkg::apis::meta::v1 as meta_v1;

fixture_tests! {
    lease: "coordination.k8s.io.v1.Lease" => coord::Lease, metadata;
    node: "core.v1.Node" => core_v1::Node, metadata;
    token_request: "authentication.k8s.io.v1.TokenRequest" => authn::TokenRequest, metadata;
    event: "core.v1.Event" => core_v1::Event, metadata;
    csi_node: "storage.k8s.io.v1.CSINode" => storage_v1::CSINode, metadata;
    status: "core.v1.Status" => meta_v1::Status;
    config_map: "core.v1.ConfigMap" => core_v1::ConfigMap, metadata;
    secret: "core.v1.Secret" => core_v1::Secret, metadata;
    namespace: "core.v1.Namespace" => core_v1::Namespace, metadata;
    service_account: "core.v1.ServiceAccount" => core_v1::ServiceAccount, metadata;
    delete_options: "core.v1.DeleteOptions" => meta_v1::DeleteOptions;
}
