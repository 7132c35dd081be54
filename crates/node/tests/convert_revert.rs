//! convert and revert on a kubeadm worker's files: the happy path, idempotence, dry runs, a hub that
//! never gets ready, kubelet restarts and `--purge`, each compared against the whole tree.

mod support;

use std::fs;
use std::os::unix::fs::PermissionsExt;

use outpost_node::{Change, NodeError};
use support::*;

#[test]
fn convert_installs_the_hub_then_redirects_kubelet() {
    let tree = NodeTree::kubeadm();
    let hub = MiniHttp::readyz(200);
    let args = convert_args(&tree, &hub.url("/v1/readyz"), &[]);

    let (result, printed) = convert(&args);
    let outcome = result.unwrap();

    assert_eq!(
        outcome.changes,
        [
            Change::Created(tree.path(MANIFEST)),
            Change::Created(tree.path(HUB_KUBECONFIG)),
            Change::Modified(tree.path(KUBEADM_FLAGS)),
        ]
    );
    assert!(!outcome.kubelet_restarted && !outcome.dry_run);
    assert!(hub.hits() >= 1, "readyz was never asked");
    assert!(
        hub.requests()[0].starts_with("GET /v1/readyz HTTP/1.1\r\n"),
        "{:?}",
        hub.requests()
    );
    assert!(
        printed.contains("systemctl daemon-reload && systemctl restart kubelet"),
        "{printed}"
    );

    let manifest = tree.read(MANIFEST);
    assert_eq!(manifest, outpost_node::static_pod(&args).unwrap());
    for line in [
        "  name: outpost\n",
        "  namespace: kube-system\n",
        "  hostNetwork: true\n",
        "  priorityClassName: system-node-critical\n",
        &format!("    image: {}\n", outpost_node::DEFAULT_IMAGE),
        "    - outpost\n",
        "    - --server-addr=https://10.0.0.10:6443\n",
        "    - --node-name=edge-node-1\n",
        "    - --nodepool-name=edge-pool-1\n",
        "    - --working-mode=edge\n",
        "    - --bootstrap-mode=kubeletcertificate\n",
        "    - --kubelet-client-certificate=/var/lib/kubelet/pki/kubelet-client-current.pem\n",
        "    - --kubelet-ca-file=/etc/kubernetes/pki/ca.crt\n",
        "    - --bind-address=127.0.0.1\n",
        "    - --disk-cache-path=/etc/kubernetes/cache/\n",
        "    - --root-dir=/var/lib/yurthub\n",
        "    - --v=2\n",
        "        path: /v1/healthz\n",
        "        path: /v1/readyz\n",
        "        cpu: 150m\n",
    ] {
        assert!(manifest.contains(line), "{line:?} missing from\n{manifest}");
    }

    assert_eq!(tree.read(HUB_KUBECONFIG), outpost_node::hub_kubeconfig());
    assert_eq!(tree.read(KUBEADM_FLAGS), REDIRECTED_FLAGS_ENV);
    assert_eq!(
        tree.read("/var/lib/outpost/backup/var/lib/kubelet/kubeadm-flags.env"),
        FLAGS_ENV
    );
    let record = tree.read("/var/lib/outpost/backup/conversion.record");
    for line in [
        "dir /var/lib/openyurt\n",
        "created /etc/kubernetes/manifests/outpost.yaml sha256=",
    ] {
        assert!(record.contains(line), "{line:?} missing from\n{record}");
    }
}

