//! Set-up shared by this crate's integration tests.

use std::time::Duration;

use outpost_certs::UpstreamTls;
use outpost_proxy::{EdgeConfig, HubConfig, LbMode, Server, UpstreamConfig};

/// A hub for node `edge-1` on ephemeral loopback ports in front of one `https://` upstream;
/// `edge: None` is cloud mode.
pub fn hub_config(upstream: &str, tls: UpstreamTls, edge: Option<EdgeConfig>) -> HubConfig {
    HubConfig {
        node_name: "edge-1".into(),
        proxy_addr: "127.0.0.1:0".parse().unwrap(),
        admin_addr: "127.0.0.1:0".parse().unwrap(),
        upstream: UpstreamConfig {
            servers: vec![Server::parse(upstream).unwrap()],
            lb_mode: LbMode::RoundRobin,
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(10),
            tls,
        },
        edge,
        namespace: "kube-system".into(),
        health: outpost_proxy::health::HealthConfig::default(),
        filters: None,
        pool_scope: Vec::new(),
        secure: None,
        dummy_if: None,
        token_bootstrap: None,
        clients: Default::default(),
    }
}
