//! kubelet's `/var/lib/kubelet/kubeadm-flags.env`: kubeadm writes one `KUBELET_KUBEADM_ARGS="…"` line,
//! which the systemd drop-in passes last on kubelet's command line. Flags appended inside its quotes
//! therefore override the drop-in's `--kubeconfig` and `--bootstrap-kubeconfig`.

/// What convert appends, exactly as yurthub's node-servant does.
pub(crate) const REDIRECT: &str =
    " --kubeconfig=/var/lib/openyurt/kubelet.conf --bootstrap-kubeconfig=";
pub(crate) const HUB_KUBECONFIG_FLAG_VALUE: &str = "/var/lib/openyurt/kubelet.conf";
const KEY: &str = "KUBELET_KUBEADM_ARGS=";

/// The `KUBELET_KUBEADM_ARGS` value of a flags file.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct KubeadmArgs<'a> {
    /// The flags between the quotes.
    pub(crate) flags: &'a str,
    /// Byte offset of the closing quote in the file.
    close_quote: usize,
}

/// What was found instead of one quoted `KUBELET_KUBEADM_ARGS` value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ArgsError {
    #[error("no KUBELET_KUBEADM_ARGS line")]
    Missing,
    #[error("KUBELET_KUBEADM_ARGS is set on {0} lines")]
    Repeated(usize),
    #[error("KUBELET_KUBEADM_ARGS is not one double-quoted value: {0}")]
    NotQuoted(String),
}

/// Finds the one quoted `KUBELET_KUBEADM_ARGS` value, or says what was found instead.
pub(crate) fn parse(content: &str) -> Result<KubeadmArgs<'_>, ArgsError> {
    let mut found = None;
    let mut count = 0;
    let mut offset = 0;
    for line in content.split_inclusive('\n') {
        let body = line.trim_end_matches(['\n', '\r']);
        if body.trim_start().starts_with(KEY) {
            count += 1;
            found = Some((offset, body));
        }
        offset += line.len();
    }
    let (start, line) = match (count, found) {
        (1, Some(found)) => found,
        (0, _) => return Err(ArgsError::Missing),
        (n, _) => return Err(ArgsError::Repeated(n)),
    };
    quoted_value(start, line)
}

fn quoted_value(start: usize, line: &str) -> Result<KubeadmArgs<'_>, ArgsError> {
    let value_at = line.find(KEY).map(|i| i + KEY.len()).unwrap_or(line.len());
    let value = line[value_at..].trim_end();
    let inner = value
        .strip_prefix('"')
        .and_then(|v| v.strip_suffix('"'))
        .filter(|v| !v.contains('"'));
    match inner {
        Some(flags) => Ok(KubeadmArgs {
            flags,
            close_quote: start + value_at + value.len() - 1,
        }),
        None => Err(ArgsError::NotQuoted(line.to_owned())),
    }
}

impl KubeadmArgs<'_> {
    /// The value kubelet would get for `--kubeconfig`, if the flags set it.
    pub(crate) fn kubeconfig(&self) -> Option<&str> {
        let mut words = self.flags.split_whitespace();
        while let Some(word) = words.next() {
            if let Some(v) = word.strip_prefix("--kubeconfig=") {
                return Some(v);
            }
            if word == "--kubeconfig" {
                return Some(words.next().unwrap_or(""));
            }
        }
        None
    }
}

/// The file with [`REDIRECT`] appended inside the quotes; every other byte is kept.
pub(crate) fn redirected(content: &str, args: &KubeadmArgs<'_>) -> String {
    let (before, after) = content.split_at(args.close_quote);
    format!("{before}{REDIRECT}{after}")
}

#[cfg(test)]
mod tests {
    use super::*;

    const KUBEADM: &str = "KUBELET_KUBEADM_ARGS=\"--container-runtime-endpoint=unix:///var/run/containerd/containerd.sock --pod-infra-container-image=registry.k8s.io/pause:3.10\"\n";

    #[test]
    fn appends_inside_the_quotes_and_keeps_the_rest() {
        let content = format!("# kubeadm\n{KUBEADM}OTHER=1\n");
        let args = parse(&content).unwrap();
        assert_eq!(args.kubeconfig(), None);
        let out = redirected(&content, &args);
        assert_eq!(
            out,
            format!(
                "# kubeadm\nKUBELET_KUBEADM_ARGS=\"--container-runtime-endpoint=unix:///var/run/containerd/containerd.sock --pod-infra-container-image=registry.k8s.io/pause:3.10{REDIRECT}\"\nOTHER=1\n"
            )
        );
        assert_eq!(
            parse(&out).unwrap().kubeconfig(),
            Some(HUB_KUBECONFIG_FLAG_VALUE)
        );
    }

    #[test]
    fn works_without_a_trailing_newline_and_with_crlf() {
        let content = KUBEADM.trim_end();
        let out = redirected(content, &parse(content).unwrap());
        assert!(out.ends_with("--bootstrap-kubeconfig=\""), "{out}");
        let crlf = KUBEADM.replace('\n', "\r\n");
        let out = redirected(&crlf, &parse(&crlf).unwrap());
        assert!(out.ends_with("--bootstrap-kubeconfig=\"\r\n"), "{out}");
    }

    #[test]
    fn finds_an_existing_kubeconfig_in_both_spellings() {
        let eq = "KUBELET_KUBEADM_ARGS=\"--a=b --kubeconfig=/etc/other.conf\"";
        assert_eq!(parse(eq).unwrap().kubeconfig(), Some("/etc/other.conf"));
        let space = "KUBELET_KUBEADM_ARGS=\"--kubeconfig /etc/other.conf --a=b\"";
        assert_eq!(parse(space).unwrap().kubeconfig(), Some("/etc/other.conf"));
    }

    #[test]
    fn says_what_it_found_when_the_file_is_unexpected() {
        assert_eq!(
            parse("FOO=1\n").unwrap_err().to_string(),
            "no KUBELET_KUBEADM_ARGS line"
        );
        let twice = format!("{KUBEADM}{KUBEADM}");
        assert_eq!(
            parse(&twice).unwrap_err().to_string(),
            "KUBELET_KUBEADM_ARGS is set on 2 lines"
        );
        let unquoted = "KUBELET_KUBEADM_ARGS=--a=b\n";
        assert!(
            parse(unquoted)
                .unwrap_err()
                .to_string()
                .contains("not one double-quoted value")
        );
        let nested = "KUBELET_KUBEADM_ARGS=\"--a=\"b\"\"\n";
        assert!(parse(nested).is_err());
    }
}