/// kubelet's flags changed while convert waited for the hub to get ready (an operator, a kubeadm
/// upgrade): the change is kept, redirected like the rest, and backed up as the original.
#[test]
fn a_change_to_kubelets_flags_during_the_wait_is_kept() {
    let tree = NodeTree::kubeadm();
    let flags = tree.path(KUBEADM_FLAGS);
    let changed = FLAGS_ENV.replace("pause:3.10", "pause:3.10 --node-labels=zone=a");
    let edit = changed.clone();
    let hub = MiniHttp::start(move |_| {
        fs::write(&flags, &edit).unwrap();
        (200, "ok".into())
    });
    let args = convert_args(&tree, &hub.url("/v1/readyz"), &[]);

    let (result, printed) = convert(&args);
    result.unwrap_or_else(|e| panic!("{e}\n{printed}"));
    assert_eq!(
        tree.read(KUBEADM_FLAGS),
        REDIRECTED_FLAGS_ENV.replace("pause:3.10", "pause:3.10 --node-labels=zone=a")
    );
    assert_eq!(
        tree.read("/var/lib/outpost/backup/var/lib/kubelet/kubeadm-flags.env"),
        changed,
        "revert restores the flags as they were when kubelet was redirected"
    );
}

#[test]
fn the_written_static_pod_passes_kubectl_and_a_typed_round_trip() {
    let tree = NodeTree::kubeadm();
    let hub = MiniHttp::readyz(200);
    let args = convert_args(&tree, &hub.url("/v1/readyz"), &["--working-mode=cloud"]);
    convert(&args).0.unwrap();

    let objects = validate_manifest(&tree.path(MANIFEST)).unwrap();
    assert_eq!(objects.len(), 1);
    let pod = &objects[0];
    assert_eq!(pod["metadata"]["name"], "outpost");
    assert_eq!(
        pod["spec"]["containers"][0]["command"][4],
        "--working-mode=cloud"
    );
    assert_eq!(pod["spec"]["volumes"].as_array().unwrap().len(), 4);
    let mounts = &pod["spec"]["containers"][0]["volumeMounts"];
    assert_eq!(mounts[2]["readOnly"], true);
    assert_eq!(mounts[3]["mountPath"], "/var/lib/kubelet/pki");
}

#[test]
fn the_kubelet_kubeconfig_loads_in_kubectl_and_sends_no_credentials() {
    let tree = NodeTree::kubeadm();
    let hub = MiniHttp::readyz(200);
    convert(&convert_args(&tree, &hub.url("/v1/readyz"), &[]))
        .0
        .unwrap();
    let file = tree.path(HUB_KUBECONFIG);

    let view = kubectl_with(&file, &["config", "view", "-o", "json"]);
    assert!(
        view.status.success(),
        "{}",
        String::from_utf8_lossy(&view.stderr)
    );
    let config: serde_json::Value = serde_json::from_slice(&view.stdout).unwrap();
    assert_eq!(
        config["clusters"][0]["cluster"]["server"],
        "http://127.0.0.1:10261"
    );
    assert_eq!(config["contexts"][0]["context"]["namespace"], "default");
    assert_eq!(config["current-context"], "default-context");
    assert!(
        config["users"].as_array().is_none_or(Vec::is_empty),
        "{config}"
    );

    // The same kubeconfig aimed at a fake server shows what kubelet would send: no credentials.
    let server = discovery_apiserver();
    let get = kubectl_with(
        &file,
        &[
            "get",
            "--raw",
            "/version",
            &format!("--server={}", server.url("")),
        ],
    );
    assert!(
        get.status.success(),
        "{}",
        String::from_utf8_lossy(&get.stderr)
    );
    let last = server.requests().pop().unwrap().to_lowercase();
    assert!(last.starts_with("get /version"), "{last}");
    assert!(!last.contains("authorization:"), "{last}");
}

#[test]
fn a_second_convert_changes_nothing() {
    let tree = NodeTree::kubeadm();
    let hub = MiniHttp::readyz(200);
    let args = convert_args(&tree, &hub.url("/v1/readyz"), &[]);
    convert(&args).0.unwrap();
    let converted = tree.snapshot();
    let hits = hub.hits();

    let (result, printed) = convert(&args);

    assert!(result.unwrap().nothing_to_do());
    assert!(printed.contains("already converted"), "{printed}");
    tree.snapshot().assert_same(&converted, "second convert");
    assert_eq!(
        hub.hits(),
        hits,
        "no need to wait for a hub that is already in use"
    );
}

