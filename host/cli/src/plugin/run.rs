//! `nodewright plugin run FILE --stage S --root DIR`.

use nodewright_api::units::format_bytes;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail};
use clap::{Args, ValueEnum};
use nodewright_agent::{Ran, Shutdown};
use nodewright_api::grants::{Capabilities, GrantSet, GrantSource};
use nodewright_api::result::Blame;
use nodewright_engine::{RunStage, SandboxLimits, StageContext};
use nodewright_hostops::{NodeIdentity, SimHost};
use serde_json::json;

use crate::printable::printable;

/// Output format.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum Format {
    /// For people.
    Text,
    /// For scripts.
    Json,
}

/// Arguments of `plugin run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// The component: a .wasm file or an OCI reference (repo:tag or repo@sha256:...).
    file: String,
    #[command(flatten)]
    registry: super::source::RegistryArgs,
    /// Stage: plan, apply, apply-check, config, config-check, interrupt, post-interrupt,
    /// post-interrupt-check, upgrade, upgrade-check, uninstall, uninstall-check.
    #[arg(long, value_parser = |s: &str| s.parse::<RunStage>())]
    stage: RunStage,
    /// Scratch directory standing in for the node's `/` (created if missing).
    #[arg(long)]
    root: PathBuf,
    /// Config entry KEY=VALUE (repeatable).
    #[arg(long = "config", short = 'c', value_name = "KEY=VALUE")]
    config: Vec<String>,
    /// YAML or JSON map of config entries (merged before --config).
    #[arg(long, value_name = "FILE")]
    config_file: Option<PathBuf>,
    /// Capability grant (repeatable): files=/etc/x[:rw], kmod=NAME, service=UNIT,
    /// sysctl=KEY, command=/path[:arg,..], probe=/path[:arg,..] (read-only command), power.
    /// Globs are allowed in names.
    #[arg(long = "grant", short = 'g', value_name = "GRANT")]
    grants: Vec<String>,
    /// YAML or JSON file with a `capabilities` object as written in a NodeWright spec.
    #[arg(long, value_name = "FILE")]
    grants_file: Option<PathBuf>,
    /// Package name (default: the file name without extension).
    #[arg(long)]
    package: Option<String>,
    /// Package version.
    #[arg(long, default_value = "0.0.0-local")]
    version: String,
    /// Previous version (for upgrade).
    #[arg(long)]
    previous_version: Option<String>,
    /// The node's rollout order, as the operator would pass it (`NODEWRIGHT_NODE_ORDER`).
    #[arg(long)]
    node_order: Option<u32>,
    /// A file or directory served to the plugin at /payload/NAME, staged as a node stages
    /// a pulled payload (packed, then unpacked read-only; refused for what a node would
    /// refuse). Replaces a pulled payload of the same name. Repeatable.
    #[arg(long = "payload", value_name = "[NAME=]PATH")]
    payloads: Vec<super::payloads::PayloadArg>,
    /// A payload taken from a container image (a tag or a digest; an index narrowed to this
    /// machine's platform), served at /payload/NAME as a node serves a spec's
    /// `payloads: [{name, image, path}]`: its layers applied in order, only PATH kept.
    /// Repeatable.
    #[arg(long = "payload-image", value_name = "NAME=IMAGE[#/PATH]")]
    payload_images: Vec<super::payloads::ImageArg>,
    /// Config key reported as changed (repeatable).
    #[arg(long = "changed-key")]
    changed_keys: Vec<String>,
    /// Node name the plugin sees.
    #[arg(long, default_value = "local")]
    node: String,
    /// Wall-clock limit for the stage.
    #[arg(long, default_value = "5m", value_parser = nodewright_api::units::duration)]
    timeout: Duration,
    /// Memory limit for the sandbox (all the plugin's memories together); reads are
    /// capped at half of it.
    #[arg(long, default_value = "128Mi", value_parser = nodewright_api::units::bytes)]
    memory: u64,
    /// Bytes the stage may write through `files`.
    #[arg(long, default_value = "256Mi", value_parser = nodewright_api::units::bytes)]
    write_bytes: u64,
    /// Files and directories the stage may write or create.
    #[arg(long, default_value_t = nodewright_api::limits::DEFAULT_WRITE_FILES)]
    write_files: u32,
    /// Run only the stage, not the check that verifies it (the agent runs both).
    #[arg(long)]
    no_check: bool,
    /// Output format.
    #[arg(short, long, value_enum, default_value = "text")]
    output: Format,
}

fn read_map(path: &PathBuf) -> anyhow::Result<BTreeMap<String, String>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    serde_yaml_ng::from_str(&text).with_context(|| {
        format!(
            "{}: expected a map of string keys to string values",
            path.display()
        )
    })
}

