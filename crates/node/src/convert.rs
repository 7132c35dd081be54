//! `outpost node convert`: check the node, plan the three file changes, then make them in the
//! order that keeps kubelet working: the hub's static pod first, kubelet's redirect only once the
//! hub reports ready.
//!
//! The plan is computed from the disk and the conversion record before anything is written, so
//! every refusal happens on an untouched node. A run interrupted half-way (or one whose hub never
//! got ready) is finished by running convert again.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::args::ConvertArgs;
use crate::diff;
use crate::error::NodeError;
use crate::flags_env::{self, HUB_KUBECONFIG_FLAG_VALUE};
use crate::fsops;
use crate::kubelet::{self, RESTART_HINT};
use crate::node::{
    BACKUP_DIR, CLUSTER_CA, HUB_KUBECONFIG, KUBEADM_FLAGS, KUBELET_CLIENT_CERT, KUBELET_KUBECONFIG,
    MANIFEST, MANIFEST_DIR, Node, RECORD,
};
use crate::outcome::{Change, Outcome, say};
use crate::readyz::ReadyzUrl;
use crate::record::{Entry, Record, sha256};
use crate::render;

/// One file convert wants in a given state.
#[derive(Debug)]
struct Step {
    path: &'static str,
    /// What is on disk now.
    current: Option<Vec<u8>>,
    /// `Some` for a file convert modifies: its content before convert.
    original: Option<Vec<u8>>,
    desired: Vec<u8>,
}

impl Step {
    fn pending(&self) -> bool {
        self.current.as_deref() != Some(self.desired.as_slice())
    }
}

/// Installs the hub's static pod and, once the hub is ready, points kubelet at it.
///
/// Progress goes to `out`; an error means the node is as described by the error's message.
pub fn convert(args: &ConvertArgs, out: &mut dyn Write) -> Result<Outcome, NodeError> {
    args.validate()?;
    let readyz = ReadyzUrl::parse(&args.readyz_url)?;
    let node = Node::new(&args.root);
    let mut record = Record::load(&node)?.unwrap_or_default();
    check_kubeadm_node(&node)?;
    check_no_yurthub(&node)?;
    let hub_kubeconfig = render::hub_kubeconfig().as_bytes().to_vec();
    let kubeconfig = created_step(&node, &record, HUB_KUBECONFIG, hub_kubeconfig, false)?;
    let flags = flags_step(&node, &record)?;
    let kubelet_pending = kubeconfig.pending() || flags.pending();
    // Until kubelet is redirected nothing relies on the hub, so a re-run may fix its static pod
    // (say, a wrong image that kept it from getting ready).
    let pod = render::static_pod(args)?.into_bytes();
    let manifest = created_step(&node, &record, MANIFEST, pod, kubelet_pending)?;
    if !manifest.pending() && !kubelet_pending {
        say(out, "already converted: nothing to do")?;
        return Ok(Outcome::default());
    }
    if args.dry_run {
        return dry_run(&node, args, [&manifest, &kubeconfig, &flags], out);
    }
    let mut outcome = Outcome::default();
    apply(&node, &mut record, &manifest, &mut outcome, out)?;
    if kubelet_pending {
        wait_ready(&node, args, &readyz, out)?;
        // The wait can be long: an operator (or kubeadm) may have changed kubelet's files
        // meanwhile. Plan kubelet's part again from what is on disk now, so that such a change
        // is kept (redirected with the rest) or refused, never overwritten with what was read
        // before the wait.
        check_kubeadm_node(&node)?;
        let hub_kubeconfig = render::hub_kubeconfig().as_bytes().to_vec();
        let kubeconfig = created_step(&node, &record, HUB_KUBECONFIG, hub_kubeconfig, false)?;
        let flags = flags_step(&node, &record)?;
        apply(&node, &mut record, &kubeconfig, &mut outcome, out)?;
        apply(&node, &mut record, &flags, &mut outcome, out)?;
        outcome.kubelet_restarted = kubelet::restart_or_advise(
            &args.systemctl,
            args.restart_kubelet,
            "for kubelet to use outpost",
            out,
        )?;
    }
    say(out, "converted; `outpost node revert` undoes it")?;
    Ok(outcome)
}

fn check_kubeadm_node(node: &Node) -> Result<(), NodeError> {
    if !node.host(MANIFEST_DIR).is_dir() {
        return Err(NodeError::refused(
            node.host(MANIFEST_DIR),
            "not a directory; is this a kubeadm node with static pods enabled?",
        ));
    }
    // Present as a file or a symlink: kubelet's client certificate is an absolute symlink, which
    // does not resolve when the node's tree is mounted under another root.
    for (path, what) in [
        (KUBELET_KUBECONFIG, "kubelet's kubeconfig"),
        (CLUSTER_CA, "the cluster CA the hub needs"),
        (
            KUBELET_CLIENT_CERT,
            "kubelet's client certificate the hub needs",
        ),
    ] {
        if fs::symlink_metadata(node.host(path)).is_err() {
            return Err(NodeError::refused(
                node.host(path),
                format!("missing ({what}); is this a kubeadm node?"),
            ));
        }
    }
    Ok(())
}

