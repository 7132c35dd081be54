//! Each fault the fake can inject, observed from a client's side of the socket.

mod common;

use std::time::{Duration, Instant};

use common::{Raw, read_events};
use http::Method;
use http_body_util::BodyExt;
use serde_json::json;
use tokio::net::TcpStream;
use tokio::time::timeout;

#[tokio::test]
async fn refuse_closes_the_port_and_restore_reopens_it() {
    let fake = common::fake().await;
    let admin = Raw::admin(&fake);
    let open = admin
        .open(
            Method::GET,
            "/api/v1/namespaces/default/configmaps?watch=true&resourceVersion=0",
            None,
            Vec::new(),
        )
        .await;
    fake.refuse_connections();
    let err = TcpStream::connect(fake.addr()).await.unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionRefused);
    let body = timeout(Duration::from_secs(2), open.into_body().collect())
        .await
        .unwrap();
    assert!(body.is_err(), "open connections are dropped");
    fake.restore().await;
    assert_eq!(admin.get("/version").await.status, 200);
    fake.shutdown().await;
}

#[tokio::test]
async fn blackhole_accepts_but_never_answers() {
    let fake = common::fake().await;
    let admin = Raw::admin(&fake);
    fake.blackhole();
    let tcp = timeout(Duration::from_secs(1), TcpStream::connect(fake.addr())).await;
    assert!(matches!(tcp, Ok(Ok(_))), "TCP connects");
    let handshake = timeout(Duration::from_millis(300), admin.connect()).await;
    assert!(handshake.is_err(), "the TLS handshake never completes");
    let stalled = tokio::spawn(async move { admin.get("/version").await.status });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!stalled.is_finished());
    fake.restore().await;
    assert_eq!(
        timeout(Duration::from_secs(5), stalled)
            .await
            .unwrap()
            .unwrap(),
        200
    );
    fake.shutdown().await;
}

#[tokio::test]
async fn blackhole_stalls_open_watches() {
    let fake = common::fake().await;
    let rv = fake.current_resource_version();
    let resp = Raw::admin(&fake)
        .open(
            Method::GET,
            &format!("/api/v1/namespaces/default/configmaps?watch=true&resourceVersion={rv}"),
            None,
            Vec::new(),
        )
        .await;
    let mut body = resp.into_body();
    fake.blackhole();
    fake.create("v1/configmaps", json!({"metadata": {"name": "during"}}))
        .unwrap();
    let nothing = timeout(
        Duration::from_millis(300),
        read_events(&mut body, &mut Vec::new(), 1),
    )
    .await;
    assert!(nothing.is_err(), "no events while blackholed");
    fake.restore().await;
    let events = timeout(
        Duration::from_secs(2),
        read_events(&mut body, &mut Vec::new(), 1),
    )
    .await
    .unwrap();
    assert_eq!(events[0]["object"]["metadata"]["name"], "during");
    fake.shutdown().await;
}

#[tokio::test]
async fn latency_delays_every_response() {
    let fake = common::fake().await;
    let admin = Raw::admin(&fake);
    fake.set_latency(Duration::from_millis(300));
    let started = Instant::now();
    assert_eq!(admin.get("/version").await.status, 200);
    assert!(started.elapsed() >= Duration::from_millis(300));
    fake.restore().await;
    let started = Instant::now();
    admin.get("/version").await;
    assert!(started.elapsed() < Duration::from_millis(300));
    fake.shutdown().await;
}

#[tokio::test]
async fn failed_requests_get_status_bodies() {
    let fake = common::fake().await;
    let admin = Raw::admin(&fake);
    fake.fail_requests(Some(503));
    let r = admin.get("/api/v1/namespaces/default/pods").await;
    assert_eq!(r.status, 503);
    assert_eq!(r.headers["retry-after"], "1");
    let body = r.json();
    assert_eq!(
        (
            body["kind"].clone(),
            body["reason"].clone(),
            body["code"].clone()
        ),
        (json!("Status"), json!("ServiceUnavailable"), json!(503))
    );
    fake.fail_requests(Some(500));
    assert_eq!(admin.get("/version").await.status, 500);
    fake.fail_requests(None);
    assert_eq!(admin.get("/version").await.status, 200);
    let statuses: Vec<u16> = fake.requests().iter().map(|r| r.status).collect();
    assert_eq!(statuses, [503, 500, 200]);
    fake.shutdown().await;
}

#[tokio::test]
async fn requests_under_a_prefix_fail_and_the_rest_is_served() {
    let fake = common::fake().await;
    let admin = Raw::admin(&fake);
    fake.fail_requests_under("/apis/metrics.k8s.io", Some(503));
    let r = admin.get("/apis/metrics.k8s.io/v1beta1/nodes").await;
    assert_eq!(r.status, 503);
    assert_eq!(r.json()["reason"], "ServiceUnavailable");
    assert_eq!(admin.get("/readyz").await.status, 200);
    assert_eq!(
        admin.get("/api/v1/namespaces/default/pods").await.status,
        200
    );
    fake.restore().await;
    assert_ne!(
        admin.get("/apis/metrics.k8s.io/v1beta1/nodes").await.status,
        503
    );
    fake.shutdown().await;
}

#[tokio::test]
async fn cut_watches_drop_streams_without_a_clean_end() {
    let fake = common::fake().await;
    let admin = Raw::admin(&fake);
    let resp = admin
        .open(
            Method::GET,
            "/api/v1/namespaces/kube-system/pods?watch=true",
            None,
            Vec::new(),
        )
        .await;
    let mut body = resp.into_body();
    let initial = read_events(&mut body, &mut Vec::new(), 8).await;
    assert_eq!(initial.len(), 8);
    fake.cut_watches();
    let rest = timeout(Duration::from_secs(2), body.collect())
        .await
        .unwrap();
    assert!(
        rest.is_err(),
        "the chunked body ends in an error, not a final chunk"
    );
    // The server keeps serving: a new watch works.
    let again = admin
        .open(
            Method::GET,
            "/api/v1/namespaces/kube-system/pods?watch=true",
            None,
            Vec::new(),
        )
        .await;
    assert_eq!(again.status(), 200);
    fake.shutdown().await;
}

#[tokio::test]
async fn shutdown_frees_the_port() {
    let fake = common::fake().await;
    let addr = fake.addr();
    let resp = Raw::admin(&fake)
        .open(Method::GET, "/api/v1/pods?watch=true", None, Vec::new())
        .await;
    fake.shutdown().await;
    assert!(
        timeout(Duration::from_secs(2), resp.into_body().collect())
            .await
            .unwrap()
            .is_err()
    );
    assert_eq!(
        TcpStream::connect(addr).await.unwrap_err().kind(),
        std::io::ErrorKind::ConnectionRefused
    );
    let rebound = std::net::TcpListener::bind(addr);
    assert!(rebound.is_ok(), "{rebound:?}");
}
