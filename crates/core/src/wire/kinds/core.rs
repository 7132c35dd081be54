//! `core/v1` (`apiVersion: v1`): `Node` (every field of spec and status), `Event`, and the kinds
//! kubectl's generators write in protobuf (`ConfigMap`, `Secret`, `Namespace`,
//! `ServiceAccount`).

use k8s_pb::api::core::v1::{
    AttachedVolume, ConfigMap, ConfigMapNodeConfigSource, ContainerImage, DaemonEndpoint, Event,
    EventSeries, EventSource, LocalObjectReference, Namespace, NamespaceCondition, NamespaceSpec,
    NamespaceStatus, Node, NodeAddress, NodeCondition, NodeConfigSource, NodeConfigStatus,
    NodeDaemonEndpoints, NodeFeatures, NodeRuntimeHandler, NodeRuntimeHandlerFeatures, NodeSpec,
    NodeStatus, NodeSwapStatus, NodeSystemInfo, ObjectReference, Secret, ServiceAccount, Taint,
};

use crate::wire::convert::json_message;

json_message! {
    Node {
        metadata: "metadata" Always,
        spec: "spec" Always,
        status: "status" Always,
    }

    NodeSpec {
        pod_cidr: "podCIDR" Omit,
        pod_cid_rs: "podCIDRs" Omit,
        provider_id: "providerID" Omit,
        unschedulable: "unschedulable" Omit,
        taints: "taints" Omit,
        config_source: "configSource" Ptr,
        external_id: "externalID" Omit,
    }

    Taint {
        key: "key" Always,
        value: "value" Omit,
        effect: "effect" Always,
        time_added: "timeAdded" Ptr,
    }

    NodeConfigSource {
        config_map: "configMap" Ptr,
    }

    ConfigMapNodeConfigSource {
        namespace: "namespace" Always,
        name: "name" Always,
        uid: "uid" Omit,
        resource_version: "resourceVersion" Omit,
        kubelet_config_key: "kubeletConfigKey" Always,
    }

    NodeStatus {
        capacity: "capacity" Omit,
        allocatable: "allocatable" Omit,
        phase: "phase" Omit,
        conditions: "conditions" Omit,
        addresses: "addresses" Omit,
        daemon_endpoints: "daemonEndpoints" Always,
        node_info: "nodeInfo" Always,
        images: "images" Omit,
        volumes_in_use: "volumesInUse" Omit,
        volumes_attached: "volumesAttached" Omit,
        config: "config" Ptr,
        runtime_handlers: "runtimeHandlers" Omit,
        features: "features" Ptr,
    }

    NodeCondition {
        r#type: "type" Always,
        status: "status" Always,
        last_heartbeat_time: "lastHeartbeatTime" Always,
        last_transition_time: "lastTransitionTime" Always,
        reason: "reason" Omit,
        message: "message" Omit,
    }

    NodeAddress {
        r#type: "type" Always,
        address: "address" Always,
    }

    NodeDaemonEndpoints {
        kubelet_endpoint: "kubeletEndpoint" Always,
    }

    DaemonEndpoint {
        port: "Port" Always,
    }

    NodeSystemInfo {
        machine_id: "machineID" Always,
        system_uuid: "systemUUID" Always,
        boot_id: "bootID" Always,
        kernel_version: "kernelVersion" Always,
        os_image: "osImage" Always,
        container_runtime_version: "containerRuntimeVersion" Always,
        kubelet_version: "kubeletVersion" Always,
        kube_proxy_version: "kubeProxyVersion" Always,
        operating_system: "operatingSystem" Always,
        architecture: "architecture" Always,
        swap: "swap" Ptr,
    }

    NodeSwapStatus {
        capacity: "capacity" Ptr,
    }

    ContainerImage {
        names: "names" Always,
        size_bytes: "sizeBytes" Omit,
    }

    AttachedVolume {
        name: "name" Always,
        device_path: "devicePath" Always,
    }

    NodeConfigStatus {
        assigned: "assigned" Ptr,
        active: "active" Ptr,
        last_known_good: "lastKnownGood" Ptr,
        error: "error" Omit,
    }

    NodeRuntimeHandler {
        name: "name" Always,
        features: "features" Ptr,
    }

    NodeRuntimeHandlerFeatures {
        recursive_read_only_mounts: "recursiveReadOnlyMounts" Ptr,
        user_namespaces: "userNamespaces" Ptr,
    }

    NodeFeatures {
        supplemental_groups_policy: "supplementalGroupsPolicy" Ptr,
    }

    Event {
        metadata: "metadata" Always,
        involved_object: "involvedObject" Always,
        reason: "reason" Omit,
        message: "message" Omit,
        source: "source" Always,
        first_timestamp: "firstTimestamp" Always,
        last_timestamp: "lastTimestamp" Always,
        count: "count" Omit,
        r#type: "type" Omit,
        event_time: "eventTime" Always,
        series: "series" Ptr,
        action: "action" Omit,
        related: "related" Ptr,
        reporting_component: "reportingComponent" Always,
        reporting_instance: "reportingInstance" Always,
    }

    EventSource {
        component: "component" Omit,
        host: "host" Omit,
    }

    EventSeries {
        count: "count" Omit,
        last_observed_time: "lastObservedTime" Always,
    }

    ObjectReference {
        kind: "kind" Omit,
        namespace: "namespace" Omit,
        name: "name" Omit,
        uid: "uid" Omit,
        api_version: "apiVersion" Omit,
        resource_version: "resourceVersion" Omit,
        field_path: "fieldPath" Omit,
    }

    ConfigMap {
        metadata: "metadata" Always,
        immutable: "immutable" Ptr,
        data: "data" Omit,
        binary_data: "binaryData" Omit,
    }

    Secret {
        metadata: "metadata" Always,
        immutable: "immutable" Ptr,
        data: "data" Omit,
        string_data: "stringData" Omit,
        r#type: "type" Omit,
    }

    Namespace {
        metadata: "metadata" Always,
        spec: "spec" Always,
        status: "status" Always,
    }

    NamespaceSpec {
        finalizers: "finalizers" Omit,
    }

    NamespaceStatus {
        phase: "phase" Omit,
        conditions: "conditions" Omit,
    }

    NamespaceCondition {
        r#type: "type" Always,
        status: "status" Always,
        last_transition_time: "lastTransitionTime" Always,
        reason: "reason" Omit,
        message: "message" Omit,
    }

    ServiceAccount {
        metadata: "metadata" Always,
        secrets: "secrets" Omit,
        image_pull_secrets: "imagePullSecrets" Omit,
        automount_service_account_token: "automountServiceAccountToken" Ptr,
    }

    LocalObjectReference {
        name: "name" Omit,
    }
}
