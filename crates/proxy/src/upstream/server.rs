//! The apiservers as `--server-addr` and `--lb-mode` name them.

use http::Uri;

/// How requests are spread over several `--server-addr` entries (`--lb-mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LbMode {
    /// Round-robin over the servers.
    #[default]
    RoundRobin,
    /// Always the first server in flag order.
    Priority,
}

/// Why a `--server-addr` entry is not an apiserver address.
#[derive(Debug, thiserror::Error)]
pub enum ServerAddrError {
    #[error("empty server address")]
    Empty,
    #[error("invalid server address {addr:?}: {source}")]
    Invalid {
        addr: String,
        #[source]
        source: http::Error,
    },
    #[error("server address {addr:?} must use https (got scheme {scheme:?})")]
    NotHttps { addr: String, scheme: String },
    #[error("server address {addr:?} has no host")]
    NoHost { addr: String },
    #[error("server address {addr:?} must not have a path")]
    HasPath { addr: String },
}

/// One apiserver, as given in `--server-addr` (always https).
#[derive(Debug, Clone)]
pub struct Server {
    /// `https://host:port`, used for building upstream URIs.
    pub base: Uri,
    /// [`Server::label`], made once: requests look their server's pool and bounds up by it.
    label: std::sync::Arc<str>,
}

/// Two servers are the same when their labels are: a label is the whole of `base` (scheme,
/// authority, and the path every server has), so comparing both would compare it twice.
impl PartialEq for Server {
    fn eq(&self, other: &Server) -> bool {
        self.label == other.label
    }
}

impl Eq for Server {}

impl Server {
    /// Parses one `--server-addr` entry: a missing scheme means https, any other scheme is refused.
    pub fn parse(addr: &str) -> Result<Server, ServerAddrError> {
        let addr = addr.trim().trim_end_matches('/');
        if addr.is_empty() {
            return Err(ServerAddrError::Empty);
        }
        let with_scheme = if addr.contains("://") {
            addr.to_owned()
        } else {
            format!("https://{addr}")
        };
        let invalid = |source: http::Error| ServerAddrError::Invalid {
            addr: addr.to_owned(),
            source,
        };
        let uri: Uri = with_scheme.parse::<Uri>().map_err(|e| invalid(e.into()))?;
        if uri.scheme_str() != Some("https") {
            return Err(ServerAddrError::NotHttps {
                addr: addr.to_owned(),
                scheme: uri.scheme_str().unwrap_or_default().to_owned(),
            });
        }
        let authority = uri.authority().ok_or_else(|| ServerAddrError::NoHost {
            addr: addr.to_owned(),
        })?;
        if uri.path() != "/" && !uri.path().is_empty() {
            return Err(ServerAddrError::HasPath {
                addr: addr.to_owned(),
            });
        }
        let base = Uri::builder()
            .scheme("https")
            .authority(authority.clone())
            .path_and_query("/")
            .build()
            .map_err(invalid)?;
        let label = format!("https://{authority}").into();
        Ok(Server { base, label })
    }

    /// `https://host:port` without the trailing slash, for logs and metric labels.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// [`Server::label`], shared: for what outlives a request without costing it a copy.
    pub fn shared_label(&self) -> std::sync::Arc<str> {
        self.label.clone()
    }

    pub fn uri_for<P>(&self, path_and_query: P) -> Result<Uri, http::Error>
    where
        P: TryInto<http::uri::PathAndQuery>,
        P::Error: Into<http::Error>,
    {
        let authority = self.base.authority().cloned().unwrap_or_else(|| {
            // Server::parse guarantees an authority; this branch only keeps the function total.
            http::uri::Authority::from_static("invalid")
        });
        Uri::builder()
            .scheme("https")
            .authority(authority)
            .path_and_query(path_and_query)
            .build()
    }
}