/// A node that already runs yurthub must be reverted with OpenYurt's tools first: two hubs would
/// fight over the same ports.
fn check_no_yurthub(node: &Node) -> Result<(), NodeError> {
    let dir = node.host(MANIFEST_DIR);
    let entries = fs::read_dir(&dir).map_err(|e| NodeError::io("list", &dir, e))?;
    for entry in entries {
        let path = entry.map_err(|e| NodeError::io("list", &dir, e))?.path();
        let name = path
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .to_lowercase();
        if name.starts_with('.') || path == node.host(MANIFEST) || !path.is_file() {
            continue;
        }
        if name.contains("yurthub") || name.contains("yurt-hub") || runs_yurthub(&path) {
            return Err(NodeError::refused(
                path,
                "a yurthub static pod is installed; revert it with OpenYurt's tools first",
            ));
        }
    }
    Ok(())
}

fn runs_yurthub(manifest: &Path) -> bool {
    let text = fs::read(manifest).unwrap_or_default();
    String::from_utf8_lossy(&text).lines().any(|line| {
        let line = line.trim();
        line == "- yurthub" || (line.starts_with("image:") && line.contains("yurthub"))
    })
}

/// A file convert creates: absent before, or written by an earlier (maybe interrupted) convert,
/// which may be replaced when `replaceable`.
fn created_step(
    node: &Node,
    record: &Record,
    path: &'static str,
    desired: Vec<u8>,
    replaceable: bool,
) -> Result<Step, NodeError> {
    let host = node.host(path);
    let current = fsops::read_opt(&host)?;
    match (record.find(path), &current) {
        (None, None) => {}
        (None, Some(_)) => {
            return Err(NodeError::refused(
                host,
                "exists but was not written by outpost node convert \
                 (a node converted by yurtctl or node-servant?)",
            ));
        }
        (Some(Entry::Created { sha, .. }), Some(bytes)) if *bytes != desired => {
            if sha256(bytes) != *sha {
                return Err(changed_since_convert(host));
            }
            if !replaceable {
                return Err(different_settings(host));
            }
        }
        (Some(Entry::Created { .. }), _) => {}
        (Some(_), _) => return Err(unexpected_entry(node, path)),
    }
    Ok(Step {
        path,
        current,
        original: None,
        desired,
    })
}

/// kubeadm-flags.env: the original comes from the backup once convert has modified it.
fn flags_step(node: &Node, record: &Record) -> Result<Step, NodeError> {
    let host = node.host(KUBEADM_FLAGS);
    let Some(current) = fsops::read_opt(&host)? else {
        return Err(NodeError::refused(host, "missing; is this a kubeadm node?"));
    };
    let original = match record.find(KUBEADM_FLAGS) {
        None => {
            check_not_redirected(&host, &current)?;
            current.clone()
        }
        Some(Entry::Modified { original_sha, .. }) => backup(node, KUBEADM_FLAGS, original_sha)?,
        Some(_) => return Err(unexpected_entry(node, KUBEADM_FLAGS)),
    };
    let desired = redirect_flags(&host, &original)?;
    if current != desired && current != original {
        return Err(changed_since_convert(host));
    }
    Ok(Step {
        path: KUBEADM_FLAGS,
        current: Some(current),
        original: Some(original),
        desired,
    })
}

fn redirect_flags(host: &Path, content: &[u8]) -> Result<Vec<u8>, NodeError> {
    let text =
        std::str::from_utf8(content).map_err(|_| NodeError::refused(host, "not UTF-8 text"))?;
    let args =
        flags_env::parse(text).map_err(|found| NodeError::refused(host, found.to_string()))?;
    Ok(flags_env::redirected(text, &args).into_bytes())
}

fn check_not_redirected(host: &Path, content: &[u8]) -> Result<(), NodeError> {
    let text = String::from_utf8_lossy(content);
    let Ok(args) = flags_env::parse(&text) else {
        return Ok(()); // redirect_flags reports what is wrong with the file
    };
    match args.kubeconfig() {
        None => Ok(()),
        Some(HUB_KUBECONFIG_FLAG_VALUE) => Err(NodeError::refused(
            host,
            format!(
                "KUBELET_KUBEADM_ARGS already has --kubeconfig={HUB_KUBECONFIG_FLAG_VALUE}, \
                 not set by outpost (converted by yurtctl or node-servant?)"
            ),
        )),
        Some(other) => Err(NodeError::refused(
            host,
            format!("KUBELET_KUBEADM_ARGS already redirects kubelet: --kubeconfig={other}"),
        )),
    }
}

/// The original of a modified file, checked against the record.
fn backup(node: &Node, path: &str, original_sha: &str) -> Result<Vec<u8>, NodeError> {
    let at = node.backup_of(path);
    match fsops::read_opt(&at)? {
        Some(bytes) if sha256(&bytes) == original_sha => Ok(bytes),
        Some(_) => Err(NodeError::refused(
            at,
            "the backup does not match the checksum in the conversion record",
        )),
        None => Err(NodeError::refused(
            at,
            "the backup of the original is missing",
        )),
    }
}

