//! `outpost cache ls|get|verify|export`: look into the edge cache on disk without the daemon.
//!
//! sled locks its database exclusively, so these commands only work while no hub runs on the
//! cache; a held lock is reported as such (exit 2), not as sled's raw error. Nothing here creates
//! a cache: a path without one is "no cache at …" (exit 1).
//!
//! Exit codes: 0 success; 1 not found, corruption found, I/O failure; 2 usage errors and a cache
//! held by a running hub. Errors are one `outpost: error: …` line on stderr.

use std::fs;
use std::io::{self, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, UNIX_EPOCH};

use outpost_cache::{
    CachedObject, Gvr, Lookup, ObjectKey, ResourceStats, SledOptions, SledStore, Store,
};
use serde_json::json;

use crate::cli::{CacheCommand, CacheExportArgs, CacheGetArgs, CacheLsArgs, CacheLsOutput};

/// Why a command failed: the line to print and the exit code.
#[derive(Debug)]
struct Failure {
    code: u8,
    message: String,
}

impl Failure {
    /// Exit 1: the command ran and the answer is "no" (not cached, corrupt, I/O failure).
    fn failed(message: impl Into<String>) -> Self {
        Failure {
            code: 1,
            message: message.into(),
        }
    }

    /// Exit 2: the command line cannot be acted on as given.
    fn usage(message: impl Into<String>) -> Self {
        Failure {
            code: 2,
            message: message.into(),
        }
    }
}

impl From<io::Error> for Failure {
    fn from(e: io::Error) -> Self {
        Failure::failed(format!("writing output: {e}"))
    }
}

/// Runs one `outpost cache` subcommand; prints its own error line.
pub fn main(command: CacheCommand) -> ExitCode {
    let mut stdout = io::stdout().lock();
    let result = match command {
        CacheCommand::Ls(args) => ls(&args, &mut stdout),
        CacheCommand::Get(args) => get(&args, &mut stdout),
        CacheCommand::Verify(args) => verify(&args.path.disk_cache_path, args.repair, &mut stdout),
        CacheCommand::Export(args) => export(&args, &mut stdout),
    }
    .and_then(|()| stdout.flush().map_err(Failure::from));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            eprintln!("outpost: error: {}", f.message);
            ExitCode::from(f.code)
        }
    }
}

/// Opens an existing cache, never creating one, and names a lock held by a running hub. Damage
/// is reported, and the files left alone.
fn open(path: &Path) -> Result<SledStore, Failure> {
    open_with(path, false)
}

/// [`open`]; `repair`: a damaged database is moved aside and a fresh one started instead.
fn open_with(path: &Path, repair: bool) -> Result<SledStore, Failure> {
    let shown = path.display();
    match fs::metadata(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(Failure::failed(format!("no cache at {shown}")));
        }
        Err(e) => return Err(Failure::failed(format!("cannot read {shown}: {e}"))),
        Ok(meta) if !meta.is_dir() => {
            return Err(Failure::failed(format!(
                "no cache at {shown}: not a directory"
            )));
        }
        Ok(_) => {}
    }
    // `SledStore::open` would start a new cache in a directory without `CURRENT` (see the layout
    // in `outpost_cache::sled_store`); an inspection tool must not.
    if !path.join("CURRENT").is_file() {
        return Err(Failure::failed(format!(
            "no cache at {shown} (no CURRENT file: no hub has cached here)"
        )));
    }
    let options = SledOptions {
        repair_damaged: repair,
        ..SledOptions::default()
    };
    SledStore::open(path, options).map_err(|e| {
        if e.is_locked() {
            Failure::usage(format!(
                "the cache at {shown} is in use by a running outpost (sled holds its lock); \
                 stop the daemon or use its admin endpoints"
            ))
        } else if e.is_damage() {
            Failure::failed(format!(
                "the cache at {shown} is damaged ({e}); `outpost cache verify --repair` moves it \
                 aside and starts a fresh one (the hub does the same when it starts)"
            ))
        } else {
            Failure::failed(format!("cannot open the cache at {shown}: {e}"))
        }
    })
}

