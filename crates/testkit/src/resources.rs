//! The registry of API resources the fake serves: names, kinds, scope, verbs, subresources,
//! selectable fields and per-type storage behaviour, mirroring kube-apiserver 1.32's built-ins.
//!
//! Everything else (discovery, routing, the store's strategies, field selectors, watch bookmarks)
//! reads these definitions, so adding a resource is one table entry.

use serde_json::{Value, json};

/// The verbs of an ordinary read-write resource, in the order discovery lists them.
const CRUD: &[&str] = &[
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];
const CREATE_ONLY: &[&str] = &["create"];

/// What a client-initiated create does to `.status` (the type's `PrepareForCreate`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CreateStatus {
    /// No status stanza, or one the creator may set (nodes register with their status).
    Keep,
    /// Status is reset to empty.
    Clear,
    /// Status is reset to `{}` (a struct that is always serialised, as CSRs have).
    Empty,
    /// Pods and PVCs start `Pending`.
    Pending,
    /// Namespaces start `Active`.
    Active,
}

/// How unsupported field selectors are worded (custom conversion functions vs the default one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldLabels {
    /// `runtime.DefaultMetaV1FieldSelectorConversion`: only `metadata.name` / `metadata.namespace`.
    Default,
    /// A type-specific conversion function accepting exactly these labels.
    Custom(&'static [&'static str]),
}

/// One served resource (one group/version/plural).
#[derive(Debug)]
pub struct ResourceDef {
    pub group: &'static str,
    pub version: &'static str,
    /// Plural, lower case: the URL segment.
    pub name: &'static str,
    pub singular: &'static str,
    pub kind: &'static str,
    pub namespaced: bool,
    pub verbs: &'static [&'static str],
    pub short_names: &'static [&'static str],
    pub categories: &'static [&'static str],
    /// Has a `/status` subresource (main-resource writes keep the old status, and vice versa).
    pub status: bool,
    pub create_status: CreateStatus,
    /// `metadata.generation` is maintained (bumped when anything but status/metadata changes).
    pub generation: bool,
    /// PUT on a missing object creates it (the type's `AllowCreateOnUpdate`).
    pub create_on_update: bool,
    /// Built-in types accept strategic merge patch; custom resources answer 415.
    pub builtin: bool,
    pub field_labels: FieldLabels,
    /// The JSON body fields (besides metadata) of the Go zero value, used for bookmark objects.
    pub zero_fields: &'static str,
    /// Only `create` is served and nothing is stored (TokenReview, SubjectAccessReview).
    pub virtual_create: bool,
}

impl ResourceDef {
    /// `v1` or `apps/v1`.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_owned()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// The key callers of the server-side API use: `v1/pods`, `coordination.k8s.io/v1/leases`.
    pub fn gvr(&self) -> String {
        format!("{}/{}", self.api_version(), self.name)
    }

    pub fn list_kind(&self) -> String {
        format!("{}List", self.kind)
    }

    /// The zero-valued object a real apiserver sends as a watch bookmark for this type.
    pub fn bookmark_object(&self, resource_version: u64) -> Value {
        let mut obj = json!({"kind": self.kind, "apiVersion": self.api_version()});
        let mut metadata = json!({"resourceVersion": resource_version.to_string()});
        if self.builtin {
            // Typed Go structs serialise a zero metav1.Time as null; unstructured ones omit it.
            metadata["creationTimestamp"] = Value::Null;
        }
        obj["metadata"] = metadata;
        if let Ok(Value::Object(fields)) = serde_json::from_str::<Value>(self.zero_fields)
            && let Some(map) = obj.as_object_mut()
        {
            map.extend(fields);
        }
        obj
    }

    /// Whether `field` may appear in a field selector for this type.
    pub fn supports_field(&self, field: &str) -> bool {
        match self.field_labels {
            FieldLabels::Default => field == "metadata.name" || field == "metadata.namespace",
            FieldLabels::Custom(labels) => labels.contains(&field),
        }
    }

    /// The 400 message kube-apiserver gives for an unsupported field selector label.
    pub fn unsupported_field_message(&self, field: &str) -> String {
        match self.field_labels {
            FieldLabels::Default => format!(
                "\"{field}\" is not a known field selector: only \"metadata.name\", \"metadata.namespace\""
            ),
            FieldLabels::Custom(_) => format!("field label not supported: {field}"),
        }
    }

