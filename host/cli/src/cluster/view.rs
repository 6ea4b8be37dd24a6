//! What the cluster verbs print, as pure functions of the objects read: the same status and
//! node annotations the operator writes. Tables for people, `-o json` for scripts.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Node;
use nodewright_api::keys;
use nodewright_api::node_state::{NodeState, PackageStatus, Staged};
use nodewright_api::units::format_bytes;
use nodewright_api::v1alpha1::NodeWright;
use serde::Serialize;

/// Lays out rows under a header, columns padded to their widest cell.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let widths: Vec<usize> = (0..header.len())
        .map(|i| {
            rows.iter()
                .map(|r| r[i].chars().count())
                .chain([header[i].len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |cells: Vec<&str>| {
        let padded: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c}{}", " ".repeat(w - c.chars().count())))
            .collect();
        format!("{}\n", padded.join("  ").trim_end())
    };
    let mut out = line(header.to_vec());
    for r in rows {
        out.push_str(&line(r.iter().map(String::as_str).collect()));
    }
    out
}

/// `stage/state`, e.g. `apply/in_progress`.
pub fn stage_state(p: &PackageStatus) -> String {
    format!("{}/{}", p.stage.as_str(), p.state.as_str())
}

/// A node's state for `cr`, if it has a readable one.
pub fn node_state(node: &Node, cr: &str) -> Option<NodeState> {
    let annotations = node.metadata.annotations.as_ref()?;
    annotations
        .contains_key(&keys::node_state(cr))
        .then_some(())?;
    NodeState::read(&name(node), annotations, cr).ok()
}

fn name(n: &Node) -> String {
    n.metadata.name.clone().unwrap_or_default()
}

fn cordoned(n: &Node) -> bool {
    n.spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false)
}

/// One NodeWright in the overview.
#[derive(Debug, Serialize)]
pub struct Summary {
    pub name: String,
    pub status: String,
    pub complete_nodes: String,
    pub paused: bool,
    pub disabled: bool,
    /// Conditions that are not as they should be: `Type=Status: message`.
    pub problems: Vec<String>,
    /// The spec's generation and the one the status describes.
    pub generation: i64,
    pub observed_generation: Option<i64>,
    /// `name:version` of each package.
    pub packages: Vec<String>,
    /// While every maintenance window is closed: when the next opens (RFC 3339).
    pub next_window: Option<String>,
}

/// The overview: every NodeWright's roll-up.
pub fn summaries(crs: &[NodeWright]) -> Vec<Summary> {
    crs.iter()
        .map(|cr| {
            let st = cr.status.clone().unwrap_or_default();
            let ann = cr.metadata.annotations.clone().unwrap_or_default();
            let flag = |k: &str| ann.get(k).is_some_and(|v| v == "true");
            let problems = st
                .conditions
                .iter()
                .filter(|c| {
                    (c.type_ == "Ready" || c.type_ == "PluginsReady") != (c.status == "True")
                })
                .filter(|c| !(c.type_ == "Ready" && c.reason == "Progressing"))
                .map(|c| format!("{}={}: {}", c.type_, c.status, c.message))
                .collect();
            Summary {
                name: cr.metadata.name.clone().unwrap_or_default(),
                status: st
                    .status
                    .map(|s| s.as_str().to_string())
                    .unwrap_or_else(|| "unknown".into()),
                complete_nodes: st.complete_nodes.unwrap_or_else(|| "-".into()),
                paused: flag(keys::PAUSE),
                disabled: flag(keys::DISABLE),
                problems,
                generation: cr.metadata.generation.unwrap_or_default(),
                observed_generation: st.observed_generation,
                packages: cr
                    .spec
                    .packages
                    .iter()
                    .map(|(n, p)| format!("{n}:{}", p.version))
                    .collect(),
                next_window: st.next_window,
            }
        })
        .collect()
}

/// The overview as a table; `wide` adds generations and packages.
pub fn summaries_table(s: &[Summary], wide: bool) -> String {
    let rows: Vec<Vec<String>> = s
        .iter()
        .map(|s| {
            let mut flags: Vec<String> = Vec::new();
            if s.paused {
                flags.push("paused".into());
            }
            if s.disabled {
                flags.push("disabled".into());
            }
            if let Some(next) = &s.next_window {
                flags.push(format!("next-window={next}"));
            }
            let mut row = vec![
                s.name.clone(),
                s.status.clone(),
                s.complete_nodes.clone(),
                flags.join(","),
            ];
            if wide {
                let observed = s
                    .observed_generation
                    .map_or_else(|| "-".into(), |g| g.to_string());
                row.extend([format!("{observed}/{}", s.generation), s.packages.join(",")]);
            }
            row.push(s.problems.join("; "));
            row
        })
        .collect();
    let header: &[&str] = if wide {
        &[
            "NODEWRIGHT",
            "STATUS",
            "COMPLETE",
            "FLAGS",
            "OBSERVED/GEN",
            "PACKAGES",
            "PROBLEMS",
        ]
    } else {
        &["NODEWRIGHT", "STATUS", "COMPLETE", "FLAGS", "PROBLEMS"]
    };
    table(header, &rows)
}

/// One node under one NodeWright.
#[derive(Debug, Serialize)]
pub struct NodeRow {
    pub node: String,
    pub status: String,
    pub cordoned: bool,
    /// Bytes of the NodeWright's payloads the node has staged (its `nodewright.io/staged.*`
    /// annotation), if it staged any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub staged: Option<u64>,
    /// `package → stage/state`.
    pub packages: BTreeMap<String, String>,
    /// `package → last message` (failures, waits), where there is one.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub messages: BTreeMap<String, String>,
}

/// Every node a NodeWright reports, with its packages.
pub fn node_rows(cr: &NodeWright, nodes: &[Node]) -> Vec<NodeRow> {
    let name_ = cr.metadata.name.clone().unwrap_or_default();
    let st = cr.status.clone().unwrap_or_default();
    let mut rows: Vec<NodeRow> = nodes
        .iter()
        .filter(|n| st.node_status.contains_key(&name(n)) || node_state(n, &name_).is_some())
        .map(|n| {
            let state = node_state(n, &name_).unwrap_or_default();
            NodeRow {
                node: name(n),
                status: st
                    .node_status
                    .get(&name(n))
                    .map(|s| s.as_str().to_string())
                    .unwrap_or_else(|| "-".into()),
                cordoned: cordoned(n),
                staged: n
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(&keys::staged(&name_)))
                    .and_then(|v| v.parse::<Staged>().ok())
                    .map(|s| s.bytes),
                packages: state
                    .values()
                    .map(|p| (p.name.clone(), stage_state(p)))
                    .collect(),
                messages: state
                    .values()
                    .filter(|p| !p.message.is_empty())
                    .map(|p| (p.name.clone(), p.message.clone()))
                    .collect(),
            }
        })
        .collect();
    rows.sort_by(|a, b| a.node.cmp(&b.node));
    rows
}