fn cache_error(what: &str) -> impl FnOnce(outpost_cache::CacheError) -> Failure + '_ {
    move |e| Failure::failed(format!("{what}: {e}"))
}

// ---- ls ----------------------------------------------------------------------------------------

fn ls(args: &CacheLsArgs, out: &mut impl Write) -> Result<(), Failure> {
    let path = &args.path.disk_cache_path;
    let store = open(path)?;
    let rows = store.stats().map_err(cache_error("reading the cache"))?;
    let size = store
        .size_on_disk()
        .map_err(cache_error("measuring the cache"))?;
    let health = store.health();
    match args.output {
        CacheLsOutput::Json => {
            let resources: Vec<_> = rows
                .iter()
                .map(|r| {
                    json!({
                        "component": r.component,
                        "resource": r.gvr.to_string(),
                        "group": r.gvr.group,
                        "version": r.gvr.version,
                        "name": r.gvr.resource,
                        "objects": r.objects,
                        "events": r.events,
                        "scopes": r.scopes,
                        "bytes": r.bytes,
                        "lastResourceVersion": r.last_resource_version.as_ref().map(|rv| rv.as_str()),
                        "lastWriteUnixMillis": r.last_write.and_then(|t| t.duration_since(UNIX_EPOCH).ok()).map(|d| d.as_millis() as u64),
                        "ageSeconds": r.age().map(|a| a.as_secs()),
                    })
                })
                .collect();
            let doc = json!({
                "diskCachePath": path.display().to_string(),
                "sizeOnDisk": size,
                "degraded": health.degraded,
                "lastError": health.last_error,
                "quarantined": health.quarantined,
                "resources": resources,
            });
            serde_json::to_writer_pretty(&mut *out, &doc).map_err(io::Error::from)?;
            writeln!(out)?;
        }
        CacheLsOutput::Table => {
            if rows.is_empty() {
                writeln!(out, "no cached resources")?;
            } else {
                write_table(out, &table_rows(&rows))?;
            }
            let components = {
                let mut c: Vec<&str> = rows.iter().map(|r| r.component.as_str()).collect();
                c.dedup();
                c.len()
            };
            let objects: usize = rows.iter().map(|r| r.objects).sum();
            let state = match (&health.degraded, &health.last_error) {
                (true, Some(e)) => format!("DEGRADED ({e})"),
                (true, None) => "DEGRADED".to_owned(),
                (false, _) => "not degraded".to_owned(),
            };
            let quarantine = match health.quarantined {
                0 => "0 entries quarantined".to_owned(),
                1 => "1 entry quarantined (kept for inspection, never served)".to_owned(),
                n => format!("{n} entries quarantined (kept for inspection, never served)"),
            };
            writeln!(
                out,
                "{} component(s), {} resource(s), {objects} object(s); {} on disk at {}; {state}; \
                 {quarantine}",
                components,
                rows.len(),
                human_bytes(size),
                path.display(),
            )?;
        }
    }
    Ok(())
}

const HEADER: [&str; 8] = [
    "COMPONENT",
    "RESOURCE",
    "OBJECTS",
    "EVENTS",
    "SCOPES",
    "BYTES",
    "LAST-RV",
    "AGE",
];

fn table_rows(rows: &[ResourceStats]) -> Vec<[String; 8]> {
    rows.iter()
        .map(|r| {
            [
                r.component.clone(),
                r.gvr.to_string(),
                r.objects.to_string(),
                r.events.to_string(),
                r.scopes.to_string(),
                human_bytes(r.bytes),
                r.last_resource_version
                    .as_ref()
                    .map_or_else(|| "-".to_owned(), ToString::to_string),
                r.age().map_or_else(|| "-".to_owned(), human_age),
            ]
        })
        .collect()
}