    /// The value of a selectable field, as the type's `ToSelectableFields` renders it.
    pub fn field_value(&self, obj: &Value, field: &str) -> Option<String> {
        let path: Vec<&str> = match (self.kind, field) {
            ("Event", "source") => vec!["source", "component"],
            ("Pod", "status.podIPs") => vec!["status", "podIP"],
            _ => field.split('.').collect(),
        };
        let mut cur = obj;
        for seg in &path {
            match cur.get(seg) {
                Some(v) => cur = v,
                None => return self.missing_field_default(field),
            }
        }
        match cur {
            Value::String(s) => Some(s.clone()),
            Value::Bool(b) => Some(b.to_string()),
            Value::Number(n) => Some(n.to_string()),
            Value::Null => self.missing_field_default(field),
            _ => None,
        }
    }

    /// Boolean fields are rendered with `strconv.FormatBool`, so absent means `"false"`.
    fn missing_field_default(&self, field: &str) -> Option<String> {
        matches!(
            (self.kind, field),
            ("Pod", "spec.hostNetwork") | ("Node", "spec.unschedulable")
        )
        .then(|| "false".to_owned())
    }
}

const POD_FIELDS: &[&str] = &[
    "metadata.name",
    "metadata.namespace",
    "spec.nodeName",
    "spec.restartPolicy",
    "spec.schedulerName",
    "spec.serviceAccountName",
    "spec.hostNetwork",
    "status.phase",
    "status.podIP",
    "status.podIPs",
    "status.nominatedNodeName",
];
const NODE_FIELDS: &[&str] = &["metadata.name", "spec.unschedulable"];
const EVENT_FIELDS: &[&str] = &[
    "metadata.name",
    "metadata.namespace",
    "involvedObject.kind",
    "involvedObject.namespace",
    "involvedObject.name",
    "involvedObject.uid",
    "involvedObject.apiVersion",
    "involvedObject.resourceVersion",
    "involvedObject.fieldPath",
    "reason",
    "reportingComponent",
    "source",
    "type",
];
const SECRET_FIELDS: &[&str] = &["metadata.name", "metadata.namespace", "type"];
const NAMESPACE_FIELDS: &[&str] = &["metadata.name", "status.phase"];
const SERVICE_FIELDS: &[&str] = &[
    "metadata.name",
    "metadata.namespace",
    "spec.clusterIP",
    "spec.type",
];
const CSR_FIELDS: &[&str] = &["metadata.name", "spec.signerName"];

/// Defaults shared by most entries; each entry overrides what differs.
const BASE: ResourceDef = ResourceDef {
    group: "",
    version: "v1",
    name: "",
    singular: "",
    kind: "",
    namespaced: true,
    verbs: CRUD,
    short_names: &[],
    categories: &[],
    status: false,
    create_status: CreateStatus::Keep,
    generation: false,
    create_on_update: false,
    builtin: true,
    field_labels: FieldLabels::Default,
    zero_fields: "{}",
    virtual_create: false,
};

