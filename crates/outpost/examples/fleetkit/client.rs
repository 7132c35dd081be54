//! Plain HTTP/1.1 to a hub's proxy and admin ports, one connection per request, as
//! `outpost_testkit::kubelet_boot` sends it: the light client every simulated component uses.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, Result, anyhow};
use bytes::Bytes;
use http::{HeaderMap, Method, Request, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use serde_json::Value;

/// Bound on connecting and on a response's head.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(30);
/// Bound on a whole non-watch body.
pub const BODY_TIMEOUT: Duration = Duration::from_secs(60);

/// Who sends a request: its User-Agent, `Accept`, and bearer token if any.
#[derive(Clone, Copy, Debug)]
pub struct Caller<'a> {
    pub user_agent: &'a str,
    pub accept: &'a str,
    pub token: Option<&'a str>,
}

/// A response whose body is still streaming (a watch).
pub struct Open {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Incoming,
}

/// A whole response.
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Reply {
    /// The body as JSON, whether it came as JSON or as Kubernetes protobuf.
    pub fn object(&self) -> Result<Value> {
        let content_type = self
            .headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok());
        outpost_core::wire::read_body(content_type, &self.body)
            .map_err(|e| anyhow!("undecodable {content_type:?} body: {e}"))
    }
}

/// `x-outpost-served-from`, when the hub answered itself.
pub fn served_from(headers: &HeaderMap) -> Option<&str> {
    headers
        .get("x-outpost-served-from")
        .and_then(|v| v.to_str().ok())
}

/// Sends one request on a new connection and returns once its head arrived.
pub async fn open(
    addr: SocketAddr,
    caller: Caller<'_>,
    method: Method,
    path: &str,
    body: Option<(&str, Bytes)>,
) -> Result<Open> {
    let mut builder = Request::builder()
        .method(method)
        .uri(path)
        .header(header::HOST, addr.to_string())
        .header(header::USER_AGENT, caller.user_agent)
        .header(header::ACCEPT, caller.accept);
    if let Some(token) = caller.token {
        builder = builder.header(header::AUTHORIZATION, format!("Bearer {token}"));
    }
    let bytes = match body {
        Some((content_type, bytes)) => {
            builder = builder.header(header::CONTENT_TYPE, content_type);
            bytes
        }
        None => Bytes::new(),
    };
    let request = builder.body(Full::new(bytes))?;
    let response = tokio::time::timeout(HEAD_TIMEOUT, async {
        let stream = tokio::net::TcpStream::connect(addr).await?;
        let (mut sender, connection) =
            hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(async move {
            let _ = connection.await;
        });
        anyhow::Ok(sender.send_request(request).await?)
    })
    .await
    .context("no response head in time")??;
    let (parts, body) = response.into_parts();
    Ok(Open {
        status: parts.status,
        headers: parts.headers,
        body,
    })
}

/// One whole request and response.
pub async fn call(
    addr: SocketAddr,
    caller: Caller<'_>,
    method: Method,
    path: &str,
    body: Option<(&str, Bytes)>,
) -> Result<Reply> {
    let open = open(addr, caller, method, path, body).await?;
    let body = tokio::time::timeout(BODY_TIMEOUT, open.body.collect())
        .await
        .context("body not complete in time")??
        .to_bytes();
    Ok(Reply {
        status: open.status,
        headers: open.headers,
        body,
    })
}

/// Splits a watch stream into its newline-delimited JSON events.
#[derive(Default)]
pub struct EventLines {
    buf: Vec<u8>,
}

impl EventLines {
    /// Adds a chunk; returns the complete events in it (undecodable lines as `Err`).
    pub fn push(&mut self, chunk: &[u8]) -> Vec<Result<Value, serde_json::Error>> {
        self.buf.extend_from_slice(chunk);
        let mut events = Vec::new();
        while let Some(end) = memchr_newline(&self.buf) {
            let line: Vec<u8> = self.buf.drain(..=end).collect();
            if line.iter().any(|b| !b.is_ascii_whitespace()) {
                events.push(serde_json::from_slice(&line));
            }
        }
        events
    }
}

fn memchr_newline(buf: &[u8]) -> Option<usize> {
    buf.iter().position(|b| *b == b'\n')
}
