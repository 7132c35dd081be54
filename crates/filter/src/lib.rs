//! yurthub's response filters, I/O-free: the proxy asks which filters apply to a request, and
//! hands response bytes (a GET object, a LIST, each WATCH event line) to the resulting chain.
//!
//! Start with [`FilterSet`] (`config.rs`): built from the flags, updated from `yurt-hub-cfg`,
//! and [`FilterSet::for_request`] gives a [`Chain`] or `None`. `None` is the common case and
//! costs a few string comparisons: the proxy streams the body untouched. A [`Chain`]
//! (`chain.rs`) reads each object's [`Head`] (kind, namespace, name, labels, annotations,
//! `spec.type`) and decodes it only when a filter needs the full object; what no filter changed
//! goes out as its original bytes.
//!
//! - [`filter`]: the [`Filter`] trait (rules, default components, peek, filter) and its answers.
//! - [`filters`]: the seven filters, one file each, with their exact rules and tests.
//! - [`context`]: [`FilterContext`], the side data (node, pool, hub address, Services, NodePools).
//! - [`side`]: reading watched Services, NodePools and the Node into that context.
//!
//! The wire shapes (watch events, lists, line framing) are `outpost_core::wire`'s.
//!
//! The proxy's side, for one LIST:
//!
//! ```
//! use outpost_core::RequestInfo;
//! use outpost_filter::{FilterConfig, FilterContext, FilterSet, Outcome};
//!
//! let filters = FilterSet::new(&FilterConfig::default()); // + set_hub_cfg(&yurt_hub_cfg)
//! let ctx = FilterContext::new("edge-1"); // + pool, hub address, Services, NodePools
//! let ua = Some("kubelet/v1.32.0 (linux/amd64) kubernetes/70d3cc9");
//! let info = RequestInfo::classify(&http::Method::GET, "/api/v1/services", ua).unwrap();
//! let chain = filters.for_request(&info).expect("masterservice applies");
//!
//! let body = br#"{"kind":"ServiceList","apiVersion":"v1","metadata":{"resourceVersion":"9"},"items":[
//!   {"metadata":{"name":"kubernetes","namespace":"default"},"spec":{"clusterIP":"10.96.0.1","ports":[{"name":"https","port":443}]}},
//!   {"metadata":{"name":"web","namespace":"shop"},"spec":{"clusterIP":"10.96.7.7"}}]}"#;
//! let Outcome::Replaced(new) = chain.filter_list(body, &ctx) else { panic!() };
//! let new = std::str::from_utf8(&new).unwrap();
//! assert!(new.contains(r#""clusterIP":"169.254.2.1""#) && new.contains(r#""port":10268"#));
//! assert!(new.contains(r#"{"metadata":{"name":"web","namespace":"shop"},"spec":{"clusterIP":"10.96.7.7"}}"#));
//! ```
//!
//! Filters work on JSON. A protobuf or otherwise undecodable body is [`Outcome::Undecodable`]:
//! it passes unchanged and the proxy counts it, so the proxy should ask upstream for JSON on
//! filtered requests.

pub mod chain;
pub mod config;
pub mod context;
pub mod filter;
pub mod filters;
pub mod head;
pub mod side;
mod splice;

#[cfg(test)]
mod testing;

pub use chain::{Chain, Outcome};
pub use config::{FilterConfig, FilterSet};
pub use context::FilterContext;
pub use filter::{Filter, Needs, Peek, Rule, Verdict};
pub use head::{Head, Pairs};
pub use splice::Rewrite;

/// Why a body could not be filtered (it is then passed on unchanged).
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    #[error("body is not UTF-8: {0}")]
    Utf8(#[from] std::str::Utf8Error),
    #[error("body is not the expected JSON: {0}")]
    Json(#[from] serde_json::Error),
}
