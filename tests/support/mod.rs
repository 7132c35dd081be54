//! Shared helpers of the end-to-end tests: a fake cluster, the real `outpost` binary as a child
//! process, kubeconfigs and kubectl, and a raw HTTP/1.1 client for byte-level checks.
//!
//! Every process a test starts is owned by a guard that kills it on drop.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use outpost_testkit::{FakeApiServer, FakeConfig, NodeCertFiles};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

pub const NODE: &str = "edge-1";
pub const ADMIN_TOKEN: &str = "admin-token-for-tests";

/// The binary under test, built by cargo for this test target.
pub fn outpost_bin() -> &'static str {
    env!("CARGO_BIN_EXE_outpost")
}

/// A fake apiserver plus the node's certificate files in a temporary directory.
pub struct Cluster {
    pub fake: FakeApiServer,
    pub dir: tempfile::TempDir,
    pub node_files: NodeCertFiles,
}

impl Cluster {
    pub async fn start() -> Cluster {
        Cluster::start_with(FakeConfig::default()).await
    }

    pub async fn start_with(config: FakeConfig) -> Cluster {
        let fake = FakeApiServer::start(config)
            .await
            .expect("fake apiserver starts");
        fake.add_token(ADMIN_TOKEN, "admin", &["system:masters"]);
        // As in a real cluster, the hub's own RBAC is installed next to the Node authorizer.
        fake.apply_rbac(&hub_rbac()).expect("hub RBAC applies");
        let dir = tempfile::tempdir().expect("tempdir");
        let node_files = fake
            .pki()
            .write_node_files(&dir.path().join("pki"), NODE)
            .expect("node cert files");
        Cluster {
            fake,
            dir,
            node_files,
        }
    }

    /// The flags of the reference command line, with ports picked by the OS.
    pub fn hub_args(&self) -> Vec<String> {
        let d = self.dir.path();
        vec![
            format!("--server-addr={}", self.fake.url()),
            format!("--node-name={NODE}"),
            "--nodepool-name=pool-a".into(),
            "--bootstrap-mode=kubeletcertificate".into(),
            format!(
                "--kubelet-client-certificate={}",
                self.node_files.client_pem.display()
            ),
            format!("--kubelet-ca-file={}", self.node_files.ca_crt.display()),
            "--proxy-port=0".into(),
            "--serve-port=0".into(),
            format!("--root-dir={}", d.join("root").display()),
            format!("--disk-cache-path={}", d.join("cache").display()),
            "--enable-dummy-if=false".into(),
            // Tests run in parallel: each hub's secure port is picked by the OS.
            "--proxy-secure-port=0".into(),
            // Fast probes keep outage and recovery tests short; no kubelet health endpoint here.
            "--heartbeat-interval-seconds=1".into(),
            "--kubelet-healthz-url=".into(),
            "--v=2".into(),
        ]
    }

    /// Starts the real binary against this cluster and waits until it serves.
    pub fn start_hub(&self) -> HubProcess {
        self.start_hub_with(&self.hub_args())
    }

    /// Starts the real binary with [`Cluster::hub_args`], `extra` flags replacing the same flags.
    pub fn start_hub_with_flags(&self, extra: &[&str]) -> HubProcess {
        let flag = |a: &str| a.split('=').next().unwrap_or(a).to_owned();
        let overridden: Vec<String> = extra.iter().map(|a| flag(a)).collect();
        let mut args: Vec<String> = self
            .hub_args()
            .into_iter()
            .filter(|a| !overridden.contains(&flag(a)))
            .collect();
        args.extend(extra.iter().map(|s| (*s).to_owned()));
        HubProcess::spawn(&args)
    }

    /// Starts the real binary with `args` (usually [`Cluster::hub_args`] changed).
    pub fn start_hub_with(&self, args: &[String]) -> HubProcess {
        HubProcess::spawn(args)
    }
}

