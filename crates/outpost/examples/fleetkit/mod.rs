//! The fleet simulation's parts (`examples/fleet.rs` runs them): the cluster in the fake
//! apiserver (`cluster`), the hubs as child processes (`hub`), each node's workload over plain
//! HTTP/1.1 (`client`, `workload`), what is measured (`sample`, `requests`, `probe`,
//! `converge`) and how it is reported (`report`).

pub mod client;
pub mod cluster;
pub mod converge;
pub mod hub;
pub mod probe;
pub mod report;
pub mod requests;
pub mod sample;
pub mod workload;
