//! The conversion record: which node files and directories convert created or modified, with the
//! SHA-256 of what it wrote (and of the original, whose copy sits next to the record). revert trusts
//! nothing else, and refuses when a checksum no longer matches.

use std::path::Path;

use crate::error::NodeError;
use crate::fsops;
use crate::node::{Node, RECORD};

const HEADER: &str = "# outpost node convert record v1";
const PREAMBLE: &str =
    "# `outpost node revert` checks these checksums and undoes exactly this. Do not edit.";

/// One thing convert did, named by its node path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Entry {
    /// A directory that did not exist before; removed again if it is empty.
    Dir { path: String },
    /// A file that did not exist before.
    Created { path: String, sha: String },
    /// A file whose original is kept in the backup folder.
    Modified {
        path: String,
        sha: String,
        original_sha: String,
    },
}

impl Entry {
    pub(crate) fn path(&self) -> &str {
        match self {
            Entry::Dir { path } | Entry::Created { path, .. } | Entry::Modified { path, .. } => {
                path
            }
        }
    }

    fn render(&self) -> String {
        match self {
            Entry::Dir { path } => format!("dir {path}"),
            Entry::Created { path, sha } => format!("created {path} sha256={sha}"),
            Entry::Modified {
                path,
                sha,
                original_sha,
            } => format!("modified {path} sha256={sha} original-sha256={original_sha}"),
        }
    }

    fn parse(line: &str) -> Option<Entry> {
        let fields: Vec<&str> = line.split(' ').collect();
        let path = |p: &str| p.starts_with('/').then(|| p.to_owned());
        let sha = |f: &str, key: &str| {
            let hex = f.strip_prefix(key)?.strip_prefix('=')?;
            (hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit())).then(|| hex.to_owned())
        };
        match fields.as_slice() {
            ["dir", p] => Some(Entry::Dir { path: path(p)? }),
            ["created", p, s] => Some(Entry::Created {
                path: path(p)?,
                sha: sha(s, "sha256")?,
            }),
            ["modified", p, s, o] => Some(Entry::Modified {
                path: path(p)?,
                sha: sha(s, "sha256")?,
                original_sha: sha(o, "original-sha256")?,
            }),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Record {
    entries: Vec<Entry>,
}

impl Record {
    /// The node's record, or `None` if convert never ran (or revert finished).
    pub(crate) fn load(node: &Node) -> Result<Option<Record>, NodeError> {
        let path = node.host(RECORD);
        let Some(bytes) = fsops::read_opt(&path)? else {
            return Ok(None);
        };
        let text = String::from_utf8(bytes)
            .map_err(|_| NodeError::refused(&path, "the conversion record is not UTF-8 text"))?;
        Record::parse(&text, &path).map(Some)
    }

    fn parse(text: &str, path: &Path) -> Result<Record, NodeError> {
        let mut lines = text.lines();
        if lines.next() != Some(HEADER) {
            return Err(NodeError::refused(
                path,
                format!("the conversion record does not start with {HEADER:?}"),
            ));
        }
        let entries = lines
            .enumerate()
            .filter(|(_, l)| !l.starts_with('#') && !l.is_empty())
            .map(|(i, l)| {
                Entry::parse(l).ok_or_else(|| {
                    NodeError::refused(path, format!("unreadable line {}: {l:?}", i + 2))
                })
            })
            .collect::<Result<_, _>>()?;
        Ok(Record { entries })
    }

    fn render(&self) -> String {
        let mut text = format!("{HEADER}\n{PREAMBLE}\n");
        for entry in &self.entries {
            text.push_str(&entry.render());
            text.push('\n');
        }
        text
    }

    pub(crate) fn save(&self, node: &Node) -> Result<(), NodeError> {
        fsops::write_private(&node.host(RECORD), self.render().as_bytes())
    }

    pub(crate) fn entries(&self) -> &[Entry] {
        &self.entries
    }

    pub(crate) fn find(&self, path: &str) -> Option<&Entry> {
        self.entries.iter().find(|e| e.path() == path)
    }

    /// Adds the entry, or replaces the one for the same path.
    pub(crate) fn put(&mut self, entry: Entry) {
        match self.entries.iter_mut().find(|e| e.path() == entry.path()) {
            Some(slot) => *slot = entry,
            None => self.entries.push(entry),
        }
    }
}

/// Lowercase hex SHA-256.
pub(crate) fn sha256(bytes: &[u8]) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, bytes);
    digest.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Record {
        let mut r = Record::default();
        r.put(Entry::Dir {
            path: "/var/lib/openyurt".into(),
        });
        r.put(Entry::Created {
            path: "/etc/kubernetes/manifests/outpost.yaml".into(),
            sha: sha256(b"a"),
        });
        r.put(Entry::Modified {
            path: "/var/lib/kubelet/kubeadm-flags.env".into(),
            sha: sha256(b"b"),
            original_sha: sha256(b"c"),
        });
        r
    }

    #[test]
    fn sha256_matches_a_known_vector() {
        assert_eq!(
            sha256(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn round_trips_through_text() {
        let r = sample();
        assert_eq!(Record::parse(&r.render(), Path::new("/r")).unwrap(), r);
    }

    #[test]
    fn put_replaces_the_entry_for_the_same_path() {
        let mut r = sample();
        r.put(Entry::Created {
            path: "/etc/kubernetes/manifests/outpost.yaml".into(),
            sha: sha256(b"z"),
        });
        assert_eq!(r.entries().len(), 3);
        assert_eq!(
            r.find("/etc/kubernetes/manifests/outpost.yaml"),
            Some(&Entry::Created {
                path: "/etc/kubernetes/manifests/outpost.yaml".into(),
                sha: sha256(b"z")
            })
        );
    }

    #[test]
    fn damaged_records_are_refused_naming_the_line() {
        let text = sample().render().replace("created /etc", "created etc");
        let err = Record::parse(&text, Path::new("/r"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("/r") && err.contains("line 4"), "{err}");
        let err = Record::parse("garbage\n", Path::new("/r"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("does not start with"), "{err}");
    }
}
