//! Prometheus metrics of the proxy, registered in an explicit registry (no global state).
//!
//! Names carry the `outpost_` prefix. The `component` label is yurthub's component (User-Agent up to
//! the first `/`), not the full User-Agent, to keep cardinality bounded.

use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry, TextEncoder,
};

/// Handles to every metric the proxy updates.
#[derive(Clone)]
pub struct Metrics {
    registry: Registry,
    pub requests: IntCounterVec,
    pub in_flight: IntGaugeVec,
    pub upstream_errors: IntCounterVec,
    pub response_bytes: IntCounterVec,
    pub latency: HistogramVec,
    pub client_cert_expiry: IntGaugeVec,
}

impl Metrics {
    pub fn new() -> Self {
        let registry = Registry::new();
        let requests = IntCounterVec::new(
            Opts::new(
                "outpost_requests_total",
                "Proxied requests by component, verb, resource and response code.",
            ),
            &["component", "verb", "resource", "code"],
        )
        .expect("valid metric definition");
        let in_flight = IntGaugeVec::new(
            Opts::new(
                "outpost_in_flight_requests",
                "Requests being served right now (watches count until their stream ends).",
            ),
            &["component", "verb"],
        )
        .expect("valid metric definition");
        let upstream_errors = IntCounterVec::new(
            Opts::new(
                "outpost_upstream_errors_total",
                "Failed upstream exchanges by server and kind (unreachable, timeout, bad_reply).",
            ),
            &["server", "kind"],
        )
        .expect("valid metric definition");
        let response_bytes = IntCounterVec::new(
            Opts::new(
                "outpost_proxied_response_bytes_total",
                "Response body bytes sent to clients, by component.",
            ),
            &["component"],
        )
        .expect("valid metric definition");
        let latency = HistogramVec::new(
            HistogramOpts::new(
                "outpost_request_duration_seconds",
                "Time from request to response headers, by verb.",
            )
            .buckets(vec![
                0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                10.0, 30.0, 60.0,
            ]),
            &["verb"],
        )
        .expect("valid metric definition");
        let client_cert_expiry = IntGaugeVec::new(
            Opts::new(
                "outpost_client_certificate_expiry_timestamp_seconds",
                "Expiry (Unix time) of the client certificate the hub presents upstream.",
            ),
            &["user"],
        )
        .expect("valid metric definition");
        for c in [
            Box::new(requests.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(in_flight.clone()),
            Box::new(upstream_errors.clone()),
            Box::new(response_bytes.clone()),
            Box::new(latency.clone()),
            Box::new(client_cert_expiry.clone()),
        ] {
            registry.register(c).expect("metric names are unique");
        }
        Metrics {
            registry,
            requests,
            in_flight,
            upstream_errors,
            response_bytes,
            latency,
            client_cert_expiry,
        }
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> Vec<u8> {
        let mut out = Vec::new();
        // Encoding into a Vec only fails on invalid metric families, which registration prevents.
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut out);
        out
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}
