//! The binary's command line: bad flags and bad files give one clear line and exit code 2, never a
//! panic; `--help` and `--version` succeed; SIGTERM stops a running hub cleanly; the demo runs.

mod support;

use std::os::unix::fs::PermissionsExt;
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
    let token_mode = with(&base, "--bootstrap-mode", Some("token"));
    assert_refused(
        &token_mode,
        "--bootstrap-mode=token needs --join-token or --bootstrap-file",
    );
    let with_token = with(&token_mode, "--join-token", Some("abcdef.0123456789abcdef"));
    assert_refused(&with_token, "needs --discovery-token-ca-cert-hash");
    assert_refused(
        &with(&token_mode, "--join-token", Some("not-a-token")),
        "--join-token: a bootstrap token has the form",
    );
    assert_refused(&with(&base, "--working-mode", Some("local")), "local");
    assert_refused(&with(&base, "--lb-mode", Some("hash")), "hash");
    for ip in ["169.254.1.1", "169.254.31.7", "10.0.0.1"] {
        assert_refused(&with(&base, "--dummy-if-ip", Some(ip)), "--dummy-if-ip");
    }
    assert_refused(
        &with(&base, "--dummy-if-name", Some("a-name-of-16-chr")),
        "longer than 15 characters",
    );
    assert_refused(
        &with(&base, "--min-request-timeout", Some("0s")),
        "--min-request-timeout",
    );
    assert_refused(
        &with(&base, "--min-request-timeout", Some("soon")),
        "--min-request-timeout",
    );
    let electing = with(&base, "--enable-pool-leader-election", Some("true"));
    assert_refused(
        &with(&electing, "--pool-leader-replicas", Some("0")),
        "--pool-leader-replicas must be at least 1",
    );
    let mut unknown = base.clone();
    unknown.push("--no-such-flag".into());
    assert_refused(&unknown, "--no-such-flag");
}

