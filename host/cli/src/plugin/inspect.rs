//! `nodewright plugin inspect FILE`.

use nodewright_api::units::format_bytes;
use std::process::ExitCode;

use clap::Args;
use nodewright_api::grants::{Capabilities, GrantSet, GrantSource};
use nodewright_engine::{
    EXPECTED_EXPORT, GrantCheck, ImportKind, LoadedPlugin, STAGE_FUNCTIONS, check_grants,
};
use serde_json::json;

use super::source::Source;

/// Arguments of `plugin inspect`.
#[derive(Debug, Args)]
pub struct InspectArgs {
    /// The component: a .wasm file or an OCI reference (repo:tag or repo@sha256:...).
    file: String,
    #[command(flatten)]
    registry: super::source::RegistryArgs,
    /// Also check these grants against the imports (same syntax as `plugin run --grant`).
    #[arg(long = "grant", value_name = "GRANT")]
    grants: Vec<String>,
    /// Output format.
    #[arg(short, long, value_enum, default_value = "text")]
    output: super::run::Format,
}

/// `plugin inspect`: what the component is, what it imports, and (with `--grant`) whether
/// the grants cover it — as text or JSON. Exits 1 when a grant is missing.
pub async fn run(args: InspectArgs) -> anyhow::Result<ExitCode> {
    let engine = super::engine()?;
    let source = super::source::load(&engine, &args.file, &args.registry).await?;
    let check = if args.grants.is_empty() {
        None
    } else {
        let (caps, power) = Capabilities::from_flags(&args.grants)?;
        let set = GrantSet::parse(&caps, power, GrantSource::Flags).map_err(|errs| {
            anyhow::anyhow!(
                errs.iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join("; ")
            )
        })?;
        Some(check_grants(&source.plugin, &set))
    };
    match args.output {
        super::run::Format::Json => print_json(&source, check.as_ref())?,
        super::run::Format::Text => print_text(&source, check.as_ref()),
    }
    Ok(match check {
        Some(c) if !c.missing.is_empty() => ExitCode::from(1),
        _ => ExitCode::SUCCESS,
    })
}

fn required(plugin: &LoadedPlugin) -> Vec<&'static str> {
    plugin
        .required_capabilities()
        .iter()
        .map(|c| c.interface())
        .collect()
}

fn print_json(source: &Source, check: Option<&GrantCheck>) -> anyhow::Result<()> {
    let plugin = &source.plugin;
    let imports: Vec<_> = plugin
        .imports
        .iter()
        .map(|i| {
            let kind = match i.kind {
                ImportKind::AlwaysLinked => "always-linked".to_string(),
                ImportKind::Capability(c) => format!("capability:{c}"),
                ImportKind::Wasi => "wasi".to_string(),
            };
            json!({"name": i.name, "kind": kind})
        })
        .collect();
    let mut out = json!({
        "source": source.display,
        "digest": plugin.digest,
        "size": plugin.size,
        "world": "nodewright:plugin/plugin@0.1.0",
        "export": EXPECTED_EXPORT,
        "stages": STAGE_FUNCTIONS,
        "requiredCapabilities": required(plugin),
        "imports": imports,
        "payloads": source.payloads.iter().map(|p| json!({
            "name": p.name,
            "size": p.layer.size,
            "digest": p.layer.digest,
        })).collect::<Vec<_>>(),
    });
    if let Some(check) = check {
        out["grantCheck"] = json!({
            "missing": check.missing.iter().map(|c| c.interface()).collect::<Vec<_>>(),
            "excess": check.excess.iter().map(|c| c.interface()).collect::<Vec<_>>(),
        });
    }
    println!("{}", serde_json::to_string_pretty(&out)?);
    Ok(())
}

fn print_text(source: &Source, check: Option<&GrantCheck>) {
    let plugin = &source.plugin;
    let required = required(plugin);
    println!("source        {}", source.display);
    println!("digest        {}", plugin.digest);
    println!(
        "size          {} ({} bytes)",
        format_bytes(plugin.size as u64),
        plugin.size
    );
    println!("world         nodewright:plugin/plugin@0.1.0");
    println!(
        "exports       {EXPECTED_EXPORT}: {}",
        STAGE_FUNCTIONS.join(", ")
    );
    println!(
        "capabilities  {}",
        if required.is_empty() {
            "none".to_string()
        } else {
            required.join(", ")
        }
    );
    println!("imports");
    for i in &plugin.imports {
        let kind = match i.kind {
            ImportKind::AlwaysLinked => "always linked".to_string(),
            ImportKind::Capability(c) => format!("needs grant: {}", c.grant_field()),
            ImportKind::Wasi => "wasi (nothing granted behind it)".to_string(),
        };
        println!("  {:<40} {kind}", i.name);
    }
    if !source.payloads.is_empty() {
        println!("payloads      (read at /payload/NAME)");
        for p in &source.payloads {
            println!(
                "  {:<24} {:>10}  {}",
                p.name.as_str(),
                format_bytes(p.layer.bytes()),
                p.layer.digest
            );
        }
    }
    if let Some(check) = check {
        if check.missing.is_empty() {
            println!("grant check   ok");
        } else {
            println!("grant check   missing: {}", check.missing_summary());
        }
        if !check.excess.is_empty() {
            let excess: Vec<&str> = check.excess.iter().map(|c| c.interface()).collect();
            println!(
                "              granted but not imported: {}",
                excess.join(", ")
            );
        }
    }
}
