//! The fake's transport as a fleet sees it: HTTP/2 by ALPN (and HTTP/1.1 for clients without
//! it, or for all when `http2` is off), per-connection accounting, and gzip answers.

mod common;

use std::io::Read;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{ADMIN, MASTERS, Raw, read_events};
use http::{Method, Request, header};
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::{TokioExecutor, TokioIo};
use outpost_testkit::{FakeApiServer, FakeConfig, GZIP_THRESHOLD_BYTES, HttpVersion};
use rustls::pki_types::ServerName;
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tokio::time::timeout;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

const H2: &[u8] = b"h2";
const HTTP1: &[u8] = b"http/1.1";

/// A TLS connection as `user` (a fresh client certificate) offering `alpn`.
async fn tls_as(
    fake: &FakeApiServer,
    user: (&str, &[&str]),
    alpn: &[&[u8]],
) -> std::io::Result<TlsStream<TcpStream>> {
    let config = common::client_tls(fake, Some(user), alpn);
    let tcp = TcpStream::connect(fake.addr()).await?;
    let name = ServerName::try_from("127.0.0.1").unwrap();
    TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
}

fn get(path: &str) -> Request<Empty<Bytes>> {
    Request::get(format!("https://127.0.0.1{path}"))
        .body(Empty::new())
        .unwrap()
}

/// The first event of a watch (bounded wait).
async fn first_event(watch: http::Response<hyper::body::Incoming>) -> Value {
    let mut body = watch.into_body();
    let events = timeout(
        Duration::from_secs(5),
        read_events(&mut body, &mut Vec::new(), 1),
    )
    .await
    .expect("an event within 5 s");
    events.into_iter().next().expect("the watch ended early")
}

/// Waits (bounded) until `done` holds for the fake's connection records.
async fn until_connections(fake: &FakeApiServer, done: impl Fn(&FakeApiServer) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !done(fake) {
        assert!(
            Instant::now() < deadline,
            "connections: {:#?}",
            fake.connections()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn an_h2_client_gets_http2_and_multiplexes_one_connection() {
    let fake = common::fake().await;
    let started = Instant::now();
    let tls = tls_as(&fake, (ADMIN, MASTERS), &[H2, HTTP1]).await.unwrap();
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(H2));
    let (sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
            .await
            .expect("HTTP/2 handshake");
    tokio::spawn(conn);
    let rv = fake.current_resource_version();
    let watch = sender
        .clone()
        .send_request(get(&format!(
            "/api/v1/namespaces/default/configmaps?watch=true&resourceVersion={rv}"
        )))
        .await
        .unwrap();
    assert_eq!(watch.status(), 200);
    assert_eq!(watch.version(), http::Version::HTTP_2);
    // Two more requests while the watch streams, on the same connection.
    let (version, list) = tokio::join!(
        sender.clone().send_request(get("/version")),
        sender.clone().send_request(get("/api/v1/namespaces")),
    );
    assert_eq!(version.unwrap().status(), 200);
    let list = list
        .unwrap()
        .into_body()
        .collect()
        .await
        .unwrap()
        .to_bytes();
    let list: Value = serde_json::from_slice(&list).unwrap();
    assert!(!list["items"].as_array().unwrap().is_empty());
    fake.create("v1/configmaps", json!({"metadata": {"name": "over-h2"}}))
        .unwrap();
    let event = first_event(watch).await;
    assert_eq!(event["object"]["metadata"]["name"], "over-h2");

    let connections = fake.connections();
    assert_eq!(connections.len(), 1, "{connections:#?}");
    let conn = &connections[0];
    assert_eq!(conn.identity, ADMIN);
    assert_eq!(conn.version, Some(HttpVersion::Http2));
    assert_eq!(conn.requests, 3);
    assert!(conn.closed_at.is_none());
    let traffic = &fake.traffic()[ADMIN];
    assert_eq!(
        (
            traffic.connections_accepted,
            traffic.connections_open,
            traffic.http2_connections,
            traffic.http1_connections
        ),
        (1, 1, 1, 0)
    );
    let requests = fake.requests();
    assert_eq!(requests.len(), 3);
    assert!(requests.iter().all(|r| r.connection == conn.id));
    assert!(
        requests
            .iter()
            .all(|r| r.at >= started && r.at >= conn.opened_at && r.at <= Instant::now())
    );
    fake.shutdown().await;
}

#[tokio::test]
async fn clients_without_h2_get_http1_from_an_http2_fake() {
    let fake = common::fake().await;
    let tls = tls_as(&fake, (ADMIN, MASTERS), &[HTTP1]).await.unwrap();
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(HTTP1));
    drop(tls);
    // No ALPN at all (the hub's upstream client today) is HTTP/1.1 too.
    let reply = Raw::admin(&fake).get("/version").await;
    assert_eq!(reply.status, 200);
    until_connections(&fake, |f| {
        f.connections()
            .iter()
            .all(|c| c.version == Some(HttpVersion::Http1) && c.closed_at.is_some())
    })
    .await;
    assert_eq!(fake.traffic()[ADMIN].http1_connections, 2);
    fake.shutdown().await;
}

#[tokio::test]
async fn with_http2_off_the_fake_offers_only_http1() {
    let fake = common::fake_with(FakeConfig {
        http2: false,
        ..FakeConfig::default()
    })
    .await;
    let tls = tls_as(&fake, (ADMIN, MASTERS), &[H2, HTTP1]).await.unwrap();
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(HTTP1));
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .unwrap();
    tokio::spawn(conn);
    let resp = sender.send_request(get("/version")).await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.version(), http::Version::HTTP_11);
    // A client that speaks only h2 finds no protocol in common.
    let refused = tls_as(&fake, (ADMIN, MASTERS), &[H2]).await;
    assert!(refused.is_err(), "an h2-only handshake must fail");
    fake.shutdown().await;
}

