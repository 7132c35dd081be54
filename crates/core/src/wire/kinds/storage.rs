//! `storage.k8s.io/v1`: `CSINode` (kubelet registers its CSI drivers in it).

use k8s_pb::api::storage::v1::{CSINode, CSINodeDriver, CSINodeSpec, VolumeNodeResources};

use crate::wire::convert::json_message;

json_message! {
    CSINode {
        metadata: "metadata" Always,
        spec: "spec" Always,
    }

    CSINodeSpec {
        drivers: "drivers" Always,
    }

    CSINodeDriver {
        name: "name" Always,
        node_id: "nodeID" Always,
        topology_keys: "topologyKeys" Always,
        allocatable: "allocatable" Ptr,
    }

    VolumeNodeResources {
        count: "count" Ptr,
    }
}