/// The `outpost` binary running as a child process; killed on drop.
pub struct HubProcess {
    child: Child,
    pub proxy: SocketAddr,
    pub admin: SocketAddr,
    /// The secure port for in-cluster clients.
    pub secure: SocketAddr,
    /// Everything the hub wrote to stderr so far (one log line per entry).
    pub log: Arc<Mutex<Vec<String>>>,
}

impl HubProcess {
    pub fn spawn(args: &[String]) -> HubProcess {
        Self::spawn_wrapped(&[], args)
    }

    /// The binary run by `wrapper` (a command that execs its arguments, such as `setpriv …`),
    /// so that the hub keeps the wrapper's pid.
    pub fn spawn_wrapped(wrapper: &[&str], args: &[String]) -> HubProcess {
        let mut command = match wrapper.split_first() {
            Some((program, wrapper_args)) => {
                let mut c = Command::new(program);
                c.args(wrapper_args).arg(outpost_bin());
                c
            }
            None => Command::new(outpost_bin()),
        };
        let mut child = command
            .args(args)
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("outpost starts");
        let stderr = child.stderr.take().expect("piped stderr");
        let log = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let sink = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if line.contains("ready to serve") {
                    let _ = tx.send(line.clone());
                }
                sink.lock().unwrap().push(line);
            }
        });
        let ready = match rx.recv_timeout(Duration::from_secs(20)) {
            Ok(line) => line,
            Err(_) => {
                let _ = child.kill();
                panic!(
                    "hub did not start; log:\n{}",
                    log.lock().unwrap().join("\n")
                );
            }
        };
        HubProcess {
            child,
            proxy: field_addr(&ready, "proxy="),
            admin: field_addr(&ready, "admin="),
            secure: field_addr(&ready, "secure="),
            log,
        }
    }

    pub fn proxy_url(&self) -> String {
        format!("http://{}", self.proxy)
    }

    pub fn log_text(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }

    /// The log once one of its lines satisfies `found`, or as it stands after `within` (for the
    /// caller's assertion to show): the hub's output reaches the test through a reader thread,
    /// a moment after the hub wrote it.
    pub async fn log_once(&self, found: impl Fn(&str) -> bool, within: Duration) -> String {
        let deadline = Instant::now() + within;
        loop {
            let log = self.log_text();
            if log.lines().any(&found) || Instant::now() >= deadline {
                return log;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Sends `signal` (`USR1`, `TERM`…) to the hub.
    pub fn signal(&self, signal: &str) {
        let sent = Command::new("kill")
            .args([format!("-{signal}"), self.pid().to_string()])
            .status()
            .expect("kill runs");
        assert!(sent.success(), "kill -{signal}");
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether the process has exited (reaping it if so).
    pub fn exited(&mut self) -> bool {
        self.child.try_wait().expect("wait").is_some()
    }

    /// SIGTERM, then wait (bounded) for a clean exit; returns the exit status.
    pub fn terminate(self) -> std::process::ExitStatus {
        self.terminate_within(Duration::from_secs(10))
    }

    /// SIGTERM, then wait until the hub exits; panics (with its log) if that takes over `bound`.
    pub fn terminate_within(mut self, bound: Duration) -> std::process::ExitStatus {
        self.signal("TERM");
        let deadline = Instant::now() + bound;
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "hub did not exit within {bound:?} of SIGTERM; log:\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for HubProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // A failing test shows what the hub said (the test harness prints captured output).
        if std::thread::panicking() {
            eprintln!("--- the hub's log ---\n{}", self.log_text());
        }
    }
}

fn field_addr(line: &str, key: &str) -> SocketAddr {
    let start = line.find(key).unwrap_or_else(|| panic!("{key} in {line}")) + key.len();
    let value: String = line[start..]
        .chars()
        .take_while(|c| !c.is_whitespace())
        .collect();
    value
        .parse()
        .unwrap_or_else(|_| panic!("address in {line}"))
}

/// A kube-rs client through the hub. kube-rs sends no User-Agent by default; the hub keys the
/// caller's component on it, so every test client names one.
pub fn kube_client(hub: &HubProcess, user_agent: &'static str) -> kube::Client {
    let mut config = kube::Config::new(hub.proxy_url().parse().expect("hub url"));
    config.headers.push((
        http::header::USER_AGENT,
        http::HeaderValue::from_static(user_agent),
    ));
    kube::Client::try_from(config).expect("kube client")
}

/// A kubeconfig for the hub: `http://` server and no credentials, like the node's kubelet.conf.
pub fn hub_kubeconfig(dir: &Path, hub: &HubProcess) -> PathBuf {
    let path = dir.join(format!("hub-{}.kubeconfig", hub.proxy.port()));
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: hub\n  cluster:\n    server: {}\n\
         contexts:\n- name: hub\n  context: {{cluster: hub, user: node, namespace: default}}\n\
         users:\n- name: node\n  user: {{}}\ncurrent-context: hub\n",
        hub.proxy_url()
    );
    std::fs::write(&path, text).expect("write kubeconfig");
    path
}

/// Runs kubectl with `kubeconfig` and a private cache dir; bounded by `--request-timeout`.
pub fn kubectl(kubeconfig: &Path, args: &[&str]) -> Output {
    let cache = kubeconfig.with_extension("cache");
    Command::new("kubectl")
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .arg(format!("--cache-dir={}", cache.display()))
        .arg("--request-timeout=20s")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("kubectl runs")
}

pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn assert_ok(out: &Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what} failed: {}\nstdout: {}",
        String::from_utf8_lossy(&out.stderr),
        stdout(out)
    );
    stdout(out)
}

