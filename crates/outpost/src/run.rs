//! `outpost` with no subcommand: validate flags, prepare directories and certificates, start the
//! hub, and run until SIGTERM or SIGINT.

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use outpost_agent::pool::PoolSettings;
use outpost_agent::{EdgeConfig, Hub, HubConfig, SecureConfig, UpstreamConfig};
use outpost_cache::{MemStore, SledOptions, SledStore, Store};
use outpost_certs::UpstreamTls;
use outpost_proxy::edge::CacheAgents;
use tracing::{error, info, warn};
use tracing_subscriber::EnvFilter;

use outpost_agent::identity::bootstrap::IdentityFiles;

use crate::cli::{HubFlags, IdentitySource, ValidatedHub, WorkingMode};

/// Start-up failures: configuration the hub cannot run with. Printed as one line, exit code 2.
struct StartupError(String);

pub fn hub(flags: &HubFlags) -> ExitCode {
    init_tracing(flags.verbosity);
    match prepare(flags) {
        Ok((config, validated)) => serve(config, &validated),
        Err(StartupError(message)) => {
            eprintln!("outpost: error: {message}");
            ExitCode::from(2)
        }
    }
}

fn prepare(flags: &HubFlags) -> Result<(HubConfig, ValidatedHub), StartupError> {
    let v = flags.validate().map_err(StartupError)?;
    let inert = flags.inert.set();
    if !inert.is_empty() {
        warn!(flags = %inert.join(" "), "yurthub flags accepted for compatibility have no effect in outpost");
    }
    create_dir(&v.root_dir, "--root-dir")?;
    let mut private = vec![v.root_dir.as_path()];
    let edge = match v.working_mode {
        WorkingMode::Edge => {
            create_dir(&v.disk_cache_path, "--disk-cache-path")?;
            private.push(&v.disk_cache_path);
            tighten(&private);
            Some(open_cache(&v)?)
        }
        WorkingMode::Cloud => {
            tighten(&private);
            None
        }
    };
    let files = identity_files(&v.identity)?;
    let tls = UpstreamTls::load(&files.client_pem, &files.ca_file)
        .map_err(|e| StartupError(e.to_string()))?;
    if tls.identity.is_expired_at(SystemTime::now()) {
        warn!(path = %files.client_pem.display(), "client certificate has expired; readyz will fail");
    }
    info!(
        node = %v.node_name,
        pool = v.nodepool_name.as_deref().unwrap_or("(from the node's label)"),
        mode = ?v.working_mode,
        identity = %tls.identity.user,
        "starting outpost"
    );
    let config = HubConfig {
        node_name: v.node_name.clone(),
        proxy_addr: v.proxy_addr,
        admin_addr: v.admin_addr,
        upstream: UpstreamConfig {
            servers: v.servers.clone(),
            lb_mode: v.lb_mode,
            connect_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(60),
            tls,
            http2: v.http2,
        },
        edge,
        namespace: v.namespace.clone(),
        health: v.health.clone(),
        filters: Some(v.filters.clone()),
        pool_scope: v.pool_scope.clone(),
        pool_sharing: (!v.pool_scope.is_empty()).then(|| PoolSettings {
            node: v.node_name.clone(),
            namespace: v.namespace.clone(),
            pool: v.nodepool_name.clone(),
            port: v.multiplexer_port,
            election: v.pool_leader_election,
        }),
        secure: Some(SecureConfig {
            addr: std::net::SocketAddr::new(v.filters.hub_host, v.filters.hub_port),
            cert_file: v.root_dir.join("pki").join("yurthub-server-current.pem"),
            tokens_file: Some(v.root_dir.join("verified-tokens")),
            node_ip: v.node_ip,
        }),
        dummy_if: v.dummy_if.clone(),
        token_bootstrap: match &v.identity {
            IdentitySource::Token(bootstrap) => Some(bootstrap.clone()),
            IdentitySource::Files(_) => None,
        },
        clients: v.clients,
    };
    Ok((config, v))
}