#[test]
fn revert_restores_the_node_byte_for_byte() {
    let tree = NodeTree::kubeadm();
    let before = tree.snapshot();
    let hub = MiniHttp::readyz(200);
    convert(&convert_args(&tree, &hub.url("/v1/readyz"), &[]))
        .0
        .unwrap();
    assert_ne!(tree.snapshot().len(), before.len());

    let (result, printed) = revert(&revert_args(&tree, &[]));
    let outcome = result.unwrap();

    tree.snapshot().assert_same(&before, "after revert");
    assert_eq!(
        outcome.changes[..3],
        [
            Change::Restored(tree.path(KUBEADM_FLAGS)),
            Change::Removed(tree.path(HUB_KUBECONFIG)),
            Change::Removed(tree.path(MANIFEST)),
        ]
    );
    assert!(
        outcome
            .changes
            .contains(&Change::Removed(tree.path("/var/lib/outpost/backup")))
    );
    assert!(
        outcome
            .changes
            .contains(&Change::Removed(tree.path("/var/lib/openyurt")))
    );
    assert!(
        printed.contains("systemctl daemon-reload && systemctl restart kubelet"),
        "{printed}"
    );

    let (again, printed) = revert(&revert_args(&tree, &[]));
    assert!(again.unwrap().nothing_to_do());
    assert!(printed.contains("not converted"), "{printed}");
}

#[test]
fn revert_keeps_the_original_permissions() {
    let tree = NodeTree::kubeadm();
    fs::set_permissions(tree.path(KUBEADM_FLAGS), fs::Permissions::from_mode(0o640)).unwrap();
    let before = tree.snapshot();
    let hub = MiniHttp::readyz(200);
    convert(&convert_args(&tree, &hub.url("/v1/readyz"), &[]))
        .0
        .unwrap();
    let mode = fs::metadata(tree.path(KUBEADM_FLAGS))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o640);
    revert(&revert_args(&tree, &[])).0.unwrap();
    tree.snapshot().assert_same(&before, "after revert");
}

#[test]
fn convert_dry_run_prints_diffs_and_changes_nothing() {
    let tree = NodeTree::kubeadm();
    let before = tree.snapshot();
    let hub = MiniHttp::readyz(200);

    let (result, printed) = convert(&convert_args(&tree, &hub.url("/v1/readyz"), &["--dry-run"]));
    let outcome = result.unwrap();

    tree.snapshot().assert_same(&before, "convert --dry-run");
    assert_eq!(hub.hits(), 0, "a dry run must not wait for the hub");
    assert!(outcome.dry_run);
    assert_eq!(outcome.changes.len(), 3);
    let manifest = tree.path(MANIFEST).display().to_string();
    let flags = tree.path(KUBEADM_FLAGS).display().to_string();
    for expected in [
        format!("--- /dev/null\n+++ {manifest}\n"),
        "+    - --node-name=edge-node-1\n".into(),
        format!("--- {flags}\n+++ {flags}\n"),
        format!("-{FLAGS_ENV}+{REDIRECTED_FLAGS_ENV}"),
        "+    server: http://127.0.0.1:10261\n".into(),
    ] {
        assert!(
            printed.contains(&expected),
            "{expected:?} missing from\n{printed}"
        );
    }
}

#[test]
fn revert_dry_run_prints_diffs_and_changes_nothing() {
    let tree = NodeTree::kubeadm();
    let hub = MiniHttp::readyz(200);
    convert(&convert_args(&tree, &hub.url("/v1/readyz"), &[]))
        .0
        .unwrap();
    let converted = tree.snapshot();

    let (result, printed) = revert(&revert_args(&tree, &["--dry-run", "--purge"]));

    assert!(result.unwrap().dry_run);
    tree.snapshot().assert_same(&converted, "revert --dry-run");
    let manifest = tree.path(MANIFEST).display().to_string();
    for expected in [
        format!("--- {manifest}\n+++ /dev/null\n"),
        format!("-{REDIRECTED_FLAGS_ENV}+{FLAGS_ENV}"),
        format!(
            "would remove {}",
            tree.path("/var/lib/outpost/backup").display()
        ),
    ] {
        assert!(
            printed.contains(&expected),
            "{expected:?} missing from\n{printed}"
        );
    }
}