fn grants(args: &RunArgs) -> anyhow::Result<(GrantSet, String)> {
    let (mut caps, power) = Capabilities::from_flags(&args.grants)?;
    if let Some(file) = &args.grants_file {
        let text = std::fs::read_to_string(file)
            .with_context(|| format!("cannot read {}", file.display()))?;
        let from_file: Capabilities = serde_yaml_ng::from_str(&text)
            .with_context(|| format!("{}: not a capabilities object", file.display()))?;
        caps.files.extend(from_file.files);
        caps.kernel_modules.extend(from_file.kernel_modules);
        caps.services.extend(from_file.services);
        caps.sysctl.extend(from_file.sysctl);
        caps.commands.extend(from_file.commands);
    }
    let set = GrantSet::parse(&caps, power, GrantSource::Flags).map_err(|errs| {
        anyhow::anyhow!(
            "invalid grants: {}",
            errs.iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; ")
        )
    })?;
    let summary = {
        let mut parts: Vec<String> = args.grants.clone();
        if args.grants_file.is_some() {
            parts.push("(+ grants file)".into());
        }
        if parts.is_empty() {
            "none".into()
        } else {
            parts.join(" ")
        }
    };
    Ok((set, summary))
}

/// `.../sysctl.wasm` → `sysctl`; `registry/plugins/sysctl:1.0` → `sysctl`.
fn package_name(source: &str) -> String {
    let last = source.rsplit('/').next().unwrap_or(source);
    let stem = last.split(['@', ':']).next().unwrap_or(last);
    let stem = stem.strip_suffix(".wasm").unwrap_or(stem);
    let stem = stem.strip_prefix("nodewright_plugin_").unwrap_or(stem);
    if stem.is_empty() {
        "plugin".into()
    } else {
        stem.replace('_', "-")
    }
}

fn print_logs(lines: &[nodewright_engine::LogLine]) {
    for line in lines {
        println!(
            "  {:<5} {}",
            format!("{:?}", line.level).to_lowercase(),
            printable(&line.message)
        );
    }
}

/// `plugin run`: the author loop, in the order it prints — load, grants, the simulated
/// node, the stage and its check, the blame — as text or one JSON document.
pub async fn run(args: RunArgs) -> anyhow::Result<ExitCode> {
    let config = config(&args)?;
    let (grants, grant_summary) = grants(&args)?;
    let package = match &args.package {
        Some(p) => p.clone(),
        None => package_name(&args.file),
    };
    let engine = super::engine()?;
    let source = super::source::load(&engine, &args.file, &args.registry).await?;
    let prepared = engine
        .prepare(&source.plugin, &grants)
        .with_context(|| source.display.clone())?;
    let pulled = super::source::stage(&source, &args.registry).await?;
    let mut payloads = super::payloads::stage_local(&super::cache_root()?, &args.payloads, pulled)?;
    if !args.payload_images.is_empty() {
        let puller = nodewright_oci::Puller::new(
            nodewright_oci::Registry::new(args.registry.config()?),
            nodewright_oci::NodeCache::open(&super::cache_root()?)?,
        );
        super::payloads::stage_images(
            &puller,
            &args.payload_images,
            &mut payloads,
            &super::source::print_progress,
        )
        .await?;
    }
    std::fs::create_dir_all(&args.root)
        .with_context(|| format!("cannot create {}", args.root.display()))?;
    let host = Arc::new(SimHost::new(
        &args.root,
        NodeIdentity {
            name: args.node.clone(),
            labels: vec![],
        },
    )?);
    let text = matches!(args.output, Format::Text);
    if text {
        print_header(&args, &source, &package, &grant_summary);
    }
    let inputs = nodewright_agent::StageInputs {
        prepared: &prepared,
        ctx: StageContext {
            node: args.node.clone(),
            package,
            version: args.version.clone(),
            previous_version: args.previous_version.clone(),
            config,
            changed_keys: args.changed_keys.clone(),
            node_order: args.node_order,
            payloads,
        },
        host: host.clone(),
        grants: Arc::new(grants),
        limits: &SandboxLimits {
            timeout: args.timeout,
            memory: args.memory,
            write_bytes: args.write_bytes,
            write_files: args.write_files,
            ..Default::default()
        },
    };
    let run =
        nodewright_agent::run_checked(&inputs, args.stage, !args.no_check, &mut Shutdown::never())
            .await;
    let actions = host.recorded();
    // 2: the sandbox stopped the plugin; 1: the plugin (or its check) failed.
    let code = if run.runs.iter().any(|r| r.outcome.is_err()) {
        ExitCode::from(2)
    } else if run.result.blame != Blame::None {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    };
    if text {
        print_text(&run, &actions);
    } else {
        print_json(&source.plugin, &run, &actions)?;
    }
    // The process ends after this stage: the engine's teardown (its instance pool unmapped,
    // each compiled module's unwind tables deregistered one by one) is left to the kernel
    // that reclaims it anyway — it was a twentieth of a warm `plugin run`.
    drop(inputs);
    std::mem::forget((prepared, source, engine));
    Ok(code)
}

