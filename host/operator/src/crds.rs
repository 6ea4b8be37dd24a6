//! `nodewright-operator apply-crds`: the chart's pre-upgrade hook.
//!
//! Helm installs the CRDs in a chart's `crds/` on the first install and never touches them
//! again, so an upgrade that adds a field would leave the old schema serving, and the
//! apiserver would prune the new field from every object. This applies the chart's CRDs on
//! every `helm upgrade` (server-side apply), and never narrows one: a CRD that a newer chart
//! applied is kept as it is. Helm runs no upgrade hook on `helm rollback`, and a downgrade
//! keeps the newer CRD here, so objects that use a newer field keep it either way.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams};
use semver::Version;

/// The CRD annotation recording which chart version applied it.
pub const CHART_VERSION: &str = "nodewright.io/chart-version";

/// `apply-crds`'s arguments.
#[derive(Debug, clap::Parser)]
#[command(
    name = "nodewright-operator apply-crds",
    about = "Apply the chart's CRDs (a helm pre-upgrade hook); never replaces a newer chart's"
)]
pub struct ApplyCrds {
    /// Directory of CRD manifests, one per `*.yaml` file.
    #[arg(long)]
    dir: PathBuf,
    /// The chart's version, recorded on each CRD it applies.
    #[arg(long)]
    chart_version: Version,
}

/// What to do with one CRD.
#[derive(Debug, PartialEq, Eq)]
enum Decision {
    /// Not installed: create it.
    Create,
    /// Installed by this chart version, an older one, or none recorded: apply ours.
    Apply { from: Option<Version> },
    /// Installed by a newer chart: keep it (ours would drop its newer fields).
    Keep { newer: Version },
}

fn decide(installed: Option<&CustomResourceDefinition>, ours: &Version) -> Decision {
    let Some(crd) = installed else {
        return Decision::Create;
    };
    let from = crd
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(CHART_VERSION))
        .and_then(|v| Version::parse(v).ok());
    match from {
        Some(v) if v > *ours => Decision::Keep { newer: v },
        from => Decision::Apply { from },
    }
}

/// The CRDs in `dir`, in name order.
fn read(dir: &Path) -> Result<Vec<CustomResourceDefinition>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("--dir {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    files
        .iter()
        .map(|f| {
            let text = std::fs::read_to_string(f).with_context(|| f.display().to_string())?;
            serde_yaml_ng::from_str(&text)
                .with_context(|| format!("{} is not a CustomResourceDefinition", f.display()))
        })
        .collect()
}

/// Applies every CRD in `args.dir` that no newer chart has applied, saying what it did.
pub async fn run(args: ApplyCrds) -> Result<()> {
    let crds = read(&args.dir)?;
    anyhow::ensure!(!crds.is_empty(), "no *.yaml CRD in {}", args.dir.display());
    let api: Api<CustomResourceDefinition> = Api::all(crate::client().await?);
    let ours = &args.chart_version;
    for mut crd in crds {
        let name = crd.metadata.name.clone().context("a CRD without a name")?;
        let installed = api.get_opt(&name).await?;
        let decision = decide(installed.as_ref(), ours);
        if let Decision::Keep { newer } = &decision {
            println!("{name}: kept as chart {newer} applied it (newer than {ours})");
            continue;
        }
        crd.metadata
            .annotations
            .get_or_insert_default()
            .insert(CHART_VERSION.into(), ours.to_string());
        crd.metadata.managed_fields = None;
        crd.metadata.resource_version = None;
        api.patch(
            &name,
            &PatchParams::apply("nodewright-chart").force(),
            &Patch::Apply(&crd),
        )
        .await
        .with_context(|| format!("applying {name}"))?;
        match decision {
            Decision::Create => println!("{name}: created (chart {ours})"),
            Decision::Apply { from: Some(from) } => {
                println!("{name}: applied chart {ours} (was {from})")
            }
            Decision::Apply { from: None } => println!("{name}: applied chart {ours}"),
            Decision::Keep { .. } => unreachable!("kept above"),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn installed_by(version: Option<&str>) -> CustomResourceDefinition {
        let mut crd = CustomResourceDefinition::default();
        if let Some(v) = version {
            crd.metadata.annotations = Some([(CHART_VERSION.to_string(), v.to_string())].into());
        }
        crd
    }

    #[test]
    fn the_charts_crds_read_as_written() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/chart/nodewright/crds");
        let crds = read(&dir).unwrap();
        let mut names: Vec<String> = crds
            .iter()
            .filter_map(|c| c.metadata.name.clone())
            .collect();
        names.sort();
        let mut want = nodewright_api::crdgen::CRD_NAMES.to_vec();
        want.sort();
        assert_eq!(names, want);
        // YAML 1.2: the trust policy's mode `off` stays a string (YAML 1.1 reads `false`).
        let trust = crds
            .iter()
            .find(|c| c.spec.names.kind == "PluginTrustPolicy")
            .unwrap();
        let schema = serde_json::to_value(&trust.spec.versions[0].schema).unwrap();
        assert_eq!(
            schema["openAPIV3Schema"]["properties"]["spec"]["properties"]["mode"]["enum"],
            serde_json::json!(["enforce", "warn", "off"])
        );
    }

    #[test]
    fn a_crd_is_applied_unless_a_newer_chart_applied_it() {
        let ours = Version::new(0, 2, 0);
        assert_eq!(decide(None, &ours), Decision::Create);
        assert_eq!(
            decide(Some(&installed_by(None)), &ours),
            Decision::Apply { from: None },
            "from the chart's crds/ (first install): no version recorded"
        );
        assert_eq!(
            decide(Some(&installed_by(Some("0.1.9"))), &ours),
            Decision::Apply {
                from: Some(Version::new(0, 1, 9))
            }
        );
        assert_eq!(
            decide(Some(&installed_by(Some("0.2.0"))), &ours),
            Decision::Apply {
                from: Some(ours.clone())
            },
            "the same version again (a roll forward after a rollback)"
        );
        assert_eq!(
            decide(Some(&installed_by(Some("0.10.0"))), &ours),
            Decision::Keep {
                newer: Version::new(0, 10, 0)
            },
            "semver order, not text order"
        );
        assert_eq!(
            decide(Some(&installed_by(Some("0.2.1-rc.1"))), &ours),
            Decision::Keep {
                newer: "0.2.1-rc.1".parse().unwrap()
            }
        );
    }
}
