//! How the test control plane and one process kubelet scale: registers 100 and then 1000
//! simulated nodes, runs a sleeper pod on each of the first 100, and prints wall times and
//! resident memory. Run: `cargo bench -p nodewright-testcluster --bench nodes`.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, PostParams};
use nodewright_testcluster::{ControlPlane, NodeSpec, SimKubelet};

fn rss_mib(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        })
        .unwrap_or(0.0)
        / 1024.0
}

fn component_rss() -> String {
    let out = std::process::Command::new("sh")
        .args(["-c", "ps -eo pid,args | grep '[k]test '"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            let pid: u32 = it.next()?.parse().ok()?;
            let _bin = it.next()?;
            Some(format!("{} {:.0} MiB", it.next()?, rss_mib(pid)))
        })
        .collect::<Vec<_>>()
        .join(", ")
}

#[tokio::main]
async fn main() {
    let t = Instant::now();
    let cp = ControlPlane::start().unwrap();
    println!(
        "control plane start: {:.1}s; {}",
        t.elapsed().as_secs_f64(),
        component_rss()
    );
    let client = cp.client().await.unwrap();
    let roots = tempfile::tempdir().unwrap();
    for n in [100usize, 1000] {
        let specs: Vec<NodeSpec> = (0..n)
            .map(|i| NodeSpec::new(&format!("scale{n}-{i:04}"), roots.path()))
            .collect();
        let t = Instant::now();
        let sim = SimKubelet::start(client.clone(), specs).await.unwrap();
        println!(
            "{n} nodes registered in {:.1}s; test process {:.0} MiB; {}",
            t.elapsed().as_secs_f64(),
            rss_mib(std::process::id()),
            component_rss()
        );
        if n == 100 {
            let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
            let t = Instant::now();
            for i in 0..n {
                let pod: Pod = serde_json::from_value(serde_json::json!({
                    "metadata": {"name": format!("sleeper-{i}"), "labels": {"bench": "scale"}},
                    "spec": {"nodeName": format!("scale{n}-{i:04}"), "containers": [{"name": "s", "image": "pause"}]}
                }))
                .unwrap();
                pods.create(&PostParams::default(), &pod).await.unwrap();
            }
            loop {
                let running = pods
                    .list(&ListParams::default().labels("bench=scale"))
                    .await
                    .unwrap()
                    .items
                    .iter()
                    .filter(|p| {
                        p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
                    })
                    .count();
                if running == n {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            println!("{n} pods running in {:.1}s", t.elapsed().as_secs_f64());
        }
        tokio::time::sleep(Duration::from_secs(12)).await;
        println!(
            "{n} nodes after one heartbeat round: test process {:.0} MiB; {}",
            rss_mib(std::process::id()),
            component_rss()
        );
        drop(sim);
    }
}