/// yurthub's whole flag table (`cmd/yurthub/app/options/options.go`), spelled out at its
/// defaults as an operator's manifest may have it: the hub starts with it unchanged. The flags
/// for features Outpost does not have are named in one warning when they are set otherwise.
#[tokio::test]
async fn a_yurthub_command_line_starts_unchanged() {
    let cluster = Cluster::start().await;
    let defaults = [
        "--working-mode=edge",
        "--bind-address=127.0.0.1",
        "--bind-proxy-address=127.0.0.1",
        "--namespace=kube-system",
        "--lb-mode=rr",
        "--heartbeat-failed-retry=3",
        "--heartbeat-healthy-threshold=2",
        "--heartbeat-timeout-seconds=2",
        "--kubelet-health-grace-period=40s",
        "--bootstrap-file=",
        "--join-token=",
        "--discovery-token-ca-cert-hash=",
        "--discovery-token-unsafe-skip-ca-verification=false",
        "--hub-cert-organizations=",
        "--gc-frequency=120",
        "--enable-resource-filter=true",
        "--disabled-resource-filters=",
        "--dummy-if-ip=",
        "--dummy-if-name=hub-dummy0",
        "--enable-node-pool=true",
        "--enable-pool-service-topology=false",
        "--min-request-timeout=1800s",
        "--pool-scope-resources=/v1/services,discovery.k8s.io/v1/endpointslices",
        "--host-control-plane-address=",
        "--profiling=true",
        "--max-requests-in-flight=250",
        "--enable-iptables=false",
        "--multiplexer-port=10269",
        "--node-ip=",
    ];
    let mut args = cluster.hub_args();
    args.extend(defaults.map(String::from));
    let hub = cluster.start_hub_with(&args);
    let node = support::get(hub.proxy, "/api/v1/nodes/edge-1", "kubelet/v1.32.0").await;
    assert_eq!(node.status, 200, "{}", String::from_utf8_lossy(&node.body));
    let log = hub.log_text();
    assert!(!log.contains("have no effect"), "{log}");
    drop(hub);

    let mut args: Vec<String> = args
        .into_iter()
        .filter(|a| !a.starts_with("--max-requests-in-flight=") && !a.starts_with("--profiling="))
        .collect();
    args.extend([
        "--max-requests-in-flight=100".into(),
        "--profiling=false".into(),
    ]);
    let hub = cluster.start_hub_with(&args);
    let log = hub.log_text();
    let warning: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("have no effect"))
        .collect();
    assert_eq!(warning.len(), 1, "{log}");
    assert!(
        warning[0].contains("--profiling=false --max-requests-in-flight=100"),
        "{}",
        warning[0]
    );
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
        "--client-header-timeout",
        "--client-idle-timeout",
        "--max-connections-per-port",
    ] {
        assert!(text.contains(flag), "{flag} missing from --help");
    }
    assert!(
        text.contains("needs CAP_NET_ADMIN"),
        "--help must say what the dummy interface needs"
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

/// `kill -USR1`, which operators send yurthub for a dump, writes the hub's state to yurthub's
/// file and leaves the hub serving (unhandled, SIGUSR1 ends a process).
#[tokio::test]
async fn sigusr1_dumps_the_state_where_yurthub_writes_its_stacks_and_the_hub_serves_on() {
    let cluster = Cluster::start().await;
    let mut hub = cluster.start_hub();
    let node = support::get(hub.proxy, "/api/v1/nodes/edge-1", "kubelet/v1.32.4").await;
    assert_eq!(node.status, 200);
    // A ready hub's dump (until its configuration is read, readiness says so).
    support::until_ready(&hub, "readyz check passed").await;
    let dump = cluster
        .dir
        .path()
        .join(format!("root/yurthub.{}.stacks.log", hub.pid()));
    hub.signal("USR1");
    let written = support::eventually(Duration::from_secs(5), || dump.is_file()).await;
    assert!(written, "no {}; log:\n{}", dump.display(), hub.log_text());
    // Written in one go after the file is created: wait for its last section.
    let mut text = String::new();
    let complete = support::eventually(Duration::from_secs(5), || {
        text = std::fs::read_to_string(&dump).unwrap_or_default();
        text.contains("== metrics")
    })
    .await;
    assert!(complete, "{text}");
    for needle in [
        &format!("pid {}", hub.pid()),
        "[+]",
        "readyz check passed",
        "tokio-r",
        "alive tasks",
        // The GET above, counted.
        "outpost_requests_total",
    ] {
        assert!(text.contains(needle), "{needle:?} not in the dump:\n{text}");
    }
    assert!(!hub.exited(), "SIGUSR1 ended the hub");
    let again = support::get(hub.proxy, "/api/v1/nodes/edge-1", "kubelet/v1.32.4").await;
    assert_eq!(again.status, 200);
    assert!(
        hub.log_text().contains("state dumped"),
        "{}",
        hub.log_text()
    );
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

/// The reference flags in token mode: a join token and the CA pin instead of kubelet's files.
fn token_mode_args(cluster: &Cluster, token: &str, pin: &str) -> Vec<String> {
    let mut args: Vec<String> = cluster
        .hub_args()
        .into_iter()
        .filter(|a| !a.starts_with("--bootstrap-mode=") && !a.starts_with("--kubelet-c"))
        .collect();
    args.extend([
        "--bootstrap-mode=token".to_owned(),
        format!("--join-token={token}"),
        format!("--discovery-token-ca-cert-hash={pin}"),
    ]);
    args
}

/// A cluster with the bootstrap token `token` published, the token, and the CA's pin.
async fn token_cluster(token: &'static str) -> (Cluster, &'static str, String) {
    let cluster = Cluster::start().await;
    cluster
        .fake
        .add_bootstrap_token(token)
        .expect("bootstrap token");
    let pins = outpost_certs::bootstrap::ca_cert_hashes(cluster.fake.pki().ca_pem.as_bytes())
        .expect("CA hash");
    (cluster, token, pins[0].clone())
}

/// yurthub's default mode: the hub discovers the CA from `cluster-info` (signature and pin
/// checked), gets its own client certificate by CSR with the bootstrap token, proxies as
/// `system:node:<node>` in its groups and `--hub-cert-organizations`, and on the next start
/// uses the kept certificate, with the cloud gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_mode_bootstraps_a_client_certificate_and_keeps_it() {
    let (cluster, token, pin) = token_cluster("abcdef.0123456789abcdef").await;

    let other_ca = TestPki::new().unwrap();
    let wrong_pin =
        &outpost_certs::bootstrap::ca_cert_hashes(other_ca.ca_pem.as_bytes()).unwrap()[0];
    assert_refused(
        &token_mode_args(&cluster, token, wrong_pin),
        "does not match --discovery-token-ca-cert-hash",
    );
    let root = cluster.dir.path().join("root");
    assert!(!root.join("pki/yurthub-current.pem").exists());

    let mut args = token_mode_args(&cluster, token, &pin);
    args.push("--hub-cert-organizations=openyurt:tenant:ns1".into());
    let hub = cluster.start_hub_with(&args);
    let pem = root.join("pki/yurthub-current.pem");
    let mode = std::fs::metadata(&pem)
        .expect("kept certificate")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    cluster.fake.clear_requests();
    let node = support::get(hub.proxy, "/api/v1/nodes/edge-1", "kubelet/v1.32.0").await;
    assert_eq!(node.status, 200, "{}", String::from_utf8_lossy(&node.body));
    let users: Vec<String> = cluster
        .fake
        .requests()
        .into_iter()
        .filter(|r| r.path == "/api/v1/nodes/edge-1")
        .map(|r| format!("{} {:?}", r.user, r.groups))
        .collect();
    assert!(
        users.iter().any(|u| u.starts_with("system:node:edge-1 ")
            && ["openyurt:yurthub", "system:nodes", "openyurt:tenant:ns1"]
                .iter()
                .all(|group| u.contains(&format!("{group:?}")))),
        "{users:?}"
    );
    drop(hub);

    let kept = std::fs::read(&pem).unwrap();
    cluster.fake.refuse_connections();
    let hub = cluster.start_hub_with(&args);
    assert!(
        hub.log_text()
            .contains("client certificate from an earlier bootstrap")
    );
    assert_eq!(
        std::fs::read(&pem).unwrap(),
        kept,
        "no new certificate was asked for"
    );
    drop(hub);
    cluster.fake.restore().await;
}

/// A certificate the hub obtained itself is renewed after 80 % of its lifetime, with a CSR
/// the current certificate authenticates, and presented from then on without a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_mode_renews_its_client_certificate_before_it_expires() {
    let (cluster, token, pin) = token_cluster("abcdef.0123456789abcdef").await;
    let pki = cluster.fake.pki();
    // Kept from an earlier start: valid for one more minute, so past 80 % of its lifetime (the
    // signer dates it 5 minutes back).
    let draft = outpost_certs::bootstrap::draft_client_csr(support::NODE, &[]).expect("csr");
    let usages = ["digital signature", "key encipherment", "client auth"];
    let short = pki
        .sign_csr_with_usages(&draft.csr_pem, &usages, Duration::from_secs(6 * 60))
        .expect("signed");
    let pem = cluster.dir.path().join("root/pki/yurthub-current.pem");
    std::fs::create_dir_all(pem.parent().unwrap()).unwrap();
    std::fs::write(&pem, format!("{short}{}", draft.key_pem)).unwrap();
    std::fs::write(pem.with_file_name("ca.crt"), &pki.ca_pem).unwrap();

    let hub = cluster.start_hub_with(&token_mode_args(&cluster, token, &pin));
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !hub.log_text().contains("client certificate rotated") {
        assert!(
            std::time::Instant::now() < deadline,
            "no rotation; log:\n{}",
            hub.log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let log = hub.log_text();
    assert!(
        log.contains("client certificate from an earlier bootstrap"),
        "{log}"
    );
    assert!(log.contains("client certificate renewed"), "{log}");
    let renewed = outpost_certs::UpstreamTls::load(&pem, &pem.with_file_name("ca.crt"))
        .expect("the renewed file loads");
    let left = renewed
        .identity
        .not_after
        .duration_since(std::time::SystemTime::now())
        .unwrap_or_default();
    assert!(left > Duration::from_secs(300 * 24 * 3600), "{left:?}");
    assert_eq!(renewed.identity.user, "system:node:edge-1");
    let node = support::get(hub.proxy, "/api/v1/nodes/edge-1", "kubelet/v1.32.0").await;
    assert_eq!(node.status, 200, "{}", String::from_utf8_lossy(&node.body));
}

/// yurtadm's way: `--bootstrap-file` names a kubeconfig with the server, the CA and the token;
/// no discovery, the pin still checked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_mode_takes_a_bootstrap_file() {
    let (cluster, token, pin) = token_cluster("fedcba.fedcba9876543210").await;
    let conf = cluster.dir.path().join("bootstrap-hub.conf");
    let ca = cluster.node_files.ca_crt.display();
    std::fs::write(
        &conf,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {}\n    certificate-authority: {ca}\nusers:\n- name: u\n  user:\n    token: {token}\n",
            cluster.fake.url()
        ),
    )
    .expect("bootstrap file");
    let mut args: Vec<String> = token_mode_args(&cluster, token, &pin)
        .into_iter()
        .filter(|a| !a.starts_with("--join-token="))
        .collect();
    args.push(format!("--bootstrap-file={}", conf.display()));
    let hub = cluster.start_hub_with(&args);
    assert!(hub.log_text().contains("client certificate issued"));
    let node = support::get(hub.proxy, "/api/v1/nodes/edge-1", "kubelet/v1.32.0").await;
    assert_eq!(node.status, 200, "{}", String::from_utf8_lossy(&node.body));
}

