//! Helpers shared by the fidelity tests: a kube-rs client from the fake's kubeconfig, and a raw
//! HTTPS client (for status codes, headers and stream framing the typed clients hide).

// Each test binary uses a different subset of these helpers.
#![allow(dead_code)]

use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, Method, Request};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use outpost_testkit::{FakeApiServer, FakeConfig, TestPki};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use serde_json::Value;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

pub const ADMIN: &str = "kubernetes-admin";
pub const MASTERS: &[&str] = &["system:masters"];
pub const USER_AGENT: &str = "outpost-testkit-tests/0.1";

pub async fn fake() -> FakeApiServer {
    fake_with(FakeConfig::default()).await
}

pub async fn fake_with(config: FakeConfig) -> FakeApiServer {
    FakeApiServer::start(config)
        .await
        .expect("fake apiserver starts")
}

/// A kube-rs client authenticated with a fresh client certificate for `user`.
pub async fn kube_client(
    fake: &FakeApiServer,
    dir: &Path,
    user: &str,
    groups: &[&str],
) -> kube::Client {
    let path = fake.kubeconfig_for(dir, user, groups);
    let kubeconfig = kube::config::Kubeconfig::read_from(&path).expect("kubeconfig parses");
    let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .expect("kubeconfig loads");
    // kube-rs retries 429/503/504 up to 15 times; tests want to see the server's first answer.
    config.default_retry = false;
    config.headers.push((
        http::header::USER_AGENT,
        http::HeaderValue::from_static(USER_AGENT),
    ));
    kube::Client::try_from(config).expect("client builds")
}

pub async fn admin_client(fake: &FakeApiServer, dir: &Path) -> kube::Client {
    kube_client(fake, dir, ADMIN, MASTERS).await
}

/// The fixture the fake seeds from.
pub fn fixture_pods() -> Value {
    serde_json::from_str(include_str!("../../fixtures/kube-system-pods.json")).unwrap()
}

/// The `code` of a kube-rs API error.
pub fn api_code(err: &kube::Error) -> Option<u16> {
    match err {
        kube::Error::Api(status) => Some(status.code),
        _ => None,
    }
}

/// A one-request-per-connection HTTPS client with an optional client certificate.
pub struct Raw {
    connector: TlsConnector,
    addr: std::net::SocketAddr,
    pub bearer: Option<String>,
    /// The `Accept` header, if any.
    pub accept: Option<String>,
    /// The `Accept-Encoding` header, if any.
    pub accept_encoding: Option<String>,
}

/// A client TLS config trusting the fake's CA, with a fresh client certificate for `user` (or
/// none), offering `alpn` (e.g. `h2`, `http/1.1`; none when empty).
pub fn client_tls(
    fake: &FakeApiServer,
    user: Option<(&str, &[&str])>,
    alpn: &[&[u8]],
) -> rustls::ClientConfig {
    let identity = user.map(|(user, groups)| {
        let pair = fake.pki().client(user, groups).unwrap();
        (pair.cert_pem, pair.key_pem)
    });
    let mut config = tls_config(fake.pki(), identity);
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    config
}

fn tls_config(pki: &TestPki, identity: Option<(String, String)>) -> rustls::ClientConfig {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(pki.ca_pem.as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    let builder = rustls::ClientConfig::builder().with_root_certificates(roots);
    match identity {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => {
            let certs: Vec<_> = CertificateDer::pem_slice_iter(cert.as_bytes())
                .map(Result::unwrap)
                .collect();
            let key = PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap();
            builder.with_client_auth_cert(certs, key).unwrap()
        }
    }
}

/// A finished response: status, headers, body.
pub struct Reply {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Reply {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&self.body)))
    }
}

impl Raw {
    pub fn anonymous(fake: &FakeApiServer) -> Raw {
        Self::with_config(fake, tls_config(fake.pki(), None))
    }

