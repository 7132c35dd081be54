//! The state dump an operator asks for with `kill -USR1` (yurthub's SIGUSR1), written to
//! `<root-dir>/yurthub.<pid>.stacks.log`, the file yurthub writes its goroutine stacks to.
//!
//! Async Rust tasks have no stacks to walk, so the dump holds what explains a stuck or slow hub
//! instead: readiness with every check's detail, the process's threads and what each is doing,
//! the async runtime's task counts, and every metric (requests in flight per component and
//! resource, upstream health, open watches, cache state). Start at [`render`].

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::admin::Admin;

/// The whole dump, as text, from what the admin server reports.
pub fn render(admin: &Admin) -> String {
    let mut out = format!(
        "outpost {} state dump, pid {}, {}\n\
         Async Rust tasks have no stacks to dump; this is the hub's state.\n",
        env!("CARGO_PKG_VERSION"),
        std::process::id(),
        outpost_proxy::rfc3339_now(),
    );
    let (_, readiness) = admin.readiness_text(true);
    section(&mut out, "readiness (/v1/readyz?verbose)", &readiness);
    section(&mut out, "threads (/proc/self/task)", &threads());
    section(&mut out, "async runtime", &runtime());
    let metrics = admin.metrics.render();
    section(
        &mut out,
        "metrics (/metrics)",
        &String::from_utf8_lossy(&metrics),
    );
    out
}

/// Where the dump of process `pid` goes: yurthub's file name, so that collection scripts find it.
pub fn path(root_dir: &Path, pid: u32) -> PathBuf {
    root_dir.join(format!("yurthub.{pid}.stacks.log"))
}

fn section(out: &mut String, title: &str, body: &str) {
    let _ = write!(out, "\n== {title}\n{body}");
    if !body.ends_with('\n') {
        out.push('\n');
    }
}

/// One line per thread: id, name, scheduler state and CPU time.
fn threads() -> String {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return "not available on this system\n".into();
    };
    let mut lines: Vec<(u32, String)> = tasks
        .filter_map(|t| {
            let tid: u32 = t.ok()?.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).ok()?;
            Some((tid, thread_line(tid, &stat)?))
        })
        .collect();
    lines.sort();
    let mut out = String::from("tid\tstate\tcpu_ms\tname\n");
    for (_, line) in lines {
        out.push_str(&line);
        out.push('\n');
    }
    out
}

/// A thread's line from its `/proc/<pid>/task/<tid>/stat`: `tid (comm) state ... utime stime`.
fn thread_line(tid: u32, stat: &str) -> Option<String> {
    // The name may hold spaces and parentheses: it ends at the last ')'.
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let name = &stat[open + 1..close];
    let fields: Vec<&str> = stat[close + 1..].split_whitespace().collect();
    // After the name: state is field 3 of the file, utime and stime fields 14 and 15.
    let state = fields.first()?;
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    // USER_HZ is 100 on every Linux ABI Outpost runs on.
    Some(format!("{tid}\t{state}\t{}\t{name}", ticks * 10))
}

fn runtime() -> String {
    match tokio::runtime::Handle::try_current() {
        Ok(handle) => {
            let m = handle.metrics();
            format!(
                "workers {}, alive tasks {}, tasks queued globally {}\n",
                m.num_workers(),
                m.num_alive_tasks(),
                m.global_queue_depth()
            )
        }
        Err(_) => "no runtime\n".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_line_reads_names_with_spaces_and_parentheses() {
        let stat = "4242 (sled-io (2)) S 1 1 1 0 -1 4194368 80 0 0 0 7 5 0 0 20 0 15 0";
        assert_eq!(
            thread_line(4242, stat).unwrap(),
            "4242\tS\t120\tsled-io (2)"
        );
        assert!(thread_line(1, "garbage").is_none());
    }

    #[test]
    fn this_process_lists_its_threads() {
        let text = threads();
        let me = std::fs::read_to_string("/proc/thread-self/comm").unwrap();
        assert!(text.contains(me.trim()), "{text}");
    }

    #[test]
    fn the_dump_goes_where_yurthub_writes_its_stacks() {
        assert_eq!(
            path(Path::new("/var/lib/yurthub"), 7),
            Path::new("/var/lib/yurthub/yurthub.7.stacks.log")
        );
    }
}