#[test]
fn a_hub_that_never_gets_ready_leaves_kubelet_untouched() {
    let tree = NodeTree::kubeadm();
    let before = tree.snapshot();
    let kubelet_conf = tree.read(KUBELET_CONF);
    let sick = MiniHttp::readyz(500);
    let args = convert_args(&tree, &sick.url("/v1/readyz"), &["--wait-ready-timeout=1s"]);

    let (result, printed) = convert(&args);

    let err = result.unwrap_err();
    assert!(matches!(err, NodeError::NotReady { .. }), "{err}");
    assert_eq!(err.exit_code(), 1);
    let line = err.to_string();
    assert!(
        line.contains("HTTP 500") && line.contains("kubelet was left untouched"),
        "{line}"
    );
    assert!(sick.hits() >= 2, "readyz is polled, not asked once");
    assert_eq!(tree.read(KUBEADM_FLAGS), FLAGS_ENV);
    assert_eq!(tree.read(KUBELET_CONF), kubelet_conf);
    assert!(!tree.exists(HUB_KUBECONFIG));
    assert!(tree.exists(MANIFEST), "the static pod stays for inspection");
    assert!(printed.contains("waiting up to 1s"), "{printed}");

    // Once the hub is healthy, convert again finishes the job; revert still gets back to the start.
    let hub = MiniHttp::readyz(200);
    let outcome = convert(&convert_args(&tree, &hub.url("/v1/readyz"), &[]))
        .0
        .unwrap();
    assert_eq!(
        outcome.changes,
        [
            Change::Created(tree.path(HUB_KUBECONFIG)),
            Change::Modified(tree.path(KUBEADM_FLAGS))
        ]
    );
    revert(&revert_args(&tree, &[])).0.unwrap();
    tree.snapshot().assert_same(&before, "after revert");
}

#[test]
fn a_rerun_may_fix_the_static_pod_until_kubelet_is_redirected() {
    let tree = NodeTree::kubeadm();
    let before = tree.snapshot();
    let sick = MiniHttp::readyz(500);
    let typo = [
        "--image=ghcr.io/outpost/outpst:0.1.0",
        "--wait-ready-timeout=0s",
    ];
    assert!(
        convert(&convert_args(&tree, &sick.url("/v1/readyz"), &typo))
            .0
            .is_err()
    );

    let hub = MiniHttp::readyz(200);
    let outcome = convert(&convert_args(&tree, &hub.url("/v1/readyz"), &[]))
        .0
        .unwrap();

    assert_eq!(outcome.changes[0], Change::Modified(tree.path(MANIFEST)));
    assert!(
        tree.read(MANIFEST)
            .contains(&format!("image: {}\n", outpost_node::DEFAULT_IMAGE))
    );
    revert(&revert_args(&tree, &[])).0.unwrap();
    tree.snapshot().assert_same(&before, "after revert");
}

#[test]
fn revert_after_a_failed_convert_removes_the_static_pod() {
    let tree = NodeTree::kubeadm();
    let before = tree.snapshot();
    let sick = MiniHttp::readyz(503);
    let args = convert_args(&tree, &sick.url("/v1/readyz"), &["--wait-ready-timeout=0s"]);
    assert!(convert(&args).0.is_err());

    let outcome = revert(&revert_args(&tree, &["--restart-kubelet"]))
        .0
        .unwrap();

    assert!(
        !outcome.kubelet_restarted,
        "kubelet's files were never changed"
    );
    tree.snapshot().assert_same(&before, "after revert");
}

