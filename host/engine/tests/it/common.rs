//! Shared fixtures: one engine per test process, a simulated node per test.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use nodewright_api::grants::{Capabilities, GrantSet, GrantSource};
use nodewright_engine::{
    Engine, EngineConfig, LoadedPlugin, RunError, RunReport, RunStage, SandboxLimits, StageContext,
};
use nodewright_hostops::{NodeIdentity, SimHost};

/// One engine per test process, with a code cache every test process shares: each test
/// runs in a process of its own under `cargo xtask test`, and compiling the Python and
/// JavaScript interpreters again in each would cost minutes. The cache is what nodes use
/// (keyed by the engine's settings, checked by hash before loading), so a test that loads
/// from it exercises the node's path; `code_cache.rs` tests the cache itself.
pub fn engine() -> &'static Engine {
    static ENGINE: OnceLock<Engine> = OnceLock::new();
    ENGINE.get_or_init(|| {
        let dir = std::env::temp_dir().join("nodewright-engine-tests");
        Engine::new(EngineConfig {
            cache_dir: Some(dir),
            ..Default::default()
        })
        .expect("engine")
    })
}

pub fn load(path: &str) -> LoadedPlugin {
    engine()
        .load(&nodewright_artifacts::read(path))
        .expect("load plugin")
}

pub fn grants(flags: &[&str], package: &str) -> Arc<GrantSet> {
    let (caps, power) = Capabilities::from_flags(flags).expect("grant flags");
    Arc::new(
        GrantSet::parse(
            &caps,
            power,
            GrantSource::Spec {
                package: package.into(),
            },
        )
        .expect("grants"),
    )
}

pub fn sim(root: &Path) -> Arc<SimHost> {
    Arc::new(
        SimHost::new(
            root,
            NodeIdentity {
                name: "node-1".into(),
                labels: vec![],
            },
        )
        .expect("sim host"),
    )
}

pub struct Run<'a> {
    pub plugin: &'a LoadedPlugin,
    pub package: &'a str,
    pub grants: &'a [&'a str],
    pub config: &'a [(&'a str, &'a str)],
    pub limits: SandboxLimits,
    /// Payload trees the plugin reads at `/payload/<name>`.
    pub payloads: Vec<(&'a str, PathBuf)>,
}

impl<'a> Run<'a> {
    pub fn new(plugin: &'a LoadedPlugin, package: &'a str, grants: &'a [&'a str]) -> Self {
        Run {
            plugin,
            package,
            grants,
            config: &[],
            limits: SandboxLimits {
                timeout: Duration::from_secs(30),
                ..Default::default()
            },
            payloads: Vec::new(),
        }
    }

    pub fn config(mut self, config: &'a [(&'a str, &'a str)]) -> Self {
        self.config = config;
        self
    }

    pub async fn stage(&self, host: &Arc<SimHost>, stage: RunStage) -> Result<RunReport, RunError> {
        let grants = grants(self.grants, self.package);
        let prepared = engine().prepare(self.plugin, &grants).expect("prepare");
        let mut ctx = StageContext::new("node-1", self.package, "1.0.0");
        for (k, v) in self.config {
            ctx = ctx.with_config(k, v);
        }
        for (name, tree) in &self.payloads {
            let name = nodewright_api::payload::PayloadName::parse(name).expect("payload name");
            ctx = ctx.with_payload(name, tree.clone());
        }
        prepared
            .run(stage, ctx, host.clone(), grants, &self.limits)
            .await
    }
}

/// One narrow grant for each capability the hostile guest imports.
pub const EVERY_CAPABILITY: [&str; 6] = nodewright_artifacts::HOSTILE_GRANTS;

/// One attack of the hostile guest: its `attack` config, the grants, the limits, and a
/// simulated node prepared by `setup`.
pub struct Attack<'a> {
    pub name: &'a str,
    pub stage: RunStage,
    pub grants: &'a [&'a str],
    pub limits: SandboxLimits,
}

impl<'a> Attack<'a> {
    pub fn new(name: &'a str, grants: &'a [&'a str]) -> Self {
        Attack {
            name,
            stage: RunStage::Apply,
            grants,
            limits: SandboxLimits {
                // A bound for a stuck guest, not a speed test: the floods take seconds alone
                // and several times that beside other tests on two cores.
                timeout: Duration::from_secs(60),
                memory: 32 << 20,
                ..Default::default()
            },
        }
    }

    /// Runs the attack on a fresh node; `setup` prepares the node's root first.
    pub async fn run(
        &self,
        setup: impl FnOnce(&Path),
    ) -> (Result<RunReport, RunError>, tempfile::TempDir) {
        let plugin = load(nodewright_artifacts::HOSTILE);
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(tmp.path().join("etc/app")).unwrap();
        std::fs::write(tmp.path().join("etc/shadow"), "secret").unwrap();
        std::fs::write(tmp.path().join("etc/app/a.conf"), "a").unwrap();
        setup(tmp.path());
        let host = sim(tmp.path());
        let config = [("attack", self.name)];
        // The guest imports every capability: grant each narrowly unless the attack does.
        let key = |g: &str| g.split('=').next().unwrap_or(g).to_string();
        let mut grants: Vec<&str> = self.grants.to_vec();
        grants.extend(
            EVERY_CAPABILITY
                .iter()
                .filter(|d| !self.grants.iter().any(|g| key(g) == key(d))),
        );
        let mut run = Run::new(&plugin, "hostile", &grants).config(&config);
        run.limits = self.limits.clone();
        (run.stage(&host, self.stage).await, tmp)
    }
}

/// The denial a report ended with, or a panic saying what it was instead.
pub fn denial(name: &str, result: &Result<RunReport, RunError>) -> nodewright_engine::Denial {
    match result {
        Ok(RunReport {
            result: Err(nodewright_engine::StepFailure::Denied(d)),
            ..
        }) => d.clone(),
        Ok(r) => panic!("{name}: expected a denial, got {:?}", r.result),
        Err(e) => panic!("{name}: sandbox error {e}"),
    }
}