/// The client certificate's files; in token mode, bootstrapped first (the hub cannot reach
/// the apiservers without them, so it does not serve before).
fn identity_files(source: &IdentitySource) -> Result<IdentityFiles, StartupError> {
    let bootstrap = match source {
        IdentitySource::Files(files) => return Ok(files.clone()),
        IdentitySource::Token(bootstrap) => bootstrap,
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| StartupError(format!("cannot start the async runtime: {e}")))?;
    runtime
        .block_on(bootstrap.ensure())
        .map_err(|e| StartupError(format!("token bootstrap: {e}")))
}

/// Opens the sled cache. Another process holding it (a second hub) is a start-up error. A
/// damaged cache (sled panics or reports corruption) is moved aside and a fresh one started
/// (`outpost_cache::sled_store`, "Damage"); one that cannot be opened for any other reason (a
/// read-only or full disk, permissions) must not stop the node's traffic either, so the hub
/// runs with an in-memory cache and reports it degraded.
fn open_cache(v: &ValidatedHub) -> Result<EdgeConfig, StartupError> {
    let path = &v.disk_cache_path;
    let options = SledOptions {
        compact_above_bytes: v.compact_above_bytes,
        min_free_bytes: v.min_free_bytes,
        repair_damaged: true,
        ..SledOptions::default()
    };
    let (store, volatile): (Arc<dyn Store>, _) = match SledStore::open(path, options) {
        Ok(store) => {
            info!(path = %path.display(), "edge cache opened");
            (Arc::new(store), None)
        }
        Err(e) if e.is_locked() => {
            return Err(StartupError(format!(
                "--disk-cache-path: the cache at {} is in use by another process (is another outpost running?)",
                path.display()
            )));
        }
        Err(e) => {
            error!(path = %path.display(), error = %e, "cannot open the edge cache; caching in memory only");
            (Arc::new(MemStore::new()), Some(e.to_string()))
        }
    };
    Ok(EdgeConfig {
        store,
        agents: CacheAgents::default(),
        volatile,
        min_request_timeout: v.min_request_timeout,
        max_object_bytes: v.max_object_bytes,
        hung_after: outpost_agent::admin::CACHE_HUNG_AFTER,
    })
}

fn create_dir(path: &Path, flag: &str) -> Result<(), StartupError> {
    crate::private::create_dir(path)
        .map_err(|e| StartupError(format!("{flag}: cannot create {}: {e}", path.display())))
}

/// Makes what earlier runs left under the hub's directories private ([`crate::private`]); one
/// log line when something was readable by others, one when something could not be checked.
fn tighten(dirs: &[&Path]) {
    let mut tightened = crate::private::Tightened::default();
    for dir in dirs {
        let found = crate::private::tighten(dir);
        tightened.paths.extend(found.paths);
        tightened.failed.extend(found.failed);
    }
    if let Some(first) = tightened.paths.first() {
        warn!(
            paths = tightened.paths.len(),
            first = %first.display(),
            "files of the hub were readable by other users; now 0600 (directories 0700)"
        );
    }
    if let Some((path, error)) = tightened.failed.first() {
        warn!(
            paths = tightened.failed.len(),
            first = %path.display(),
            %error,
            "cannot make some files of the hub private"
        );
    }
}

/// Raises the soft open-files limit to the hard one, as Go programs (yurthub among them) do at
/// start: the ports' connection caps are sized from it ([`outpost_agent::listen::slots`]).
fn raise_open_files_limit() {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    if limit.current < limit.maximum {
        let raised = rustix::process::Rlimit {
            current: limit.maximum,
            maximum: limit.maximum,
        };
        if let Err(e) = setrlimit(Resource::Nofile, raised) {
            warn!(error = %e, "cannot raise the open-files limit");
        }
    }
}

