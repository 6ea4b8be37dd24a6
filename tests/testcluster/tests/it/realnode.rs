//! The real node by itself: the real kubelet with containerd and runc in namespaces of
//! its own, Ready against the test control plane, running a pod from the local registry,
//! and rebooting (a restart of its namespaces with a new boot ID) when its `systemctl`
//! is asked to; its kernel modules its own (the `modprobe`/`depmod` shims, its own
//! /sys/module and /lib/modules), never the machine's. Skipped, saying why, where the machine lacks what it needs (the CI
//! installs it: `cargo xtask setup`).

use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, PostParams};
use nodewright_oci::{Registry, RegistryConfig};
use nodewright_testcluster::realnode::{RealNodeConfig, pause_image, real_node_available};
use nodewright_testcluster::{ControlPlane, Options, RealNode};
use nodewright_testregistry::TestRegistry;
use serde_json::json;

#[tokio::test(flavor = "multi_thread")]
async fn a_real_node_runs_pods_and_reboots_with_a_new_boot_id() {
    nodewright_testregistry::require!(ControlPlane, Registry, Helm);
    if !real_node_available() {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let index = 7;
    let host_ip = RealNodeConfig::host_ip(index);
    let dir = work.path().join("cp");
    let options = Options {
        extra_addresses: vec![host_ip.clone()],
        workloads: true,
    };
    let cp = tokio::task::spawn_blocking(move || ControlPlane::start_with(&dir, &options))
        .await
        .unwrap()
        .unwrap();
    let client = cp.client().await.unwrap();
    let registry = tokio::task::spawn_blocking(TestRegistry::start_on_all_interfaces)
        .await
        .unwrap();
    let port = registry.host().rsplit(':').next().unwrap().to_string();
    let oci = Registry::new(RegistryConfig {
        insecure: vec![registry.host().into()],
        ..Default::default()
    });
    let pause = pause_image(&work.path().join("pause")).unwrap();
    let pinned = pause
        .push(&oci, &format!("{}/pause:3.10", registry.host()), &|_| {})
        .await
        .unwrap();
    let pause_ref = pinned.replace(registry.host(), &format!("{host_ip}:{port}"));
    let config = RealNodeConfig {
        name: "real-1".into(),
        index,
        registry: format!("{host_ip}:{port}"),
        pause_image: pause_ref.clone(),
    };
    let node = RealNode::start(&cp, client.clone(), config, &work.path().join("node"))
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));

    let nodes: Api<Node> = Api::all(client.clone());
    let boot = nodes
        .get("real-1")
        .await
        .unwrap()
        .status
        .unwrap()
        .node_info
        .unwrap()
        .boot_id;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let pod = serde_json::from_value(json!({
        "metadata": {"name": "sleeper"},
        "spec": {"nodeName": "real-1", "containers": [{"name": "c", "image": pause_ref}], "terminationGracePeriodSeconds": 1}
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let running = nodewright_testregistry_poll(Duration::from_secs(120), || async {
        let p = pods.get("sleeper").await.ok()?;
        (p.status?.phase.as_deref() == Some("Running")).then_some(())
    })
    .await;
    assert!(running.is_some(), "the pod never ran\n{}", node.logs());

    // The node's kernel modules are its own: a module installed under its /lib/modules,
    // listed by its depmod and loaded by its modprobe shows in its /sys/module with the
    // file's version; one in use is refused unloading; the machine sees none of it.
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let release = release.trim();
    node.load_module("busy", "1.0", 2).unwrap();
    let updates = node.host_path(&format!("/lib/modules/{release}/updates"));
    std::fs::create_dir_all(&updates).unwrap();
    std::fs::write(updates.join("demo.ko"), b"\x7fELF\0version=2.0\0").unwrap();
    let modprobe = |args: &[&str]| node.in_node(&[&["/sbin/modprobe"], args].concat());
    assert!(
        modprobe(&["--", "demo"]).is_err_and(|e| e.to_string().contains("not found")),
        "modprobe finds only what depmod listed"
    );
    node.in_node(&["/sbin/depmod", "-a", "--", release])
        .unwrap();
    modprobe(&["--", "demo"]).unwrap();
    assert_eq!(
        node.in_node(&["cat", "/sys/module/demo/version"]).unwrap(),
        "2.0"
    );
    assert_eq!(
        node.in_node(&["cat", "/sys/module/demo/initstate"])
            .unwrap(),
        "live"
    );
    assert!(
        modprobe(&["-r", "--", "busy"]).is_err_and(|e| e.to_string().contains("in use")),
        "a module in use stays"
    );
    // (containerd asks for `aufs` as it starts, and is told there is none.)
    let ours: Vec<String> = node
        .kmod_calls()
        .into_iter()
        .filter(|c| c.starts_with("depmod") || c.ends_with(" demo") || c.ends_with(" busy"))
        .collect();
    assert_eq!(
        ours,
        [
            "modprobe -- demo",
            &format!("depmod -a -- {release}"),
            "modprobe -- demo",
            "modprobe -r -- busy"
        ]
    );
    for m in ["demo", "busy"] {
        assert!(
            !std::path::Path::new(&format!("/sys/module/{m}")).exists(),
            "the machine's kernel shows no {m}"
        );
    }
    assert!(!std::path::Path::new(&format!("/lib/modules/{release}/updates/demo.ko")).exists());

    // The node's systemctl asked for a reboot: the harness restarts the node.
    let pid1 = node.pid1().unwrap();
    std::fs::write(node.dir().join("state/reboot-requested"), "test").unwrap();
    let rebooted = nodewright_testregistry_poll(Duration::from_secs(120), || async {
        let info = nodes.get("real-1").await.ok()?.status?.node_info?;
        (info.boot_id != boot && !info.boot_id.is_empty()).then_some(())
    })
    .await;
    assert!(rebooted.is_some(), "no new boot ID\n{}", node.logs());
    assert_ne!(node.pid1(), Some(pid1), "the node's init is a new one");
    assert_eq!(node.boots(), 2);
    // The node's network namespace is the node's: its ip_forward is its own.
    assert_eq!(
        node.in_netns(&["cat", "/proc/sys/net/ipv4/ip_forward"])
            .unwrap(),
        "1"
    );
    // A reboot unloads every module; what was installed stays installed.
    for m in ["demo", "busy"] {
        assert!(
            node.in_node(&["test", "-e", &format!("/sys/module/{m}")])
                .is_err(),
            "{m} survived the reboot"
        );
    }
    assert!(
        node.host_path(&format!("/lib/modules/{release}/updates/demo.ko"))
            .exists()
    );
    drop(node);
}

async fn nodewright_testregistry_poll<T, F, Fut>(timeout: Duration, mut check: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let start = std::time::Instant::now();
    loop {
        if let Some(v) = check().await {
            return Some(v);
        }
        if start.elapsed() > timeout {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