/// A raw HTTP/1.1 exchange: exactly `request` bytes out, everything until EOF back.
pub async fn raw_http(addr: SocketAddr, request: &[u8]) -> RawResponse {
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    stream.write_all(request).await.expect("write");
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), stream.read_to_end(&mut buf))
        .await
        .expect("response within 30s")
        .expect("read");
    RawResponse::parse(&buf)
}

/// `method path` with a JSON `body` (none when empty) and `Connection: close`, to `addr`.
pub async fn send_json(addr: SocketAddr, method: &str, path: &str, body: &str) -> RawResponse {
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    raw_http(addr, req.as_bytes()).await
}

/// What a Kubernetes 1.32 kubelet sends with every request.
pub const KUBELET_UA: &str = "kubelet/v1.32.4 (linux/amd64) kubernetes/e2e";
pub const KUBELET_ACCEPT: &str = "application/vnd.kubernetes.protobuf,application/json";

/// A kubelet write: `object` as a protobuf body (kubelet's `contentType`), or for a PATCH the
/// strategic-merge JSON kubelet sends, with kubelet's headers.
pub async fn kubelet_send(
    addr: SocketAddr,
    method: &str,
    path: &str,
    object: &serde_json::Value,
) -> RawResponse {
    let (content_type, body) = if method == "PATCH" {
        (
            "application/strategic-merge-patch+json",
            object.to_string().into_bytes(),
        )
    } else {
        (
            outpost_core::wire::PROTOBUF,
            outpost_core::wire::protobuf::encode_object(object).expect("a kind kubelet writes"),
        )
    };
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nUser-Agent: {KUBELET_UA}\r\nAccept: {KUBELET_ACCEPT}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    req.extend_from_slice(&body);
    raw_http(addr, &req).await
}

/// A kubelet GET, with kubelet's headers (protobuf preferred, gzip accepted).
pub async fn kubelet_get(addr: SocketAddr, path: &str) -> RawResponse {
    let req = format!(
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nUser-Agent: {KUBELET_UA}\r\nAccept: {KUBELET_ACCEPT}\r\nAccept-Encoding: gzip\r\nConnection: close\r\n\r\n"
    );
    raw_http(addr, req.as_bytes()).await
}