/// Left-aligned columns, three spaces apart, like kubectl.
fn write_table(out: &mut impl Write, rows: &[[String; 8]]) -> io::Result<()> {
    let mut widths = HEADER.map(str::len);
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let header = HEADER.map(str::to_owned);
    for row in std::iter::once(&header).chain(rows) {
        let mut line = String::new();
        for (i, (cell, w)) in row.iter().zip(widths).enumerate() {
            if i + 1 == row.len() {
                line.push_str(cell);
            } else {
                line.push_str(&format!("{cell:<w$}   "));
            }
        }
        writeln!(out, "{line}")?;
    }
    Ok(())
}

fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if n < 1024 {
        return format!("{n}B");
    }
    let mut value = n as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1}{}", UNITS[unit])
}

/// kubectl's coarse ages: `45s`, `12m`, `5h`, `3d`.
fn human_age(age: Duration) -> String {
    let s = age.as_secs();
    match s {
        0..120 => format!("{s}s"),
        120..7200 => format!("{}m", s / 60),
        7200..172_800 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86_400),
    }
}

// ---- get ---------------------------------------------------------------------------------------

fn get(args: &CacheGetArgs, out: &mut impl Write) -> Result<(), Failure> {
    let (namespace, name) = split_name(&args.name)?;
    let spelled = parse_resource(&args.resource)?;
    let store = open(&args.path.disk_cache_path)?;
    let stats = store.stats().map_err(cache_error("reading the cache"))?;
    let gvr = match spelled {
        Some(gvr) => gvr,
        None => resolve_plain(&stats, &args.component, &args.resource)?,
    };
    let key = ObjectKey::new(&args.component, &gvr, namespace, name);
    match store.get(&key).map_err(cache_error("reading the cache"))? {
        Lookup::Found(object) => {
            out.write_all(&object.bytes)?;
            // Exact bytes for pipes; a terminal gets its prompt back on a line of its own.
            if io::stdout().is_terminal() && !object.bytes.ends_with(b"\n") {
                writeln!(out)?;
            }
            Ok(())
        }
        Lookup::NotCached => {
            let cached = stats
                .iter()
                .any(|r| r.component == args.component && r.gvr == gvr);
            let hint = if cached {
                String::new()
            } else {
                format!(
                    " (nothing of {gvr} is cached for {}; see `outpost cache ls`)",
                    args.component
                )
            };
            Err(Failure::failed(format!("{key} is not cached{hint}")))
        }
        Lookup::Quarantined => Err(Failure::failed(format!(
            "{key} is corrupt and has been quarantined (never served; the hub caches it again \
             when it next fetches it)"
        ))),
    }
}

/// `<namespace>/<name>` or `<name>` (cluster-scoped).
fn split_name(spec: &str) -> Result<(&str, &str), Failure> {
    let bad = || {
        Failure::usage(format!(
            "object {spec:?}: expected <namespace>/<name>, or <name> for a cluster-scoped object"
        ))
    };
    let (namespace, name) = spec.split_once('/').unwrap_or(("", spec));
    if name.is_empty() || name.contains('/') || (spec.contains('/') && namespace.is_empty()) {
        return Err(bad());
    }
    Ok((namespace, name))
}

/// yurthub's `<resource>.<version>.<group>` (group `core` = the core group; the group may contain
/// dots) as a [`Gvr`]; `None` for a plain resource name.
fn parse_resource(spec: &str) -> Result<Option<Gvr>, Failure> {
    let mut parts = spec.splitn(3, '.');
    let resource = parts.next().unwrap_or_default();
    match (resource, parts.next(), parts.next()) {
        (r, None, _) if !r.is_empty() => Ok(None),
        (r, Some(v), Some(g)) if !r.is_empty() && !v.is_empty() && !g.is_empty() => {
            let group = if g == "core" { "" } else { g };
            Ok(Some(Gvr::new(group, v, r)))
        }
        _ => Err(Failure::usage(format!(
            "resource {spec:?}: expected <resource>.<version>.<group> as `outpost cache ls` \
             shows it (pods.v1.core, leases.v1.coordination.k8s.io) or a plain name (pods)"
        ))),
    }
}

