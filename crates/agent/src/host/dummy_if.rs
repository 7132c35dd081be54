//! The dummy interface in-cluster clients reach the hub through (yurthub's `hub-dummy0`).
//!
//! masterservice, forwardkubesvctraffic and serviceenvupdater point the node's pods at
//! `--dummy-if-ip:--proxy-secure-port` (169.254.2.1:10268), so that address must be one of the
//! node's own. [`DummyInterface::ensure`] makes it so, as yurthub does: a link of type dummy named
//! `--dummy-if-name` holding the address (/32, or /128 for IPv6), left down as yurthub leaves it
//! (the kernel answers for a local address whatever its link's state). [`maintain`] checks it
//! again every minute, since an operator or a network agent may remove it, and
//! [`DummyInterface::remove`] takes it away when the hub stops, so that a reverted node keeps
//! nothing of it.
//!
//! Where yurthub gives up, the hub goes on:
//! - A kernel built without dummy links (minimal and some container hosts) gets the address on
//!   `lo` instead: just as local to the node, for the pods' traffic too. The hub removes it at
//!   stop only if it was the one that added it.
//! - Without `CAP_NET_ADMIN` nothing can be configured. yurthub exits; the hub says so once and
//!   serves on: its loopback ports work, and in-cluster clients reach it as soon as the address
//!   exists (the secure port is bound to it in advance).

use std::io;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::Duration;

use futures_util::TryStreamExt;
use prometheus::IntGaugeVec;
use rtnetlink::{Handle, LinkDummy};
use tokio::sync::watch;
use tracing::{info, warn};

/// yurthub's period (`SyncNetworkPeriod`).
pub const RECHECK: Duration = Duration::from_secs(60);

const LOOPBACK: &str = "lo";

/// `--dummy-if-name` and `--dummy-if-ip`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DummyIfConfig {
    pub name: String,
    pub ip: IpAddr,
}

/// Where the address was put.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// On the dummy link (created now or found).
    Dummy,
    /// On `lo`: the kernel has no dummy links.
    Loopback,
}

/// The interface and what the hub did to it, for the log, the metric and the clean-up.
pub struct DummyInterface {
    config: DummyIfConfig,
    ready: IntGaugeVec,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// The last outcome, logged only when it changes (a failure repeats every minute).
    last: Option<Result<Placement, String>>,
    /// The hub put the address on `lo` itself, so it takes it away at stop.
    owns_loopback_address: bool,
}

impl DummyInterface {
    /// `ready` is `outpost_dummy_interface_ready{interface}`.
    pub fn new(config: DummyIfConfig, ready: IntGaugeVec) -> Self {
        DummyInterface {
            config,
            ready,
            state: Mutex::default(),
        }
    }

    /// Makes sure the address is the node's; logs and counts the outcome when it changed.
    pub async fn ensure(&self) -> Option<Placement> {
        self.record(with_netlink(async |handle| self.place(handle).await).await)
    }

    /// Removes what the hub configured: the dummy link (yurthub deletes it at stop), or the
    /// address on `lo` if the hub added it.
    pub async fn remove(&self) {
        let on_loopback = self.lock().owns_loopback_address;
        let DummyIfConfig { name, ip } = &self.config;
        let removed = with_netlink(async |handle| {
            if on_loopback {
                remove_address(handle, LOOPBACK, *ip).await
            } else {
                remove_link(handle, name).await
            }
        })
        .await;
        let interface = self.interface_name(on_loopback);
        match removed {
            Ok(true) => info!(interface, %ip, "dummy interface removed"),
            Ok(false) => {}
            Err(e) => warn!(interface, %ip, error = %e, "cannot remove the dummy interface"),
        }
    }

    async fn place(&self, handle: &Handle) -> io::Result<Placement> {
        let DummyIfConfig { name, ip } = &self.config;
        let index = match link_index(handle, name).await? {
            Some(index) => index,
            None => match handle
                .link()
                .add(LinkDummy::new(name).build())
                .execute()
                .await
            {
                Ok(()) => link_index(handle, name).await?.ok_or_else(|| {
                    io::Error::other(format!("link {name} vanished right after it was created"))
                })?,
                // "Unknown device type": no dummy driver in this kernel.
                Err(e) if errno(&e) == Some(libc::EOPNOTSUPP) => {
                    return self.place_on_loopback(handle).await;
                }
                Err(e) => return Err(to_io(e)),
            },
        };
        add_address(handle, index, *ip).await?;
        Ok(Placement::Dummy)
    }

    async fn place_on_loopback(&self, handle: &Handle) -> io::Result<Placement> {
        let lo = link_index(handle, LOOPBACK)
            .await?
            .ok_or_else(|| io::Error::other("this network namespace has no lo"))?;
        if add_address(handle, lo, self.config.ip).await? {
            self.lock().owns_loopback_address = true;
        }
        Ok(Placement::Loopback)
    }

    fn record(&self, outcome: io::Result<Placement>) -> Option<Placement> {
        let outcome = outcome.map_err(|e| e.to_string());
        let mut state = self.lock();
        if state.last.as_ref() != Some(&outcome) {
            let ip = self.config.ip;
            match &outcome {
                Ok(placed) => {
                    let interface = self.interface_name(*placed == Placement::Loopback);
                    if *placed == Placement::Loopback {
                        warn!(interface, %ip, "this kernel has no dummy interfaces; the dummy IP is on lo instead");
                    } else {
                        info!(interface, %ip, "dummy interface ready");
                    }
                }
                Err(e) => warn!(
                    interface = self.config.name,
                    %ip,
                    error = %e,
                    "cannot configure the dummy interface (needs CAP_NET_ADMIN); in-cluster clients cannot reach the hub's secure port until the address exists"
                ),
            }
            state.last = Some(outcome.clone());
        }
        drop(state);
        self.ready.reset();
        let on_loopback = outcome == Ok(Placement::Loopback);
        self.ready
            .with_label_values(&[self.interface_name(on_loopback)])
            .set(i64::from(outcome.is_ok()));
        outcome.ok()
    }

