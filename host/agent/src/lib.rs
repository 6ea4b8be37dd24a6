//! `nodewright-agent`: runs one stage of one package, a node's merged interrupt, or the
//! staging of a NodeWright's payloads before the node's cordon, inside a Job's pod.
//!
//! It resolves nothing: it pulls only the pinned digest it is given, verifies it through the
//! node cache, checks the grants against the component's imports, runs the stage (then its
//! check) in the sandbox against the host root, and writes a structured
//! [`StageResult`] to the termination message. Exit codes follow the failure's blame (see
//! [`Blame`]): 0 ok, 1 package, 2 denied, 3 config, 4 host (retryable), 5 disruption. What
//! it is asked is one [`AgentCall`] (`nodewright_api::agent`), the arguments the operator
//! wrote. As a library it also gives `nodewright plugin run` the same stage-then-check step
//! and failure → blame mapping ([`run_checked`], [`judge`], [`blame_of`]).

#![deny(missing_docs)]

mod host;
mod interrupt;
pub mod markers;
mod prestage;
mod stage;

use std::process::ExitCode;
use std::time::Duration;

use nodewright_api::agent::{AgentCall, Common, RunStage};
use nodewright_api::result::{Blame, StageResult};

pub use host::host;
pub use stage::{Ran, Shutdown, StageInputs, StageRun, blame_of, judge, run_checked};

use markers::MarkerKey;

/// The agent's command line: one [`AgentCall`], as [`AgentCall::to_args`] writes it.
#[derive(Debug, clap::Parser)]
#[command(name = "nodewright-agent", version)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub call: AgentCall,
}

/// Carries out `call`: skips work an idempotence marker says is done, runs it, records
/// the marker, writes the result to the termination log and returns the blame's exit code.
pub fn run(call: &AgentCall) -> ExitCode {
    let common = call.common();
    let state = markers::state_dir(&common.host_root);
    // Before any thread: an image without CA certificates still reaches plain-HTTP
    // registries, and HTTPS ones fail saying what is missing (instead of a panic).
    if let Err(e) = nodewright_oci::prepare_roots(&state.join("tls")) {
        eprintln!("cannot prepare the TLS roots: {e}");
    }
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cannot start the runtime: {e}");
            return ExitCode::from(Blame::Host.exit_code());
        }
    };
    // What an idempotence marker remembers: stages that change the host, and interrupts.
    // Staging payloads is content-addressed: doing it again finds them and changes nothing.
    let key = match call {
        AgentCall::Run(c) => (!c.ask.stage.read_only()).then(|| MarkerKey {
            cr_uid: common.cr_uid.clone(),
            generation: common.generation,
            run: common.run,
            package: c.ask.package.clone(),
            version: c.ask.version.clone(),
            stage: c.ask.stage.as_str().into(),
        }),
        AgentCall::Interrupt(c) => Some(MarkerKey {
            cr_uid: common.cr_uid.clone(),
            generation: common.generation,
            run: common.run,
            package: c.ask.package.clone(),
            version: String::new(),
            stage: format!("interrupt-{}", c.ask.kind),
        }),
        AgentCall::Prestage(_) => None,
    };
    if let Some(done) = key.as_ref().and_then(|k| k.done(&state)) {
        match call {
            AgentCall::Run(c) => eprintln!(
                "{} of {} {} already succeeded for this generation; not running it again",
                c.ask.stage, c.ask.package, c.ask.version
            ),
            AgentCall::Interrupt(_) => {
                eprintln!("the interrupt already completed for this generation")
            }
            AgentCall::Prestage(_) => {}
        }
        return finish(common, &done);
    }
    let result = rt.block_on(async {
        match call {
            AgentCall::Run(c) => stage::run_stage(c).await,
            AgentCall::Interrupt(c) => interrupt::interrupt(c).await,
            AgentCall::Prestage(c) => prestage::prestage(c).await,
        }
    });
    // A host call still blocked past the stage deadline must not keep the pod alive: give
    // blocking threads a moment, then leave them.
    rt.shutdown_timeout(Duration::from_secs(1));
    if let Some(key) = &key
        && result.blame == Blame::None
        && let Err(e) = key.record(&state, &result)
    {
        eprintln!("cannot record the idempotence marker: {e}");
    }
    finish(common, &result)
}