#[tokio::test]
async fn connections_requests_and_bytes_are_counted_per_identity() {
    let fake = common::fake().await;
    fake.add_token("counted-token", "bearer-user", &["system:masters"]);
    let admin = Raw::admin(&fake);
    let mut body_bytes = 0;
    for _ in 0..3 {
        let reply = admin.get("/api/v1/namespaces").await;
        assert_eq!(reply.status, 200);
        body_bytes += reply.body.len() as u64;
    }
    let mut bearer = Raw::anonymous(&fake);
    bearer.bearer = Some("counted-token".into());
    for _ in 0..2 {
        assert_eq!(bearer.get("/version").await.status, 200);
    }
    // A watch keeps its connection open.
    let watch = admin
        .open(
            Method::GET,
            "/api/v1/namespaces/default/configmaps?watch=true",
            None,
            Vec::new(),
        )
        .await;
    assert_eq!(watch.status(), 200);
    until_connections(&fake, |f| {
        let t = f.traffic();
        t["bearer-user"].connections_open == 0 && t[ADMIN].connections_open == 1
    })
    .await;
    let traffic = fake.traffic();
    let a = &traffic[ADMIN];
    assert_eq!((a.connections_accepted, a.requests), (4, 4));
    assert!(
        a.bytes_written > body_bytes,
        "{} bytes on the wire for {body_bytes} bytes of bodies",
        a.bytes_written
    );
    assert!(a.bytes_read > 0);
    let b = &traffic["bearer-user"];
    assert_eq!((b.connections_accepted, b.requests), (2, 2));
    // A refused server has no open connection left.
    fake.refuse_connections();
    until_connections(&fake, |f| {
        f.traffic().values().all(|t| t.connections_open == 0)
    })
    .await;
    drop(watch);
    fake.shutdown().await;
}

/// ConfigMaps whose list is well over the gzip threshold.
fn fill_over_threshold(fake: &FakeApiServer) {
    let data = "k".repeat(4096);
    let count = GZIP_THRESHOLD_BYTES as usize / data.len() + 8;
    for i in 0..count {
        fake.create(
            "v1/configmaps",
            json!({"metadata": {"name": format!("big-{i}"), "namespace": "default"},
                   "data": {"payload": data}}),
        )
        .unwrap();
    }
}

fn gunzip(body: &[u8]) -> Vec<u8> {
    let mut plain = Vec::new();
    flate2::read::GzDecoder::new(body)
        .read_to_end(&mut plain)
        .expect("a gzip body");
    plain
}

const LIST: &str = "/api/v1/namespaces/default/configmaps";

#[tokio::test]
async fn large_answers_are_gzipped_only_for_clients_that_accept_gzip() {
    let fake = common::fake_with(FakeConfig {
        gzip: true,
        ..FakeConfig::default()
    })
    .await;
    fill_over_threshold(&fake);
    let plain = Raw::admin(&fake).get(LIST).await;
    assert_eq!(plain.status, 200);
    assert!(plain.headers.get(header::CONTENT_ENCODING).is_none());
    assert!(plain.body.len() as u64 > GZIP_THRESHOLD_BYTES);

    let mut gzip = Raw::admin(&fake);
    gzip.accept_encoding = Some("gzip".into());
    let compressed = gzip.get(LIST).await;
    assert_eq!(compressed.status, 200);
    assert_eq!(compressed.headers[header::CONTENT_ENCODING], "gzip");
    assert_eq!(compressed.headers[header::VARY], "Accept-Encoding");
    let decoded: Value = serde_json::from_slice(&gunzip(&compressed.body)).unwrap();
    assert_eq!(decoded, plain.json());
    assert!(compressed.body.len() * 4 < plain.body.len());

    // Small answers stay plain even when gzip is accepted.
    let small = gzip.get("/api/v1/namespaces/default").await;
    assert_eq!(small.status, 200);
    assert!(small.headers.get(header::CONTENT_ENCODING).is_none());
    // So do watch streams.
    let watch = gzip
        .open(Method::GET, &format!("{LIST}?watch=true"), None, Vec::new())
        .await;
    assert!(watch.headers().get(header::CONTENT_ENCODING).is_none());
    assert_eq!(first_event(watch).await["type"], "ADDED");

    // The wire shows it: the gzip list's connection wrote a fraction of the plain one's bytes.
    let connections = fake.connections();
    let lists: Vec<u64> = fake
        .requests()
        .iter()
        .filter(|r| r.path == LIST && r.verb == "list")
        .filter_map(|r| connections.iter().find(|c| c.id == r.connection))
        .map(|c| c.bytes_written)
        .collect();
    assert_eq!(lists.len(), 2);
    assert!(lists[1] * 4 < lists[0], "wire bytes {lists:?}");
    fake.shutdown().await;
}

#[tokio::test]
async fn gzip_is_off_unless_configured() {
    let fake = common::fake().await;
    fill_over_threshold(&fake);
    let mut gzip = Raw::admin(&fake);
    gzip.accept_encoding = Some("gzip".into());
    let reply = gzip.get(LIST).await;
    assert_eq!(reply.status, 200);
    assert!(reply.headers.get(header::CONTENT_ENCODING).is_none());
    assert!(reply.json()["items"].is_array());
    fake.shutdown().await;
}
