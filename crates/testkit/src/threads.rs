//! A process's threads as Linux shows them (`/proc/<pid>/task/*/stat`): names and nice values,
//! for tests that check which threads run at which CPU priority.

/// One thread of a process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThreadStat {
    pub tid: i32,
    /// As the kernel keeps it: at most 15 bytes.
    pub name: String,
    pub nice: i32,
}

/// The threads of process `pid` (`None`: this one) that could be read; a thread that ends while
/// they are read is left out.
pub fn threads(pid: Option<u32>) -> Vec<ThreadStat> {
    let dir = match pid {
        Some(pid) => format!("/proc/{pid}/task"),
        None => "/proc/self/task".to_owned(),
    };
    let Ok(tasks) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|task| parse(&std::fs::read_to_string(task.path().join("stat")).ok()?))
        .collect()
}

/// The nice value of thread `tid` of this process; `None` once it ended.
pub fn nice_of(tid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).ok()?;
    parse(&stat).map(|t| t.nice)
}

/// `<tid> (<name>) <state> …`: the name may hold spaces and parentheses, so it ends at the last
/// `)`; after it the state is field 3 of the file and the nice value field 19.
fn parse(stat: &str) -> Option<ThreadStat> {
    let (open, close) = (stat.find('(')?, stat.rfind(')')?);
    let tid = stat[..open].trim().parse().ok()?;
    let nice = stat[close + 1..].split_whitespace().nth(16)?.parse().ok()?;
    Some(ThreadStat {
        tid,
        name: stat[open + 1..close].to_owned(),
        nice,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_with_spaces_and_parentheses_is_read_whole() {
        let stat = "4242 (log (flusher)) S 1 4242 4242 0 -1 4194368 0 0 0 0 3 1 0 0 30 10 5 0 100";
        let t = parse(stat).unwrap();
        assert_eq!(
            (t.tid, t.name.as_str(), t.nice),
            (4242, "log (flusher)", 10)
        );
    }

    #[test]
    fn this_threads_nice_is_found() {
        let me = threads(None);
        assert!(!me.is_empty());
        let main = &me[0];
        assert_eq!(nice_of(main.tid), Some(main.nice));
    }
}
