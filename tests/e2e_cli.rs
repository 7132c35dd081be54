//! The binary's command line: bad flags and bad files give one clear line and exit code 2, never a
//! panic; `--help` and `--version` succeed; SIGTERM stops a running hub cleanly; the demo runs.

mod support;

use std::process::{Command, Output};
use std::time::Duration;

use outpost_testkit::TestPki;
use support::{Cluster, outpost_bin};

fn run(args: &[String]) -> Output {
    Command::new(outpost_bin())
        .args(args)
        .env_remove("RUST_LOG")
        .output()
        .expect("outpost runs")
}

/// Exit code 2, a single `outpost: error:` line on stderr that mentions `expected`, no panic.
fn assert_refused(args: &[String], expected: &str) {
    let out = run(args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(2),
        "args {args:?}\nstderr: {stderr}"
    );
    assert!(
        stderr.contains(expected),
        "expected {expected:?} in {stderr}"
    );
    assert!(
        !stderr.contains("panicked") && !stderr.contains("backtrace"),
        "{stderr}"
    );
    let error_lines: Vec<&str> = stderr.lines().filter(|l| l.contains("error")).collect();
    assert_eq!(error_lines.len(), 1, "one error line expected: {stderr}");
}

/// The reference flags, with one flag replaced or removed.
fn with(base: &[String], flag: &str, value: Option<&str>) -> Vec<String> {
    let prefix = format!("{flag}=");
    let mut args: Vec<String> = base
        .iter()
        .filter(|a| !a.starts_with(&prefix))
        .cloned()
        .collect();
    if let Some(v) = value {
        args.push(format!("{flag}={v}"));
    }
    args
}

#[tokio::test]
async fn bad_flags_exit_2_with_one_line() {
    let cluster = Cluster::start().await;
    let base = cluster.hub_args();
    assert_refused(&with(&base, "--node-name", None), "--node-name is required");
    assert_refused(
        &with(&base, "--server-addr", None),
        "--server-addr is required",
    );
    assert_refused(
        &with(&base, "--server-addr", Some("http://127.0.0.1:6443")),
        "must use https",
    );
    assert_refused(
        &with(&base, "--bootstrap-mode", Some("token")),
        "--bootstrap-mode=token is not supported yet",
    );
    assert_refused(&with(&base, "--working-mode", Some("local")), "local");
    assert_refused(&with(&base, "--lb-mode", Some("hash")), "hash");
    let mut unknown = base.clone();
    unknown.push("--no-such-flag".into());
    assert_refused(&unknown, "--no-such-flag");
}

#[tokio::test]
async fn bad_certificate_files_exit_2_naming_the_file() {
    let cluster = Cluster::start().await;
    let base = cluster.hub_args();
    let dir = cluster.dir.path();

    assert_refused(
        &with(
            &base,
            "--kubelet-client-certificate",
            Some("/nonexistent/kubelet.pem"),
        ),
        "cannot read /nonexistent/kubelet.pem",
    );

    let other = TestPki::new().unwrap();
    let a = other.client("a", &[]).unwrap();
    let b = other.client("b", &[]).unwrap();
    let mismatched = dir.join("mismatched.pem");
    std::fs::write(&mismatched, format!("{}{}", a.cert_pem, b.key_pem)).unwrap();
    assert_refused(
        &with(
            &base,
            "--kubelet-client-certificate",
            Some(mismatched.to_str().unwrap()),
        ),
        "mismatched.pem",
    );

    let garbage = dir.join("garbage-ca.crt");
    std::fs::write(&garbage, "hello\n").unwrap();
    assert_refused(
        &with(&base, "--kubelet-ca-file", Some(garbage.to_str().unwrap())),
        "garbage-ca.crt",
    );
}

#[tokio::test]
async fn uncreatable_cache_dir_exits_2() {
    let cluster = Cluster::start().await;
    let file = cluster.dir.path().join("a-file");
    std::fs::write(&file, "x").unwrap();
    let under_file = file.join("cache");
    assert_refused(
        &with(
            &cluster.hub_args(),
            "--disk-cache-path",
            Some(under_file.to_str().unwrap()),
        ),
        "--disk-cache-path: cannot create",
    );
}

#[tokio::test]
async fn busy_port_exits_2() {
    let cluster = Cluster::start().await;
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    assert_refused(
        &with(&cluster.hub_args(), "--proxy-port", Some(&port)),
        "cannot listen on",
    );
}

#[test]
fn help_and_version_succeed() {
    let help = run(&["--help".into()]);
    assert!(help.status.success());
    let text = String::from_utf8_lossy(&help.stdout);
    for flag in [
        "--server-addr",
        "--kubelet-client-certificate",
        "--kubelet-ca-file",
        "--enable-dummy-if",
        "--heartbeat-interval-seconds",
        "--enable-resource-filter",
        "--disabled-resource-filters",
        "--nodepool-name",
    ] {
        assert!(text.contains(flag), "{flag} missing from --help");
    }
    assert!(
        text.contains("the interface is not created yet"),
        "--help must say the dummy interface is not created"
    );
    let version = run(&["--version".into()]);
    assert!(version.status.success());
    assert!(String::from_utf8_lossy(&version.stdout).starts_with("outpost "));
}

#[tokio::test]
async fn sigterm_stops_the_hub_cleanly() {
    let cluster = Cluster::start().await;
    let hub = cluster.start_hub();
    let status = hub.terminate();
    assert!(status.success(), "exit status after SIGTERM: {status:?}");
}

/// Background work waiting on an apiserver that never answers (the serving certificate's
/// names, probes, side data) must not hold a stopping hub: kubelet and operators expect a
/// static pod to go within seconds, and the cache writes are drained by then.
#[tokio::test]
async fn sigterm_stops_the_hub_promptly_while_the_apiserver_hangs() {
    let cluster = Cluster::start().await;
    cluster.fake.blackhole();
    let hub = cluster.start_hub();
    // Let start-up work reach the silent apiserver.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let status = hub.terminate_within(Duration::from_secs(3));
    assert!(status.success(), "exit status after SIGTERM: {status:?}");
}

/// The README's first command: the demo runs an outage end to end and exits 0.
#[test]
fn the_demo_shows_an_outage_and_exits_0() {
    let out = run(&["demo".to_owned()]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "demo failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for step in [
        "served from the edge cache",
        "kubelet still sees: web-0, web-1",
        "kubelet sees: web-0, web-2 (web-0 version=v2)",
        "demo finished: every step behaved as expected",
    ] {
        assert!(stdout.contains(step), "missing {step:?} in:\n{stdout}");
    }
}