/// The per-node table of one NodeWright: a column per package of its spec, the payload
/// bytes staged when a node staged any; `wide` adds each node's messages.
pub fn node_rows_table(cr: &NodeWright, rows: &[NodeRow], wide: bool) -> String {
    let packages: Vec<&String> = cr.spec.packages.keys().collect();
    let staging = rows.iter().any(|r| r.staged.is_some());
    let mut header = vec!["NODE", "STATUS", "CORDONED"];
    if staging {
        header.push("STAGED");
    }
    header.extend(packages.iter().map(|p| p.as_str()));
    if wide {
        header.push("MESSAGES");
    }
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            let mut c = vec![r.node.clone(), r.status.clone(), yes(r.cordoned)];
            if staging {
                c.push(r.staged.map_or_else(|| "-".into(), format_bytes));
            }
            c.extend(
                packages
                    .iter()
                    .map(|p| r.packages.get(*p).cloned().unwrap_or_else(|| "-".into())),
            );
            if wide {
                c.push(
                    r.messages
                        .iter()
                        .map(|(p, m)| format!("{p}: {m}"))
                        .collect::<Vec<_>>()
                        .join("; "),
                );
            }
            c
        })
        .collect();
    table(&header, &cells)
}

fn yes(b: bool) -> String {
    if b { "yes".into() } else { "-".into() }
}

/// One node in `node list`.
#[derive(Debug, Serialize)]
pub struct NodeListRow {
    pub node: String,
    pub ignored: bool,
    pub cordoned: bool,
    /// The Node's `Ready` condition status (`True`, `False`, `Unknown`).
    pub ready: String,
    pub boot_id: String,
    /// NodeWright → this node's status under it (`-`: not targeted).
    pub nodewrights: BTreeMap<String, String>,
}

