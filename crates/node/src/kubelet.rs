//! Restarting kubelet so it rereads `kubeadm-flags.env`: only when asked, since it briefly takes the
//! node's pods off the apiserver's radar; otherwise the operator gets the command to run.

use std::io::Write;
use std::path::Path;
use std::process::Command;

use crate::error::NodeError;
use crate::outcome::say;

pub(crate) const RESTART_HINT: &str = "systemctl daemon-reload && systemctl restart kubelet";

/// Restarts kubelet when `restart` is set, else prints how to; returns whether it restarted.
pub(crate) fn restart_or_advise(
    systemctl: &Path,
    restart: bool,
    why: &str,
    out: &mut dyn Write,
) -> Result<bool, NodeError> {
    if !restart {
        say(
            out,
            format!("kubelet was not restarted; {why}, run: {RESTART_HINT}"),
        )?;
        return Ok(false);
    }
    run(systemctl, &["daemon-reload"])?;
    run(systemctl, &["restart", "kubelet"])?;
    say(out, "restarted kubelet")?;
    Ok(true)
}

fn run(program: &Path, args: &[&str]) -> Result<(), NodeError> {
    let command = format!("{} {}", program.display(), args.join(" "));
    let output = Command::new(program)
        .args(args)
        .output()
        .map_err(|e| NodeError::Command {
            command: command.clone(),
            detail: e.to_string(),
        })?;
    if output.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&output.stderr);
    let detail = match stderr.lines().find(|l| !l.trim().is_empty()) {
        Some(line) => format!("{}: {}", output.status, line.trim()),
        None => output.status.to_string(),
    };
    Err(NodeError::Command { command, detail })
}
