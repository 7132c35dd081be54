//! The kinds the protobuf conversion knows, and their JSON tables (one file per API group).
//!
//! To add a kind: write the `json_message!` table of its message types (fields in the Go
//! struct's order, each declared as Go declares it), then add a line to [`KINDS`].

mod authentication;
mod coordination;
mod core;
mod meta;
mod storage;

use k8s_pb::api::storage::v1 as storage_v1;
use k8s_pb::api::{authentication::v1 as authn, coordination::v1 as coord, core::v1 as core_v1};
use k8s_pb::apimachinery::pkg::apis::meta::v1 as meta_v1;
use serde_json::Value;

use super::convert::{FieldError, Json};

/// One kind's conversions between its protobuf message (`Unknown.raw`) and its JSON fields.
pub(crate) struct Codec {
    /// `None` for kinds every group version registers (`Status`, `DeleteOptions`).
    pub api_version: Option<&'static str>,
    pub kind: &'static str,
    pub to_json: fn(&[u8]) -> Result<Value, Decode>,
    pub from_json: fn(&Value) -> Result<Vec<u8>, FieldError>,
}

/// Why a message did not convert to JSON.
pub(crate) enum Decode {
    Protobuf(prost::DecodeError),
    Field(FieldError),
}

const fn codec<T: prost::Message + Json>(
    api_version: Option<&'static str>,
    kind: &'static str,
) -> Codec {
    Codec {
        api_version,
        kind,
        to_json: message_to_json::<T>,
        from_json: json_to_message::<T>,
    }
}

pub(crate) const KINDS: &[Codec] = &[
    codec::<coord::Lease>(Some("coordination.k8s.io/v1"), "Lease"),
    codec::<core_v1::Node>(Some("v1"), "Node"),
    codec::<authn::TokenRequest>(Some("authentication.k8s.io/v1"), "TokenRequest"),
    codec::<core_v1::Event>(Some("v1"), "Event"),
    codec::<storage_v1::CSINode>(Some("storage.k8s.io/v1"), "CSINode"),
    codec::<meta_v1::Status>(None, "Status"),
    codec::<core_v1::ConfigMap>(Some("v1"), "ConfigMap"),
    codec::<core_v1::Secret>(Some("v1"), "Secret"),
    codec::<core_v1::Namespace>(Some("v1"), "Namespace"),
    codec::<core_v1::ServiceAccount>(Some("v1"), "ServiceAccount"),
    codec::<meta_v1::DeleteOptions>(None, "DeleteOptions"),
];

pub(crate) fn find(api_version: &str, kind: &str) -> Option<&'static Codec> {
    KINDS
        .iter()
        .find(|c| c.kind == kind && c.api_version.is_none_or(|v| v == api_version))
}

fn message_to_json<T: prost::Message + Json>(raw: &[u8]) -> Result<Value, Decode> {
    let message = T::decode(raw).map_err(Decode::Protobuf)?;
    message.to_json().map_err(Decode::Field)
}

fn json_to_message<T: prost::Message + Json>(object: &Value) -> Result<Vec<u8>, FieldError> {
    Ok(T::from_json(object)?.encode_to_vec())
}