/// Every node with its status under each NodeWright.
pub fn node_list(crs: &[NodeWright], nodes: &[Node]) -> Vec<NodeListRow> {
    let mut rows: Vec<NodeListRow> = nodes
        .iter()
        .map(|n| {
            let status = n.status.as_ref();
            NodeListRow {
                node: name(n),
                ignored: n
                    .metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(keys::IGNORE))
                    .is_some_and(|v| v == "true"),
                cordoned: cordoned(n),
                ready: status
                    .and_then(|s| s.conditions.as_ref()?.iter().find(|c| c.type_ == "Ready"))
                    .map_or_else(|| "Unknown".into(), |c| c.status.clone()),
                boot_id: status
                    .and_then(|s| s.node_info.as_ref())
                    .map(|i| i.boot_id.clone())
                    .unwrap_or_default(),
                nodewrights: crs
                    .iter()
                    .map(|cr| {
                        let st = cr
                            .status
                            .as_ref()
                            .and_then(|s| s.node_status.get(&name(n)))
                            .map_or_else(|| "-".into(), |s| s.as_str().to_string());
                        (cr.metadata.name.clone().unwrap_or_default(), st)
                    })
                    .collect(),
            }
        })
        .collect();
    rows.sort_by(|a, b| a.node.cmp(&b.node));
    rows
}

/// `node list` as a table: a column per NodeWright; `wide` adds readiness and boot ID.
pub fn node_list_table(rows: &[NodeListRow], wide: bool) -> String {
    let crs: Vec<&String> = rows
        .first()
        .map(|r| r.nodewrights.keys().collect())
        .unwrap_or_default();
    let mut header = vec!["NODE", "IGNORED", "CORDONED"];
    if wide {
        header.extend(["READY", "BOOT-ID"]);
    }
    header.extend(crs.iter().map(|c| c.as_str()));
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            let mut c = vec![r.node.clone(), yes(r.ignored), yes(r.cordoned)];
            if wide {
                c.extend([r.ready.clone(), r.boot_id.clone()]);
            }
            c.extend(r.nodewrights.values().cloned());
            c
        })
        .collect();
    table(&header, &cells)
}

/// One package entry on one node, for `package status` and `node status`.
#[derive(Debug, Serialize)]
pub struct PackageRow {
    pub nodewright: String,
    pub node: String,
    pub package: String,
    pub version: String,
    pub stage: String,
    pub state: String,
    pub attempts: i32,
    pub message: String,
    /// The pinned plugin reference the node ran.
    pub digest: String,
}

/// Package entries of `cr` (optionally one package) across `nodes`.
pub fn package_rows(cr: &str, package: Option<&str>, nodes: &[Node]) -> Vec<PackageRow> {
    let mut rows = Vec::new();
    for n in nodes {
        for p in node_state(n, cr)
            .unwrap_or_default()
            .values()
            .filter(|p| package.is_none_or(|want| p.name == want))
        {
            rows.push(PackageRow {
                nodewright: cr.into(),
                node: name(n),
                package: p.name.clone(),
                version: p.version.clone(),
                stage: p.stage.as_str().into(),
                state: p.state.as_str().into(),
                attempts: p.attempts,
                message: p.message.clone(),
                digest: p
                    .digest
                    .as_ref()
                    .map(ToString::to_string)
                    .unwrap_or_default(),
            });
        }
    }
    rows.sort_by(|a, b| {
        (&a.nodewright, &a.node, &a.package).cmp(&(&b.nodewright, &b.node, &b.package))
    });
    rows
}

/// Package rows as a table: messages cut to one short line, whole (with the pinned plugin
/// reference) when `wide`.
pub fn package_table(rows: &[PackageRow], wide: bool) -> String {
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            let mut c = vec![
                r.nodewright.clone(),
                r.node.clone(),
                r.package.clone(),
                r.version.clone(),
                r.stage.clone(),
                r.state.clone(),
                r.attempts.to_string(),
            ];
            if wide {
                c.extend([r.digest.clone(), r.message.clone()]);
            } else {
                c.push(short(&r.message));
            }
            c
        })
        .collect();
    let header: &[&str] = if wide {
        &[
            "NODEWRIGHT",
            "NODE",
            "PACKAGE",
            "VERSION",
            "STAGE",
            "STATE",
            "ATTEMPTS",
            "PLUGIN",
            "MESSAGE",
        ]
    } else {
        &[
            "NODEWRIGHT",
            "NODE",
            "PACKAGE",
            "VERSION",
            "STAGE",
            "STATE",
            "ATTEMPTS",
            "MESSAGE",
        ]
    };
    table(header, &cells)
}

/// The first line of `m`, at most 60 characters (`…` marks a cut).
fn short(m: &str) -> String {
    const MAX: usize = 60;
    let line = m.lines().next().unwrap_or_default();
    if line.chars().count() > MAX || line.len() < m.trim_end().len() {
        format!("{}…", line.chars().take(MAX).collect::<String>())
    } else {
        line.to_string()
    }
}

#[cfg(test)]
mod tests;
