//! The pipeline in-process against a minimal TLS upstream that reports what it received: which
//! headers crossed the hop, whether the node certificate was presented, and that a streamed body
//! reaches the client piece by piece rather than after the upstream finishes.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use outpost_agent::Hub;
use outpost_certs::UpstreamTls;
use outpost_testkit::TestPki;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

mod common;

/// An HTTPS upstream that answers every request with a JSON echo of it.
async fn echo_upstream(pki: &TestPki) -> SocketAddr {
    outpost_certs::install_ring_provider();
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(pki.ca_pem.as_bytes()).unwrap())
        .unwrap();
    let verifier = WebPkiClientVerifier::builder(Arc::new(roots))
        .allow_unauthenticated()
        .build()
        .unwrap();
    let certs = CertificateDer::pem_slice_iter(pki.server.cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let key = PrivateKeyDer::from_pem_slice(pki.server.key_pem.as_bytes()).unwrap();
    let config = rustls::ServerConfig::builder()
        .with_client_cert_verifier(verifier)
        .with_single_cert(certs, key)
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let has_cert = tls.get_ref().1.peer_certificates().is_some();
                let service = service_fn(move |req| echo(req, has_cert));
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tls), service)
                    .with_upgrades()
                    .await;
            });
        }
    });
    addr
}

type EchoBody = http_body_util::combinators::BoxBody<Bytes, std::convert::Infallible>;

