//! Waits for the hub's `/v1/readyz` with a plain HTTP/1.1 GET on loopback: no client stack is
//! needed for one status line, and a blocking poll keeps convert a simple sequential program.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::thread;
use std::time::{Duration, Instant};

use crate::error::{NodeError, ProbeError};

const POLL_EVERY: Duration = Duration::from_millis(500);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
const IO_TIMEOUT: Duration = Duration::from_secs(2);

/// An `http://host:port/path` URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ReadyzUrl {
    authority: String,
    host: String,
    port: u16,
    path: String,
}

impl ReadyzUrl {
    pub(crate) fn parse(url: &str) -> Result<Self, NodeError> {
        let bad = |problem: &str| NodeError::InvalidArgument {
            flag: "--readyz-url",
            problem: format!("{url:?}: {problem}"),
        };
        let rest = url
            .strip_prefix("http://")
            .ok_or_else(|| bad("only http:// URLs are supported"))?;
        let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
        let (host, port) = split_host_port(authority).ok_or_else(|| bad("expected host:port"))?;
        Ok(ReadyzUrl {
            authority: authority.to_owned(),
            host: host.to_owned(),
            port,
            path: if path.is_empty() {
                "/".into()
            } else {
                path.to_owned()
            },
        })
    }

    /// Polls until the hub answers 200 or `timeout` passes; the error is the last answer seen.
    pub(crate) fn wait(&self, timeout: Duration) -> Result<(), ProbeError> {
        let deadline = Instant::now() + timeout;
        loop {
            let last = match self.probe() {
                Ok(()) => return Ok(()),
                Err(e) => e,
            };
            if Instant::now() + POLL_EVERY > deadline {
                return Err(last);
            }
            thread::sleep(POLL_EVERY);
        }
    }

    fn probe(&self) -> Result<(), ProbeError> {
        let addr = self.resolve()?;
        let mut stream = TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT)?;
        stream.set_read_timeout(Some(IO_TIMEOUT))?;
        stream.set_write_timeout(Some(IO_TIMEOUT))?;
        let request = format!(
            "GET {} HTTP/1.1\r\nHost: {}\r\nUser-Agent: outpost-node\r\nConnection: close\r\n\r\n",
            self.path, self.authority
        );
        stream.write_all(request.as_bytes())?;
        match status_code(&read_status_line(&mut stream)?) {
            Some(200) => Ok(()),
            Some(code) => Err(ProbeError::Status(code)),
            None => Err(ProbeError::NotHttp),
        }
    }

    fn resolve(&self) -> Result<SocketAddr, ProbeError> {
        let host = || self.host.clone();
        (self.host.as_str(), self.port)
            .to_socket_addrs()
            .map_err(|source| ProbeError::Resolve {
                host: host(),
                source,
            })?
            .next()
            .ok_or_else(|| ProbeError::NoAddress(host()))
    }
}

fn split_host_port(authority: &str) -> Option<(&str, u16)> {
    let (host, port) = match authority.strip_prefix('[') {
        Some(v6) => {
            let (host, rest) = v6.split_once(']')?;
            (host, rest.strip_prefix(':')?)
        }
        None => authority.rsplit_once(':')?,
    };
    if host.is_empty() {
        return None;
    }
    Some((host, port.parse().ok()?))
}

fn read_status_line(stream: &mut TcpStream) -> Result<String, std::io::Error> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 256];
    while !buf.windows(2).any(|w| w == b"\r\n") && buf.len() < 4096 {
        match stream.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) => return Err(e),
        }
    }
    Ok(String::from_utf8_lossy(&buf)
        .lines()
        .next()
        .unwrap_or("")
        .to_owned())
}

fn status_code(line: &str) -> Option<u16> {
    let (version, rest) = line.split_once(' ')?;
    if !version.starts_with("HTTP/1.") {
        return None;
    }
    rest.split(' ').next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use std::net::TcpListener;

    use super::*;

    #[test]
    fn parses_urls() {
        let u = ReadyzUrl::parse("http://127.0.0.1:10267/v1/readyz").unwrap();
        assert_eq!(
            (u.host.as_str(), u.port, u.path.as_str()),
            ("127.0.0.1", 10267, "/v1/readyz")
        );
        let u = ReadyzUrl::parse("http://[::1]:8080").unwrap();
        assert_eq!(
            (u.host.as_str(), u.port, u.path.as_str()),
            ("::1", 8080, "/")
        );
        for bad in [
            "https://127.0.0.1:10267/v1/readyz",
            "http://127.0.0.1/v1",
            "http://:1/",
            "x",
        ] {
            assert!(ReadyzUrl::parse(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn status_lines() {
        assert_eq!(status_code("HTTP/1.1 200 OK"), Some(200));
        assert_eq!(status_code("HTTP/1.0 500 Internal Server Error"), Some(500));
        assert_eq!(status_code("SSH-2.0-OpenSSH"), None);
    }

    #[test]
    fn a_closed_port_is_reported_after_the_timeout() {
        // Bind then drop, so the port is very likely closed.
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let url = ReadyzUrl::parse(&format!("http://127.0.0.1:{port}/v1/readyz")).unwrap();
        let started = Instant::now();
        let err = url.wait(Duration::from_millis(600)).unwrap_err();
        assert!(err.to_string().to_lowercase().contains("refused"), "{err}");
        assert!(started.elapsed() < Duration::from_secs(3));
    }
}
