//! `coordination.k8s.io/v1`: `Lease` (node heartbeats in `kube-node-lease`).

use k8s_pb::api::coordination::v1::{Lease, LeaseSpec};

use crate::wire::convert::json_message;

json_message! {
    Lease {
        metadata: "metadata" Always,
        spec: "spec" Always,
    }

    LeaseSpec {
        holder_identity: "holderIdentity" Ptr,
        lease_duration_seconds: "leaseDurationSeconds" Ptr,
        acquire_time: "acquireTime" Ptr,
        renew_time: "renewTime" Ptr,
        lease_transitions: "leaseTransitions" Ptr,
        strategy: "strategy" Ptr,
        preferred_holder: "preferredHolder" Ptr,
    }
}
