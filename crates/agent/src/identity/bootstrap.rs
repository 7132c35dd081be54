//! yurthub's default `--bootstrap-mode=token`: the hub gets its own client certificate from the
//! cluster before it starts serving, kubeadm-style. [`TokenBootstrap::ensure`] is the whole flow:
//!
//! 1. A certificate from an earlier start (`<root>/pki/yurthub-current.pem`, with
//!    `<root>/pki/ca.crt`) that loads and has not expired is used as it is, so a node that
//!    reboots while the cloud is away starts at once — unless it belongs to another cluster
//!    (the kept discovery points to no `--server-addr`, or the CA is not pinned), when it is
//!    dropped.
//! 2. Otherwise the bootstrap credentials: `--bootstrap-file` (a kubeconfig with the CA and a
//!    token), or `<root>/bootstrap-hub.conf` written by an earlier discovery, or discovery with
//!    `--join-token`: `kube-public/cluster-info` read without trusting the server yet, its
//!    kubeconfig checked against the token's JWS signature and the CA against
//!    `--discovery-token-ca-cert-hash`, then read again over TLS verified with that CA.
//! 3. A CSR (`kubernetes.io/kube-apiserver-client`, CN `system:node:<node>`, O
//!    `openyurt:yurthub` and `system:nodes`) sent with the bootstrap token and polled until
//!    issued (yurt-manager's csrapprover approves it in OpenYurt clusters).
//! 4. Chain and key kept in `<root>/pki/yurthub-current.pem` (0600): from then on the hub runs
//!    exactly as in `kubeletcertificate` mode with these two files.
//!
//! While the hub runs, [`renew_client_certificate`] replaces the certificate after 80 % of its
//! lifetime, with a CSR the current certificate authenticates.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use http::{Method, Request, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use outpost_certs::bootstrap::{
    BootstrapToken, KUBE_APISERVER_CLIENT_SIGNER, TokenError, ca_is_pinned, draft_client_csr,
};
use outpost_certs::{CertError, UpstreamTls, ca_roots, install_ring_provider, write_private};
use rustls::ClientConfig;
use serde_json::{Value, json};
use tokio::sync::watch;
use tracing::{info, warn};

use crate::identity::csr::{self, CsrError, CsrTransport, signing_request};
use outpost_proxy::error::{BoxError, error_chain};
use outpost_proxy::upstream::{Server, ServerAddrError, Upstream};

const CLUSTER_INFO: &str = "/api/v1/namespaces/kube-public/configmaps/cluster-info";
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
const USER_AGENT: &str = "outpost/bootstrap";
/// What yurt-manager's csrapprover requires of a hub's client certificate, exactly.
const CLIENT_USAGES: [&str; 3] = ["digital signature", "key encipherment", "client auth"];

/// What `--bootstrap-mode=token` needs to know.
#[derive(Debug, Clone)]
pub struct TokenBootstrap {
    pub node_name: String,
    pub servers: Vec<Server>,
    pub root_dir: PathBuf,
    /// `--bootstrap-file`.
    pub bootstrap_file: Option<PathBuf>,
    /// `--join-token`.
    pub join_token: Option<String>,
    /// `--discovery-token-ca-cert-hash` (`sha256:<hex>` each).
    pub ca_pins: Vec<String>,
    /// `--discovery-token-unsafe-skip-ca-verification`.
    pub skip_ca_verification: bool,
    /// `--hub-cert-organizations`: more O= in the client certificate.
    pub extra_organizations: Vec<String>,
    /// How long to wait for the certificate in all (yurthub waits 4 minutes).
    pub deadline: Duration,
}

/// The client certificate's files, ready for [`UpstreamTls::load`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdentityFiles {
    pub client_pem: PathBuf,
    pub ca_file: PathBuf,
}