/// Arguments the agent cannot take (an operator of another version, a Job written by hand):
/// a config failure with clap's explanation, written where the result would go (the
/// `--termination-log` given, else the default), and its exit code — never clap's own exit
/// code 2, which is [`Blame::Denied`]'s.
pub fn refuse_arguments(args: &[String], error: &str) -> ExitCode {
    let value = |flag: &str| {
        let with_eq = format!("--{flag}=");
        args.iter()
            .enumerate()
            .find_map(|(i, a)| match a.strip_prefix(&with_eq) {
                Some(v) => Some(v.to_string()),
                None if a == &format!("--{flag}") => args.get(i + 1).cloned(),
                None => None,
            })
    };
    // What the arguments were for, where they say so readably.
    let stage = match args.get(1).map(String::as_str) {
        Some("interrupt") => Some(RunStage::Interrupt),
        _ => value("stage").and_then(|s| s.parse().ok()),
    };
    let package = value("package").unwrap_or_else(|| "node".into());
    eprintln!("{error}");
    let result = StageResult::failed(
        stage,
        &package,
        Blame::Config,
        format!("the agent's arguments: {}", error.trim()),
    );
    let log = value("termination-log").unwrap_or_else(|| "/dev/termination-log".into());
    let message = result.to_termination_message();
    if let Err(e) = std::fs::write(&log, &message) {
        eprintln!("cannot write {log}: {e}");
    }
    println!("{message}");
    ExitCode::from(result.blame.exit_code())
}