/// `--config-file`, then each `--config KEY=VALUE` over it.
fn config(args: &RunArgs) -> anyhow::Result<BTreeMap<String, String>> {
    let mut config = match &args.config_file {
        Some(f) => read_map(f)?,
        None => BTreeMap::new(),
    };
    for entry in &args.config {
        let Some((k, v)) = entry.split_once('=') else {
            bail!("--config {entry:?} is not KEY=VALUE")
        };
        config.insert(k.to_string(), v.to_string());
    }
    Ok(config)
}

/// What runs, on what, with which grants.
fn print_header(args: &RunArgs, source: &super::source::Source, package: &str, grants: &str) {
    let plugin = &source.plugin;
    let code = if plugin.from_cache {
        "code loaded from cache"
    } else {
        "compiled"
    };
    let artifact = match source.pulled_from_cache {
        Some(true) => "artifact from the local cache, ",
        Some(false) => "artifact pulled, ",
        None => "",
    };
    println!(
        "plugin   {} ({}, {}, {artifact}{code} in {:.1} ms)",
        source.display,
        super::source::short(&plugin.digest),
        format_bytes(plugin.size as u64),
        source.load_time.as_secs_f64() * 1000.0
    );
    println!(
        "stage    {} of {package} {} on {} (simulated node at {})",
        args.stage,
        args.version,
        args.node,
        args.root.display()
    );
    println!("grants   {grants}");
}

/// `--output json`: the reports, the verdict and the host actions as one document.
fn print_json(
    plugin: &nodewright_engine::LoadedPlugin,
    run: &nodewright_agent::StageRun,
    actions: &[impl serde::Serialize],
) -> anyhow::Result<()> {
    let report = |r: Option<&Ran>| match r.map(|r| &r.outcome) {
        Some(Ok(report)) => json!(report),
        Some(Err(e)) => json!({"error": e.to_string()}),
        None => serde_json::Value::Null,
    };
    let out = json!({
        "digest": plugin.digest,
        "fromCache": plugin.from_cache,
        "report": report(run.runs.first()),
        "check": report(run.runs.get(1)),
        "result": run.result,
        "hostActions": actions,
    });
    println!("{}", serde_json::to_string_pretty(&out)?);
    Ok(())
}

/// The runs, the blame as the agent would report it, and what the simulated node saw.
fn print_text(run: &nodewright_agent::StageRun, actions: &[impl std::fmt::Display]) {
    for (i, ran) in run.runs.iter().enumerate() {
        print_run(ran, i > 0);
    }
    println!(
        "blame    {}{}",
        run.result.blame.as_str(),
        match run.result.blame {
            Blame::None => " (the agent would report success)".to_string(),
            b => format!(
                " (the agent would exit {} on a node{})",
                b.exit_code(),
                if b.counts_against_budget() {
                    ", counted against the retry budget"
                } else {
                    ", retried without counting"
                }
            ),
        }
    );
    println!(
        "host actions (simulated node){}",
        if actions.is_empty() { ": none" } else { "" }
    );
    for a in actions {
        println!("  {}", printable(&a.to_string()));
    }
}

/// One sandbox run, for people: its logs, then its outcome (a check after the stage is
/// labelled as one).
fn print_run(ran: &Ran, is_check: bool) {
    let label = if is_check { "check  " } else { "outcome" };
    let report = match &ran.outcome {
        Ok(r) => r,
        Err(e) => {
            if !e.logs().is_empty() {
                println!("logs");
                print_logs(e.logs());
            }
            println!(
                "result   sandbox stopped the plugin{}: {}",
                if is_check {
                    format!(" in {}", ran.stage)
                } else {
                    String::new()
                },
                printable(&e.to_string())
            );
            return;
        }
    };
    if !report.logs.is_empty() {
        println!(
            "logs{}",
            if report.logs_dropped > 0 {
                format!(" ({} older lines dropped)", report.logs_dropped)
            } else {
                String::new()
            }
        );
        print_logs(&report.logs);
    }
    let check = if is_check {
        format!("{} ", ran.stage)
    } else {
        String::new()
    };
    match &report.result {
        Ok(outcome) => {
            let summary = match outcome.interrupt.to_api() {
                _ if outcome.is_converged() => "converged (no changes, no interrupt)".to_string(),
                None => format!("{} change(s), interrupt: none", outcome.changes.len()),
                Some(i) => format!("{} change(s), interrupt: {i}", outcome.changes.len()),
            };
            println!(
                "{label}  {check}ok in {:.1} ms: {summary}",
                report.duration.as_secs_f64() * 1000.0
            );
            for c in &outcome.changes {
                println!(
                    "  {:<14} {:<48} {}",
                    printable(&c.kind),
                    printable(&c.target),
                    printable(&c.detail)
                );
            }
            if let Some(m) = &outcome.message {
                println!("  {}", printable(m));
            }
        }
        Err(e) => println!("{label}  {check}failed: {}", printable(&e.to_string())),
    }
}