/// `GET path` with `Connection: close`, through `addr`.
pub async fn get(addr: SocketAddr, path: &str, user_agent: &str) -> RawResponse {
    let req = format!(
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nUser-Agent: {user_agent}\r\nAccept: application/json\r\nConnection: close\r\n\r\n"
    );
    raw_http(addr, req.as_bytes()).await
}

/// A parsed (de-chunked) HTTP/1.1 response.
#[derive(Debug)]
pub struct RawResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl RawResponse {
    pub fn parse(buf: &[u8]) -> RawResponse {
        let split = buf
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .unwrap_or_else(|| panic!("no header end in {:?}", String::from_utf8_lossy(buf)));
        let head = String::from_utf8_lossy(&buf[..split]).into_owned();
        let mut lines = head.split("\r\n");
        let status = lines
            .next()
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|c| c.parse().ok())
            .expect("status line");
        let headers: Vec<(String, String)> = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
            .collect();
        let raw_body = &buf[split + 4..];
        let chunked = headers
            .iter()
            .any(|(k, v)| k == "transfer-encoding" && v.contains("chunked"));
        let body = if chunked {
            dechunk(raw_body)
        } else {
            raw_body.to_vec()
        };
        RawResponse {
            status,
            headers,
            body,
        }
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The body as JSON, whether it came as JSON or as Kubernetes protobuf.
    pub fn object(&self) -> serde_json::Value {
        outpost_core::wire::read_body(self.header("content-type"), &self.body).unwrap_or_else(|e| {
            panic!(
                "{} body is not an object ({e}): {:?}",
                self.status,
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "body is not JSON ({e}): {:?}",
                String::from_utf8_lossy(&self.body)
            )
        })
    }
}

fn dechunk(mut raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(line_end) = raw.windows(2).position(|w| w == b"\r\n") {
        let size_text = String::from_utf8_lossy(&raw[..line_end]);
        let size = usize::from_str_radix(size_text.split(';').next().unwrap_or("0").trim(), 16)
            .unwrap_or(0);
        raw = &raw[line_end + 2..];
        if size == 0 || raw.len() < size {
            break;
        }
        out.extend_from_slice(&raw[..size]);
        raw = &raw[(size + 2).min(raw.len())..];
    }
    out
}

/// The `namespace/name` of every item of a list, sorted.
pub fn names(list: &serde_json::Value) -> Vec<String> {
    let mut names: Vec<String> = list["items"]
        .as_array()
        .unwrap_or_else(|| panic!("not a list: {list}"))
        .iter()
        .map(|i| {
            format!(
                "{}/{}",
                i["metadata"]["namespace"].as_str().unwrap_or(""),
                i["metadata"]["name"].as_str().unwrap_or("")
            )
        })
        .collect();
    names.sort();
    names
}

/// Reads an HTTP/1.1 response head byte by byte (the bytes after it belong to a tunnel).
pub async fn read_head<S: tokio::io::AsyncRead + Unpin>(stream: &mut S) -> String {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        let n = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut byte))
            .await
            .expect("head within 10s")
            .unwrap();
        assert_eq!(n, 1, "connection closed before the response head");
        head.push(byte[0]);
    }
    String::from_utf8_lossy(&head).into_owned()
}

/// Through an open tunnel to the fake's echoing `exec`: what goes in comes back, twice.
pub async fn assert_echoes<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
    stream: &mut S,
) {
    for msg in [&b"ping"[..], &b"second frame"[..]] {
        stream.write_all(msg).await.unwrap();
        let mut echoed = vec![0u8; msg.len()];
        tokio::time::timeout(Duration::from_secs(5), stream.read_exact(&mut echoed))
            .await
            .expect("echo within 5s")
            .unwrap();
        assert_eq!(echoed, msg);
    }
}

