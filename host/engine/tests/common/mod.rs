//! Shared fixtures: one engine per test binary, a simulated node per test.
#![allow(dead_code, reason = "each test binary uses a different subset")]

use std::path::Path;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use nodewright_api::grants::{Capabilities, GrantSet, GrantSource};
use nodewright_engine::{Engine, EngineConfig, LoadedPlugin, RunError, RunReport, RunStage, SandboxLimits, StageContext};
use nodewright_hostops::{NodeIdentity, SimHost};

pub fn engine() -> &'static Engine {
    static ENGINE: OnceLock<Engine> = OnceLock::new();
    ENGINE.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("nodewright-engine-tests-{}", std::process::id()));
        Engine::new(EngineConfig { cache_dir: Some(dir) }).expect("engine")
    })
}

pub fn load(path: &str) -> LoadedPlugin {
    engine().load(&nodewright_artifacts::read(path)).expect("load plugin")
}

pub fn grants(flags: &[&str], package: &str) -> Arc<GrantSet> {
    let (caps, power) = Capabilities::from_flags(flags).expect("grant flags");
    Arc::new(GrantSet::parse(&caps, power, GrantSource::Spec { package: package.into() }).expect("grants"))
}

pub fn sim(root: &Path) -> Arc<SimHost> {
    Arc::new(SimHost::new(root, NodeIdentity { name: "node-1".into(), labels: vec![] }).expect("sim host"))
}

pub struct Run<'a> {
    pub plugin: &'a LoadedPlugin,
    pub package: &'a str,
    pub grants: &'a [&'a str],
    pub config: &'a [(&'a str, &'a str)],
    pub limits: SandboxLimits,
}

impl<'a> Run<'a> {
    pub fn new(plugin: &'a LoadedPlugin, package: &'a str, grants: &'a [&'a str]) -> Self {
        Run { plugin, package, grants, config: &[], limits: SandboxLimits { timeout: Duration::from_secs(30), ..Default::default() } }
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
        prepared.run(stage, ctx, host.clone(), grants, &self.limits).await
    }
}
