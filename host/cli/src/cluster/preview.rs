//! `preview -f FILE…`: what applying NodeWrights would do, before anything is done.
//!
//! By default each NodeWright in the files becomes a `NodeWrightPreview`: the operator runs
//! each package's read-only `plan` stage on the nodes the rollout would reach and forecasts
//! the rollout with their answers — the host changes per node, converged packages, the
//! interrupts after coalescing, cordons, evictions, batches. This verb waits for the report,
//! prints it and deletes the preview (`--keep` leaves it to its TTL). The preview is
//! admitted as applying the NodeWright would be, for the same caller: a grant they may not
//! give, a trust refusal or a field rule refuses it, and the verb fails.
//!
//! `--quick` asks for a forecast only: each NodeWright is sent as a server-side dry run (a
//! create when none of that name exists, a server-side apply over the live one when it
//! does), and the webhook answers an admissible one with a forecast from its caches, every
//! package assumed to change, as warnings. Nothing is persisted.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::client::Body;
use nodewright_api::v1alpha1::{
    NodeWrightPreview, NodeWrightPreviewSpec, NodeWrightSpec, PreviewPhase, PreviewStatus,
};
use serde_json::{Value, json};

use super::args::OutputArg;
use super::kube::client;

/// How a preview is asked for.
#[derive(Debug)]
pub struct PreviewHow {
    /// Only these nodes.
    pub nodes: Vec<String>,
    /// The dry run's forecast only.
    pub quick: bool,
    /// Leave the NodeWrightPreview to its TTL.
    pub keep: bool,
    /// Longest wait for its report.
    pub timeout: Duration,
}

/// `90s`, `10m`, `1h`, or seconds.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let (digits, unit) = text.split_at(text.trim_end_matches(['s', 'm', 'h']).len());
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{text:?} is not a duration (e.g. 90s, 10m, 1h)"))?;
    let seconds = match unit {
        "" | "s" => n,
        "m" => n * 60,
        "h" => n * 3600,
        _ => return Err(format!("{text:?} is not a duration (e.g. 90s, 10m, 1h)")),
    };
    Ok(Duration::from_secs(seconds))
}

/// The preview lines the webhook writes start with this (continuation lines are indented).
const PREVIEW: &str = "nodewright preview";

/// One NodeWright's answer.
#[derive(Debug, serde::Serialize)]
struct Answer {
    name: String,
    /// The preview, line by line (empty when the operator gave none: no webhook, or an
    /// older operator).
    preview: Vec<String>,
    /// Other warnings the apiserver returned (trust findings under `warn`, ...).
    warnings: Vec<String>,
    /// Why the dry run was refused, if it was.
    refused: Option<String>,
}