fn different_settings(host: impl AsRef<Path>) -> NodeError {
    NodeError::refused(
        host.as_ref(),
        "already converted with different settings; run `outpost node revert` first",
    )
}

fn changed_since_convert(host: impl AsRef<Path>) -> NodeError {
    NodeError::refused(
        host.as_ref(),
        "changed since outpost node convert wrote it; put it back or revert by hand",
    )
}

fn unexpected_entry(node: &Node, path: &str) -> NodeError {
    NodeError::refused(
        node.host(RECORD),
        format!("the conversion record lists {path} with an unexpected kind"),
    )
}

fn dry_run(
    node: &Node,
    args: &ConvertArgs,
    steps: [&Step; 3],
    out: &mut dyn Write,
) -> Result<Outcome, NodeError> {
    say(
        out,
        "dry run: nothing is changed; convert would make these changes:",
    )?;
    let mut outcome = Outcome {
        dry_run: true,
        ..Outcome::default()
    };
    let mut waited = false;
    for step in steps.into_iter().filter(|s| s.pending()) {
        if step.path != MANIFEST && !waited {
            waited = true;
            say(
                out,
                format!(
                    "then, once {} reports ready (within {:?}):",
                    args.readyz_url, args.wait_ready_timeout
                ),
            )?;
        }
        let host = node.host(step.path);
        diff::print(out, &host, step.current.as_deref(), Some(&step.desired))?;
        outcome.changes.push(change_for(step, host));
    }
    say(
        out,
        format!(
            "originals and the conversion record would be kept in {}",
            node.host(BACKUP_DIR).display()
        ),
    )?;
    let kubelet = if args.restart_kubelet {
        "would be restarted"
    } else {
        "would not be restarted"
    };
    say(out, format!("kubelet {kubelet} ({RESTART_HINT})"))?;
    Ok(outcome)
}

fn change_for(step: &Step, host: PathBuf) -> Change {
    if step.current.is_some() {
        Change::Modified(host)
    } else {
        Change::Created(host)
    }
}

fn wait_ready(
    node: &Node,
    args: &ConvertArgs,
    readyz: &ReadyzUrl,
    out: &mut dyn Write,
) -> Result<(), NodeError> {
    say(
        out,
        format!(
            "waiting up to {:?} for outpost to report ready at {}",
            args.wait_ready_timeout, args.readyz_url
        ),
    )?;
    readyz
        .wait(args.wait_ready_timeout)
        .map_err(|last| NodeError::NotReady {
            url: args.readyz_url.clone(),
            last,
            waited: args.wait_ready_timeout,
            manifest: node.host(MANIFEST),
        })?;
    say(out, "outpost is ready")
}

/// Records the step (and backs up the original) before writing, so that a crash at any point
/// leaves a record that revert, or another convert, can finish from.
fn apply(
    node: &Node,
    record: &mut Record,
    step: &Step,
    outcome: &mut Outcome,
    out: &mut dyn Write,
) -> Result<(), NodeError> {
    if !step.pending() {
        return Ok(());
    }
    record_new_dirs(node, record, BACKUP_DIR)?;
    // The originals may hold credentials (kubelet's kubeconfig can embed its client key).
    fsops::private_dir(&node.host(BACKUP_DIR))?;
    if let Some(parent) = Path::new(step.path).parent() {
        record_new_dirs(node, record, &parent.to_string_lossy())?;
    }
    let host = node.host(step.path);
    if fsops::read_opt(&host)? != step.current {
        return Err(NodeError::refused(
            host,
            "changed while outpost node convert was running; run it again",
        ));
    }
    let entry = match &step.original {
        None => Entry::Created {
            path: step.path.into(),
            sha: sha256(&step.desired),
        },
        Some(original) => {
            save_backup(node, step.path, original)?;
            Entry::Modified {
                path: step.path.into(),
                sha: sha256(&step.desired),
                original_sha: sha256(original),
            }
        }
    };
    record.put(entry);
    record.save(node)?;
    fsops::write_atomic(&host, &step.desired)?;
    let change = change_for(step, host);
    say(out, &change)?;
    outcome.changes.push(change);
    Ok(())
}

fn record_new_dirs(node: &Node, record: &mut Record, dir: &str) -> Result<(), NodeError> {
    let created = fsops::create_dirs(node, dir)?;
    if created.is_empty() {
        return Ok(());
    }
    for path in created {
        record.put(Entry::Dir { path });
    }
    record.save(node)
}

fn save_backup(node: &Node, path: &str, original: &[u8]) -> Result<(), NodeError> {
    let at = node.backup_of(path);
    if let Some(parent) = at.parent() {
        fsops::private_dir(parent)?;
    }
    fsops::write_private(&at, original)?;
    // The backup is the only copy of the original: make sure it reads back intact.
    match fsops::read_opt(&at)? {
        Some(bytes) if bytes == original => Ok(()),
        _ => Err(NodeError::refused(
            at,
            "the backup did not read back as written",
        )),
    }
}
