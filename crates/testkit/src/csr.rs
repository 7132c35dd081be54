//! CertificateSigningRequests as kube-apiserver serves them: the create strategy (the requester's
//! identity replaces `spec.username` / `uid` / `groups` / `extra`, status starts empty),
//! validation (`spec.request` must be a correctly signed PEM `CERTIFICATE REQUEST`, `signerName`
//! and `usages` are required), the update strategies of the main resource and the `approval` and
//! `status` subresources, and the CertificateApproval and CertificateSubjectRestriction
//! admission plugins. The controllers that approve and sign are in `csr_controller`.

use std::collections::HashSet;
use std::net::IpAddr;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use http::Response;
use outpost_core::Status;
use serde_json::{Value, json};
use x509_parser::certification_request::X509CertificationRequest;
use x509_parser::extensions::{GeneralName, ParsedExtension};
use x509_parser::prelude::FromDer;

use crate::authn::UserInfo;
use crate::authz::{self, Attributes, Decision};
use crate::graph::StoreGraph;
use crate::rbac::StorePolicy;
use crate::registry::{self, Origin, Part};
use crate::reply::{ApiError, Body, json_response};
use crate::resources::ResourceDef;
use crate::state::Shared;
use crate::util;

pub const GROUP: &str = "certificates.k8s.io";
pub const RESOURCE: &str = "certificatesigningrequests";
pub const KUBELET_SERVING: &str = "kubernetes.io/kubelet-serving";
pub const KUBE_APISERVER_CLIENT: &str = "kubernetes.io/kube-apiserver-client";
pub const KUBE_APISERVER_CLIENT_KUBELET: &str = "kubernetes.io/kube-apiserver-client-kubelet";
const LEGACY_UNKNOWN: &str = "kubernetes.io/legacy-unknown";

/// The `KeyUsage` values certificates/v1 accepts, sorted as validation lists them.
const USAGES: &[&str] = &[
    "any",
    "cert sign",
    "client auth",
    "code signing",
    "content commitment",
    "crl sign",
    "data encipherment",
    "decipher only",
    "digital signature",
    "email protection",
    "encipher only",
    "ipsec end system",
    "ipsec tunnel",
    "ipsec user",
    "key agreement",
    "key encipherment",
    "microsoft sgc",
    "netscape sgc",
    "ocsp signing",
    "s/mime",
    "server auth",
    "signing",
    "timestamping",
];

/// The condition types that record a decision, and the one a signer sets when it gives up.
pub const APPROVED: &str = "Approved";
pub const DENIED: &str = "Denied";
pub const FAILED: &str = "Failed";

pub fn is_csr(def: &ResourceDef) -> bool {
    def.group == GROUP && def.name == RESOURCE
}

/// What the approver and the signers read from `spec.request` (Go's `x509.CertificateRequest`).
#[derive(Debug, Clone)]
pub struct Request {
    pub common_name: String,
    pub organizations: Vec<String>,
    pub dns_names: Vec<String>,
    pub ip_addresses: Vec<IpAddr>,
    pub emails: Vec<String>,
    pub uris: Vec<String>,
}

/// `certificates.ParseCSR` plus `CheckSignature`, with Go's error texts.
pub fn parse_request(pem: &[u8]) -> Result<Request, String> {
    const NOT_A_CSR: &str = "PEM block type must be CERTIFICATE REQUEST";
    let (_, block) = x509_parser::pem::parse_x509_pem(pem).map_err(|_| NOT_A_CSR.to_owned())?;
    if block.label != "CERTIFICATE REQUEST" {
        return Err(NOT_A_CSR.into());
    }
    let (_, csr) = X509CertificationRequest::from_der(&block.contents)
        .map_err(|_| "x509: malformed certificate request".to_owned())?;
    csr.verify_signature()
        .map_err(|_| "x509: signature verification failure".to_owned())?;
    let subject = &csr.certification_request_info.subject;
    let mut request = Request {
        common_name: subject
            .iter_common_name()
            .find_map(|a| a.as_str().ok())
            .unwrap_or("")
            .to_owned(),
        organizations: subject
            .iter_organization()
            .filter_map(|a| a.as_str().ok().map(str::to_owned))
            .collect(),
        dns_names: Vec::new(),
        ip_addresses: Vec::new(),
        emails: Vec::new(),
        uris: Vec::new(),
    };
    for ext in csr.requested_extensions().into_iter().flatten() {
        if let ParsedExtension::SubjectAlternativeName(san) = ext {
            san.general_names.iter().for_each(|n| request.add_san(n));
        }
    }
    Ok(request)
}

