//! Who arrives on which port, and which bearer tokens the cache may answer offline.
//!
//! The plain port (`127.0.0.1:10261`) is the node's own: kubelet and friends, trusted as yurthub
//! trusts them. The secure port (`--proxy-secure-port`, 10268) is where in-cluster clients land
//! once `masterservice` points `KUBERNETES_SERVICE_HOST` at the hub. There the hub does better
//! than yurthub, which lends such callers the node's identity:
//! - a request without a bearer token is refused (401): the node's certificate is never lent;
//! - a bearer token is forwarded without the node's certificate, so the apiserver judges it;
//! - offline nobody can judge a token, so the cache answers only tokens the apiserver accepted
//!   before ([`VerifiedTokens`]): a 2xx answer to a request carrying the token marks it
//!   verified, a 401 forgets it;
//! - what a secure-port caller caches is kept in its own partition of its component's cache
//!   ([`SecureCaller`]), so a pod that claims to be `kubelet` in its User-Agent never reads
//!   kubelet's cached Secrets, nor one service account another's.

use std::collections::{HashSet, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use http::HeaderMap;
use tracing::warn;

use crate::headers;

/// Which listener a request came in on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Entry {
    /// The plain-HTTP proxy port: the node's components.
    Plain,
    /// The HTTPS port for in-cluster clients: bearer tokens only.
    Secure,
}

/// A SHA-256 digest of a bearer token: what is kept instead of the token.
pub type TokenDigest = [u8; 32];

/// A caller of the secure port, as far as the hub can tell before the apiserver answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecureCaller {
    /// The digest of its bearer token: what [`VerifiedTokens`] keeps.
    pub token: TokenDigest,
    /// Its partition of the cache: its service account (the `sub` claim of its token,
    /// `system:serviceaccount:<ns>:<name>`, stable across token refreshes), or for a token that
    /// is not a JWT, the token itself (a digest prefix).
    ///
    /// The claim is read without checking the signature, and that is enough: the cache keeps
    /// only 2xx answers, which prove the apiserver accepted the token and so its claims, and
    /// answers offline only tokens it accepted.
    pub partition: String,
}

impl SecureCaller {
    /// The caller behind the request's bearer token; `None` without one.
    pub fn of(headers: &HeaderMap) -> Option<SecureCaller> {
        let token = headers::bearer_token(headers)?;
        let digest = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
        let token_digest: TokenDigest = digest.as_ref().try_into().ok()?;
        let partition =
            jwt_subject(token).unwrap_or_else(|| format!("token-{}", &to_hex(&token_digest)[..16]));
        Some(SecureCaller {
            token: token_digest,
            partition,
        })
    }
}

fn jwt_subject(token: &str) -> Option<String> {
    use base64::Engine;
    let mut parts = token.split('.');
    let (_header, payload, _signature) = (parts.next()?, parts.next()?, parts.next()?);
    let claims = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .ok()?;
    let claims: serde_json::Value = serde_json::from_slice(&claims).ok()?;
    claims["sub"]
        .as_str()
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
}

/// How many tokens are remembered; the oldest is forgotten first. A node runs at most a few
/// hundred pods, each with a token or two alive at a time.
pub const CAPACITY: usize = 4096;

/// Digests of the tokens the apiserver has accepted, in memory and (when given a file) on disk,
/// so a node rebooted while offline still answers its pods.
#[derive(Debug, Default)]
pub struct VerifiedTokens {
    file: Option<PathBuf>,
    known: Mutex<Known>,
}

#[derive(Debug, Default)]
struct Known {
    order: VecDeque<TokenDigest>,
    set: HashSet<TokenDigest>,
}

impl Known {
    fn insert(&mut self, digest: TokenDigest) -> bool {
        if !self.set.insert(digest) {
            return false;
        }
        self.order.push_back(digest);
        while self.order.len() > CAPACITY {
            if let Some(oldest) = self.order.pop_front() {
                self.set.remove(&oldest);
            }
        }
        true
    }

    fn remove(&mut self, digest: &TokenDigest) -> bool {
        if !self.set.remove(digest) {
            return false;
        }
        self.order.retain(|d| d != digest);
        true
    }
}

