//! Nodes convert or revert must not touch: each is refused with exit code 2 and one line naming the
//! file and what was found, and the node's files stay exactly as they were.

mod support;

use support::*;

/// Runs convert against a node prepared by `prepare` and checks the refusal left it untouched.
fn refuse_convert(prepare: impl FnOnce(&NodeTree), extra: &[&str], file: &str, found: &str) {
    let tree = NodeTree::kubeadm();
    prepare(&tree);
    let before = tree.snapshot();
    let hub = MiniHttp::readyz(200);

    let (result, _) = convert(&convert_args(&tree, &hub.url("/v1/readyz"), extra));

    assert_refused(result, &tree.path(file), found);
    tree.snapshot().assert_same(&before, "refused convert");
    assert_eq!(
        hub.hits(),
        0,
        "a refused convert must not get as far as waiting"
    );
}

#[test]
fn missing_kubeadm_flags_env() {
    refuse_convert(
        |t| std::fs::remove_file(t.path(KUBEADM_FLAGS)).unwrap(),
        &[],
        KUBEADM_FLAGS,
        "missing",
    );
}

#[test]
fn no_kubelet_kubeadm_args_line() {
    refuse_convert(
        |t| t.write(KUBEADM_FLAGS, "KUBELET_EXTRA_ARGS=\"--v=2\"\n"),
        &[],
        KUBEADM_FLAGS,
        "no KUBELET_KUBEADM_ARGS line",
    );
}

#[test]
fn unquoted_kubelet_kubeadm_args() {
    refuse_convert(
        |t| {
            t.write(
                KUBEADM_FLAGS,
                "KUBELET_KUBEADM_ARGS=--pod-infra-container-image=pause\n",
            )
        },
        &[],
        KUBEADM_FLAGS,
        "not one double-quoted value",
    );
}

#[test]
fn missing_cluster_ca() {
    refuse_convert(
        |t| std::fs::remove_file(t.path(CA)).unwrap(),
        &[],
        CA,
        "missing (the cluster CA",
    );
}

#[test]
fn missing_kubelet_client_certificate() {
    let cert = "/var/lib/kubelet/pki/kubelet-client-current.pem";
    refuse_convert(
        |t| std::fs::remove_file(t.path(cert)).unwrap(),
        &[],
        cert,
        "client certificate",
    );
}

#[test]
fn kubelet_already_redirected_elsewhere() {
    refuse_convert(
        |t| {
            let flags = FLAGS_ENV.replace(
                "pause:3.10",
                "pause:3.10 --kubeconfig=/etc/edge/kubelet.conf",
            );
            t.write(KUBEADM_FLAGS, &flags);
        },
        &[],
        KUBEADM_FLAGS,
        "already redirects kubelet: --kubeconfig=/etc/edge/kubelet.conf",
    );
}

#[test]
fn kubelet_redirected_to_the_openyurt_path_by_someone_else() {
    refuse_convert(
        |t| t.write(KUBEADM_FLAGS, REDIRECTED_FLAGS_ENV),
        &[],
        KUBEADM_FLAGS,
        "not set by outpost",
    );
}

#[test]
fn openyurt_kubeconfig_not_written_by_us() {
    refuse_convert(
        |t| t.write(HUB_KUBECONFIG, outpost_node::hub_kubeconfig()),
        &[],
        HUB_KUBECONFIG,
        "not written by outpost node convert",
    );
}

#[test]
fn our_manifest_name_taken_by_a_file_we_did_not_write() {
    refuse_convert(
        |t| t.write(MANIFEST, "apiVersion: v1\nkind: Pod\n"),
        &[],
        MANIFEST,
        "not written by outpost node convert",
    );
}

#[test]
fn yurthub_static_pod_by_name() {
    let yurthub = "/etc/kubernetes/manifests/yurt-hub.yaml";
    refuse_convert(
        |t| t.write(yurthub, "kind: Pod\n"),
        &[],
        yurthub,
        "a yurthub static pod",
    );
}

#[test]
fn yurthub_static_pod_by_image() {
    let hub = "/etc/kubernetes/manifests/edge-proxy.yaml";
    let pod = "apiVersion: v1\nkind: Pod\nspec:\n  containers:\n  - name: hub\n    image: openyurt/yurthub:v1.6.0\n";
    refuse_convert(|t| t.write(hub, pod), &[], hub, "a yurthub static pod");
}