/// Every resource the fake serves, grouped by API group in discovery order.
pub static RESOURCES: &[ResourceDef] = &[
    ResourceDef {
        name: "configmaps",
        singular: "configmap",
        kind: "ConfigMap",
        short_names: &["cm"],
        ..BASE
    },
    ResourceDef {
        name: "endpoints",
        singular: "endpoints",
        kind: "Endpoints",
        short_names: &["ep"],
        create_on_update: true,
        ..BASE
    },
    ResourceDef {
        name: "events",
        singular: "event",
        kind: "Event",
        short_names: &["ev"],
        create_on_update: true,
        field_labels: FieldLabels::Custom(EVENT_FIELDS),
        zero_fields: r#"{"involvedObject":{},"source":{},"firstTimestamp":null,"lastTimestamp":null,"eventTime":null,"reportingComponent":"","reportingInstance":""}"#,
        ..BASE
    },
    ResourceDef {
        name: "namespaces",
        singular: "namespace",
        kind: "Namespace",
        namespaced: false,
        verbs: &[
            "create", "delete", "get", "list", "patch", "update", "watch",
        ],
        short_names: &["ns"],
        status: true,
        create_status: CreateStatus::Active,
        field_labels: FieldLabels::Custom(NAMESPACE_FIELDS),
        zero_fields: r#"{"spec":{},"status":{}}"#,
        ..BASE
    },
    ResourceDef {
        name: "nodes",
        singular: "node",
        kind: "Node",
        namespaced: false,
        short_names: &["no"],
        status: true,
        field_labels: FieldLabels::Custom(NODE_FIELDS),
        zero_fields: r#"{"spec":{},"status":{"daemonEndpoints":{"kubeletEndpoint":{"Port":0}},"nodeInfo":{"machineID":"","systemUUID":"","bootID":"","kernelVersion":"","osImage":"","containerRuntimeVersion":"","kubeletVersion":"","kubeProxyVersion":"","operatingSystem":"","architecture":""}}}"#,
        ..BASE
    },
    ResourceDef {
        name: "persistentvolumeclaims",
        singular: "persistentvolumeclaim",
        kind: "PersistentVolumeClaim",
        short_names: &["pvc"],
        status: true,
        create_status: CreateStatus::Pending,
        zero_fields: r#"{"spec":{},"status":{}}"#,
        ..BASE
    },
    ResourceDef {
        name: "pods",
        singular: "pod",
        kind: "Pod",
        short_names: &["po"],
        categories: &["all"],
        status: true,
        create_status: CreateStatus::Pending,
        field_labels: FieldLabels::Custom(POD_FIELDS),
        zero_fields: r#"{"spec":{"containers":null},"status":{}}"#,
        ..BASE
    },
    ResourceDef {
        name: "secrets",
        singular: "secret",
        kind: "Secret",
        field_labels: FieldLabels::Custom(SECRET_FIELDS),
        ..BASE
    },
    ResourceDef {
        name: "serviceaccounts",
        singular: "serviceaccount",
        kind: "ServiceAccount",
        short_names: &["sa"],
        ..BASE
    },
    ResourceDef {
        name: "services",
        singular: "service",
        kind: "Service",
        short_names: &["svc"],
        categories: &["all"],
        status: true,
        create_status: CreateStatus::Clear,
        create_on_update: true,
        field_labels: FieldLabels::Custom(SERVICE_FIELDS),
        zero_fields: r#"{"spec":{},"status":{"loadBalancer":{}}}"#,
        ..BASE
    },
    ResourceDef {
        group: "apps",
        name: "deployments",
        singular: "deployment",
        kind: "Deployment",
        short_names: &["deploy"],
        categories: &["all"],
        status: true,
        create_status: CreateStatus::Clear,
        generation: true,
        zero_fields: r#"{"spec":{"selector":null,"template":{"metadata":{"creationTimestamp":null},"spec":{"containers":null}},"strategy":{}},"status":{}}"#,
        ..BASE
    },
    ResourceDef {
        group: "authentication.k8s.io",
        name: "tokenreviews",
        singular: "tokenreview",
        kind: "TokenReview",
        namespaced: false,
        verbs: CREATE_ONLY,
        virtual_create: true,
        ..BASE
    },
    ResourceDef {
        group: "authorization.k8s.io",
        name: "subjectaccessreviews",
        singular: "subjectaccessreview",
        kind: "SubjectAccessReview",
        namespaced: false,
        verbs: CREATE_ONLY,
        virtual_create: true,
        ..BASE
    },
    ResourceDef {
        group: "certificates.k8s.io",
        name: "certificatesigningrequests",
        singular: "certificatesigningrequest",
        kind: "CertificateSigningRequest",
        namespaced: false,
        short_names: &["csr"],
        status: true,
        create_status: CreateStatus::Empty,
        field_labels: FieldLabels::Custom(CSR_FIELDS),
        zero_fields: r#"{"spec":{"request":null,"signerName":""},"status":{}}"#,
        ..BASE
    },
    // Read by the RBAC authorizer (`rbac` module) straight from the store. The RBAC strategies
    // allow create-on-update, which is also what `FakeApiServer::apply_rbac` relies on.
    ResourceDef {
        group: "rbac.authorization.k8s.io",
        name: "clusterrolebindings",
        singular: "clusterrolebinding",
        kind: "ClusterRoleBinding",
        namespaced: false,
        create_on_update: true,
        zero_fields: r#"{"roleRef":{"apiGroup":"","kind":"","name":""}}"#,
        ..BASE
    },
    ResourceDef {
        group: "rbac.authorization.k8s.io",
        name: "clusterroles",
        singular: "clusterrole",
        kind: "ClusterRole",
        namespaced: false,
        create_on_update: true,
        zero_fields: r#"{"rules":null}"#,
        ..BASE
    },
    ResourceDef {
        group: "rbac.authorization.k8s.io",
        name: "rolebindings",
        singular: "rolebinding",
        kind: "RoleBinding",
        create_on_update: true,
        zero_fields: r#"{"roleRef":{"apiGroup":"","kind":"","name":""}}"#,
        ..BASE
    },
    ResourceDef {
        group: "rbac.authorization.k8s.io",
        name: "roles",
        singular: "role",
        kind: "Role",
        create_on_update: true,
        zero_fields: r#"{"rules":null}"#,
        ..BASE
    },
    ResourceDef {
        group: "storage.k8s.io",
        name: "csidrivers",
        singular: "csidriver",
        kind: "CSIDriver",
        namespaced: false,
        zero_fields: r#"{"spec":{}}"#,
        ..BASE
    },
    ResourceDef {
        group: "storage.k8s.io",
        name: "csinodes",
        singular: "csinode",
        kind: "CSINode",
        namespaced: false,
        zero_fields: r#"{"spec":{"drivers":null}}"#,
        ..BASE
    },
    ResourceDef {
        group: "coordination.k8s.io",
        name: "leases",
        singular: "lease",
        kind: "Lease",
        create_on_update: true,
        zero_fields: r#"{"spec":{}}"#,
        ..BASE
    },
    ResourceDef {
        group: "node.k8s.io",
        name: "runtimeclasses",
        singular: "runtimeclass",
        kind: "RuntimeClass",
        namespaced: false,
        zero_fields: r#"{"handler":""}"#,
        ..BASE
    },
    ResourceDef {
        group: "discovery.k8s.io",
        name: "endpointslices",
        singular: "endpointslice",
        kind: "EndpointSlice",
        zero_fields: r#"{"addressType":"","endpoints":null}"#,
        ..BASE
    },
    ResourceDef {
        group: "apps.openyurt.io",
        version: "v1beta1",
        name: "nodepools",
        singular: "nodepool",
        kind: "NodePool",
        namespaced: false,
        short_names: &["np"],
        status: true,
        create_status: CreateStatus::Clear,
        generation: true,
        builtin: false,
        ..BASE
    },
    ResourceDef {
        group: "apps.openyurt.io",
        version: "v1alpha1",
        name: "nodebuckets",
        singular: "nodebucket",
        kind: "NodeBucket",
        namespaced: false,
        short_names: &["nb"],
        builtin: false,
        ..BASE
    },
];

