//! A fake kube-apiserver, faithful enough that Outpost's tests can trust it.
//!
//! No real kube-apiserver can run on the build machines, so every end-to-end test, bench and the
//! demo talk to this one. Start at [`server::FakeApiServer::start`].
//!
//! - [`pki`]: a throw-away CA, serving cert and identity-bearing client certs.

pub mod pki;

pub use pki::{CertPair, NodeCertFiles, TestPki};
