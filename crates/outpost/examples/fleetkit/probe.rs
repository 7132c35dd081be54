//! What kube-proxy's Service and EndpointSlice LISTs cost on the WAN, read straight from the
//! apiserver over a fresh TLS connection each (the fake's connection accounting counts the bytes
//! on the wire, handshake included): as the hub asks today (JSON, no `Accept-Encoding`) and with
//! `Accept-Encoding: gzip`.

use std::sync::Arc;

use anyhow::{Context, Result, anyhow};
use bytes::Bytes;
use http::{Request, header};
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use outpost_testkit::FakeApiServer;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::{Value, json};

/// The probe's bearer token (a reader like kube-proxy).
pub const TOKEN: &str = "fleet-probe";
pub const USER: &str = "fleet:probe";

/// One LIST read once.
pub struct Listed {
    pub wire_bytes: u64,
    pub body_bytes: u64,
    pub items: usize,
    pub gzip: bool,
}

/// Both lists, plain and gzip-accepting.
pub struct ListCost {
    pub plain: [Listed; 2],
    pub gzip: [Listed; 2],
}

impl ListCost {
    pub fn json(&self) -> Value {
        let one = |l: &Listed| {
            json!({"wire_bytes": l.wire_bytes, "body_bytes": l.body_bytes, "items": l.items,
                   "content_encoding_gzip": l.gzip})
        };
        let total = |ls: &[Listed; 2]| ls.iter().map(|l| l.wire_bytes).sum::<u64>();
        json!({
            "services_plain": one(&self.plain[0]), "endpointslices_plain": one(&self.plain[1]),
            "services_gzip": one(&self.gzip[0]), "endpointslices_gzip": one(&self.gzip[1]),
            "wire_bytes_plain": total(&self.plain), "wire_bytes_gzip": total(&self.gzip),
        })
    }
}

const SERVICES: &str = "/api/v1/services?labelSelector=%21service.kubernetes.io%2Fheadless%2C%21service.kubernetes.io%2Fservice-proxy-name&limit=500&resourceVersion=0";
const SLICES: &str = "/apis/discovery.k8s.io/v1/endpointslices?labelSelector=%21service.kubernetes.io%2Fheadless%2C%21service.kubernetes.io%2Fservice-proxy-name&limit=500&resourceVersion=0";

pub async fn list_cost(fake: &FakeApiServer) -> Result<ListCost> {
    Ok(ListCost {
        plain: [
            list_once(fake, SERVICES, false).await?,
            list_once(fake, SLICES, false).await?,
        ],
        gzip: [
            list_once(fake, SERVICES, true).await?,
            list_once(fake, SLICES, true).await?,
        ],
    })
}

async fn list_once(fake: &FakeApiServer, path: &str, gzip: bool) -> Result<Listed> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(fake.pki().ca_pem.as_bytes()) {
        roots.add(cert?)?;
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_root_certificates(roots)
    .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(fake.addr()).await?;
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("127.0.0.1")?, tcp)
        .await?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls)).await?;
    tokio::spawn(conn);
    let mut request = Request::get(path)
        .header(header::HOST, "127.0.0.1")
        .header(header::ACCEPT, "application/json")
        .header(header::AUTHORIZATION, format!("Bearer {TOKEN}"));
    if gzip {
        request = request.header(header::ACCEPT_ENCODING, "gzip");
    }
    let resp = sender
        .send_request(request.body(Empty::<Bytes>::new())?)
        .await?;
    anyhow::ensure!(resp.status() == 200, "probe LIST {path}: {}", resp.status());
    let compressed = resp
        .headers()
        .get(header::CONTENT_ENCODING)
        .is_some_and(|v| v == "gzip");
    let body = resp.into_body().collect().await?.to_bytes();
    drop(sender);
    let plain = if compressed {
        let mut out = Vec::new();
        std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&body[..]), &mut out)?;
        out
    } else {
        body.to_vec()
    };
    let list: Value = serde_json::from_slice(&plain).context("probe LIST body")?;
    anyhow::ensure!(
        list["metadata"]["continue"]
            .as_str()
            .unwrap_or("")
            .is_empty(),
        "probe LIST {path} paged"
    );
    let connection = fake
        .requests()
        .iter()
        .rev()
        .find(|r| r.user == USER)
        .map(|r| r.connection)
        .ok_or_else(|| anyhow!("the probe's request is not in the log"))?;
    // The connection's bytes settle once the client has read the whole body.
    let wire_bytes = fake
        .connections()
        .iter()
        .find(|c| c.id == connection)
        .map(|c| c.bytes_written)
        .unwrap_or_default();
    Ok(Listed {
        wire_bytes,
        body_bytes: body.len() as u64,
        items: list["items"].as_array().map_or(0, Vec::len),
        gzip: compressed,
    })
}
