//! What it costs that a watch's ADDED and DELETED events reach the client only once the edge
//! cache has them on disk (`outpost_proxy::edge::tee`, "Durable before forwarded"): how long one
//! DELETED event takes from the fake apiserver committing the deletion until the client holds
//! it, through the hub in edge mode over a sled cache (default options: every write flushed) and
//! through the same hub in cloud mode (no cache). The node carries 110 real-shape pods; the hub
//! runs on a runtime of its own with one worker thread, the fake and the client on another. The
//! pod is created again between rounds, untimed.
//! Run: `cargo bench -p outpost-benches --bench deleted_event`.
//!
//! - `edge_deleted/one_pod/{cache_on,cache_off}`: criterion's legs;
//! - then interleaved rounds (drift from other work on the machine hits both legs alike), whose
//!   median and p90 per leg the bench prints.

use std::fmt::Debug;
use std::time::{Duration, Instant};

use bytes::Bytes;
use criterion::{Criterion, SamplingMode, criterion_group, criterion_main};
use http_body::Body;
use http_body_util::BodyExt;
use outpost_benches::{
    HubPair, Upstream, bench_runtime, kubelet_get, kubelet_request, micros, node_pods_path,
    node_scope, percentile, plain_client, seed_pods,
};
use outpost_testkit::FakeConfig;

const ON_NODE: usize = 110;
/// Worker threads of the hub's runtime.
const HUB_WORKERS: usize = 1;
const STALL: Duration = Duration::from_secs(60);

/// Reads a watch body until a line carries both `kind` (`"type":"DELETED"`) and `name`;
/// returns when it did. Lines are not split across frames by the hub (it forwards upstream's
/// frames), but the search keeps a tail across frames anyway.
async fn read_until_event<B>(body: &mut B, kind: &str, name: &str) -> Instant
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Debug,
{
    let kind = format!(r#""type":"{kind}""#);
    let name = format!(r#""name":"{name}""#);
    let mut pending: Vec<u8> = Vec::new();
    loop {
        let frame = tokio::time::timeout(STALL, body.frame())
            .await
            .expect("watch stalled")
            .expect("watch ended")
            .expect("watch frame");
        let Some(data) = frame.data_ref() else {
            continue;
        };
        pending.extend_from_slice(data);
        while let Some(end) = pending.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = pending.drain(..=end).collect();
            let line = String::from_utf8_lossy(&line);
            if line.contains(&kind) && line.contains(&name) {
                return Instant::now();
            }
        }
    }
}

/// Time for one DELETED event, commit to client, through each leg's hub (see the module doc).
fn deleted_event_delivery(c: &mut Criterion) {
    const ROUNDS: usize = 30;
    let rt = bench_runtime();
    let upstream = rt.block_on(Upstream::start(FakeConfig::default()));
    let pods = seed_pods(&upstream.fake, ON_NODE, 0);
    let dir = tempfile::tempdir().expect("tempdir");
    let HubPair { cache, on, off } = HubPair::start(&upstream, dir.path(), HUB_WORKERS);
    let client = plain_client();
    let fake = &upstream.fake;
    let mut watches = rt.block_on(async {
        let mut watches = Vec::new();
        for hub in [&on, &off] {
            let list = kubelet_get(&client, &hub.uri(&node_pods_path())).await;
            assert_eq!(list.status, 200);
            let rv = fake.current_resource_version();
            let path = format!("{}&watch=true&resourceVersion={rv}", node_pods_path());
            let resp = client
                .request(kubelet_request(&hub.uri(&path), "application/json"))
                .await
                .expect("watch");
            assert_eq!(resp.status(), 200);
            watches.push(resp.into_body());
        }
        watches
    });
    cache.until_listed(&node_scope());
    let victim = pods[0].clone();
    let name = victim["metadata"]["name"]
        .as_str()
        .expect("name")
        .to_owned();
    let namespace = victim["metadata"]["namespace"]
        .as_str()
        .expect("namespace")
        .to_owned();
    let mut recreate = victim.clone();
    recreate["metadata"]
        .as_object_mut()
        .expect("metadata")
        .retain(|k, _| k == "name" || k == "namespace" || k == "labels");
    // One round on one leg: delete (timed until the client holds DELETED), create again (its
    // ADDED read untimed). Both watches see both events; the other leg's are read untimed too.
    let mut round = |timed: usize| -> Duration {
        let started = Instant::now();
        fake.delete("v1/pods", Some(&namespace), &name)
            .expect("delete");
        let (first, second) = watches.split_at_mut(1);
        let [timed_body, other] = match timed {
            0 => [&mut first[0], &mut second[0]],
            _ => [&mut second[0], &mut first[0]],
        };
        let delivered = rt.block_on(read_until_event(timed_body, "DELETED", &name)) - started;
        rt.block_on(read_until_event(other, "DELETED", &name));
        fake.create("v1/pods", recreate.clone()).expect("create");
        rt.block_on(read_until_event(&mut *timed_body, "ADDED", &name));
        rt.block_on(read_until_event(other, "ADDED", &name));
        delivered
    };

    let mut group = c.benchmark_group("edge_deleted");
    group.sampling_mode(SamplingMode::Flat).sample_size(10);
    for (leg, name) in [(0, "one_pod/cache_on"), (1, "one_pod/cache_off")] {
        group.bench_function(name, |b| {
            b.iter_custom(|iters| (0..iters).map(|_| round(leg)).sum())
        });
    }
    group.finish();
    let mut samples: [Vec<Duration>; 2] = [Vec::new(), Vec::new()];
    for i in 0..ROUNDS {
        for step in 0..2 {
            let leg = (i + step) % 2;
            samples[leg].push(round(leg));
        }
    }
    println!("edge_deleted interleaved, {ROUNDS} rounds per leg, commit to client:");
    for (leg, name) in [(0, "cache_on"), (1, "cache_off")] {
        let mut sorted = samples[leg].clone();
        sorted.sort();
        println!(
            "  {name:9}: median {}, p90 {}",
            micros(percentile(&sorted, 0.5)),
            micros(percentile(&sorted, 0.9))
        );
    }
    drop(watches);
    drop(client);
    on.stop();
    off.stop();
    cache.wait_released();
    rt.block_on(upstream.shutdown());
}

criterion_group!(benches, deleted_event_delivery);
criterion_main!(benches);