async fn echo(
    mut req: Request<Incoming>,
    client_cert: bool,
) -> Result<Response<EchoBody>, std::convert::Infallible> {
    if req.headers().contains_key("upgrade") {
        let on_upgrade = hyper::upgrade::on(&mut req);
        tokio::spawn(async move {
            if let Ok(up) = on_upgrade.await {
                let mut io = TokioIo::new(up);
                let mut buf = [0u8; 64];
                while let Ok(n) = io.read(&mut buf).await {
                    if n == 0 || io.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            }
        });
        let resp = Response::builder()
            .status(101)
            .header("connection", "Upgrade")
            .header("upgrade", "SPDY/3.1")
            .body(Full::new(Bytes::new()).boxed())
            .unwrap();
        return Ok(resp);
    }
    if req.uri().path() == "/stream" {
        // Two frames 600 ms apart: the first must reach the client before the second exists.
        let frames = futures_util::stream::unfold(0u8, |n| async move {
            match n {
                0 => Some((Ok(Frame::data(Bytes::from_static(b"first\n"))), 1)),
                1 => {
                    tokio::time::sleep(Duration::from_millis(600)).await;
                    Some((Ok(Frame::data(Bytes::from_static(b"second\n"))), 2))
                }
                _ => None,
            }
        });
        return Ok(Response::new(StreamBody::new(frames).boxed()));
    }
    let headers: serde_json::Map<String, serde_json::Value> = req
        .headers()
        .iter()
        .map(|(k, v)| (k.to_string(), json!(v.to_str().unwrap_or("?"))))
        .collect();
    let method = req.method().to_string();
    let uri = req.uri().to_string();
    let body = req.into_body().collect().await.unwrap().to_bytes();
    let echo = json!({
        "method": method,
        "uri": uri,
        "headers": headers,
        "client_cert": client_cert,
        "body": String::from_utf8_lossy(&body),
    });
    let resp = Response::builder()
        .header("content-type", "application/json")
        .header("connection", "keep-alive, x-upstream-private")
        .header("x-upstream-private", "must not leak")
        .header("x-kept", "yes")
        .body(Full::new(Bytes::from(echo.to_string())).boxed())
        .unwrap();
    Ok(resp)
}

async fn hub_for(upstream: SocketAddr, pki: &TestPki) -> (Hub, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let files = pki.write_node_files(dir.path(), "edge-1").unwrap();
    let tls = UpstreamTls::load(&files.client_pem, &files.ca_crt).unwrap();
    let upstream = format!("https://{upstream}");
    let hub = Hub::start(common::hub_config(&upstream, tls, None))
        .await
        .unwrap();
    (hub, dir)
}

async fn exchange(addr: SocketAddr, request: &str) -> (String, Vec<u8>) {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(request.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut buf))
        .await
        .unwrap()
        .unwrap();
    let split = buf.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    (
        String::from_utf8_lossy(&buf[..split]).into_owned(),
        buf[split + 4..].to_vec(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_crosses_the_hop_cleanly() {
    let pki = TestPki::new().unwrap();
    let upstream = echo_upstream(&pki).await;
    let (hub, _dir) = hub_for(upstream, &pki).await;
    let body = r#"{"status":{"phase":"Running"}}"#;
    let req = format!(
        "PATCH /api/v1/namespaces/default/pods/p/status?fieldManager=kubelet HTTP/1.1\r\n\
         Host: 127.0.0.1:10261\r\nUser-Agent: kubelet/v1.32.4\r\n\
         Content-Type: application/strategic-merge-patch+json\r\n\
         Connection: close, x-client-private\r\nX-Client-Private: secret\r\nTE: trailers\r\n\
         Proxy-Authorization: Basic Zm9v\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let (head, resp_body) = exchange(hub.proxy_addr(), &req).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let lower = head.to_ascii_lowercase();
    assert!(lower.contains("x-kept: yes"), "{head}");
    assert!(!lower.contains("x-upstream-private"), "{head}");
    let echo: serde_json::Value = serde_json::from_slice(&resp_body).unwrap();
    assert_eq!(echo["method"], "PATCH");
    assert_eq!(
        echo["uri"],
        "/api/v1/namespaces/default/pods/p/status?fieldManager=kubelet"
    );
    assert_eq!(echo["body"], body);
    assert_eq!(
        echo["client_cert"], true,
        "the node certificate is presented"
    );
    let h = echo["headers"].as_object().unwrap();
    assert_eq!(h["host"], upstream.to_string(), "Host names the upstream");
    assert_eq!(h["user-agent"], "kubelet/v1.32.4");
    assert_eq!(h["content-type"], "application/strategic-merge-patch+json");
    for hop in ["x-client-private", "te", "proxy-authorization"] {
        assert!(!h.contains_key(hop), "{hop} crossed the hop: {h:?}");
    }
    hub.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bearer_requests_go_without_the_node_certificate() {
    let pki = TestPki::new().unwrap();
    let upstream = echo_upstream(&pki).await;
    let (hub, _dir) = hub_for(upstream, &pki).await;
    let req = "GET /api/v1/namespaces/default/configmaps HTTP/1.1\r\nHost: x\r\n\
               Authorization: Bearer pod-token\r\nConnection: close\r\n\r\n";
    let (_, body) = exchange(hub.proxy_addr(), req).await;
    let echo: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(echo["client_cert"], false);
    assert_eq!(echo["headers"]["authorization"], "Bearer pod-token");
    hub.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_bodies_are_not_buffered() {
    let pki = TestPki::new().unwrap();
    let upstream = echo_upstream(&pki).await;
    let (hub, _dir) = hub_for(upstream, &pki).await;
    let mut s = tokio::net::TcpStream::connect(hub.proxy_addr())
        .await
        .unwrap();
    s.write_all(b"GET /stream HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let started = Instant::now();
    let mut seen = Vec::new();
    let mut buf = [0u8; 1024];
    while !String::from_utf8_lossy(&seen).contains("first") {
        let n = s.read(&mut buf).await.unwrap();
        assert!(n > 0, "stream ended before the first frame");
        seen.extend_from_slice(&buf[..n]);
    }
    let first_after = started.elapsed();
    let mut rest = Vec::new();
    s.read_to_end(&mut rest).await.unwrap();
    assert!(String::from_utf8_lossy(&rest).contains("second"));
    assert!(
        first_after < Duration::from_millis(500),
        "first frame arrived only after {first_after:?}: the body was buffered"
    );
    hub.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upgrades_splice_both_directions() {
    let pki = TestPki::new().unwrap();
    let upstream = echo_upstream(&pki).await;
    let (hub, _dir) = hub_for(upstream, &pki).await;
    let mut s = tokio::net::TcpStream::connect(hub.proxy_addr())
        .await
        .unwrap();
    s.write_all(
        b"POST /api/v1/namespaces/default/pods/p/portforward HTTP/1.1\r\nHost: x\r\n\
          Connection: Upgrade\r\nUpgrade: SPDY/3.1\r\n\r\n",
    )
    .await
    .unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        assert_eq!(s.read(&mut byte).await.unwrap(), 1);
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).to_ascii_lowercase();
    assert!(head.starts_with("http/1.1 101"), "{head}");
    assert!(head.contains("upgrade: spdy/3.1"), "{head}");
    s.write_all(b"hello tunnel").await.unwrap();
    let mut echoed = [0u8; 12];
    tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut echoed))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&echoed, b"hello tunnel");
    hub.shutdown().await;
}