/// The group/versions in discovery order (core first, then as kube-apiserver orders groups).
pub fn group_versions() -> Vec<(&'static str, &'static str)> {
    let mut out: Vec<(&str, &str)> = Vec::new();
    for r in RESOURCES {
        if !out.contains(&(r.group, r.version)) {
            out.push((r.group, r.version));
        }
    }
    out
}

/// Looks a resource up by group, version and plural name.
pub fn find(group: &str, version: &str, name: &str) -> Option<&'static ResourceDef> {
    RESOURCES
        .iter()
        .find(|r| r.group == group && r.version == version && r.name == name)
}

/// Looks a resource up by the `gvr` key of the server-side API (`v1/pods`, `apps/v1/deployments`).
pub fn by_gvr(gvr: &str) -> Option<&'static ResourceDef> {
    let parts: Vec<&str> = gvr.trim_matches('/').split('/').collect();
    match parts.as_slice() {
        [version, name] => find("", version, name),
        [group, version, name] => find(group, version, name),
        _ => None,
    }
}

/// Whether any resource is served in this group/version (else the whole path is unknown).
pub fn serves_group_version(group: &str, version: &str) -> bool {
    RESOURCES
        .iter()
        .any(|r| r.group == group && r.version == version)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gvr_lookup_round_trips() {
        for r in RESOURCES {
            let found = by_gvr(&r.gvr()).map(|d| d.kind);
            assert_eq!(found, Some(r.kind), "{}", r.gvr());
        }
        assert!(by_gvr("v1/widgets").is_none());
        assert!(by_gvr("pods").is_none());
    }

    #[test]
    fn pod_bookmark_matches_real_apiserver_shape() {
        let pods = by_gvr("v1/pods").unwrap();
        let b = pods.bookmark_object(498);
        assert_eq!(
            b,
            json!({"kind":"Pod","apiVersion":"v1","metadata":{"resourceVersion":"498","creationTimestamp":null},"spec":{"containers":null},"status":{}})
        );
    }

    #[test]
    fn every_zero_fields_entry_is_a_json_object() {
        for r in RESOURCES {
            let v: Value = serde_json::from_str(r.zero_fields).unwrap();
            assert!(v.is_object(), "{}", r.name);
        }
    }

    #[test]
    fn field_values_follow_selectable_fields() {
        let pods = by_gvr("v1/pods").unwrap();
        let pod =
            json!({"metadata":{"name":"p"},"spec":{"nodeName":"n1"},"status":{"phase":"Running"}});
        assert_eq!(
            pods.field_value(&pod, "spec.nodeName").as_deref(),
            Some("n1")
        );
        assert_eq!(
            pods.field_value(&pod, "spec.hostNetwork").as_deref(),
            Some("false")
        );
        assert_eq!(pods.field_value(&pod, "spec.restartPolicy"), None);
        assert!(pods.supports_field("status.phase"));
        assert!(!pods.supports_field("spec.containers"));
        let cms = by_gvr("v1/configmaps").unwrap();
        assert!(cms.supports_field("metadata.namespace"));
        assert!(!cms.supports_field("data.x"));
        let nodes = by_gvr("v1/nodes").unwrap();
        assert!(!nodes.supports_field("metadata.namespace"));
        assert_eq!(
            nodes.unsupported_field_message("x"),
            "field label not supported: x"
        );
    }
}