/// Polls `/v1/readyz?verbose` (bounded) until it answers 200 with `needle` in its body; returns
/// the body.
pub async fn until_ready(hub: &HubProcess, needle: &str) -> String {
    let mut body = String::new();
    for _ in 0..150 {
        let resp = get(hub.admin, "/v1/readyz?verbose", "test").await;
        body = String::from_utf8_lossy(&resp.body).into_owned();
        if resp.status == 200 && body.contains(needle) {
            return body;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("readyz never 200 with {needle:?}:\n{body}");
}

/// Polls `cond` every 50 ms until it holds or `timeout` passes.
pub async fn eventually(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if cond() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    cond()
}

/// Whether a watch `stream` ends within `within` without an object change (bookmarks may come):
/// what a client sees when the hub ends a watch on purpose. An object change panics.
pub async fn ends_without_changes<K, S>(stream: &mut S, within: Duration) -> bool
where
    S: futures_util::Stream<Item = kube::Result<kube::api::WatchEvent<K>>> + Unpin,
{
    use futures_util::StreamExt;
    use kube::api::WatchEvent;
    tokio::time::timeout(within, async {
        while let Some(event) = stream.next().await {
            if let Ok(WatchEvent::Added(_) | WatchEvent::Modified(_) | WatchEvent::Deleted(_)) =
                event
            {
                panic!("no object changes expected: the stream should only end");
            }
        }
    })
    .await
    .is_ok()
}

/// The hub's `/metrics` text.
pub async fn metrics_text(hub: &HubProcess) -> String {
    String::from_utf8_lossy(&get(hub.admin, "/metrics", "test").await.body).into_owned()
}

/// The value of one series, its name and labels written exactly as exposed, in a Prometheus
/// text exposition; `None` when the series is not there.
pub fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

/// A TLS client that trusts only the cluster CA, as a pod's service-account `ca.crt` does.
pub fn tls_client(ca_pem: &str) -> tokio_rustls::TlsConnector {
    tls_client_as(ca_pem, None)
}

/// [`tls_client`], presenting `client` (a certificate and its key) when given.
pub fn tls_client_as(
    ca_pem: &str,
    client: Option<&outpost_testkit::CertPair>,
) -> tokio_rustls::TlsConnector {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    let builder = rustls::ClientConfig::builder().with_root_certificates(roots);
    let config = match client {
        Some(pair) => {
            let chain = CertificateDer::pem_slice_iter(pair.cert_pem.as_bytes())
                .collect::<Result<Vec<_>, _>>()
                .unwrap();
            let key = PrivateKeyDer::from_pem_slice(pair.key_pem.as_bytes()).unwrap();
            builder.with_client_auth_cert(chain, key).unwrap()
        }
        None => builder.with_no_client_auth(),
    };
    tokio_rustls::TlsConnector::from(Arc::new(config))
}

/// `GET path` over TLS to `addr` (verified as the IP address it is), `Connection: close`.
pub async fn https_get(
    addr: SocketAddr,
    ca_pem: &str,
    path: &str,
    user_agent: &str,
    token: Option<&str>,
) -> Result<RawResponse, String> {
    https_get_with(tls_client(ca_pem), addr, path, user_agent, token).await
}

/// [`https_get`] through `connector` (which may present a client certificate).
pub async fn https_get_with(
    connector: tokio_rustls::TlsConnector,
    addr: SocketAddr,
    path: &str,
    user_agent: &str,
    token: Option<&str>,
) -> Result<RawResponse, String> {
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let name = rustls::pki_types::ServerName::IpAddress(addr.ip().into());
    let mut tls = connector
        .connect(name, tcp)
        .await
        .map_err(|e| format!("TLS handshake: {e}"))?;
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    let req = format!(
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nUser-Agent: {user_agent}\r\nAccept: application/json\r\n{auth}Connection: close\r\n\r\n"
    );
    tls.write_all(req.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut buf = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(30), tls.read_to_end(&mut buf)).await;
    // The server may close without close_notify after `Connection: close`; what was read counts.
    match read {
        Ok(Ok(_)) => {}
        Ok(Err(e)) if !buf.is_empty() => eprintln!("read ended with {e}"),
        Ok(Err(e)) => return Err(e.to_string()),
        Err(_) => return Err("no answer within 30 s".into()),
    }
    Ok(RawResponse::parse(&buf))
}

/// Waits (bounded) until the secure port completes a TLS handshake with a certificate the
/// cluster CA vouches for.
pub async fn until_certified(hub: &HubProcess, ca_pem: &str) {
    for _ in 0..200 {
        if https_get(hub.secure, ca_pem, "/version", "probe", Some(ADMIN_TOKEN))
            .await
            .is_ok()
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!(
        "the secure port never presented a certificate; log:\n{}",
        hub.log_text()
    );
}

/// A pod in `default`, bound to `node`, labelled `app`.
pub fn pod(name: &str, node: &str, app: &str) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": {"app": app}},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}]}
    })
}