fn finish(common: &Common, result: &StageResult) -> ExitCode {
    let message = result.to_termination_message();
    if let Err(e) = std::fs::write(&common.termination_log, &message) {
        eprintln!("cannot write {}: {e}", common.termination_log.display());
    }
    println!("{message}");
    ExitCode::from(result.blame.exit_code())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::path::PathBuf;

    use clap::Parser;
    use nodewright_api::agent::{
        Backend, InterruptAsk, InterruptCall, PrestageAsk, PrestageCall, Pulling, RunStage,
        StageAsk, StageCall,
    };
    use nodewright_api::grants::Capabilities;
    use nodewright_api::pinned::PinnedRef;
    use nodewright_api::v1alpha1::InterruptType;

    use super::*;

    fn common() -> Common {
        Common {
            host_root: PathBuf::from("/host"),
            backend: Backend::Sim,
            node: "gpu-7".into(),
            cr_uid: "0b5c".into(),
            generation: 4,
            run: 1_700_000_000,
            termination_log: PathBuf::from("/dev/termination-log"),
        }
    }

    fn pinned(name: &str) -> PinnedRef {
        format!("reg.example/plugins/{name}@sha256:{}", "0".repeat(64))
            .parse()
            .unwrap()
    }

    #[test]
    fn an_unpinned_plugin_is_refused_at_the_argument_naming_it() {
        let call = AgentCall::Run(StageCall::new(
            common(),
            StageAsk::new(RunStage::Apply, "p", "1.0.0", pinned("p")),
        ));
        let args: Vec<String> = call
            .to_args()
            .into_iter()
            .map(|a| {
                if a.starts_with("--plugin=") {
                    "--plugin=reg.example/plugins/p:1.0.0".into()
                } else {
                    a
                }
            })
            .collect();
        let err = Cli::try_parse_from(std::iter::once("nodewright-agent".to_string()).chain(args))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("--plugin") && err.contains("not pinned"),
            "{err}"
        );
    }

    fn parsed(call: &AgentCall) -> AgentCall {
        let argv = std::iter::once("nodewright-agent".to_string()).chain(call.to_args());
        Cli::try_parse_from(argv)
            .unwrap_or_else(|e| panic!("{:?}: {e}", call.to_args()))
            .call
    }

    #[test]
    fn the_agent_parses_back_every_field_the_operator_writes() {
        let caps: Capabilities = serde_json::from_str(
            r#"{"files": [{"path": "/etc/sysctl.d", "access": "readWrite"}],
                "sysctl": ["vm.swappiness"], "commands": [{"path": "/bin/true", "args": ["a b", "--x=y"]}]}"#,
        )
        .unwrap();
        let mut ask = StageAsk::new(RunStage::Upgrade, "driver", "2.0.0", pinned("driver"));
        ask.previous_version = Some("1.9.0".into());
        ask.node_order = Some(3);
        ask.capabilities = caps;
        ask.reboot_allowed = true;
        ask.config = BTreeMap::from([
            ("a.conf".into(), "x=1\ny=\"2\"".into()),
            ("--looks-like-a-flag".into(), "=".into()),
        ]);
        ask.changed_keys = vec!["a.conf".into(), "b conf".into()];
        ask.timeout = Duration::from_millis(1500);
        ask.limits.memory = 300 << 20;
        ask.limits.write_bytes = 7;
        ask.limits.write_files = 9;
        ask.graceful_shutdown = Duration::from_secs(45);
        ask.payload_images = vec![
            format!("fw=reg.example/nvidia/fw@sha256:{}", "1".repeat(64))
                .parse()
                .unwrap(),
            format!(
                "driver=reg.example/nvidia/driver@sha256:{}#/opt/nvidia",
                "2".repeat(64)
            )
            .parse()
            .unwrap(),
        ];
        let mut stage = StageCall::new(common(), ask);
        stage.min_free_bytes = 1 << 30;
        stage.pulling = Pulling {
            insecure_registries: vec!["localhost:5000".into()],
            registry_configs: vec![
                "/etc/nodewright/registry/secrets/a/.dockerconfigjson".into(),
                "/etc/nodewright/registry/secrets/b/.dockerconfigjson".into(),
            ],
            registry_cas: vec![
                "reg.example:5000=/etc/nodewright/registry/ca/corp/ca.crt"
                    .parse()
                    .unwrap(),
            ],
            cache_dir: Some("/var/cache/nw".into()),
            cache_quota: Some(20 << 30),
        };
        let pulling = stage.pulling.clone();
        let call = AgentCall::Run(stage);
        assert_eq!(parsed(&call), call);
        // The defaults survive too (nothing optional is lost or invented).
        let bare = AgentCall::Run(StageCall::new(
            common(),
            StageAsk::new(RunStage::Plan, "p", "1.0.0", pinned("p")),
        ));
        assert_eq!(parsed(&bare), bare);

        let mut interrupt = InterruptCall::new(
            common(),
            InterruptAsk {
                kind: InterruptType::Service,
                package: "driver".into(),
                services: vec!["a.service".into(), "b@1.service".into()],
            },
        );
        interrupt.reboot_wait = Duration::from_millis(200);
        let call = AgentCall::Interrupt(interrupt);
        assert_eq!(parsed(&call), call);

        let call = AgentCall::Prestage(PrestageCall {
            common: common(),
            ask: PrestageAsk {
                plugins: vec![pinned("driver"), pinned("firmware")],
                images: vec![
                    format!(
                        "fw=reg.example/nvidia/fw@sha256:{}#/lib/firmware",
                        "1".repeat(64)
                    )
                    .parse()
                    .unwrap(),
                ],
                keep: vec![pinned("kmod")],
                keep_images: vec![
                    format!("tools=reg.example/vendor/tools@sha256:{}", "3".repeat(64))
                        .parse()
                        .unwrap(),
                ],
            },
            pulling,
        });
        assert_eq!(parsed(&call), call);
    }
}