/// Why token mode has no client certificate.
#[derive(Debug, thiserror::Error)]
pub enum BootstrapError {
    #[error(transparent)]
    Cert(#[from] CertError),
    #[error("the issued client certificate cannot be used: {0}")]
    Unusable(#[source] CertError),
    #[error("{}: {source}", path.display())]
    Remove {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{} is missing and there is no --join-token", conf.display())]
    NoJoinToken { conf: PathBuf },
    #[error("--join-token: {0}")]
    JoinToken(#[source] TokenError),
    /// `/v1/token`'s token.
    #[error(transparent)]
    Token(#[from] TokenError),
    #[error("cluster-info discovery failed: {}", unanswered(.0))]
    Discovery(Vec<Unanswered>),
    #[error("the cluster CA does not match --discovery-token-ca-cert-hash")]
    CaNotPinned,
    #[error("the cluster CA: {0}")]
    CaUnreadable(#[source] TokenError),
    #[error("cluster-info has no kubeconfig")]
    NoKubeconfig,
    #[error("cluster-info has no {0}: the token is unknown or expired")]
    NoSignature(String),
    #[error("cluster-info signature: {0}")]
    Signature(#[source] TokenError),
    #[error("cluster-info changed between the unverified and the verified read")]
    Changed,
    #[error(transparent)]
    Kubeconfig(#[from] KubeconfigError),
    #[error("{}: {source}", path.display())]
    Conf {
        path: PathBuf,
        #[source]
        source: KubeconfigError,
    },
    #[error(transparent)]
    Call(#[from] CallError),
    #[error(transparent)]
    Csr(#[from] CsrError),
    #[error("CSR {name}: the issued certificate cannot be used: {source}")]
    RenewedUnusable {
        name: String,
        #[source]
        source: CertError,
    },
    #[error("cannot write {}: {source}", path.display())]
    Rename {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// One server's failed discovery.
#[derive(Debug)]
pub struct Unanswered {
    pub server: String,
    pub error: BootstrapError,
}

fn unanswered(problems: &[Unanswered]) -> String {
    let each: Vec<String> = problems
        .iter()
        .map(|p| format!("{}: {}", p.server, p.error))
        .collect();
    each.join("; ")
}

/// Why a kubeconfig (kept, or `--bootstrap-file`) cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum KubeconfigError {
    #[error(transparent)]
    Read(#[from] std::io::Error),
    #[error("not a kubeconfig: {0}")]
    Parse(#[source] Box<serde_saphyr::Error>),
    #[error("the kubeconfig has no cluster")]
    NoCluster,
    #[error("certificate-authority-data: {0}")]
    CaData(#[source] base64::DecodeError),
    #[error("the kubeconfig's cluster has no certificate authority")]
    NoCa,
    #[error("cannot read {}: {source}", path.display())]
    ReadCa {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the kubeconfig's cluster has no server")]
    NoServer,
    #[error(transparent)]
    Server(#[from] ServerAddrError),
    #[error("the kubeconfig has no user token")]
    NoToken,
}

/// One call of the bootstrap (before the hub has a certificate), named by its method and path.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    #[error("{path}: {source}")]
    Request {
        path: String,
        #[source]
        source: http::Error,
    },
    #[error("{method} {path}: {status}: {body}")]
    Status {
        method: Method,
        path: String,
        status: StatusCode,
        body: String,
    },
    #[error("{method} {path}: unreadable answer: {source}")]
    Unreadable {
        method: Method,
        path: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("{method} {path}: no answer within {CALL_TIMEOUT:?}")]
    TimedOut { method: Method, path: String },
    #[error("{method} {path}: {}", error_chain(source))]
    Send {
        method: Method,
        path: String,
        #[source]
        source: hyper_util::client::legacy::Error,
    },
    #[error("{method} {path}: {source}")]
    Body {
        method: Method,
        path: String,
        #[source]
        source: hyper::Error,
    },
}

/// The apiserver, its CA and a token that may ask for a certificate.
struct Credentials {
    server: Server,
    ca_pem: Vec<u8>,
    token: String,
}

impl TokenBootstrap {
    pub fn files(&self) -> IdentityFiles {
        let pki = self.root_dir.join("pki");
        IdentityFiles {
            client_pem: pki.join("yurthub-current.pem"),
            ca_file: pki.join("ca.crt"),
        }
    }

    /// `--bootstrap-file`, or where discovery keeps what it found.
    fn bootstrap_conf(&self) -> PathBuf {
        self.bootstrap_file
            .clone()
            .unwrap_or_else(|| self.root_dir.join("bootstrap-hub.conf"))
    }

    /// The hub's client certificate files: kept from an earlier start, or obtained now.
    pub async fn ensure(&self) -> Result<IdentityFiles, BootstrapError> {
        let files = self.files();
        self.forget_another_cluster(&files)?;
        if let Ok(tls) = UpstreamTls::load(&files.client_pem, &files.ca_file) {
            if !tls.identity.is_expired_at(SystemTime::now()) {
                info!(path = %files.client_pem.display(), identity = %tls.identity.user, "client certificate from an earlier bootstrap");
                return Ok(files);
            }
            warn!(path = %files.client_pem.display(), "the bootstrapped client certificate has expired; asking for a new one");
        }
        let started = Instant::now();
        let creds = self.credentials().await?;
        self.check_pin(&creds.ca_pem)?;
        self.issue(&creds, started).await?;
        Ok(files)
    }

    /// Keeps the cluster CA, obtains a certificate with `creds` and keeps it, once it loads.
    async fn issue(&self, creds: &Credentials, started: Instant) -> Result<(), BootstrapError> {
        let files = self.files();
        write_private(&files.ca_file, &creds.ca_pem)?;
        let pem = self.obtain_certificate(creds, started).await?;
        write_private(&files.client_pem, pem.as_bytes())?;
        let tls = UpstreamTls::load(&files.client_pem, &files.ca_file)
            .map_err(BootstrapError::Unusable)?;
        info!(identity = %tls.identity.user, path = %files.client_pem.display(), "client certificate issued");
        Ok(())
    }

    /// What an earlier bootstrap kept belongs to another cluster when the apiserver its
    /// discovery found is none of `--server-addr` (yurthub wipes its root then, #367) or its CA
    /// is not one `--discovery-token-ca-cert-hash` pins: the node was moved, and presenting the
    /// old cluster's certificate would only fail. The kept files go and the hub bootstraps again.
    fn forget_another_cluster(&self, files: &IdentityFiles) -> Result<(), BootstrapError> {
        let Some(reason) = self.kept_for_another_cluster(files) else {
            return Ok(());
        };
        warn!(%reason, "the kept bootstrap belongs to another cluster; bootstrapping again");
        let mut kept = vec![files.client_pem.clone(), files.ca_file.clone()];
        if self.bootstrap_file.is_none() {
            kept.push(self.bootstrap_conf());
        }
        for path in kept {
            match std::fs::remove_file(&path) {
                Err(source) if source.kind() != std::io::ErrorKind::NotFound => {
                    return Err(BootstrapError::Remove { path, source });
                }
                _ => {}
            }
        }
        Ok(())
    }

    fn kept_for_another_cluster(&self, files: &IdentityFiles) -> Option<String> {
        let conf = self.bootstrap_conf();
        let kept = (self.bootstrap_file.is_none() && conf.exists())
            .then(|| read_bootstrap_conf(&conf).ok())
            .flatten();
        if let Some(kept) = kept {
            let ours = |s: &Server| s.base.authority() == kept.server.base.authority();
            if !self.servers.iter().any(ours) {
                return Some(format!(
                    "{} points to {}, which is not a --server-addr",
                    conf.display(),
                    kept.server.label()
                ));
            }
        }
        let ca = std::fs::read(&files.ca_file).ok()?;
        if !self.skip_ca_verification && matches!(ca_is_pinned(&ca, &self.ca_pins), Ok(false)) {
            return Some(format!(
                "{} is not the CA --discovery-token-ca-cert-hash pins",
                files.ca_file.display()
            ));
        }
        None
    }

    async fn credentials(&self) -> Result<Credentials, BootstrapError> {
        let conf = self.bootstrap_conf();
        if conf.exists() {
            return read_bootstrap_conf(&conf);
        }
        let token = self
            .join_token
            .as_deref()
            .ok_or(BootstrapError::NoJoinToken { conf })?;
        let token = BootstrapToken::parse(token).map_err(BootstrapError::JoinToken)?;
        self.discover_and_keep(&token).await
    }

    /// Discovery from the first server that answers; the result is kept as the bootstrap conf.
    async fn discover_and_keep(
        &self,
        token: &BootstrapToken,
    ) -> Result<Credentials, BootstrapError> {
        let mut problems = Vec::new();
        for server in &self.servers {
            match self.discover(server, token).await {
                Ok(creds) => {
                    let conf = bootstrap_kubeconfig(&creds);
                    write_private(&self.bootstrap_conf(), conf.as_bytes())?;
                    return Ok(creds);
                }
                Err(error) => problems.push(Unanswered {
                    server: server.label().to_owned(),
                    error,
                }),
            }
        }
        Err(BootstrapError::Discovery(problems))
    }

    /// yurthub's `/v1/token`: discovery with a new join token rewrites the bootstrap conf, and
    /// a client certificate that has expired (or is gone) is obtained again with it at once, so
    /// a node whose certificate lapsed while it was cut off can rejoin without a restart.
    pub async fn rejoin(&self, token: &str) -> Result<&'static str, BootstrapError> {
        let token = BootstrapToken::parse(token)?;
        let creds = self.discover_and_keep(&token).await?;
        let files = self.files();
        let current = UpstreamTls::load(&files.client_pem, &files.ca_file);
        if current.is_ok_and(|tls| !tls.identity.is_expired_at(SystemTime::now())) {
            return Ok("bootstrap token updated");
        }
        self.issue(&creds, Instant::now()).await?;
        Ok("bootstrap token updated; client certificate issued")
    }

    fn check_pin(&self, ca_pem: &[u8]) -> Result<(), BootstrapError> {
        if self.skip_ca_verification {
            warn!(
                "--discovery-token-unsafe-skip-ca-verification: the cluster CA is not checked against a pinned hash"
            );
            return Ok(());
        }
        match ca_is_pinned(ca_pem, &self.ca_pins) {
            Ok(true) => Ok(()),
            Ok(false) => Err(BootstrapError::CaNotPinned),
            Err(e) => Err(BootstrapError::CaUnreadable(e)),
        }
    }

    /// kubeadm's discovery: read cluster-info unverified, check its signature and CA, then read
    /// it again through TLS verified with that CA and require the same kubeconfig.
    async fn discover(
        &self,
        server: &Server,
        token: &BootstrapToken,
    ) -> Result<Credentials, BootstrapError> {
        let unverified = https_client(unverified_tls());
        let info = get_json(&unverified, server, CLUSTER_INFO, None).await?;
        let kubeconfig = info
            .pointer("/data/kubeconfig")
            .and_then(Value::as_str)
            .ok_or(BootstrapError::NoKubeconfig)?;
        let jws_key = format!("jws-kubeconfig-{}", token.id);
        let jws = info["data"][&jws_key]
            .as_str()
            .ok_or_else(|| BootstrapError::NoSignature(jws_key.clone()))?;
        token
            .verify_detached(jws, kubeconfig.as_bytes())
            .map_err(BootstrapError::Signature)?;
        let ca_pem = kubeconfig_ca(&parse_kubeconfig(kubeconfig)?, None)?;
        self.check_pin(&ca_pem)?;
        let verified = https_client(verified_tls(&ca_pem)?);
        let again = get_json(&verified, server, CLUSTER_INFO, None).await?;
        if again.pointer("/data/kubeconfig").and_then(Value::as_str) != Some(kubeconfig) {
            return Err(BootstrapError::Changed);
        }
        info!(server = %server.label(), token_id = %token.id, "cluster CA discovered and verified");
        Ok(Credentials {
            server: server.clone(),
            ca_pem,
            token: token.bearer(),
        })
    }

    async fn obtain_certificate(
        &self,
        creds: &Credentials,
        started: Instant,
    ) -> Result<String, BootstrapError> {
        let draft = draft_client_csr(&self.node_name, &self.extra_organizations)?;
        let transport = WithToken {
            client: https_client(verified_tls(&creds.ca_pem)?),
            server: &creds.server,
            token: &creds.token,
        };
        let object = signing_request(&draft.csr_pem, KUBE_APISERVER_CLIENT_SIGNER, &CLIENT_USAGES);
        let deadline = Some(started + self.deadline);
        let (_, cert_pem) = csr::request(&transport, object, "client", deadline).await?;
        Ok(format!("{cert_pem}{}", draft.key_pem))
    }
}

/// The first client certificate's CSR goes with the bootstrap token.
struct WithToken<'a> {
    client: HttpsClient,
    server: &'a Server,
    token: &'a str,
}

impl CsrTransport for WithToken<'_> {
    async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<(StatusCode, Bytes), BoxError> {
        let answer = exchange(
            &self.client,
            self.server,
            method,
            path,
            Some(self.token),
            body.as_ref(),
        )
        .await?;
        Ok(answer)
    }
}

/// How long after a failed renewal the next attempt is made (doubling, up to 16 minutes).
const RENEWAL_RETRY: Duration = Duration::from_secs(30);

/// Token mode, while the hub runs: after 80 % of the client certificate's lifetime, asks for a
/// new one as the node (the current certificate authenticates the CSR, as client-go's manager
/// does), checks it, and writes it over the kept certificate, where
/// [`super::client_cert::watch_client_certificate`] picks it up.
pub async fn renew_client_certificate(
    upstream: Arc<Upstream>,
    bootstrap: TokenBootstrap,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut identity = upstream.identity();
    let mut failures = 0u32;
    loop {
        let due = identity.borrow_and_update().renew_at();
        let wait = due.duration_since(SystemTime::now()).unwrap_or_default();
        if !wait.is_zero() {
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                changed = identity.changed() => if changed.is_err() { return },
                _ = shutdown.wait_for(|stop| *stop) => return,
            }
            continue;
        }
        let renewed = tokio::select! {
            renewed = renew_once(&upstream, &bootstrap) => renewed,
            _ = shutdown.wait_for(|stop| *stop) => return,
        };
        // After a renewal, wait until the hub has loaded it (its renewal time then moves on);
        // after a failure, back off.
        let pause = match renewed {
            Ok(()) => {
                failures = 0;
                RENEWAL_RETRY
            }
            Err(e) => {
                let pause = RENEWAL_RETRY.saturating_mul(1 << failures.min(5));
                failures = failures.saturating_add(1);
                warn!(error = %e, retry_in_s = pause.as_secs(), "cannot renew the client certificate");
                pause
            }
        };
        tokio::select! {
            () = tokio::time::sleep(pause) => {}
            changed = identity.changed() => if changed.is_err() { return },
            _ = shutdown.wait_for(|stop| *stop) => return,
        }
    }
}

async fn renew_once(upstream: &Upstream, bootstrap: &TokenBootstrap) -> Result<(), BootstrapError> {
    let files = bootstrap.files();
    let draft = draft_client_csr(&bootstrap.node_name, &bootstrap.extra_organizations)?;
    let object = signing_request(&draft.csr_pem, KUBE_APISERVER_CLIENT_SIGNER, &CLIENT_USAGES);
    let (name, cert_pem) = crate::identity::csr::request(upstream, object, "client", None).await?;
    let staged = files.client_pem.with_extension("new");
    write_private(&staged, format!("{cert_pem}{}", draft.key_pem).as_bytes())?;
    let checked = UpstreamTls::load(&staged, &files.ca_file);
    if let Err(source) = checked {
        let _ = std::fs::remove_file(&staged);
        return Err(BootstrapError::RenewedUnusable { name, source });
    }
    std::fs::rename(&staged, &files.client_pem).map_err(|source| BootstrapError::Rename {
        path: files.client_pem.clone(),
        source,
    })?;
    info!(csr = %name, path = %files.client_pem.display(), "client certificate renewed");
    Ok(())
}

type HttpsClient = Client<hyper_rustls::HttpsConnector<HttpConnector>, Full<Bytes>>;

fn https_client(tls: ClientConfig) -> HttpsClient {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_connect_timeout(Some(CALL_TIMEOUT));
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_only()
        .enable_http1()
        .wrap_connector(http);
    Client::builder(TokioExecutor::new()).build(connector)
}

fn verified_tls(ca_pem: &[u8]) -> Result<ClientConfig, BootstrapError> {
    install_ring_provider();
    let roots = ca_roots(Path::new("the cluster CA"), ca_pem)?;
    Ok(ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth())
}

/// For the first read of cluster-info only, as kubeadm does: what it returns is trusted only
/// after its signature and CA pin check out, and is then read again with verification.
fn unverified_tls() -> ClientConfig {
    install_ring_provider();
    let provider = rustls::crypto::ring::default_provider();
    ClientConfig::builder()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyServer(provider)))
        .with_no_client_auth()
}

/// Accepts any server certificate, still checking that the server holds its key.
#[derive(Debug)]
struct AnyServer(rustls::crypto::CryptoProvider);

impl rustls::client::danger::ServerCertVerifier for AnyServer {
    fn verify_server_cert(
        &self,
        _end_entity: &rustls::pki_types::CertificateDer<'_>,
        _intermediates: &[rustls::pki_types::CertificateDer<'_>],
        _server_name: &rustls::pki_types::ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

async fn get_json(
    client: &HttpsClient,
    server: &Server,
    path: &str,
    token: Option<&str>,
) -> Result<Value, CallError> {
    call(client, server, Method::GET, path, token, None).await
}

/// One request; a 2xx JSON answer, or an error naming the path and what the server said.
async fn call(
    client: &HttpsClient,
    server: &Server,
    method: Method,
    path: &str,
    token: Option<&str>,
    body: Option<&Value>,
) -> Result<Value, CallError> {
    let (status, bytes) = exchange(client, server, method.clone(), path, token, body).await?;
    if !status.is_success() {
        return Err(CallError::Status {
            method,
            path: path.to_owned(),
            status,
            body: String::from_utf8_lossy(&bytes).into_owned(),
        });
    }
    serde_json::from_slice(&bytes).map_err(|source| CallError::Unreadable {
        method,
        path: path.to_owned(),
        source,
    })
}

/// One request, bounded by [`CALL_TIMEOUT`]; the answer whatever its status.
async fn exchange(
    client: &HttpsClient,
    server: &Server,
    method: Method,
    path: &str,
    token: Option<&str>,
    body: Option<&Value>,
) -> Result<(StatusCode, Bytes), CallError> {
    let request = |source| CallError::Request {
        path: path.to_owned(),
        source,
    };
    let uri = server.uri_for(path).map_err(request)?;
    let mut req = Request::builder()
        .method(method.clone())
        .uri(uri)
        .header(header::USER_AGENT, USER_AGENT)
        .header(header::ACCEPT, "application/json");
    if let Some(token) = token {
        req = req.header(header::AUTHORIZATION, format!("Bearer {token}"));
    }
    let body = match body {
        Some(value) => {
            req = req.header(header::CONTENT_TYPE, "application/json");
            Full::new(Bytes::from(value.to_string()))
        }
        None => Full::new(Bytes::new()),
    };
    let req = req.body(body).map_err(request)?;
    let exchange = async {
        let resp = client.request(req).await.map_err(Failure::Send)?;
        let status = resp.status();
        let bytes = resp
            .into_body()
            .collect()
            .await
            .map_err(Failure::Body)?
            .to_bytes();
        Ok::<_, Failure>((status, bytes))
    };
    let what = || (method.clone(), path.to_owned());
    tokio::time::timeout(CALL_TIMEOUT, exchange)
        .await
        .map_err(|_| CallError::TimedOut {
            method: method.clone(),
            path: path.to_owned(),
        })?
        .map_err(|failure| {
            let (method, path) = what();
            match failure {
                Failure::Send(source) => CallError::Send {
                    method,
                    path,
                    source,
                },
                Failure::Body(source) => CallError::Body {
                    method,
                    path,
                    source,
                },
            }
        })
}

/// What went wrong inside one exchange, before it is named by its method and path.
enum Failure {
    Send(hyper_util::client::legacy::Error),
    Body(hyper::Error),
}

fn parse_kubeconfig(text: &str) -> Result<Value, KubeconfigError> {
    serde_saphyr::from_str::<Value>(text).map_err(|e| KubeconfigError::Parse(Box::new(e)))
}

/// The CA of a kubeconfig's first cluster: inline data, or a file relative to `dir`.
fn kubeconfig_ca(config: &Value, dir: Option<&Path>) -> Result<Vec<u8>, KubeconfigError> {
    let cluster = config
        .pointer("/clusters/0/cluster")
        .ok_or(KubeconfigError::NoCluster)?;
    if let Some(data) = cluster["certificate-authority-data"].as_str() {
        return STANDARD
            .decode(data.trim())
            .map_err(KubeconfigError::CaData);
    }
    let file = cluster["certificate-authority"]
        .as_str()
        .ok_or(KubeconfigError::NoCa)?;
    let path = dir.map_or_else(|| PathBuf::from(file), |d| d.join(file));
    std::fs::read(&path).map_err(|source| KubeconfigError::ReadCa { path, source })
}

/// `--bootstrap-file` (or the kept discovery): server, CA and token.
fn read_bootstrap_conf(path: &Path) -> Result<Credentials, BootstrapError> {
    credentials_in(path).map_err(|source| BootstrapError::Conf {
        path: path.to_owned(),
        source,
    })
}

fn credentials_in(path: &Path) -> Result<Credentials, KubeconfigError> {
    let text = std::fs::read_to_string(path)?;
    let config = parse_kubeconfig(&text)?;
    let ca_pem = kubeconfig_ca(&config, path.parent())?;
    let server = config
        .pointer("/clusters/0/cluster/server")
        .and_then(Value::as_str)
        .ok_or(KubeconfigError::NoServer)?;
    let server = Server::parse(server)?;
    let token = config
        .pointer("/users/0/user/token")
        .and_then(Value::as_str)
        .ok_or(KubeconfigError::NoToken)?
        .to_owned();
    Ok(Credentials {
        server,
        ca_pem,
        token,
    })
}

/// The bootstrap kubeconfig a discovery leaves in `<root>/bootstrap-hub.conf` (JSON is YAML).
fn bootstrap_kubeconfig(creds: &Credentials) -> String {
    let config = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "cluster", "cluster": {
            "server": creds.server.base.to_string().trim_end_matches('/'),
            "certificate-authority-data": STANDARD.encode(&creds.ca_pem),
        }}],
        "users": [{"name": "bootstrap", "user": {"token": creds.token}}],
        "contexts": [{"name": "bootstrap", "context": {"cluster": "cluster", "user": "bootstrap"}}],
        "current-context": "bootstrap",
    });
    serde_json::to_string_pretty(&config).expect("a kubeconfig serializes")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token_bootstrap(root: &Path, server: &str, ca_pem: &str) -> TokenBootstrap {
        TokenBootstrap {
            node_name: "edge-1".into(),
            servers: vec![Server::parse(server).expect("server")],
            root_dir: root.to_owned(),
            bootstrap_file: None,
            join_token: Some("abcdef.0123456789abcdef".into()),
            ca_pins: outpost_certs::bootstrap::ca_cert_hashes(ca_pem.as_bytes()).expect("pin"),
            skip_ca_verification: false,
            extra_organizations: Vec::new(),
            deadline: Duration::from_secs(1),
        }
    }

    /// Leaves what a bootstrap against `server` with `ca_pem` keeps in `root`.
    fn keep_bootstrap(root: &Path, server: &str, ca_pem: &str) {
        let creds = Credentials {
            server: Server::parse(server).expect("server"),
            ca_pem: ca_pem.as_bytes().to_vec(),
            token: "abcdef.0123456789abcdef".into(),
        };
        std::fs::create_dir_all(root.join("pki")).expect("pki");
        std::fs::write(
            root.join("bootstrap-hub.conf"),
            bootstrap_kubeconfig(&creds),
        )
        .expect("conf");
        std::fs::write(root.join("pki/ca.crt"), ca_pem).expect("ca");
        std::fs::write(root.join("pki/yurthub-current.pem"), "kept").expect("pem");
    }

    #[test]
    fn what_a_bootstrap_kept_for_another_cluster_is_dropped() {
        let ours = outpost_testkit::TestPki::new().expect("pki").ca_pem;
        let theirs = outpost_testkit::TestPki::new().expect("pki").ca_pem;
        let server = "https://127.0.0.1:6443";
        let cases = [
            ("the same cluster", server, &ours, None),
            (
                "another server",
                "https://10.0.0.9:6443",
                &ours,
                Some("not a --server-addr"),
            ),
            (
                "another port",
                "https://127.0.0.1:7443",
                &ours,
                Some("not a --server-addr"),
            ),
            ("another CA", server, &theirs, Some("not the CA")),
        ];
        for (case, kept_server, kept_ca, reason) in cases {
            let dir = tempfile::tempdir().expect("tempdir");
            keep_bootstrap(dir.path(), kept_server, kept_ca);
            let bootstrap = token_bootstrap(dir.path(), server, &ours);
            let files = bootstrap.files();
            let found = bootstrap.kept_for_another_cluster(&files);
            match reason {
                None => assert_eq!(found, None, "{case}"),
                Some(reason) => assert!(
                    found.as_deref().is_some_and(|f| f.contains(reason)),
                    "{case}: {found:?}"
                ),
            }
            bootstrap.forget_another_cluster(&files).expect("forget");
            let left = [
                &files.client_pem,
                &files.ca_file,
                &bootstrap.bootstrap_conf(),
            ]
            .map(|p| p.exists());
            assert_eq!(left, [reason.is_none(); 3], "{case}");
        }
        // An unreadable bootstrap conf says nothing of the server; the CA is still checked.
        let dir = tempfile::tempdir().expect("tempdir");
        keep_bootstrap(dir.path(), server, &theirs);
        std::fs::write(dir.path().join("bootstrap-hub.conf"), "not: [a kubeconfig").expect("conf");
        let bootstrap = token_bootstrap(dir.path(), server, &ours);
        let found = bootstrap.kept_for_another_cluster(&bootstrap.files());
        assert!(
            found.as_deref().is_some_and(|f| f.contains("not the CA")),
            "{found:?}"
        );
    }

    #[test]
    fn a_kept_bootstrap_conf_reads_back() {
        let dir = tempfile::tempdir().expect("tempdir");
        let creds = Credentials {
            server: Server::parse("127.0.0.1:6443").expect("server"),
            ca_pem: b"-----BEGIN CERTIFICATE-----\n".to_vec(),
            token: "abcdef.0123456789abcdef".into(),
        };
        let path = dir.path().join("bootstrap-hub.conf");
        std::fs::write(&path, bootstrap_kubeconfig(&creds)).expect("write");
        let read = read_bootstrap_conf(&path).expect("read");
        assert_eq!(read.server, creds.server);
        assert_eq!(read.ca_pem, creds.ca_pem);
        assert_eq!(read.token, creds.token);
    }

    #[test]
    fn a_bootstrap_file_may_name_its_ca_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("ca.crt"), "CA").expect("ca");
        let path = dir.path().join("bootstrap.conf");
        std::fs::write(
            &path,
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://10.0.0.1:6443\n    certificate-authority: ca.crt\nusers:\n- name: u\n  user:\n    token: abcdef.0123456789abcdef\n",
        )
        .expect("conf");
        let read = read_bootstrap_conf(&path).expect("read");
        assert_eq!(read.ca_pem, b"CA");
        assert_eq!(read.server.label(), "https://10.0.0.1:6443");
        std::fs::write(&path, "apiVersion: v1\nclusters: []\n").expect("conf");
        let err = read_bootstrap_conf(&path)
            .err()
            .expect("no cluster")
            .to_string();
        assert!(
            err.contains("bootstrap.conf") && err.contains("no cluster"),
            "{err}"
        );
    }
}
