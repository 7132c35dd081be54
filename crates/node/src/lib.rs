//! `outpost node convert` / `outpost node revert`: switch a kubeadm node's kubelet to talk to the
//! apiserver through the outpost hub, and back, the way yurtctl/node-servant do for yurthub.
//!
//! convert writes the hub's static pod, waits until the hub reports ready, and only then points
//! kubelet at it (`/var/lib/openyurt/kubelet.conf` plus two flags appended to
//! `KUBELET_KUBEADM_ARGS`). Every file it creates or changes is recorded, with checksums and a copy of
//! the original, under `/var/lib/outpost/backup`, so revert can restore the node byte for byte and
//! refuse when someone changed a file in between. All paths are taken under `--root`, which lets
//! tests (and jobs that mount the host somewhere else) work on a copy of a node's tree.

mod args;
mod convert;
mod diff;
mod error;
mod flags_env;
mod fsops;
mod kubelet;
mod node;
mod outcome;
mod readyz;
mod record;
mod render;
mod revert;

pub use args::{ConvertArgs, DEFAULT_IMAGE, RevertArgs, WorkingMode};
pub use convert::convert;
pub use error::NodeError;
pub use outcome::{Change, Outcome};
pub use render::{hub_kubeconfig, static_pod};
pub use revert::revert;