/// A node moved to another cluster: what the earlier bootstrap kept (its CA, its certificate,
/// its bootstrap kubeconfig) is the old cluster's, so the hub drops it and bootstraps again
/// instead of presenting a certificate the new apiserver does not trust.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_mode_bootstraps_again_on_a_node_moved_to_another_cluster() {
    let (cluster, token, pin) = token_cluster("abcdef.0123456789abcdef").await;
    let old = TestPki::new().unwrap();
    let draft = outpost_certs::bootstrap::draft_client_csr(support::NODE, &[]).expect("csr");
    let usages = ["digital signature", "key encipherment", "client auth"];
    let old_cert = old
        .sign_csr_with_usages(&draft.csr_pem, &usages, Duration::from_secs(3600))
        .expect("signed");
    let pki = cluster.dir.path().join("root/pki");
    std::fs::create_dir_all(&pki).unwrap();
    std::fs::write(
        pki.join("yurthub-current.pem"),
        format!("{old_cert}{}", draft.key_pem),
    )
    .unwrap();
    std::fs::write(pki.join("ca.crt"), &old.ca_pem).unwrap();

    let hub = cluster.start_hub_with(&token_mode_args(&cluster, token, &pin));
    let log = hub.log_text();
    assert!(log.contains("belongs to another cluster"), "{log}");
    assert!(log.contains("client certificate issued"), "{log}");
    let node = support::get(hub.proxy, "/api/v1/nodes/edge-1", "kubelet/v1.32.0").await;
    assert_eq!(node.status, 200, "{}", String::from_utf8_lossy(&node.body));
    assert_eq!(
        std::fs::read_to_string(pki.join("ca.crt")).unwrap(),
        cluster.fake.pki().ca_pem
    );
}