fn serve(config: HubConfig, v: &ValidatedHub) -> ExitCode {
    raise_open_files_limit();
    // One thread runs every task: the node's cores belong to its workloads, and a second
    // worker makes every proxied request hop between threads (the client's connection, the
    // upstream connection's task) with a wake-up each. The current-thread scheduler also spends
    // less per task switch than a multi-thread one with a single worker (`benches/proxy.rs --
    // processes`, `cloud-1-worker`; figures in BENCHMARKS.md). Blocking work (cache reads, the
    // cache writer, sled) runs on threads of its own. TOKIO_WORKER_THREADS=<n>: tokio's
    // multi-thread scheduler with n workers instead.
    let mut runtime = match std::env::var_os("TOKIO_WORKER_THREADS") {
        None => tokio::runtime::Builder::new_current_thread(),
        Some(_) => tokio::runtime::Builder::new_multi_thread(),
    };
    let runtime = match runtime.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("outpost: error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let code = runtime.block_on(async {
        // Signal handlers first: a SIGTERM that arrives while the hub starts must still take
        // the graceful path, not the default "terminate now".
        let signals = match Signals::install() {
            Ok(signals) => Some(signals),
            Err(e) => {
                error!(error = %e, "cannot listen for signals; SIGTERM will stop the hub abruptly");
                None
            }
        };
        let hub = match Hub::start(config).await {
            Ok(hub) => hub,
            Err(e) => {
                eprintln!("outpost: error: {e}");
                return ExitCode::from(2);
            }
        };
        info!(node = %v.node_name, proxy = %hub.proxy_addr(), admin = %hub.admin_addr(), secure = %hub.secure_addr().map_or_else(|| "none".to_owned(), |a| a.to_string()), "ready to serve");
        match signals {
            Some(mut signals) => loop {
                match signals.next().await {
                    Signal::DumpState => dump_state(&hub, &v.root_dir).await,
                    Signal::Stop(name) => {
                        info!(signal = name, "shutting down");
                        break;
                    }
                }
            },
            None => std::future::pending::<()>().await,
        }
        hub.shutdown().await;
        ExitCode::SUCCESS
    });
    // Dropping the runtime would wait for every blocking task, and one stuck in the cache (a
    // deadlocked store) never ends: the hub must stop within its grace period whatever the disk
    // does. Every write was flushed when it was made, and the final flush was waited for.
    runtime.shutdown_timeout(RUNTIME_STOP_WITHIN);
    code
}

/// How long the stopping hub waits for blocking tasks once everything else has stopped.
const RUNTIME_STOP_WITHIN: Duration = Duration::from_secs(1);

/// Writes the hub's state where yurthub writes its stacks on SIGUSR1; one log line says where.
async fn dump_state(hub: &Hub, root_dir: &Path) {
    let path = outpost_agent::host::dump::path(root_dir, std::process::id());
    let text = hub.state_dump();
    let written = async {
        tokio::fs::create_dir_all(root_dir).await?;
        tokio::fs::write(&path, text).await
    };
    match written.await {
        Ok(()) => info!(path = %path.display(), "state dumped (SIGUSR1)"),
        Err(e) => error!(path = %path.display(), error = %e, "cannot write the state dump"),
    }
}

/// SIGTERM and SIGINT (stop), and SIGUSR1 (dump the state), listened for from start-up on.
/// Unhandled, SIGUSR1 would end the process: operators send it to yurthub for a dump.
struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
    usr1: tokio::signal::unix::Signal,
}

enum Signal {
    Stop(&'static str),
    DumpState,
}

impl Signals {
    fn install() -> std::io::Result<Signals> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(Signals {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
            usr1: signal(SignalKind::user_defined1())?,
        })
    }

    async fn next(&mut self) -> Signal {
        tokio::select! {
            _ = self.term.recv() => Signal::Stop("SIGTERM"),
            _ = self.int.recv() => Signal::Stop("SIGINT"),
            _ = self.usr1.recv() => Signal::DumpState,
        }
    }
}

/// klog-style `--v` mapped onto tracing levels; `RUST_LOG` overrides it when set.
pub fn init_tracing(verbosity: u8) {
    let level = match verbosity {
        0 | 1 => "info",
        2 | 3 => "debug",
        _ => "trace",
    };
    init_tracing_with(&format!(
        "warn,outpost={level},outpost_proxy={level},outpost_agent={level},outpost_certs={level},outpost_cache={level}"
    ));
}

/// Installs the log subscriber with `default` directives unless `RUST_LOG` says otherwise.
pub fn init_tracing_with(default: &str) {
    use std::io::IsTerminal;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(false)
        .compact()
        .try_init();
}