/// A plain resource name: the one resource of that name cached for the component; core/v1 when
/// none is (which is then reported as not cached).
fn resolve_plain(stats: &[ResourceStats], component: &str, plain: &str) -> Result<Gvr, Failure> {
    let candidates: Vec<&Gvr> = stats
        .iter()
        .filter(|r| r.component == component && r.gvr.resource == plain)
        .map(|r| &r.gvr)
        .collect();
    match candidates.as_slice() {
        [] => Ok(Gvr::new("", "v1", plain)),
        [one] => Ok((*one).clone()),
        many => {
            let names: Vec<String> = many.iter().map(ToString::to_string).collect();
            Err(Failure::usage(format!(
                "resource {plain:?} is ambiguous for {component}: cached as {}; name one of them",
                names.join(", ")
            )))
        }
    }
}

// ---- verify ------------------------------------------------------------------------------------

fn verify(path: &Path, repair: bool, out: &mut impl Write) -> Result<(), Failure> {
    let store = open_with(path, repair)?;
    if let Some(aside) = store.moved_aside() {
        writeln!(
            out,
            "the cache was damaged: moved aside to {} (kept for inspection); a fresh, empty cache \
             was started, which the hub refills from the cloud",
            aside.display()
        )?;
        return Ok(());
    }
    let report = match store.verify() {
        Ok(report) => report,
        Err(e) if e.is_damage() && repair => {
            let aside = store
                .start_afresh(&e)
                .map_err(cache_error("repairing the cache"))?;
            writeln!(
                out,
                "the cache is damaged ({e}): moved aside to {} (kept for inspection); a fresh, \
                 empty cache was started, which the hub refills from the cloud",
                aside.display()
            )?;
            return Ok(());
        }
        Err(e) if e.is_damage() => {
            return Err(Failure::failed(format!(
                "the cache is damaged ({e}); `outpost cache verify --repair` moves it aside and \
                 starts a fresh one (the hub does the same when it meets it)"
            )));
        }
        Err(e) => return Err(cache_error("verifying the cache")(e)),
    };
    let corrupt = report.corrupt.len();
    if corrupt == 0 {
        writeln!(out, "checked {} entries: no corruption", report.checked)?;
    } else {
        writeln!(
            out,
            "checked {} entries: {corrupt} corrupt (now quarantined)",
            report.checked
        )?;
        for entry in &report.corrupt {
            writeln!(out, "  {}: {}", entry.key, entry.reason)?;
        }
    }
    writeln!(
        out,
        "quarantine holds {} entries",
        store.health().quarantined
    )?;
    match corrupt {
        0 => Ok(()),
        _ if repair => Ok(()),
        n => Err(Failure::failed(format!(
            "{n} corrupt cache {} found; quarantined (never served, cached again on the next fetch)",
            if n == 1 { "entry" } else { "entries" }
        ))),
    }
}

// ---- export ------------------------------------------------------------------------------------

/// What `export` writes, grouped by component then resource.
type Grouped = Vec<(String, Vec<(Gvr, Vec<CachedObject>)>)>;

