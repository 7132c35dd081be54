//! `authentication.k8s.io/v1`: `TokenRequest` (`serviceaccounts/<name>/token`).

use k8s_pb::api::authentication::v1::{
    BoundObjectReference, TokenRequest, TokenRequestSpec, TokenRequestStatus,
};

use crate::wire::convert::json_message;

json_message! {
    TokenRequest {
        metadata: "metadata" Always,
        spec: "spec" Always,
        status: "status" Always,
    }

    TokenRequestSpec {
        audiences: "audiences" Always,
        expiration_seconds: "expirationSeconds" Nullable,
        bound_object_ref: "boundObjectRef" Nullable,
    }

    BoundObjectReference {
        kind: "kind" Omit,
        api_version: "apiVersion" Omit,
        name: "name" Omit,
        u_id: "uid" Omit,
    }

    TokenRequestStatus {
        token: "token" Always,
        expiration_timestamp: "expirationTimestamp" Always,
    }
}