    pub fn as_user(fake: &FakeApiServer, user: &str, groups: &[&str]) -> Raw {
        let pair = fake.pki().client(user, groups).unwrap();
        Self::with_config(
            fake,
            tls_config(fake.pki(), Some((pair.cert_pem, pair.key_pem))),
        )
    }

    pub fn admin(fake: &FakeApiServer) -> Raw {
        Self::as_user(fake, ADMIN, MASTERS)
    }

    pub fn node(fake: &FakeApiServer, node: &str) -> Raw {
        Self::as_user(fake, &format!("system:node:{node}"), &["system:nodes"])
    }

    pub fn with_pem(fake: &FakeApiServer, cert: String, key: String) -> Raw {
        Self::with_config(fake, tls_config(fake.pki(), Some((cert, key))))
    }

    fn with_config(fake: &FakeApiServer, config: rustls::ClientConfig) -> Raw {
        Raw {
            connector: TlsConnector::from(Arc::new(config)),
            addr: fake.addr(),
            bearer: None,
            accept: None,
            accept_encoding: None,
        }
    }

    pub async fn connect(&self) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
        let tcp = TcpStream::connect(self.addr).await?;
        let name = ServerName::try_from("127.0.0.1").unwrap();
        self.connector.connect(name, tcp).await
    }

    /// Sends one request and returns the response head with its still-streaming body.
    pub async fn open(
        &self,
        method: Method,
        path: &str,
        content_type: Option<&str>,
        body: Vec<u8>,
    ) -> http::Response<Incoming> {
        let tls = self.connect().await.expect("TLS connect");
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
                .await
                .expect("HTTP handshake");
        tokio::spawn(conn);
        let mut req = Request::builder()
            .method(method)
            .uri(path)
            .header("host", "127.0.0.1")
            .header("user-agent", USER_AGENT);
        if let Some(ct) = content_type {
            req = req.header("content-type", ct);
        }
        if let Some(token) = &self.bearer {
            req = req.header("authorization", format!("Bearer {token}"));
        }
        if let Some(accept) = &self.accept {
            req = req.header("accept", accept);
        }
        if let Some(encoding) = &self.accept_encoding {
            req = req.header("accept-encoding", encoding);
        }
        let req = req.body(Full::new(Bytes::from(body))).unwrap();
        sender.send_request(req).await.expect("response head")
    }

    pub async fn send(
        &self,
        method: Method,
        path: &str,
        content_type: Option<&str>,
        body: Vec<u8>,
    ) -> Reply {
        let resp = self.open(method, path, content_type, body).await;
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let body = resp
            .into_body()
            .collect()
            .await
            .expect("full body")
            .to_bytes();
        Reply {
            status,
            headers,
            body,
        }
    }

    pub async fn get(&self, path: &str) -> Reply {
        self.send(Method::GET, path, None, Vec::new()).await
    }

    pub async fn post_json(&self, path: &str, body: &Value) -> Reply {
        self.send(
            Method::POST,
            path,
            Some("application/json"),
            body.to_string().into_bytes(),
        )
        .await
    }
}

/// Reads newline-delimited watch events until `n` have arrived (or the stream ends).
pub async fn read_events(body: &mut Incoming, buf: &mut Vec<u8>, n: usize) -> Vec<Value> {
    let mut events = Vec::new();
    loop {
        while let Some(pos) = buf.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = buf.drain(..=pos).collect();
            events.push(serde_json::from_slice(&line).expect("each line is one JSON event"));
            if events.len() == n {
                return events;
            }
        }
        match body.frame().await {
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    buf.extend_from_slice(data);
                }
            }
            _ => return events,
        }
    }
}

/// Sorted top-level keys, for comparing shapes.
pub fn keys(v: &Value) -> Vec<String> {
    let mut k: Vec<String> = v
        .as_object()
        .map(|m| m.keys().cloned().collect())
        .unwrap_or_default();
    k.sort();
    k
}
