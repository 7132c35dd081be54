//! `meta/v1`: `ObjectMeta` and its parts, `Status`, `DeleteOptions`.

use k8s_pb::apimachinery::pkg::apis::meta::v1::{
    DeleteOptions, ListMeta, ManagedFieldsEntry, ObjectMeta, OwnerReference, Preconditions, Status,
    StatusCause, StatusDetails,
};

use crate::wire::convert::json_message;

json_message! {
    ObjectMeta {
        name: "name" Omit,
        generate_name: "generateName" Omit,
        namespace: "namespace" Omit,
        self_link: "selfLink" Omit,
        uid: "uid" Omit,
        resource_version: "resourceVersion" Omit,
        generation: "generation" Omit,
        // A struct: `null` when zero (kube-apiserver 1.37 and later omit it instead).
        creation_timestamp: "creationTimestamp" Always,
        deletion_timestamp: "deletionTimestamp" Ptr,
        deletion_grace_period_seconds: "deletionGracePeriodSeconds" Ptr,
        labels: "labels" Omit,
        annotations: "annotations" Omit,
        owner_references: "ownerReferences" Omit,
        finalizers: "finalizers" Omit,
        managed_fields: "managedFields" Omit,
    }

    OwnerReference {
        api_version: "apiVersion" Always,
        kind: "kind" Always,
        name: "name" Always,
        uid: "uid" Always,
        controller: "controller" Ptr,
        block_owner_deletion: "blockOwnerDeletion" Ptr,
    }

    ManagedFieldsEntry {
        manager: "manager" Omit,
        operation: "operation" Omit,
        api_version: "apiVersion" Omit,
        time: "time" Ptr,
        fields_type: "fieldsType" Omit,
        fields_v1: "fieldsV1" Ptr,
        subresource: "subresource" Omit,
    }

    ListMeta {
        self_link: "selfLink" Omit,
        resource_version: "resourceVersion" Omit,
        r#continue: "continue" Omit,
        remaining_item_count: "remainingItemCount" Ptr,
    }

    Status {
        metadata: "metadata" Always,
        status: "status" Omit,
        message: "message" Omit,
        reason: "reason" Omit,
        details: "details" Ptr,
        code: "code" Omit,
    }

    StatusDetails {
        name: "name" Omit,
        group: "group" Omit,
        kind: "kind" Omit,
        uid: "uid" Omit,
        causes: "causes" Omit,
        retry_after_seconds: "retryAfterSeconds" Omit,
    }

    StatusCause {
        reason: "reason" Omit,
        message: "message" Omit,
        field: "field" Omit,
    }

    DeleteOptions {
        grace_period_seconds: "gracePeriodSeconds" Ptr,
        preconditions: "preconditions" Ptr,
        orphan_dependents: "orphanDependents" Ptr,
        propagation_policy: "propagationPolicy" Ptr,
        dry_run: "dryRun" Omit,
        ignore_store_read_error_with_cluster_breaking_potential:
            "ignoreStoreReadErrorWithClusterBreakingPotential" Ptr,
    }

    Preconditions {
        uid: "uid" Ptr,
        resource_version: "resourceVersion" Ptr,
    }
}