fn export(args: &CacheExportArgs, out: &mut impl Write) -> Result<(), Failure> {
    let path = &args.path.disk_cache_path;
    let store = open(path)?;
    let quarantined_before = store.health().quarantined;
    let mut grouped: Grouped = Vec::new();
    // `stats` is sorted by (component, resource), so each component's rows are adjacent.
    for row in store.stats().map_err(cache_error("reading the cache"))? {
        let objects = store
            .objects(&row.component, &row.gvr)
            .map_err(cache_error("reading the cache"))?
            .into_iter()
            .map(|(_, object)| object)
            .collect();
        match grouped.last_mut() {
            Some((component, resources)) if *component == row.component => {
                resources.push((row.gvr, objects));
            }
            _ => grouped.push((row.component, vec![(row.gvr, objects)])),
        }
    }
    let left_out = store.health().quarantined - quarantined_before;
    drop(store);

    let doc = export_document(path, &grouped)?;
    let total: usize = grouped
        .iter()
        .flat_map(|(_, r)| r)
        .map(|(_, o)| o.len())
        .sum();
    if args.file.as_os_str() == "-" {
        out.write_all(&doc)?;
    } else {
        write_atomically(&args.file, &doc)?;
        let resources: usize = grouped.iter().map(|(_, r)| r.len()).sum();
        writeln!(
            out,
            "exported {total} object(s) of {resources} resource(s) and {} component(s) to {}",
            grouped.len(),
            args.file.display()
        )?;
    }
    if left_out > 0 {
        eprintln!(
            "outpost: warning: {left_out} corrupt object(s) were quarantined and left out of the \
             export; see `outpost cache verify`"
        );
    }
    Ok(())
}

/// The export as JSON, written by hand so each object keeps its upstream bytes verbatim (the
/// cache checked that they parse as JSON).
fn export_document(source: &Path, grouped: &Grouped) -> io::Result<Vec<u8>> {
    let total: usize = grouped
        .iter()
        .flat_map(|(_, r)| r)
        .map(|(_, o)| o.len())
        .sum();
    let s = |v: &str| serde_json::to_string(v).map_err(io::Error::from);
    let mut doc = Vec::new();
    writeln!(doc, "{{")?;
    writeln!(doc, "  \"kind\": \"OutpostCacheExport\",")?;
    writeln!(doc, "  \"version\": 1,")?;
    writeln!(
        doc,
        "  \"diskCachePath\": {},",
        s(&source.display().to_string())?
    )?;
    writeln!(doc, "  \"objects\": {total},")?;
    write!(doc, "  \"components\": {{")?;
    for (ci, (component, resources)) in grouped.iter().enumerate() {
        let comma = if ci == 0 { "" } else { "," };
        write!(doc, "{comma}\n    {}: {{", s(component)?)?;
        for (ri, (gvr, objects)) in resources.iter().enumerate() {
            let comma = if ri == 0 { "" } else { "," };
            write!(doc, "{comma}\n      {}: [", s(&gvr.to_string())?)?;
            for (oi, object) in objects.iter().enumerate() {
                let comma = if oi == 0 { "" } else { "," };
                write!(doc, "{comma}\n        ")?;
                doc.extend_from_slice(&object.bytes);
            }
            write!(doc, "{}]", if objects.is_empty() { "" } else { "\n      " })?;
        }
        write!(
            doc,
            "{}}}",
            if resources.is_empty() { "" } else { "\n    " }
        )?;
    }
    writeln!(doc, "{}}}", if grouped.is_empty() { "" } else { "\n  " })?;
    writeln!(doc, "}}")?;
    Ok(doc)
}

