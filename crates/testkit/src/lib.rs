//! A fake kube-apiserver, faithful enough that Outpost's tests can trust it.
//!
//! No real kube-apiserver can run on the build machines, so every end-to-end test, bench and the
//! demo talk to this one. Start at [`FakeApiServer::start`]; it serves HTTPS on an ephemeral
//! loopback port, authenticates like kube-apiserver (client certs, bearer tokens, anonymous),
//! authorizes nodes like the Node authorizer in union with RBAC, and keeps an etcd-like store with
//! a global resourceVersion, watch event log, paging and fault injection.
//!
//! Request path, outermost first:
//! - [`server`]: listener, TLS (ALPN `h2` and `http/1.1`), per-connection hyper tasks (HTTP/2 or
//!   HTTP/1.1), fault switches, the public handle.
//! - [`connections`]: per-connection accounting (identity, HTTP version, requests, bytes on the
//!   wire), read with [`FakeApiServer::connections`] and [`FakeApiServer::traffic`].
//! - `router`: classification (`RequestInfo`), authn/authz/admission, dispatch, request log.
//! - `authn`: client certificate and bearer token authentication.
//! - `authz`: Node authorizer + NodeRestriction, anonymous and admin policies, union with RBAC.
//! - `rbac`: the RBAC authorizer, over the ClusterRoles / Roles and bindings in the store.
//! - `discovery`: `/version`, `/api`, `/apis`, resource lists.
//! - `handlers`: get / list (resourceVersion, paging) / create / update / patch / delete.
//! - `table`: server-side printing (`Table` responses for `kubectl get`).
//! - `watch`: watch streams (initial events, bookmarks, replay, 410, selector transitions).
//! - `compress`: gzip answers over 128 KiB for clients that accept them ([`FakeConfig::gzip`]).
//!
//! State and rules:
//! - [`resources`]: the served resources and their per-type behaviour.
//! - `registry`: create/update/delete strategies.
//! - `csr`: CertificateSigningRequest strategies, validation, `approval` / `status`, admission.
//! - `csr_controller`: the in-cluster CSR approver (yurt-manager) and signer
//!   (kube-controller-manager), per [`CsrSigning`].
//! - `store`: objects, global resourceVersion, event log, snapshots.
//! - `query`: list options, validation, selectors, continue tokens.
//! - `patch`: JSON, merge and strategic-merge(-like) patches.
//! - `protobuf`: Kubernetes protobuf request bodies and answers (kubelet's, client-go's), through
//!   `outpost_core::wire`; lists and watches stay JSON.
//! - `graph`: which objects a node reaches through its pods.
//! - `seed`: the default cluster state (fixture pods plus an edge node).
//! - `bootstrap`: kubeadm's bootstrap tokens and the signed `kube-public/cluster-info`
//!   ([`FakeApiServer::add_bootstrap_token`]).
//! - [`pki`]: a throw-away CA, serving cert and identity-bearing client certs.
//! - [`manifest`]: YAML manifests as JSON values (e.g. for [`FakeApiServer::apply_rbac`]).
//! - [`threads`]: a process's threads, their names and nice values (`/proc`).
//! - `kubeconfig`, `reply`, `state`, `util`: helpers.

mod authn;
mod authz;
mod bootstrap;
mod compress;
pub mod connections;
mod csr;
mod csr_controller;
mod discovery;
pub mod full_node;
mod goaway;
mod graph;
mod handlers;
mod kubeconfig;
pub mod kubelet_boot;
pub mod manifest;
mod patch;
pub mod pki;
mod protobuf;
mod query;
mod rbac;
mod registry;
mod reply;
pub mod resources;
mod router;
mod seed;
pub mod server;
mod state;
mod store;
mod table;
pub mod threads;
mod util;
mod watch;

pub use compress::GZIP_THRESHOLD_BYTES;
pub use connections::{ConnectionRecord, HttpVersion, IdentityTraffic};
pub use outpost_core::Status;
pub use pki::{CertPair, NodeCertFiles, TestPki};
pub use server::{CsrSigning, FakeApiServer, FakeConfig, TestkitError};
pub use state::RequestRecord;

/// The fake's authorization decisions as pure functions, for tests that ask "would the cluster
/// allow this request with exactly these RBAC objects?", e.g. that a manifest's ClusterRole grants
/// the requests a program really made, and nothing more. [`authorization::authorize`] is the
/// whole chain the fake runs (public info, the Node authorizer over a caller-supplied
/// [`authorization::NodeGraph`], RBAC over an [`authorization::RbacPolicy`]);
/// [`authorization::rule_allows`] matches a single `PolicyRule`.
pub mod authorization {
    pub use crate::authn::UserInfo;
    pub use crate::authz::{Attributes, Decision, NodeGraph, RefKind, authorize, node_name};
    pub use crate::rbac::{RbacPolicy, StaticPolicy, rule_allows};
}
