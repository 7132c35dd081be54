//! Links the release `outpost` binary with the functions it runs in operation placed together
//! (`link/hot.order`, an lld symbol ordering file; `link/regenerate.sh` writes it).
//!
//! Why: an idle hub's resident memory is mostly the binary's code pages. The kernel maps code in
//! 64 KiB windows around each page touched, and the few functions a hub runs were spread over
//! nearly every window of the text, next to the CLI and code that runs once. Placed together
//! they fit in a fraction of it, and the idle hub's RSS falls by about a third (figures in
//! BENCHMARKS.md and `docs/benchmarks-journal.md`, "The hot code placed together").
//!
//! Only where lld is known to be the linker: release builds for x86_64 Linux (GNU) with rustc
//! 1.90 or later shipping its own lld (its default linker there; some distributions' rustc does
//! not ship it), and no linker chosen by the user. A symbol the file names but the binary lacks
//! (an older file, another compiler) is skipped without a word; the layout then falls back
//! towards the default one, never to a failed link. The file is written for the shipped build
//! (`--no-default-features`, as the Dockerfile builds it); `link/check.sh`, run by CI, fails
//! when that build defines under 95 % of its symbols.
//! `OUTPOST_LINK_ORDER=off` turns it off.

use std::env;
use std::path::Path;
use std::process::Command;

const ORDER_FILE: &str = "link/hot.order";

fn main() {
    println!("cargo:rerun-if-changed={ORDER_FILE}");
    println!("cargo:rerun-if-env-changed=OUTPOST_LINK_ORDER");
    if env::var("OUTPOST_LINK_ORDER").is_ok_and(|v| v == "off") || !links_with_default_lld() {
        return;
    }
    let dir = env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let order = Path::new(&dir).join(ORDER_FILE);
    if !order.is_file() {
        return;
    }
    println!(
        "cargo:rustc-link-arg-bin=outpost=-Wl,--symbol-ordering-file={}",
        order.display()
    );
    println!("cargo:rustc-link-arg-bin=outpost=-Wl,--no-warn-symbol-ordering");
}

/// Whether this build links the release binary with rustc's own lld.
fn links_with_default_lld() -> bool {
    let var = |name: &str| env::var(name).unwrap_or_default();
    var("PROFILE") == "release"
        && var("TARGET") == "x86_64-unknown-linux-gnu"
        && env::var_os("RUSTC_LINKER").is_none()
        && !var("CARGO_ENCODED_RUSTFLAGS").contains("linker")
        && rustc(&["-vV"]).is_some_and(|v| minor_version(&v).is_some_and(|minor| minor >= 90))
        && rustc(&["--print", "sysroot"]).is_some_and(|sysroot| {
            Path::new(sysroot.trim())
                .join("lib/rustlib/x86_64-unknown-linux-gnu/bin/gcc-ld/ld.lld")
                .is_file()
        })
}

/// What `rustc <args>` prints.
fn rustc(args: &[&str]) -> Option<String> {
    let out = Command::new(env::var_os("RUSTC")?)
        .args(args)
        .output()
        .ok()?;
    out.status.success().then_some(())?;
    String::from_utf8(out.stdout).ok()
}

/// `90` for rustc 1.90.x, from `rustc -vV`.
fn minor_version(verbose: &str) -> Option<u32> {
    let release = verbose.lines().find_map(|l| l.strip_prefix("release: "))?;
    release.split('.').nth(1)?.parse().ok()
}