impl VerifiedTokens {
    /// Remembered in `file` (one hex digest per line). A missing file is an empty set; lines that
    /// are not digests are skipped with a warning (the token is verified again when online).
    pub fn load(file: &Path) -> VerifiedTokens {
        let mut known = Known::default();
        match std::fs::read_to_string(file) {
            Ok(text) => {
                let mut skipped = 0usize;
                for line in text.lines().filter(|l| !l.trim().is_empty()) {
                    match from_hex(line.trim()) {
                        Some(digest) => {
                            known.insert(digest);
                        }
                        None => skipped += 1,
                    }
                }
                if skipped > 0 {
                    warn!(path = %file.display(), skipped, "ignored malformed lines in the verified-token file");
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                warn!(path = %file.display(), error = %e, "cannot read the verified-token file; starting empty")
            }
        }
        VerifiedTokens {
            file: Some(file.to_owned()),
            known: Mutex::new(known),
        }
    }

    pub fn knows(&self, digest: &TokenDigest) -> bool {
        self.lock().set.contains(digest)
    }

    /// The apiserver accepted this token.
    pub fn remember(&self, digest: TokenDigest) {
        let mut known = self.lock();
        if known.insert(digest) {
            self.persist(&known);
        }
    }

    /// The apiserver refused this token (401): the cache stops answering it.
    pub fn forget(&self, digest: &TokenDigest) {
        let mut known = self.lock();
        if known.remove(digest) {
            self.persist(&known);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Known> {
        self.known.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Rewrites the file through a temporary one. It changes only when a new token is first
    /// accepted, and is at most 4096 lines; no fsync: losing it costs a re-verification online.
    fn persist(&self, known: &Known) {
        let Some(file) = &self.file else { return };
        let mut text = String::with_capacity(known.order.len() * 65);
        for digest in &known.order {
            text.push_str(&to_hex(digest));
            text.push('\n');
        }
        let tmp = file.with_extension("tmp");
        if let Err(e) = std::fs::write(&tmp, text).and_then(|()| std::fs::rename(&tmp, file)) {
            warn!(path = %file.display(), error = %e, "cannot save verified tokens; they are kept in memory");
        }
    }
}

fn to_hex(digest: &TokenDigest) -> String {
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

fn from_hex(s: &str) -> Option<TokenDigest> {
    if s.len() != 64 || !s.is_ascii() {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn bearer(token: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(
            http::header::AUTHORIZATION,
            HeaderValue::from_str(&format!("Bearer {token}")).unwrap(),
        );
        h
    }

    fn token_digest(headers: &HeaderMap) -> Option<TokenDigest> {
        SecureCaller::of(headers).map(|c| c.token)
    }

    fn partition(headers: &HeaderMap) -> Option<String> {
        SecureCaller::of(headers).map(|c| c.partition)
    }

    #[test]
    fn digests_are_of_the_token_only() {
        let a = token_digest(&bearer("abc")).unwrap();
        assert_eq!(token_digest(&bearer("abc")), Some(a));
        assert_ne!(token_digest(&bearer("abd")), Some(a));
        assert_eq!(token_digest(&HeaderMap::new()), None);
        assert_eq!(from_hex(&to_hex(&a)), Some(a));
    }

    #[test]
    fn a_service_account_token_is_partitioned_by_its_subject_and_others_by_themselves() {
        use base64::Engine;
        let b64 = |s: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
        let jwt = |sub: &str| {
            format!(
                "{}.{}.sig",
                b64(r#"{"alg":"RS256"}"#),
                b64(&format!(r#"{{"sub":"{sub}","exp":1}}"#))
            )
        };
        let coredns = "system:serviceaccount:kube-system:coredns";
        assert_eq!(partition(&bearer(&jwt(coredns))).as_deref(), Some(coredns));
        // A refreshed token of the same account: the same partition.
        let refreshed = format!("{}x", jwt(coredns));
        assert_eq!(partition(&bearer(&refreshed)).as_deref(), Some(coredns));
        let opaque = partition(&bearer("static-token")).unwrap();
        assert!(
            opaque.starts_with("token-") && opaque.len() == 22,
            "{opaque}"
        );
        assert_ne!(partition(&bearer("other-token")), Some(opaque));
        assert!(partition(&bearer("a.b.c")).unwrap().starts_with("token-"));
        assert_eq!(partition(&HeaderMap::new()), None);
    }

    #[test]
    fn verified_tokens_survive_a_restart_and_forgetting_is_saved_too() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("verified-tokens");
        let a = token_digest(&bearer("secret-token-a")).unwrap();
        let b = token_digest(&bearer("secret-token-b")).unwrap();
        let tokens = VerifiedTokens::load(&file);
        tokens.remember(a);
        tokens.remember(b);
        tokens.forget(&a);
        let text = std::fs::read_to_string(&file).unwrap();
        assert!(!text.contains("secret"), "no token in clear: {text}");
        assert_eq!(text.lines().count(), 1);
        let again = VerifiedTokens::load(&file);
        assert!(!again.knows(&a));
        assert!(again.knows(&b));
    }

    #[test]
    fn a_damaged_file_loses_only_its_bad_lines() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("verified-tokens");
        let a = token_digest(&bearer("a")).unwrap();
        std::fs::write(&file, format!("garbage\n{}\nzz\n", to_hex(&a))).unwrap();
        let tokens = VerifiedTokens::load(&file);
        assert!(tokens.knows(&a));
        assert_eq!(tokens.lock().order.len(), 1);
    }

    #[test]
    fn the_oldest_token_goes_first() {
        let tokens = VerifiedTokens::default();
        let digests: Vec<TokenDigest> = (0..=CAPACITY)
            .map(|i| token_digest(&bearer(&format!("t{i}"))).unwrap())
            .collect();
        for d in &digests {
            tokens.remember(*d);
        }
        assert!(!tokens.knows(&digests[0]));
        assert!(tokens.knows(&digests[1]));
        assert!(tokens.knows(&digests[CAPACITY]));
    }
}
