//! The same packages in Rust, Python and JavaScript, side by side: artifact size, cold
//! compile, the per-stage cost once the code is cached (a fresh engine loading the cached
//! code, instantiating and running `plan`, as the agent does in each stage's process), and
//! the linear memory a stage holds. Figures vary with machine load: medians over repeated
//! runs in one process.
//!
//! Run: `cargo xtask bench` (which sets up the Python and JavaScript tools), or
//! `cargo bench -p nodewright-cli --bench languages` with them set up.

// The allocator the shipped binaries run the engine with (see the workspace's `mimalloc`).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nodewright_api::grants::{Capabilities, GrantSet, GrantSource};
use nodewright_engine::{Engine, EngineConfig, RunStage, SandboxLimits, StageContext};
use nodewright_figures::Figure;
use nodewright_hostops::{NodeIdentity, SimHost};

struct Case {
    name: &'static str,
    wasm: Option<&'static str>,
    grants: &'static [&'static str],
    config: &'static [(&'static str, &'static str)],
}

const SYSCTL_GRANTS: &[&str] = &["files=/etc/sysctl.d:rw", "sysctl=net.ipv4.ip_forward"];
const SYSCTL_CONFIG: &[(&str, &str)] = &[("net.ipv4.ip_forward", "1")];
const FILES_GRANTS: &[&str] = &["files=/etc/app:rw"];
const FILES_CONFIG: &[(&str, &str)] = &[
    ("file:/etc/app/a.conf", "x\n"),
    ("mode:/etc/app/a.conf", "0600"),
];

fn seed(root: &Path) {
    std::fs::create_dir_all(root.join("proc/sys/net/ipv4")).unwrap();
    std::fs::write(root.join("proc/sys/net/ipv4/ip_forward"), "0").unwrap();
    std::fs::create_dir_all(root.join("etc/app")).unwrap();
}

fn main() {
    // The CLI's own process has no transparent huge pages (`nodewright_cli::no_huge_pages`).
    nodewright_cli::no_huge_pages().expect("transparent huge pages turned off");
    let cases = [
        Case {
            name: "sysctl (Rust)",
            wasm: Some(nodewright_artifacts::SYSCTL),
            grants: SYSCTL_GRANTS,
            config: SYSCTL_CONFIG,
        },
        Case {
            name: "sysctl (Python)",
            wasm: nodewright_artifacts::port(nodewright_artifacts::SYSCTL_PY, "SYSCTL_PY"),
            grants: SYSCTL_GRANTS,
            config: SYSCTL_CONFIG,
        },
        Case {
            name: "files (Rust)",
            wasm: Some(nodewright_artifacts::FILES),
            grants: FILES_GRANTS,
            config: FILES_CONFIG,
        },
        Case {
            name: "files (JavaScript)",
            wasm: nodewright_artifacts::port(nodewright_artifacts::FILES_JS, "FILES_JS"),
            grants: FILES_GRANTS,
            config: FILES_CONFIG,
        },
    ];
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    println!(
        "{:<20} {:>10} {:>14} {:>22} {:>12} {:>12}",
        "plugin", "size", "cold compile", "cached load+inst+plan", "of which plan", "stage memory"
    );
    for case in cases {
        let Some(path) = case.wasm else { continue };
        let bytes = std::fs::read(path).unwrap();
        let tmp = tempfile::tempdir().unwrap();
        let cache = tmp.path().join("code");
        let root = tmp.path().join("root");
        seed(&root);
        // Cold compile: no cache (few rounds for the interpreters: seconds each).
        let rounds = if bytes.len() > 1 << 20 { 3 } else { 10 };
        let compile: Vec<Duration> = (0..rounds)
            .map(|_| {
                let e = Engine::new(EngineConfig::default()).unwrap();
                let t = Instant::now();
                e.load(&bytes).unwrap();
                t.elapsed()
            })
            .collect();
        let engine = |c: &Path| {
            Engine::new(EngineConfig {
                cache_dir: Some(c.to_path_buf()),
                ..Default::default()
            })
            .unwrap()
        };
        engine(&cache).load(&bytes).unwrap();
        let (caps, _) = Capabilities::from_flags(case.grants).unwrap();
        let grants = Arc::new(GrantSet::parse(&caps, false, GrantSource::Flags).unwrap());
        let host = Arc::new(SimHost::new(&root, NodeIdentity::default()).unwrap());
        let mut ctx = StageContext::new("n", "tuning", "1");
        for (k, v) in case.config {
            ctx = ctx.with_config(k, v);
        }
        let mut whole = Vec::new();
        let mut plan = Vec::new();
        let mut memory = 0;
        for _ in 0..20 {
            let t = Instant::now();
            let e = engine(&cache);
            let plugin = e.load(&bytes).unwrap();
            assert!(plugin.from_cache);
            let prepared = e.prepare(&plugin, &grants).unwrap();
            let report = rt
                .block_on(prepared.run(
                    RunStage::Plan,
                    ctx.clone(),
                    host.clone(),
                    grants.clone(),
                    &SandboxLimits::default(),
                ))
                .unwrap();
            whole.push(t.elapsed());
            assert!(report.result.is_ok(), "{}: {:?}", case.name, report.result);
            plan.push(report.duration);
            memory = report.memory_peak;
        }
        let figures = [
            Figure::timed("languages", format!("{}: cold compile", case.name), compile),
            Figure::timed(
                "languages",
                format!("{}: cached load + instantiate + plan", case.name),
                whole,
            ),
            Figure::timed("languages", format!("{}: of which plan", case.name), plan),
        ];
        println!(
            "{:<20} {:>7.1} MB {:>11.0} ms {:>19.1} ms {:>9.1} ms {:>9.1} MiB",
            case.name,
            bytes.len() as f64 / 1e6,
            figures[0].median,
            figures[1].median,
            figures[2].median,
            memory as f64 / (1 << 20) as f64
        );
        figures.iter().for_each(Figure::write);
    }
    println!(
        "(cached load+inst+plan: a new engine loads the cached code, instantiates and runs plan; targets: <= 1 ms Rust, <= 50 ms Python/JS)"
    );
}