#[test]
fn revert_on_a_fresh_node_does_nothing() {
    let tree = NodeTree::kubeadm();
    let before = tree.snapshot();

    let (result, printed) = revert(&revert_args(&tree, &["--purge"]));

    assert!(result.unwrap().nothing_to_do());
    assert!(printed.contains("not converted by outpost"), "{printed}");
    tree.snapshot()
        .assert_same(&before, "revert on a fresh node");
}

#[test]
fn purge_removes_the_hub_directories_and_only_with_purge() {
    for purge in [false, true] {
        let tree = NodeTree::kubeadm();
        let before = tree.snapshot();
        let hub = MiniHttp::readyz(200);
        convert(&convert_args(&tree, &hub.url("/v1/readyz"), &[]))
            .0
            .unwrap();
        // What the running hub would leave behind.
        tree.write("/etc/kubernetes/cache/kubelet/pods.v1.core/default/p", "{}");
        tree.write("/var/lib/yurthub/pki/outpost.pem", "x");

        let flags: &[&str] = if purge { &["--purge"] } else { &[] };
        let outcome = revert(&revert_args(&tree, flags)).0.unwrap();

        assert_eq!(tree.exists("/etc/kubernetes/cache"), !purge);
        assert_eq!(tree.exists("/var/lib/yurthub/pki/outpost.pem"), !purge);
        assert_eq!(
            outcome
                .changes
                .contains(&Change::Removed(tree.path("/var/lib/yurthub"))),
            purge
        );
        if purge {
            tree.snapshot().assert_same(&before, "after revert --purge");
        }
    }
}

#[test]
fn restart_kubelet_runs_systemctl_after_each_switch() {
    let tree = NodeTree::kubeadm();
    let log = tree.root().join("systemctl.log");
    let systemctl = tree.root().join("fake-systemctl");
    fs::write(
        &systemctl,
        format!("#!/bin/sh\necho \"$@\" >> '{}'\n", log.display()),
    )
    .unwrap();
    fs::set_permissions(&systemctl, fs::Permissions::from_mode(0o755)).unwrap();
    let fake = format!("--systemctl={}", systemctl.display());
    let hub = MiniHttp::readyz(200);

    let (result, printed) = convert(&convert_args(
        &tree,
        &hub.url("/v1/readyz"),
        &["--restart-kubelet", &fake],
    ));
    assert!(result.unwrap().kubelet_restarted);
    assert_eq!(
        fs::read_to_string(&log).unwrap(),
        "daemon-reload\nrestart kubelet\n"
    );
    assert!(printed.contains("restarted kubelet"), "{printed}");

    let outcome = revert(&revert_args(&tree, &["--restart-kubelet", &fake]))
        .0
        .unwrap();
    assert!(outcome.kubelet_restarted);
    assert_eq!(
        fs::read_to_string(&log).unwrap(),
        "daemon-reload\nrestart kubelet\ndaemon-reload\nrestart kubelet\n"
    );
}

#[test]
fn a_failing_systemctl_is_reported_with_its_message() {
    let tree = NodeTree::kubeadm();
    let systemctl = tree.root().join("broken-systemctl");
    fs::write(
        &systemctl,
        "#!/bin/sh\necho 'Failed to connect to bus' >&2\nexit 1\n",
    )
    .unwrap();
    fs::set_permissions(&systemctl, fs::Permissions::from_mode(0o755)).unwrap();
    let hub = MiniHttp::readyz(200);
    let fake = format!("--systemctl={}", systemctl.display());

    let err = convert(&convert_args(
        &tree,
        &hub.url("/v1/readyz"),
        &["--restart-kubelet", &fake],
    ))
    .0
    .unwrap_err();

    assert_eq!(err.exit_code(), 1);
    let line = err.to_string();
    assert!(
        line.contains("daemon-reload") && line.contains("Failed to connect to bus"),
        "{line}"
    );
    assert_eq!(
        tree.read(KUBEADM_FLAGS),
        REDIRECTED_FLAGS_ENV,
        "files are switched; only the restart failed"
    );
}
