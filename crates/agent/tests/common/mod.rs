//! Set-up shared by this crate's integration tests.

use std::time::Duration;

use outpost_agent::{EdgeConfig, HubConfig, LbMode, Server, UpstreamConfig};
use outpost_certs::UpstreamTls;

/// A hub for node `edge-1` on ephemeral loopback ports in front of one `https://` upstream;
/// `edge: None` is cloud mode.
pub fn hub_config(upstream: &str, tls: UpstreamTls, edge: Option<EdgeConfig>) -> HubConfig {
    HubConfig {
        proxy_addr: "127.0.0.1:0".parse().unwrap(),
        admin_addr: "127.0.0.1:0".parse().unwrap(),
        edge,
        ..HubConfig::new(
            "edge-1",
            UpstreamConfig {
                servers: vec![Server::parse(upstream).unwrap()],
                lb_mode: LbMode::RoundRobin,
                connect_timeout: Duration::from_secs(5),
                request_timeout: Duration::from_secs(10),
                tls,
                http2: Default::default(),
            },
        )
    }
}
