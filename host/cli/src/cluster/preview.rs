//! `preview -f FILE…`: what applying NodeWrights would do, before anything is done.
//!
//! Each NodeWright in the files is sent as a server-side dry run — a create when none of
//! that name exists, a server-side apply over the live one when it does — and the
//! operator's admission webhook answers an admissible one with a forecast of its rollout
//! (see the operator's `preview`), which kubectl shows as warnings and this verb prints. A
//! refusal (a field rule, a grant the caller may not give, a trust policy) is printed as
//! the apiserver gives it, and the verb fails. Nothing is persisted either way.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use kube::api::{Patch, PatchParams, PostParams};
use kube::client::Body;
use serde_json::{Value, json};

use super::args::OutputArg;
use super::kube::client;

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
pub async fn preview(files: &[PathBuf], output: OutputArg) -> Result<ExitCode> {
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
