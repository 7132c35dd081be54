//! After the outage: how long until each hub's cache, and each node's kube-proxy, hold what the
//! apiserver holds. A hub's cache is read through its admin `GET /pods` (kubelet's pods as its
//! edge cache answers them) and compared, names and resourceVersions, with the apiserver's pods
//! of that node; kube-proxy's view is the one its reflectors keep. The cloud keeps changing
//! meanwhile, so a hub counts as converged when it equals the apiserver as read just before or
//! just after it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use http::Method;
use outpost_testkit::FakeApiServer;

use super::client::{self, Caller};
use super::cluster::{self, View};
use super::workload::Views;

const POLL: Duration = Duration::from_secs(1);

/// What the convergence check needs of one hub.
pub struct Target {
    pub node: String,
    pub admin: SocketAddr,
    pub views: Arc<Views>,
}

/// Seconds from `since` until each hub converged, if it did in time.
#[derive(Clone, Debug, Default)]
pub struct Converged {
    pub cache: Option<f64>,
    pub kube_proxy: Option<f64>,
}

pub async fn wait(
    fake: &FakeApiServer,
    targets: &[Target],
    since: Instant,
    within: Duration,
) -> Vec<Converged> {
    let mut done = vec![Converged::default(); targets.len()];
    while since.elapsed() < within {
        let before = Snapshot::read(fake);
        let caches = join_all(targets.iter().zip(&done).map(|(t, d)| async move {
            match d.cache {
                Some(_) => None,
                None => cached_pods(t.admin).await,
            }
        }))
        .await;
        let after = Snapshot::read(fake);
        let now = since.elapsed().as_secs_f64();
        for ((target, converged), cache) in targets.iter().zip(done.iter_mut()).zip(caches) {
            if converged.cache.is_none()
                && let Some(cache) = cache
                && [&before, &after].iter().any(|s| {
                    s.pods
                        .get(&target.node)
                        .map_or(cache.is_empty(), |p| *p == cache)
                })
            {
                converged.cache = Some(now);
            }
            if converged.kube_proxy.is_none() && proxy_equal(&target.views, &before, &after) {
                converged.kube_proxy = Some(now);
            }
        }
        if done
            .iter()
            .all(|d| d.cache.is_some() && d.kube_proxy.is_some())
        {
            break;
        }
        tokio::time::sleep(POLL).await;
    }
    done
}

/// The apiserver's side at one moment.
struct Snapshot {
    pods: std::collections::HashMap<String, View>,
    services: View,
    slices: View,
}

impl Snapshot {
    fn read(fake: &FakeApiServer) -> Snapshot {
        Snapshot {
            pods: cluster::pods_by_node(fake),
            services: cluster::view_of(fake, "v1/services"),
            slices: cluster::view_of(fake, "discovery.k8s.io/v1/endpointslices"),
        }
    }
}

fn proxy_equal(views: &Views, before: &Snapshot, after: &Snapshot) -> bool {
    let lock = |m: &std::sync::Mutex<View>| m.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let (services, slices) = (lock(&views.proxy_services), lock(&views.proxy_slices));
    [before, after]
        .iter()
        .any(|s| s.services == services && s.slices == slices)
}

/// The hub's `/pods`: name -> resourceVersion; `None` if it did not answer a list.
async fn cached_pods(admin: SocketAddr) -> Option<View> {
    let caller = Caller {
        user_agent: "fleet-converge",
        accept: "application/json",
        token: None,
    };
    let reply = client::call(admin, caller, Method::GET, "/pods", None)
        .await
        .ok()?;
    if reply.status != 200 {
        return None;
    }
    let list = reply.object().ok()?;
    Some(
        list["items"]
            .as_array()?
            .iter()
            .map(|p| {
                (
                    cluster::meta(p, "name"),
                    cluster::meta(p, "resourceVersion"),
                )
            })
            .collect(),
    )
}