impl Request {
    fn add_san(&mut self, name: &GeneralName<'_>) {
        match name {
            GeneralName::DNSName(d) => self.dns_names.push((*d).to_owned()),
            GeneralName::RFC822Name(e) => self.emails.push((*e).to_owned()),
            GeneralName::URI(u) => self.uris.push((*u).to_owned()),
            GeneralName::IPAddress(b) => {
                let ip = match b.len() {
                    4 => <[u8; 4]>::try_from(*b).ok().map(IpAddr::from),
                    16 => <[u8; 16]>::try_from(*b).ok().map(IpAddr::from),
                    _ => None,
                };
                self.ip_addresses.extend(ip);
            }
            _ => {}
        }
    }
}

/// A `[]byte` field (base64 in JSON); anything else fails decoding with a 400, like the typed
/// decoder, before validation runs.
pub fn bytes_at(obj: &Value, pointer: &str) -> Result<Vec<u8>, Status> {
    let undecodable = |detail: String| {
        Status::bad_request(format!(
            "CertificateSigningRequest in version \"v1\" cannot be handled as a CertificateSigningRequest: {detail}"
        ))
    };
    match obj.pointer(pointer) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::String(s)) => STANDARD
            .decode(s)
            .map_err(|e| undecodable(format!("illegal base64 data: {e}"))),
        Some(_) => Err(undecodable(format!(
            "{}: expects a base64-encoded string",
            pointer.trim_start_matches('/').replace('/', ".")
        ))),
    }
}

pub fn str_at<'a>(obj: &'a Value, pointer: &str) -> &'a str {
    obj.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