/// yurthub's `/v1/token` on the admin port: a new join token rewrites the bootstrap conf, and
/// a client certificate that is gone (or expired) is obtained again at once with it. Bad
/// bodies and unknown tokens are refused and change nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v1_token_rejoins_with_a_new_bootstrap_token() {
    let (cluster, token, pin) = token_cluster("abcdef.0123456789abcdef").await;
    let renewed = "bcdefa.123456789abcdef0";
    cluster
        .fake
        .add_bootstrap_token(renewed)
        .expect("second token");
    let hub = cluster.start_hub_with(&token_mode_args(&cluster, token, &pin));
    let root = cluster.dir.path().join("root");
    let conf = root.join("bootstrap-hub.conf");
    let conf_text = || std::fs::read_to_string(&conf).expect("bootstrap conf");
    assert!(conf_text().contains(token));

    let rejoin = format!(r#"{{"jointoken":"{renewed}"}}"#);
    let answer = support::send_json(hub.admin, "POST", "/v1/token", &rejoin).await;
    assert_eq!(
        answer.status,
        200,
        "{}",
        String::from_utf8_lossy(&answer.body)
    );
    assert!(conf_text().contains(renewed), "{}", conf_text());
    assert!(!conf_text().contains(token));

    for (body, method, status) in [
        (r#"{"token":"x"}"#, "POST", 400),
        ("not json", "PUT", 400),
        (r#"{"jointoken":"abc"}"#, "POST", 500),
        (r#"{"jointoken":"cccccc.cccccccccccccccc"}"#, "PUT", 500),
        ("", "GET", 405),
    ] {
        let answer = support::send_json(hub.admin, method, "/v1/token", body).await;
        assert_eq!(
            answer.status,
            status,
            "{method} {body}: {}",
            String::from_utf8_lossy(&answer.body)
        );
        assert!(
            conf_text().contains(renewed),
            "{method} {body} changed the conf"
        );
    }

    let pem = root.join("pki/yurthub-current.pem");
    std::fs::remove_file(&pem).expect("kept certificate");
    let answer = support::send_json(hub.admin, "PUT", "/v1/token", &rejoin).await;
    let text = String::from_utf8_lossy(&answer.body).into_owned();
    assert_eq!(answer.status, 200, "{text}");
    assert!(text.contains("client certificate issued"), "{text}");
    let issued = outpost_certs::UpstreamTls::load(&pem, &pem.with_file_name("ca.crt"))
        .expect("the new certificate loads");
    assert_eq!(issued.identity.user, "system:node:edge-1");
    let node = support::get(hub.proxy, "/api/v1/nodes/edge-1", "kubelet/v1.32.0").await;
    assert_eq!(node.status, 200, "{}", String::from_utf8_lossy(&node.body));
}

/// The README's first command: the demo runs an outage end to end and exits 0.
#[cfg(feature = "demo")]
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
