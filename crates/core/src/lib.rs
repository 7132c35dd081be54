//! I/O-free building blocks shared by every other Outpost crate.
//!
//! Nothing here touches sockets, disks or clocks, so all of it is unit- and property-tested in
//! isolation. Start with [`request_info`]: it classifies one HTTP request exactly once, the way
//! kube-apiserver's `RequestInfoFactory` does, and every later stage of the proxy reads the result.
//!
//! - [`request_info`]: verb / group / version / resource / namespace / name / component.
//! - [`selector`]: label and field selectors (parse, match), as `k8s.io/apimachinery` defines them.
//! - [`status`]: Kubernetes `Status` error bodies; every error a client sees is one of these.
//! - [`time`]: `metav1.Time` / `MicroTime` text.
//! - [`wire`]: bodies on the wire: JSON and Kubernetes protobuf, `Accept` negotiation.

pub mod request_info;
pub mod selector;
pub mod status;
pub mod time;
pub mod wire;

pub use request_info::{ClassifyError, RequestInfo, Verb};
pub use status::{Reason, Status};