/// `preview -f FILE…`.
pub async fn preview(files: &[PathBuf], how: &PreviewHow, output: OutputArg) -> Result<ExitCode> {
    let mut docs = Vec::new();
    for file in files {
        let text =
            std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
        for doc in serde_yaml_ng::Deserializer::from_str(&text) {
            let doc = <Value as serde::Deserialize>::deserialize(doc)
                .with_context(|| format!("{}: not YAML", file.display()))?;
            if doc["kind"] == "NodeWright" {
                docs.push(doc);
            }
        }
    }
    if docs.is_empty() {
        bail!("no NodeWright in {}", names(files));
    }
    let c = client().await?;
    if !how.quick {
        let mut answers = Vec::new();
        for doc in &docs {
            answers.push(planned(&c, doc, how).await?);
        }
        let failed = answers.iter().any(|a| a.refused.is_some());
        output
            .output
            .emit(&answers, |wide| planned_table(&answers, wide))?;
        return Ok(if failed {
            ExitCode::from(1)
        } else {
            ExitCode::SUCCESS
        });
    }
    let mut answers = Vec::new();
    for doc in &docs {
        answers.push(dry_run(&c, doc).await?);
    }
    let refused = answers.iter().any(|a| a.refused.is_some());
    output.output.emit(&answers, |_| table(&answers))?;
    Ok(if refused {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

fn names(files: &[PathBuf]) -> String {
    let names: Vec<String> = files.iter().map(|f| f.display().to_string()).collect();
    names.join(", ")
}

fn table(answers: &[Answer]) -> String {
    let mut out = String::new();
    for a in answers {
        if let Some(why) = &a.refused {
            out.push_str(&format!("{}: refused: {why}\n", a.name));
        } else if a.preview.is_empty() {
            out.push_str(&format!(
                "{}: admitted, with no preview (is the operator's webhook installed?)\n",
                a.name
            ));
        }
        for line in &a.preview {
            out.push_str(line);
            out.push('\n');
        }
        for w in &a.warnings {
            out.push_str(&format!("warning: {w}\n"));
        }
    }
    out
}

/// One NodeWright's full preview.
#[derive(Debug, serde::Serialize)]
struct Planned {
    name: String,
    /// The NodeWrightPreview's status: its phase, plan counts and report.
    preview: Option<PreviewStatus>,
    /// Why it was refused or failed, if it was.
    refused: Option<String>,
}

/// Creates a NodeWrightPreview of `doc`, waits for its report (progress on stderr) and
/// deletes it unless asked to keep it.
async fn planned(c: &kube::Client, doc: &Value, how: &PreviewHow) -> Result<Planned> {
    let name = doc["metadata"]["name"]
        .as_str()
        .context("a NodeWright without metadata.name")?
        .to_string();
    let spec: NodeWrightSpec = serde_json::from_value(doc["spec"].clone())
        .with_context(|| format!("NodeWright {name:?}: spec"))?;
    let mut preview = NodeWrightPreview::new(
        "",
        NodeWrightPreviewSpec {
            nodewright: name.clone(),
            spec,
            nodes: how.nodes.clone(),
            ttl_seconds_after_finished: None,
        },
    );
    preview.metadata.name = None;
    preview.metadata.generate_name = Some(format!("{name}-"));
    let api = kube::Api::<NodeWrightPreview>::all(c.clone());
    let created = match api.create(&PostParams::default(), &preview).await {
        Ok(p) => p,
        Err(kube::Error::Api(e)) if e.code == 404 => bail!(
            "this cluster has no NodeWrightPreview kind: install the chart's CRDs (or use --quick)"
        ),
        Err(kube::Error::Api(e)) => {
            return Ok(Planned {
                name,
                preview: None,
                refused: Some(e.message),
            });
        }
        Err(e) => return Err(e).with_context(|| format!("creating a preview of {name:?}")),
    };
    let id = created.metadata.name.clone().unwrap_or_default();
    let started = Instant::now();
    let mut said = String::new();
    let status = loop {
        let p = api
            .get(&id)
            .await
            .with_context(|| format!("reading NodeWrightPreview {id:?}"))?;
        let status = p.status.unwrap_or_default();
        if status.phase.is_some_and(PreviewPhase::finished) {
            break status;
        }
        let now = match status.phase {
            Some(PreviewPhase::Planning) => format!(
                "{name}: plan stages {} of {} answered",
                status.plans.done, status.plans.wanted
            ),
            Some(_) => format!("{name}: {}", status.message),
            None => format!("{name}: waiting for the operator"),
        };
        if now != said {
            eprintln!("{now}");
            said = now;
        }
        if started.elapsed() > how.timeout {
            bail!(
                "NodeWrightPreview {id} has no report after {} s (still {}); it is kept: `kubectl get nwp {id} -o yaml`",
                how.timeout.as_secs(),
                status
                    .phase
                    .map_or("not started".into(), |p| format!("{p:?}"))
            );
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    if !how.keep {
        api.delete(&id, &DeleteParams::background())
            .await
            .with_context(|| format!("deleting NodeWrightPreview {id:?}"))?;
    }
    let refused = (status.phase == Some(PreviewPhase::Failed)).then(|| status.message.clone());
    Ok(Planned {
        name,
        preview: Some(status),
        refused,
    })
}

/// The report: the summary and groups (each with its plans' host changes), then — with
/// `-o wide`, or for a few nodes — each node's compartment, batch and pods.
fn planned_table(answers: &[Planned], wide: bool) -> String {
    let mut out = String::new();
    for a in answers {
        if let Some(why) = &a.refused {
            out.push_str(&format!("{}: refused: {why}\n", a.name));
            continue;
        }
        let Some(report) = a.preview.as_ref().and_then(|p| p.report.as_ref()) else {
            continue;
        };
        out.push_str(&format!("{}: {report}", a.name));
        if wide || report.nodes.len() <= 10 {
            out.push_str("  NODE  COMPARTMENT/BATCH  OUTCOME  EVICTED  REFUSED\n");
            for n in &report.nodes {
                let batch = match (&n.compartment, n.batch) {
                    (Some(c), Some(b)) => format!("{c}/{b}"),
                    _ => "-".into(),
                };
                let outcome = report
                    .groups
                    .get(n.group)
                    .map_or(String::new(), |g| g.outcome.to_string());
                let list = |l: &[String]| {
                    if l.is_empty() {
                        "-".into()
                    } else {
                        l.join(",")
                    }
                };
                out.push_str(&format!(
                    "  {}  {batch}  {outcome}  {}  {}\n",
                    n.name,
                    list(&n.evicted),
                    list(&n.refused)
                ));
            }
        }
    }
    out
}

/// Sends `doc` as a server-side dry run and reads the apiserver's warnings.
async fn dry_run(c: &kube::Client, doc: &Value) -> Result<Answer> {
    let name = doc["metadata"]["name"]
        .as_str()
        .context("a NodeWright without metadata.name")?
        .to_string();
    let request = kube::core::Request::new("/apis/nodewright.io/v1alpha1/nodewrights");
    let exists = kube::Api::<nodewright_api::v1alpha1::NodeWright>::all(c.clone())
        .get_opt(&name)
        .await
        .with_context(|| format!("reading NodeWright {name:?}"))?
        .is_some();
    let http = if exists {
        let pp = PatchParams {
            dry_run: true,
            force: true,
            field_manager: Some("nodewright-preview".into()),
            ..Default::default()
        };
        let mut doc = doc.clone();
        doc["apiVersion"] = json!("nodewright.io/v1alpha1");
        request.patch(&name, &pp, &Patch::Apply(&doc))
    } else {
        let pp = PostParams {
            dry_run: true,
            ..Default::default()
        };
        request.create(&pp, serde_json::to_vec(doc)?)
    }
    .with_context(|| format!("building the dry run of {name:?}"))?;
    let response = c
        .send(http.map(Body::from))
        .await
        .with_context(|| format!("sending the dry run of {name:?}"))?;
    let status = response.status();
    let mut answer = Answer {
        name: name.clone(),
        preview: Vec::new(),
        warnings: Vec::new(),
        refused: None,
    };
    for value in response.headers().get_all("warning") {
        let text = warning_text(&String::from_utf8_lossy(value.as_bytes()));
        if text.starts_with(PREVIEW) || (text.starts_with("  ") && !answer.preview.is_empty()) {
            answer.preview.push(text);
        } else {
            answer.warnings.push(text);
        }
    }
    if !status.is_success() {
        let body = response
            .into_body()
            .collect_bytes()
            .await
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default();
        let message = serde_json::from_str::<Value>(&body)
            .ok()
            .and_then(|v| v["message"].as_str().map(String::from))
            .unwrap_or(body);
        answer.refused = Some(message);
    }
    Ok(answer)
}

/// The text of a `Warning` header (`299 - "text"`, quotes and backslashes escaped).
fn warning_text(header: &str) -> String {
    let text = header.split_once(" \"").map_or(header, |(_, t)| t);
    let text = text.strip_suffix('"').unwrap_or(text);
    text.replace("\\\"", "\"").replace("\\\\", "\\")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_duration_reads_in_seconds_minutes_or_hours() {
        assert_eq!(parse_duration("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("45"), Ok(Duration::from_secs(45)));
        assert!(parse_duration("ten").unwrap_err().contains("\"ten\""));
        assert!(parse_duration("5d").is_err());
    }

    #[test]
    fn a_warning_header_reads_as_its_text() {
        assert_eq!(
            warning_text(r#"299 - "nodewright preview of driver: 2 nodes""#),
            "nodewright preview of driver: 2 nodes"
        );
        assert_eq!(
            warning_text(r#"299 - "  plugin \"x\" is a \\ path""#),
            r#"  plugin "x" is a \ path"#
        );
        assert_eq!(warning_text("no quotes"), "no quotes");
    }
}