pub fn strings_at(obj: &Value, pointer: &str) -> Vec<String> {
    obj.pointer(pointer)
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

fn conditions(obj: &Value) -> &[Value] {
    obj.pointer("/status/conditions")
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

fn count_of(obj: &Value, kind: &str) -> usize {
    conditions(obj).iter().filter(|c| c["type"] == kind).count()
}

/// Whether the CSR carries a `True` condition of this type (`Approved`, `Denied`, `Failed`).
pub fn has_condition(obj: &Value, kind: &str) -> bool {
    conditions(obj)
        .iter()
        .any(|c| c["type"] == kind && c["status"] == "True")
}

pub fn is_approved(obj: &Value) -> bool {
    has_condition(obj, APPROVED)
}

pub fn is_denied(obj: &Value) -> bool {
    has_condition(obj, DENIED)
}

pub fn is_failed(obj: &Value) -> bool {
    has_condition(obj, FAILED)
}

/// A `True` condition stamped now, as a controller appends it.
pub fn condition(kind: &str, reason: &str, message: &str) -> Value {
    let now = util::now_rfc3339();
    json!({
        "type": kind,
        "status": "True",
        "reason": reason,
        "message": message,
        "lastUpdateTime": now,
        "lastTransitionTime": now,
    })
}

/// `errors.NewInvalid` with every field error, `[a, b]` when there are several.
fn invalid(def: &ResourceDef, obj: &Value, errors: Vec<String>) -> Result<(), Status> {
    let joined = match errors.len() {
        0 => return Ok(()),
        1 => errors[0].clone(),
        _ => format!("[{}]", errors.join(", ")),
    };
    Err(registry::invalid(
        def,
        str_at(obj, "/metadata/name"),
        &joined,
    ))
}

/// Go's `%#v` of a byte slice, which is how `field.Invalid` prints `spec.request`.
fn go_bytes(b: &[u8]) -> String {
    if b.is_empty() {
        return "[]byte(nil)".into();
    }
    let hex: Vec<String> = b.iter().map(|x| format!("{x:#x}")).collect();
    format!("[]byte{{{}}}", hex.join(", "))
}

// ---- create ------------------------------------------------------------------------------

/// POST: the requester's identity is written into the spec, then validation (400 / 422), the
/// subject restriction (403) and the generic create.
pub fn create(
    shared: &Shared,
    def: &'static ResourceDef,
    user: &UserInfo,
    body: &[u8],
) -> Result<Response<Body>, ApiError> {
    let mut obj = crate::handlers::object_body(body)?;
    set_requester(&mut obj, user);
    validate_create(def, &obj)?;
    restrict_subject(&obj)?;
    let out = registry::create(&shared.store, def, None, obj, Origin::Client)?;
    Ok(json_response(201, &out))
}

/// `PrepareForCreate`: whatever the client claimed, the spec names the authenticated caller.
fn set_requester(obj: &mut Value, user: &UserInfo) {
    let Some(spec) = obj.get_mut("spec").and_then(Value::as_object_mut) else {
        return;
    };
    for field in ["username", "uid", "groups", "extra"] {
        spec.shift_remove(field);
    }
    spec.insert("username".into(), user.name.clone().into());
    if !user.groups.is_empty() {
        spec.insert("groups".into(), json!(user.groups));
    }
}

/// `ValidateCertificateSigningRequestCreate`.
fn validate_create(def: &ResourceDef, obj: &Value) -> Result<(), Status> {
    if !obj.get("spec").is_none_or(Value::is_object) {
        return Err(Status::bad_request(
            "CertificateSigningRequest in version \"v1\" cannot be handled as a CertificateSigningRequest: spec: expects an object",
        ));
    }
    let request = bytes_at(obj, "/spec/request")?;
    let mut errors = Vec::new();
    if let Err(e) = parse_request(&request) {
        errors.push(format!(
            "spec.request: Invalid value: {}: {e}",
            go_bytes(&request)
        ));
    }
    errors.extend(usage_errors(&strings_at(obj, "/spec/usages")));
    errors.extend(signer_name_errors(str_at(obj, "/spec/signerName")));
    if let Some(secs) = obj
        .pointer("/spec/expirationSeconds")
        .and_then(Value::as_i64)
        .filter(|s| *s < 600)
    {
        errors.push(format!(
            "spec.expirationSeconds: Invalid value: {secs}: may not specify a duration less than 600 seconds (10 minutes)"
        ));
    }
    invalid(def, obj, errors)
}

fn usage_errors(usages: &[String]) -> Vec<String> {
    if usages.is_empty() {
        return vec!["spec.usages: Required value: usages must be provided".into()];
    }
    let supported = USAGES
        .iter()
        .map(|u| format!("\"{u}\""))
        .collect::<Vec<_>>()
        .join(", ");
    let mut seen = HashSet::new();
    let mut errors = Vec::new();
    for (i, u) in usages.iter().enumerate() {
        if !USAGES.contains(&u.as_str()) {
            errors.push(format!(
                "spec.usages[{i}]: Unsupported value: \"{u}\": supported values: {supported}"
            ));
        } else if !seen.insert(u) {
            errors.push(format!("spec.usages[{i}]: Duplicate value: \"{u}\""));
        }
    }
    errors
}

/// `ValidateSignerName` (the `domain/path` shape), and no legacy signer through v1.
fn signer_name_errors(signer: &str) -> Vec<String> {
    let field = "spec.signerName";
    if signer.is_empty() {
        return vec![format!("{field}: Required value")];
    }
    let well_formed = signer
        .split_once('/')
        .is_some_and(|(domain, path)| domain.contains('.') && !path.is_empty());
    if !well_formed {
        return vec![format!(
            "{field}: Invalid value: \"{signer}\": must be a fully qualified domain and path of the form 'example.com/signer-name'"
        )];
    }
    if signer == LEGACY_UNKNOWN {
        return vec![format!(
            "{field}: Invalid value: \"{signer}\": the legacy signerName is not allowed via this API version"
        )];
    }
    Vec::new()
}

/// CertificateSubjectRestriction: no `system:masters` client certificates through the CSR API.
fn restrict_subject(obj: &Value) -> Result<(), Status> {
    if str_at(obj, "/spec/signerName") != KUBE_APISERVER_CLIENT {
        return Ok(());
    }
    let request = bytes_at(obj, "/spec/request")?;
    let masters = parse_request(&request)
        .is_ok_and(|r| r.organizations.iter().any(|o| o == "system:masters"));
    if !masters {
        return Ok(());
    }
    let name = str_at(obj, "/metadata/name");
    Err(Status::forbidden(format!(
        "{RESOURCE}.{GROUP} \"{name}\" is forbidden: use of {KUBE_APISERVER_CLIENT} signer with system:masters group is not allowed"
    ))
    .with_details(GROUP, RESOURCE, name))
}

// ---- updates -----------------------------------------------------------------------------

/// The object an `approval` write starts from: the current one with the body's conditions.
pub fn with_conditions_of(cur: &Value, body: &Value) -> Value {
    let mut next = cur.clone();
    if !next.get("status").is_some_and(Value::is_object) {
        next["status"] = json!({});
    }
    match body.pointer("/status/conditions") {
        Some(c) if !c.is_null() => next["status"]["conditions"] = c.clone(),
        _ => {
            next["status"]
                .as_object_mut()
                .map(|s| s.shift_remove("conditions"));
        }
    }
    next
}

/// The update strategies (`csrStrategy`, `csrStatusStrategy`, `csrApprovalStrategy`) and their
/// validation, applied to the object the generic update computed for `part`.
pub fn prepare_update(
    def: &ResourceDef,
    part: Part,
    cur: &Value,
    next: &mut Value,
) -> Result<(), Status> {
    keep_field(cur, next, "spec");
    if part == Part::Main {
        keep_field(cur, next, "status");
    }
    if part == Part::Status {
        preserve_instances(cur, next, APPROVED);
        preserve_instances(cur, next, DENIED);
    }
    stamp_conditions(cur, next);
    validate_update(def, part, cur, next)
}

fn keep_field(cur: &Value, next: &mut Value, field: &str) {
    let Some(map) = next.as_object_mut() else {
        return;
    };
    match cur.get(field) {
        Some(v) => map.insert(field.into(), v.clone()),
        None => map.shift_remove(field),
    };
}

/// Approved / Denied conditions cannot be edited through `status`: the old ones are kept.
fn preserve_instances(cur: &Value, next: &mut Value, kind: &str) {
    let old: Vec<&Value> = conditions(cur)
        .iter()
        .filter(|c| c["type"] == kind)
        .collect();
    let Some(new) = next
        .pointer_mut("/status/conditions")
        .and_then(Value::as_array_mut)
    else {
        return;
    };
    let slots: Vec<usize> = (0..new.len()).filter(|i| new[*i]["type"] == kind).collect();
    if slots.len() != old.len() {
        return;
    }
    for (slot, old) in slots.into_iter().zip(old) {
        new[slot] = old.clone();
    }
}

/// `populateConditionTimestamps`: missing times become now, or the old transition time of a
/// condition with the same type and status.
fn stamp_conditions(cur: &Value, next: &mut Value) {
    let now = util::now_rfc3339();
    let old = conditions(cur).to_vec();
    let Some(new) = next
        .pointer_mut("/status/conditions")
        .and_then(Value::as_array_mut)
    else {
        return;
    };
    for c in new.iter_mut().filter(|c| c.is_object()) {
        if c.get("lastUpdateTime").is_none_or(Value::is_null) {
            c["lastUpdateTime"] = now.clone().into();
        }
        if c.get("lastTransitionTime").is_none_or(Value::is_null) {
            let previous = old.iter().find(|o| {
                o["type"] == c["type"]
                    && o["status"] == c["status"]
                    && o.get("lastTransitionTime").is_some_and(|t| !t.is_null())
            });
            c["lastTransitionTime"] =
                previous.map_or_else(|| now.clone().into(), |o| o["lastTransitionTime"].clone());
        }
    }
}

/// `validateCertificateSigningRequestUpdate` with the options of each subresource.
fn validate_update(def: &ResourceDef, part: Part, cur: &Value, next: &Value) -> Result<(), Status> {
    let mut errors = condition_errors(next);
    for kind in [APPROVED, DENIED, FAILED] {
        if count_of(next, kind) < count_of(cur, kind) {
            errors.push(format!(
                "status.conditions: Forbidden: updates may not remove a condition of type \"{kind}\""
            ));
        }
    }
    if part != Part::Approval {
        for kind in [APPROVED, DENIED] {
            if count_of(next, kind) > count_of(cur, kind) {
                errors.push(format!(
                    "status.conditions: Forbidden: updates may not add a condition of type \"{kind}\""
                ));
            }
        }
    }
    let (old_cert, new_cert) = (
        bytes_at(cur, "/status/certificate")?,
        bytes_at(next, "/status/certificate")?,
    );
    if old_cert != new_cert {
        if part != Part::Status {
            errors.push(
                "status.certificate: Forbidden: updates may not set certificate content".into(),
            );
        } else if !old_cert.is_empty() {
            errors.push(
                "status.certificate: Forbidden: updates may not modify existing certificate content"
                    .into(),
            );
        } else if let Err(e) = check_certificates(&new_cert) {
            errors.push(format!(
                "status.certificate: Invalid value: \"<certificate data>\": {e}"
            ));
        }
    }
    invalid(def, next, errors)
}

/// `validateConditions`: known statuses, one condition per type, Approved xor Denied.
fn condition_errors(obj: &Value) -> Vec<String> {
    let mut errors = Vec::new();
    let mut seen = HashSet::new();
    for (i, c) in conditions(obj).iter().enumerate() {
        let kind = c["type"].as_str().unwrap_or("");
        let status = c["status"].as_str().unwrap_or("");
        let path = format!("status.conditions[{i}]");
        if kind.is_empty() {
            errors.push(format!("{path}.type: Required value"));
        } else if !seen.insert(kind) {
            errors.push(format!("{path}.type: Duplicate value: \"{kind}\""));
        }
        if !matches!(status, "True" | "False" | "Unknown") {
            errors.push(format!(
                "{path}.status: Unsupported value: \"{status}\": supported values: \"False\", \"True\", \"Unknown\""
            ));
        } else if matches!(kind, APPROVED | DENIED) && status != "True" {
            errors.push(format!(
                "{path}.status: Unsupported value: \"{status}\": supported values: \"True\""
            ));
        }
    }
    if seen.contains(APPROVED) && seen.contains(DENIED) {
        errors.push(
            "status.conditions: Invalid value: \"<conditions>\": Approved and Denied conditions are mutually exclusive"
                .into(),
        );
    }
    errors
}

/// An issued certificate must be one or more parseable PEM `CERTIFICATE` blocks.
fn check_certificates(pem: &[u8]) -> Result<(), String> {
    let mut rest = pem;
    let mut found = 0;
    while let Ok((next, block)) = x509_parser::pem::parse_x509_pem(rest) {
        if block.label != "CERTIFICATE" {
            return Err(format!(
                "only CERTIFICATE PEM blocks are allowed, found \"{}\"",
                block.label
            ));
        }
        block
            .parse_x509()
            .map_err(|e| format!("error parsing certificate: {e}"))?;
        found += 1;
        rest = next;
    }
    if found == 0 {
        return Err("must contain at least one CERTIFICATE PEM block".into());
    }
    Ok(())
}

// ---- admission ---------------------------------------------------------------------------

/// CertificateApproval: writing `approval` needs the `approve` verb on the CSR's signer
/// (`signers` in `certificates.k8s.io`, named by the signer or by `<domain>/*`).
pub fn admit_approval(shared: &Shared, attrs: &Attributes<'_>) -> Result<(), ApiError> {
    let def = crate::resources::find(GROUP, "v1", RESOURCE).expect("CSRs are registered");
    let Some(cur) = shared.store.get(def, attrs.name) else {
        return Ok(());
    };
    let signer = str_at(&cur, "/spec/signerName");
    let wildcard = signer
        .split_once('/')
        .map(|(domain, _)| format!("{domain}/*"));
    let (graph, policy) = (StoreGraph(&shared.store), StorePolicy(&shared.store));
    let allowed = [Some(signer.to_owned()), wildcard]
        .into_iter()
        .flatten()
        .any(|name| {
            let ask = Attributes {
                verb: "approve",
                resource: "signers",
                subresource: "",
                namespace: "",
                name: &name,
                field_selector: None,
                ..*attrs
            };
            authz::authorize(&ask, &graph, &policy) == Decision::Allow
        });
    if allowed {
        return Ok(());
    }
    let message = format!("user not permitted to approve requests with signerName \"{signer}\"");
    Err(authz::forbidden_for(attrs, &message).into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::by_gvr;

    fn def() -> &'static ResourceDef {
        by_gvr("certificates.k8s.io/v1/certificatesigningrequests").unwrap()
    }

    fn request_pem(cn: &str, orgs: &[&str], sans: &[&str]) -> String {
        let mut params =
            rcgen::CertificateParams::new(sans.iter().map(|s| s.to_string()).collect::<Vec<_>>())
                .unwrap();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, cn);
        for o in orgs {
            params
                .distinguished_name
                .push(rcgen::DnType::OrganizationName, *o);
        }
        let key = rcgen::KeyPair::generate().unwrap();
        params.serialize_request(&key).unwrap().pem().unwrap()
    }

    fn csr(request: &[u8], signer: &str, usages: &[&str]) -> Value {
        json!({
            "metadata": {"name": "c"},
            "spec": {"request": STANDARD.encode(request), "signerName": signer, "usages": usages},
        })
    }

    #[test]
    fn parses_subject_and_sans() {
        let pem = request_pem(
            "system:node:edge-1",
            &["system:nodes"],
            &["169.254.2.1", "kubernetes.default.svc"],
        );
        let r = parse_request(pem.as_bytes()).unwrap();
        assert_eq!(r.common_name, "system:node:edge-1");
        assert_eq!(r.organizations, ["system:nodes"]);
        assert_eq!(r.dns_names, ["kubernetes.default.svc"]);
        assert_eq!(r.ip_addresses, ["169.254.2.1".parse::<IpAddr>().unwrap()]);
        assert_eq!(
            parse_request(b"garbage").unwrap_err(),
            "PEM block type must be CERTIFICATE REQUEST"
        );
    }

    #[test]
    fn create_validation_collects_field_errors() {
        let pem = request_pem("system:node:n", &["system:nodes"], &["n"]);
        let good = csr(
            pem.as_bytes(),
            KUBELET_SERVING,
            &["digital signature", "server auth"],
        );
        assert!(validate_create(def(), &good).is_ok());
        let err = validate_create(def(), &csr(b"ab", "", &[])).unwrap_err();
        assert_eq!(err.code, 422);
        assert_eq!(
            err.message,
            "CertificateSigningRequest.certificates.k8s.io \"c\" is invalid: [spec.request: Invalid value: []byte{0x61, 0x62}: PEM block type must be CERTIFICATE REQUEST, spec.usages: Required value: usages must be provided, spec.signerName: Required value]"
        );
        let dup = csr(
            pem.as_bytes(),
            LEGACY_UNKNOWN,
            &["server auth", "server auth"],
        );
        let message = validate_create(def(), &dup).unwrap_err().message;
        assert!(message.contains("spec.usages[1]: Duplicate value: \"server auth\""));
        assert!(message.contains("the legacy signerName is not allowed"));
        let mut undecodable = good.clone();
        undecodable["spec"]["request"] = "%%%".into();
        assert_eq!(validate_create(def(), &undecodable).unwrap_err().code, 400);
    }

    #[test]
    fn requester_replaces_claimed_identity() {
        let mut obj = json!({"spec": {"username": "admin", "groups": ["system:masters"], "extra": {"a": ["b"]}, "uid": "x"}});
        let user = UserInfo {
            name: "system:node:n".into(),
            groups: vec!["system:nodes".into(), "system:authenticated".into()],
        };
        set_requester(&mut obj, &user);
        assert_eq!(
            obj["spec"],
            json!({"username": "system:node:n", "groups": ["system:nodes", "system:authenticated"]})
        );
    }

    #[test]
    fn approval_sets_only_conditions_and_stamps_them() {
        let cur =
            json!({"metadata": {"name": "c"}, "spec": {"signerName": "a.io/b"}, "status": {}});
        let body = json!({"spec": {"signerName": "x.io/y"}, "status": {"conditions": [{"type": "Approved", "status": "True"}], "certificate": "Zm9v"}});
        let mut next = with_conditions_of(&cur, &body);
        prepare_update(def(), Part::Approval, &cur, &mut next).unwrap();
        assert_eq!(next["spec"], cur["spec"]);
        assert!(next["status"].get("certificate").is_none());
        assert!(next["status"]["conditions"][0]["lastTransitionTime"].is_string());
        // Approvals stick: neither the approval nor the status subresource removes them.
        let mut removed = with_conditions_of(&next, &json!({"status": {}}));
        let err = prepare_update(def(), Part::Approval, &next, &mut removed).unwrap_err();
        assert!(
            err.message
                .contains("updates may not remove a condition of type \"Approved\"")
        );
        let mut both = with_conditions_of(
            &next,
            &json!({"status": {"conditions": [{"type": "Approved", "status": "True"}, {"type": "Denied", "status": "True"}]}}),
        );
        let err = prepare_update(def(), Part::Approval, &next, &mut both).unwrap_err();
        assert!(err.message.contains("mutually exclusive"));
    }

    #[test]
    fn status_cannot_approve_or_rewrite_a_certificate() {
        let cur = json!({"metadata": {"name": "c"}, "spec": {}, "status": {}});
        let mut approving = json!({"metadata": {"name": "c"}, "spec": {}, "status": {"conditions": [{"type": "Approved", "status": "True"}]}});
        let err = prepare_update(def(), Part::Status, &cur, &mut approving).unwrap_err();
        assert!(
            err.message
                .contains("may not add a condition of type \"Approved\"")
        );
        let mut junk = json!({"metadata": {"name": "c"}, "spec": {}, "status": {"certificate": STANDARD.encode("nope")}});
        let err = prepare_update(def(), Part::Status, &cur, &mut junk).unwrap_err();
        assert!(
            err.message
                .contains("must contain at least one CERTIFICATE PEM block")
        );
        let signed =
            json!({"metadata": {"name": "c"}, "spec": {}, "status": {"certificate": "Zm9v"}});
        let mut rewrite =
            json!({"metadata": {"name": "c"}, "spec": {}, "status": {"certificate": "YmFy"}});
        let err = prepare_update(def(), Part::Status, &signed, &mut rewrite).unwrap_err();
        assert!(
            err.message
                .contains("may not modify existing certificate content")
        );
    }
}