    fn interface_name(&self, on_loopback: bool) -> &str {
        if on_loopback {
            LOOPBACK
        } else {
            &self.config.name
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Checks the interface every [`RECHECK`] until the hub stops; [`crate::Hub::shutdown`] removes
/// it once the listeners have closed their connections.
pub async fn maintain(iface: std::sync::Arc<DummyInterface>, mut shutdown: watch::Receiver<bool>) {
    loop {
        tokio::select! {
            changed = shutdown.changed() => {
                if changed.is_err() || *shutdown.borrow() {
                    return;
                }
            }
            _ = tokio::time::sleep(RECHECK) => {
                iface.ensure().await;
            }
        }
    }
}

/// Runs `work` over a netlink connection of its own, closed when it is done.
async fn with_netlink<T>(work: impl AsyncFnOnce(&Handle) -> io::Result<T>) -> io::Result<T> {
    let (connection, handle, _) = rtnetlink::new_connection()?;
    let connection = tokio::spawn(connection);
    let result = work(&handle).await;
    connection.abort();
    result
}

async fn link_index(handle: &Handle, name: &str) -> io::Result<Option<u32>> {
    let mut links = handle.link().get().match_name(name.to_owned()).execute();
    match links.try_next().await {
        Ok(link) => Ok(link.map(|l| l.header.index)),
        Err(e) if errno(&e) == Some(libc::ENODEV) => Ok(None),
        Err(e) => Err(to_io(e)),
    }
}

/// Adds `ip` as a host address of link `index`; `false` when it was there already.
async fn add_address(handle: &Handle, index: u32, ip: IpAddr) -> io::Result<bool> {
    match handle
        .address()
        .add(index, ip, host_prefix(ip))
        .execute()
        .await
    {
        Ok(()) => Ok(true),
        Err(e) if errno(&e) == Some(libc::EEXIST) => Ok(false),
        Err(e) => Err(to_io(e)),
    }
}

/// Removes `ip` from `link`; `false` when it was not there.
async fn remove_address(handle: &Handle, link: &str, ip: IpAddr) -> io::Result<bool> {
    let Some(index) = link_index(handle, link).await? else {
        return Ok(false);
    };
    let found = handle
        .address()
        .get()
        .set_link_index_filter(index)
        .set_address_filter(ip)
        .set_prefix_length_filter(host_prefix(ip))
        .execute()
        .try_next()
        .await
        .map_err(to_io)?;
    let Some(address) = found else {
        return Ok(false);
    };
    handle
        .address()
        .del(address)
        .execute()
        .await
        .map_err(to_io)?;
    Ok(true)
}

/// Deletes link `name`; `false` when there was none.
async fn remove_link(handle: &Handle, name: &str) -> io::Result<bool> {
    let Some(index) = link_index(handle, name).await? else {
        return Ok(false);
    };
    handle.link().del(index).execute().await.map_err(to_io)?;
    Ok(true)
}

/// A single address: /32, or /128 for IPv6.
fn host_prefix(ip: IpAddr) -> u8 {
    match ip {
        IpAddr::V4(_) => 32,
        IpAddr::V6(_) => 128,
    }
}

/// The errno a netlink request failed with, if the kernel refused it.
fn errno(e: &rtnetlink::Error) -> Option<i32> {
    match e {
        rtnetlink::Error::NetlinkError(message) => message.to_io().raw_os_error(),
        _ => None,
    }
}

fn to_io(e: rtnetlink::Error) -> io::Error {
    match e {
        rtnetlink::Error::NetlinkError(message) => message.to_io(),
        other => io::Error::other(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn interface(ready: &IntGaugeVec) -> DummyInterface {
        let config = DummyIfConfig {
            name: "hub-dummy0".into(),
            ip: "169.254.2.1".parse().unwrap(),
        };
        DummyInterface::new(config, ready.clone())
    }

    fn series(ready: &IntGaugeVec) -> Vec<(String, i64)> {
        use prometheus::core::Collector;
        ready.collect()[0]
            .get_metric()
            .iter()
            .map(|m| {
                (
                    m.get_label()[0].value().to_owned(),
                    m.get_gauge().get_value() as i64,
                )
            })
            .collect()
    }

    #[test]
    fn the_metric_names_where_the_address_is_and_whether_it_is_there() {
        let ready =
            IntGaugeVec::new(prometheus::Opts::new("ready", "test"), &["interface"]).unwrap();
        let iface = interface(&ready);
        assert_eq!(iface.record(Ok(Placement::Dummy)), Some(Placement::Dummy));
        assert_eq!(series(&ready), [("hub-dummy0".to_owned(), 1)]);
        let refused = io::Error::from_raw_os_error(libc::EPERM);
        assert_eq!(iface.record(Err(refused)), None);
        assert_eq!(series(&ready), [("hub-dummy0".to_owned(), 0)]);
        assert_eq!(
            iface.record(Ok(Placement::Loopback)),
            Some(Placement::Loopback)
        );
        assert_eq!(
            series(&ready),
            [("lo".to_owned(), 1)],
            "one series: where it is now"
        );
    }

    #[test]
    fn a_single_host_address() {
        assert_eq!(host_prefix("169.254.2.1".parse().unwrap()), 32);
        assert_eq!(host_prefix("fd00::2:1".parse().unwrap()), 128);
    }
}