pub fn served_from_cache(resp: &RawResponse) -> bool {
    resp.header("x-outpost-served-from") == Some("edge-cache")
}

/// Polls until the hub answers `path` from its cache (the writer applies asynchronously).
pub async fn until_cached(hub: &HubProcess, path: &str) -> RawResponse {
    until_cached_by(hub, path, || kubelet_get(hub.proxy, path)).await
}

/// [`until_cached`], asking with `fetch` (another client's request for `path`).
pub async fn until_cached_by<F, Fut>(hub: &HubProcess, path: &str, fetch: F) -> RawResponse
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = RawResponse>,
{
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let resp = fetch().await;
        if resp.status == 200 && served_from_cache(&resp) {
            return resp;
        }
        assert!(
            Instant::now() < deadline,
            "{path} never served from cache: {} {}\n{}",
            resp.status,
            String::from_utf8_lossy(&resp.body),
            hub.log_text()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Polls `/metrics` (bounded) until each `outpost_cache_writes_total{labels}` has counted a write.
pub async fn until_durable(hub: &HubProcess, labels: &[&str]) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text =
            String::from_utf8_lossy(&get(hub.admin, "/metrics", "test").await.body).into_owned();
        let counted = |l: &&str| {
            text.lines()
                .any(|line| line.starts_with(&format!("outpost_cache_writes_total{{{l}}} ")))
        };
        if labels.iter().all(counted) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "writes {labels:?} never applied:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits (bounded) until readyz no longer reports the hub offline.
pub async fn wait_online(hub: &HubProcess) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let ready = get(hub.admin, "/v1/readyz", "test").await;
        if !String::from_utf8_lossy(&ready.body).contains("offline") {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "hub stayed offline:\n{}",
            hub.log_text()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A fake cluster with these pods (app=web) bound to the node.
pub async fn cluster_with_pods(names: &[&str]) -> Cluster {
    let cluster = Cluster::start().await;
    for name in names {
        cluster
            .fake
            .create("v1/pods", pod(name, NODE, "web"))
            .unwrap();
    }
    cluster
}

/// The hub's RBAC as the e2e clusters install it: `manifests/cluster/rbac.yaml` and the opt-in
/// `pool-sharing-rbac.yaml` (the suite's hubs follow their pool's leader-hub ConfigMap).
pub fn hub_rbac() -> Vec<serde_json::Value> {
    ["rbac.yaml", "pool-sharing-rbac.yaml"]
        .iter()
        .flat_map(|file| {
            let path = format!(
                "{}/../../manifests/cluster/{file}",
                env!("CARGO_MANIFEST_DIR")
            );
            outpost_testkit::manifest::load_yaml(path).expect("hub RBAC manifest")
        })
        .collect()
}