/// Temp file in the same directory (mode 0600: the cache can hold secrets), fsync, rename.
fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), Failure> {
    let fail = |e: io::Error| Failure::failed(format!("cannot write {}: {e}", path.display()));
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_owned(),
        _ => PathBuf::from("."),
    };
    let mut tmp = tempfile::Builder::new()
        .prefix(".outpost-export-")
        .tempfile_in(&dir)
        .map_err(fail)?;
    tmp.write_all(bytes).map_err(fail)?;
    tmp.as_file().sync_all().map_err(fail)?;
    tmp.persist(path).map_err(|e| fail(e.error))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{Cli, Command, DEFAULT_DISK_CACHE_PATH};
    use clap::Parser;

    #[test]
    fn the_default_path_is_the_hubs() {
        let hub = Cli::try_parse_from(["outpost"]).expect("hub defaults");
        assert_eq!(
            hub.hub.disk_cache_path,
            PathBuf::from(DEFAULT_DISK_CACHE_PATH)
        );
        let cli = Cli::try_parse_from(["outpost", "cache", "verify"]).expect("parse");
        let Some(Command::Cache { command }) = cli.command else {
            panic!("not a cache command");
        };
        let CacheCommand::Verify(args) = *command else {
            panic!("not verify");
        };
        assert_eq!(args.path.disk_cache_path, hub.hub.disk_cache_path);
    }

    #[test]
    fn resources_parse_in_yurthubs_spelling() {
        let parsed = |s| parse_resource(s).map_err(|f| f.message);
        assert_eq!(parsed("pods.v1.core"), Ok(Some(Gvr::new("", "v1", "pods"))));
        assert_eq!(
            parsed("leases.v1.coordination.k8s.io"),
            Ok(Some(Gvr::new("coordination.k8s.io", "v1", "leases")))
        );
        assert_eq!(parsed("pods"), Ok(None));
        for bad in ["", "pods.v1", "pods..core", ".v1.core", "pods.v1."] {
            assert!(parsed(bad).is_err(), "{bad:?}");
        }
        let gvr = Gvr::new("discovery.k8s.io", "v1", "endpointslices");
        assert_eq!(parsed(&gvr.to_string()), Ok(Some(gvr)));
    }

    fn row(component: &str, gvr: Gvr) -> ResourceStats {
        ResourceStats {
            component: component.into(),
            gvr,
            objects: 1,
            events: 0,
            bytes: 10,
            scopes: 0,
            last_resource_version: None,
            last_write: None,
        }
    }

    #[test]
    fn plain_names_resolve_when_unambiguous() {
        let stats = [
            row("kubelet", Gvr::new("", "v1", "pods")),
            row("kubelet", Gvr::new("apps", "v1", "deployments")),
            row("kubelet", Gvr::new("apps", "v1beta1", "deployments")),
            row("kube-proxy", Gvr::new("example.com", "v1", "widgets")),
        ];
        let resolve = |c, p| resolve_plain(&stats, c, p).map_err(|f| (f.code, f.message));
        assert_eq!(resolve("kubelet", "pods"), Ok(Gvr::new("", "v1", "pods")));
        assert_eq!(
            resolve("kube-proxy", "pods"),
            Ok(Gvr::new("", "v1", "pods")),
            "nothing cached: core/v1"
        );
        assert_eq!(
            resolve("kube-proxy", "widgets"),
            Ok(Gvr::new("example.com", "v1", "widgets"))
        );
        let (code, message) = resolve("kubelet", "deployments").expect_err("ambiguous");
        assert_eq!(code, 2);
        assert!(
            message.contains("deployments.v1.apps, deployments.v1beta1.apps"),
            "{message}"
        );
    }

    #[test]
    fn object_names() {
        assert_eq!(
            split_name("kube-system/coredns").ok(),
            Some(("kube-system", "coredns"))
        );
        assert_eq!(split_name("node-1").ok(), Some(("", "node-1")));
        for bad in ["", "/x", "a/", "a/b/c"] {
            assert!(split_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn sizes_and_ages_read_like_kubectl() {
        assert_eq!(human_bytes(999), "999B");
        assert_eq!(human_bytes(1536), "1.5KiB");
        assert_eq!(human_bytes(5 << 20), "5.0MiB");
        assert_eq!(human_age(Duration::from_secs(59)), "59s");
        assert_eq!(human_age(Duration::from_secs(600)), "10m");
        assert_eq!(human_age(Duration::from_secs(3 * 3600)), "3h");
        assert_eq!(human_age(Duration::from_secs(5 * 86_400)), "5d");
    }

    #[test]
    fn an_export_of_nothing_is_still_json() {
        let doc = export_document(Path::new("/c"), &Vec::new()).expect("doc");
        let v: serde_json::Value = serde_json::from_slice(&doc).expect("json");
        assert_eq!(v["components"], json!({}));
        assert_eq!(v["objects"], 0);
    }
}
