//! Unified diffs for `--dry-run`, with `/dev/null` standing for a file that does not exist.

use std::io::Write;
use std::path::Path;

use similar::TextDiff;

use crate::error::NodeError;

/// Prints the diff that turns `before` into `after` at `path`.
pub(crate) fn print(
    out: &mut dyn Write,
    path: &Path,
    before: Option<&[u8]>,
    after: Option<&[u8]>,
) -> Result<(), NodeError> {
    let name = path.display().to_string();
    let label = |side: Option<&[u8]>| {
        if side.is_some() {
            name.as_str()
        } else {
            "/dev/null"
        }
    };
    let old = String::from_utf8_lossy(before.unwrap_or_default());
    let new = String::from_utf8_lossy(after.unwrap_or_default());
    let diff = TextDiff::from_lines(old.as_ref(), new.as_ref());
    let text = diff
        .unified_diff()
        .context_radius(3)
        .header(label(before), label(after))
        .to_string();
    out.write_all(text.as_bytes()).map_err(NodeError::Report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn creation_and_modification_diffs() {
        let mut out = Vec::new();
        print(&mut out, Path::new("/a"), None, Some(b"x\n")).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "--- /dev/null\n+++ /a\n@@ -0,0 +1 @@\n+x\n"
        );
        let mut out = Vec::new();
        print(&mut out, Path::new("/a"), Some(b"x\ny\n"), Some(b"x\nz\n")).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.starts_with("--- /a\n+++ /a\n"), "{text}");
        assert!(text.contains("-y\n+z\n"), "{text}");
    }
}
