//! Plugin engine benchmark: prints compile time, cached load time, instantiate+call, and
//! the whole-process overhead of `nodewright plugin run`. Figures vary with machine load;
//! each is a median (and p90) over repeated runs in one process.
//!
//! Run: `cargo bench -p nodewright-cli --bench plugin`.

// The allocator the shipped binaries run the engine with (see the workspace's `mimalloc`).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::sync::Arc;
use std::time::{Duration, Instant};

use nodewright_figures::Figure;

use nodewright_api::grants::{Capabilities, GrantSet, GrantSource};
use nodewright_engine::{Engine, EngineConfig, RunStage, SandboxLimits, StageContext};
use nodewright_hostops::{NodeIdentity, SimHost};

fn stats(name: &str, xs: Vec<Duration>) {
    Figure::timed("plugin", name, xs).report();
}

fn time<T>(f: impl FnOnce() -> T) -> (T, Duration) {
    let t = Instant::now();
    let v = f();
    (v, t.elapsed())
}

fn main() {
    // The CLI's own process has no transparent huge pages (`nodewright_cli::no_huge_pages`).
    nodewright_cli::no_huge_pages().expect("transparent huge pages turned off");
    let bytes = std::fs::read(nodewright_artifacts::SYSCTL).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    println!("plugin: sysctl ({} bytes)", bytes.len());

    // Compile (no cache).
    let nocache = Engine::new(EngineConfig::default()).unwrap();
    let compile: Vec<_> = (0..10)
        .map(|_| time(|| nocache.load(&bytes).unwrap()).1)
        .collect();
    stats("compile (Cranelift, no cache)", compile);

    // Engine creation: what every agent process pays once (the epoch ticker, the pool).
    let engines: Vec<_> = (0..50)
        .map(|_| time(|| Engine::new(EngineConfig::default()).unwrap()).1)
        .collect();
    stats("engine creation", engines);

    // Cached load: a fresh engine each time so nothing is in memory, the same cache dir.
    let cache = tmp.path().join("cache");
    Engine::new(EngineConfig {
        cache_dir: Some(cache.clone()),
        ..Default::default()
    })
    .unwrap()
    .load(&bytes)
    .unwrap();
    let cached: Vec<_> = (0..20)
        .map(|_| {
            let e = Engine::new(EngineConfig {
                cache_dir: Some(cache.clone()),
                ..Default::default()
            })
            .unwrap();
            let (p, d) = time(|| e.load(&bytes).unwrap());
            assert!(p.from_cache);
            d
        })
        .collect();
    stats("cached load (re-hash + mmap)", cached);

    // Instantiate + call plan, fresh store each time.
    let engine = Engine::new(EngineConfig {
        cache_dir: Some(cache.clone()),
        ..Default::default()
    })
    .unwrap();
    let plugin = engine.load(&bytes).unwrap();
    let (caps, _) =
        Capabilities::from_flags(&["files=/etc/sysctl.d:rw", "sysctl=net.ipv4.ip_forward"])
            .unwrap();
    let grants = Arc::new(GrantSet::parse(&caps, false, GrantSource::Flags).unwrap());
    let prepared = engine.prepare(&plugin, &grants).unwrap();
    let root = tmp.path().join("root");
    std::fs::create_dir_all(root.join("proc/sys/net/ipv4")).unwrap();
    std::fs::write(root.join("proc/sys/net/ipv4/ip_forward"), "1").unwrap();
    let host = Arc::new(SimHost::new(&root, NodeIdentity::default()).unwrap());
    let ctx = StageContext::new("n", "tuning", "1").with_config("net.ipv4.ip_forward", "1");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    // More calls for a profiler: PLUGIN_BENCH_CALLS=100000.
    let n: usize = std::env::var("PLUGIN_BENCH_CALLS").map_or(300, |v| v.parse().unwrap());
    let calls: Vec<_> = (0..n)
        .map(|_| {
            rt.block_on(async {
                let t = Instant::now();
                let r = prepared
                    .run(
                        RunStage::Plan,
                        ctx.clone(),
                        host.clone(),
                        grants.clone(),
                        &SandboxLimits::default(),
                    )
                    .await
                    .unwrap();
                assert!(r.result.is_ok());
                t.elapsed()
            })
        })
        .collect();
    stats("instantiate + plan (3 host calls)", calls);

    // Whole `nodewright plugin run` process, warm cache.
    let bin = env!("CARGO_BIN_EXE_nodewright");
    let args = [
        "plugin",
        "run",
        nodewright_artifacts::SYSCTL,
        "--stage",
        "plan",
        "--root",
        root.to_str().unwrap(),
        "--grant",
        "files=/etc/sysctl.d:rw",
        "--grant",
        "sysctl=net.ipv4.ip_forward",
        "--config",
        "net.ipv4.ip_forward=1",
    ];
    let run = || {
        std::process::Command::new(bin)
            .args(args)
            .env("NODEWRIGHT_CACHE_DIR", &cache)
            .output()
            .unwrap()
    };
    assert!(run().status.success());
    let procs: Vec<_> = (0..20).map(|_| time(run).1).collect();
    stats("`nodewright plugin run` process, warm", procs);

    // From a registry on loopback (Debian docker-registry).
    let reg = nodewright_testregistry::TestRegistry::start();
    let registry_config = || nodewright_oci::RegistryConfig {
        insecure: vec![reg.host().to_string()],
        ..Default::default()
    };
    let pinned = rt.block_on(async {
        let r = nodewright_oci::Registry::new(registry_config());
        r.push(
            &format!("{}/bench/sysctl:1", reg.host()),
            &bytes,
            Default::default(),
            &|_| {},
        )
        .await
        .unwrap()
        .pinned
    });
    let cold: Vec<_> = (0..10)
        .map(|i| {
            let dir = tmp.path().join(format!("cold-{i}"));
            rt.block_on(async {
                let t = Instant::now();
                let puller = nodewright_oci::Puller::new(
                    nodewright_oci::Registry::new(registry_config()),
                    nodewright_oci::NodeCache::open(&dir).unwrap(),
                );
                let pulled = puller.pull_pinned(&pinned, &|_| {}).await.unwrap();
                let e = Engine::new(EngineConfig {
                    cache_dir: Some(puller.cache().code_dir()),
                    ..Default::default()
                })
                .unwrap();
                assert!(!e.load(&pulled.bytes).unwrap().from_cache);
                t.elapsed()
            })
        })
        .collect();
    stats("registry: cold pull + compile", cold);
    let warm_dir = tmp.path().join("cold-0");
    let warm: Vec<_> = (0..20)
        .map(|_| {
            rt.block_on(async {
                let t = Instant::now();
                let puller = nodewright_oci::Puller::new(
                    nodewright_oci::Registry::new(registry_config()),
                    nodewright_oci::NodeCache::open(&warm_dir).unwrap(),
                );
                let pulled = puller.pull_pinned(&pinned, &|_| {}).await.unwrap();
                assert!(pulled.from_cache);
                let e = Engine::new(EngineConfig {
                    cache_dir: Some(puller.cache().code_dir()),
                    ..Default::default()
                })
                .unwrap();
                assert!(e.load(&pulled.bytes).unwrap().from_cache);
                t.elapsed()
            })
        })
        .collect();
    stats("registry: warm (node cache + code)", warm);
}