#[test]
fn invalid_flags_name_the_flag() {
    let tree = NodeTree::kubeadm();
    let before = tree.snapshot();
    for (flag, expected) in [
        ("--node-name=Edge_1", "invalid --node-name"),
        ("--nodepool-name=pool a", "invalid --nodepool-name"),
        ("--server-addr=", "invalid --server-addr"),
        (
            "--readyz-url=https://127.0.0.1:10267/v1/readyz",
            "only http://",
        ),
        ("--root-dir=relative/dir", "invalid --root-dir"),
    ] {
        let err = convert(&convert_args(&tree, "http://127.0.0.1:1/", &[flag]))
            .0
            .unwrap_err();
        assert_eq!(err.exit_code(), 2, "{err}");
        assert!(err.to_string().contains(expected), "{flag}: {err}");
    }
    let err = revert(&revert_args(&tree, &["--purge", "--root-dir=/var"]))
        .0
        .unwrap_err();
    assert!(err.to_string().contains("refusing to purge /var"), "{err}");
    tree.snapshot().assert_same(&before, "invalid flags");
}

/// A converted node, and its files just after convert.
fn converted() -> (NodeTree, Snapshot) {
    let tree = NodeTree::kubeadm();
    let hub = MiniHttp::readyz(200);
    convert(&convert_args(&tree, &hub.url("/v1/readyz"), &[]))
        .0
        .unwrap();
    let snapshot = tree.snapshot();
    (tree, snapshot)
}

#[test]
fn convert_again_with_other_settings() {
    let (tree, after_convert) = converted();
    let hub = MiniHttp::readyz(200);
    let (result, _) = convert(&convert_args(
        &tree,
        &hub.url("/v1/readyz"),
        &["--image=registry.local/outpost:dev"],
    ));
    assert_refused(
        result,
        &tree.path(MANIFEST),
        "already converted with different settings",
    );
    tree.snapshot()
        .assert_same(&after_convert, "refused convert");
}

#[test]
fn revert_after_kubeadm_flags_were_edited() {
    let (tree, _) = converted();
    tree.write(KUBEADM_FLAGS, &format!("{REDIRECTED_FLAGS_ENV}# edited\n"));
    let edited = tree.snapshot();

    let (result, _) = revert(&revert_args(&tree, &["--purge"]));

    assert_refused(
        result,
        &tree.path(KUBEADM_FLAGS),
        "changed since outpost node convert modified it",
    );
    tree.snapshot().assert_same(&edited, "refused revert");

    // Putting the original back by hand lets revert finish the rest.
    tree.write(KUBEADM_FLAGS, FLAGS_ENV);
    revert(&revert_args(&tree, &[])).0.unwrap();
    assert!(!tree.exists(MANIFEST) && !tree.exists(HUB_KUBECONFIG));
}

#[test]
fn revert_after_the_static_pod_was_edited() {
    let (tree, _) = converted();
    let manifest = tree.read(MANIFEST).replace("--v=2", "--v=4");
    tree.write(MANIFEST, &manifest);
    let edited = tree.snapshot();

    let (result, _) = revert(&revert_args(&tree, &[]));

    assert_refused(
        result,
        &tree.path(MANIFEST),
        "changed since outpost node convert wrote it",
    );
    tree.snapshot().assert_same(&edited, "refused revert");
}

#[test]
fn revert_with_a_damaged_backup() {
    let (tree, _) = converted();
    let backup = "/var/lib/outpost/backup/var/lib/kubelet/kubeadm-flags.env";
    tree.write(backup, "KUBELET_KUBEADM_ARGS=\"\"\n");
    let damaged = tree.snapshot();

    let (result, _) = revert(&revert_args(&tree, &[]));

    assert_refused(result, &tree.path(backup), "does not match the checksum");
    tree.snapshot().assert_same(&damaged, "refused revert");
}

#[test]
fn revert_with_our_manifest_but_no_record() {
    let (tree, _) = converted();
    std::fs::remove_dir_all(tree.path("/var/lib/outpost")).unwrap();
    let before = tree.snapshot();

    let (result, _) = revert(&revert_args(&tree, &[]));

    assert_refused(result, &tree.path(MANIFEST), "no conversion record");
    tree.snapshot().assert_same(&before, "refused revert");
}
