//! The live progress view: one row per node, one column per package, read from the same
//! node annotations and CR status the operator writes. Pure: a [`Frame`] in, text out.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use nodewright_api::node_state::{NodeState, PackageStatus, State};
use nodewright_api::v1alpha1::{NodeWrightStatus, Status};
use nodewright_api::validate::DEFAULT_COMPARTMENT;

/// One node as the view shows it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeLine {
    /// Node name.
    pub name: String,
    /// Its `nodewright.io/tier` label (the policy compartment it falls in), or `-`.
    pub tier: String,
    /// Cordoned (unschedulable).
    pub cordoned: bool,
    /// Reboots the simulated host recorded.
    pub reboots: usize,
    /// `cr → its state annotation on this node`.
    pub states: BTreeMap<String, NodeState>,
}

/// Everything one redraw shows.
#[derive(Clone, Debug, Default)]
pub struct Frame {
    /// Seconds since the NodeWrights were applied.
    pub elapsed: f64,
    /// `cr → (packages in column order, status)`.
    pub crs: Vec<(String, Vec<String>, Option<NodeWrightStatus>)>,
    /// The nodes.
    pub nodes: Vec<NodeLine>,
}

/// `apply …`, `config ✓`, `interrupt ↷`, `apply ✗ (2)`.
pub fn cell(p: Option<&PackageStatus>) -> String {
    let Some(p) = p else { return "·".into() };
    let mark = match p.state {
        State::Complete => "✓".to_string(),
        State::InProgress => "…".into(),
        State::Skipped => "↷".into(),
        State::Erroring => format!("✗ ({})", p.attempts),
        State::Unknown => p.state.as_str().to_string(),
    };
    format!("{} {mark}", p.stage.as_str())
}

fn cr_summary(name: &str, status: Option<&NodeWrightStatus>) -> String {
    let Some(s) = status else {
        return format!("{name}: waiting for the operator");
    };
    let state = s.status.map(Status::as_str).unwrap_or("unknown");
    let mut out = format!(
        "{name}: {state}, {} nodes complete",
        s.complete_nodes.as_deref().unwrap_or("0/?")
    );
    for c in s
        .conditions
        .iter()
        .filter(|c| c.status == "True" && c.type_ != "Ready" && c.type_ != "PluginsReady")
    {
        let _ = write!(out, " · {} ({})", c.type_, c.reason);
    }
    if let Some(ready) = s
        .conditions
        .iter()
        .find(|c| c.type_ == "PluginsReady" && c.status == "False")
    {
        let _ = write!(out, " · plugins not ready: {}", ready.message);
    }
    let comps: Vec<String> = s
        .compartment_statuses
        .iter()
        .map(|(n, c)| {
            format!(
                "{} {}/{}",
                if n == DEFAULT_COMPARTMENT {
                    "default"
                } else {
                    n
                },
                c.completed,
                c.matched
            )
        })
        .collect();
    if !comps.is_empty() {
        let _ = write!(out, "\n    compartments: {}", comps.join(", "));
    }
    out
}

/// The whole view as text.
pub fn render(f: &Frame) -> String {
    let mut out = String::new();
    let all_done = !f.crs.is_empty()
        && f.crs.iter().all(|(_, _, s)| {
            s.as_ref()
                .is_some_and(|s| s.status == Some(Status::Complete))
        });
    let phase = if all_done {
        "rollout complete"
    } else {
        "rollout in progress"
    };
    let _ = writeln!(out, "nodewright demo — {phase}, {:.0} s\n", f.elapsed);
    for (name, _, status) in &f.crs {
        let _ = writeln!(out, "  {}", cr_summary(name, status.as_ref()));
    }
    let mut header = vec![
        "NODE".to_string(),
        "TIER".into(),
        "CORDON".into(),
        "REBOOTS".into(),
    ];
    let mut rows: Vec<Vec<String>> = Vec::new();
    for (cr, packages, _) in &f.crs {
        for p in packages {
            header.push(format!("{cr}/{p}"));
        }
    }
    for n in &f.nodes {
        let mut row = vec![
            n.name.clone(),
            n.tier.clone(),
            if n.cordoned { "yes".into() } else { "-".into() },
            n.reboots.to_string(),
        ];
        for (cr, packages, _) in &f.crs {
            let state = n.states.get(cr);
            for p in packages {
                row.push(cell(state.and_then(|s| s.values().find(|e| &e.name == p))));
            }
        }
        rows.push(row);
    }
    let widths: Vec<usize> = (0..header.len())
        .map(|i| {
            std::iter::once(&header[i])
                .chain(rows.iter().map(|r| &r[i]))
                .map(|c| c.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    out.push('\n');
    for row in std::iter::once(&header).chain(rows.iter()) {
        let line: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c}{}", " ".repeat(w - c.chars().count())))
            .collect();
        let _ = writeln!(out, "  {}", line.join("  ").trim_end());
    }
    out
}

/// The lines that changed between two frames' node rows, for a terminal that cannot redraw
/// (output piped to a file): `12 s  gpu-1  gpu-modules/nvidia-modules: apply …`.
pub fn changes(before: &Frame, after: &Frame) -> Vec<String> {
    let mut out = Vec::new();
    let t = after.elapsed;
    for n in &after.nodes {
        let old = before.nodes.iter().find(|o| o.name == n.name);
        if old.is_some_and(|o| o.cordoned != n.cordoned) || (old.is_none() && n.cordoned) {
            out.push(format!(
                "{t:>5.0} s  {}  {}",
                n.name,
                if n.cordoned { "cordoned" } else { "uncordoned" }
            ));
        }
        if old.map_or(0, |o| o.reboots) < n.reboots {
            out.push(format!("{t:>5.0} s  {}  rebooted", n.name));
        }
        for (cr, packages, _) in &after.crs {
            for p in packages {
                let find = |row: &NodeLine| {
                    row.states
                        .get(cr)
                        .and_then(|s| s.values().find(|e| &e.name == p))
                        .map(|e| cell(Some(e)))
                };
                let now = find(n);
                if now.is_some() && old.and_then(find) != now {
                    out.push(format!(
                        "{t:>5.0} s  {}  {cr}/{p}: {}",
                        n.name,
                        now.unwrap_or_default()
                    ));
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use nodewright_api::node_state::Stage;

    use super::*;

    fn entry(stage: Stage, state: State) -> PackageStatus {
        let mut p = PackageStatus::new("driver", "1.0.0", stage, 1);
        p.state = state;
        p
    }

    fn frame(stage: Stage, state: State, cordoned: bool) -> Frame {
        let st: NodeState = [("driver|1.0.0".to_string(), entry(stage, state))].into();
        Frame {
            elapsed: 3.0,
            crs: vec![("gpu".into(), vec!["driver".into()], None)],
            nodes: vec![NodeLine {
                name: "n1".into(),
                tier: "canary".into(),
                cordoned,
                reboots: 0,
                states: [("gpu".to_string(), st)].into(),
            }],
        }
    }

    #[test]
    fn cells_show_stage_and_state() {
        assert_eq!(
            cell(Some(&entry(Stage::PostInterrupt, State::Complete))),
            "post-interrupt ✓"
        );
        assert_eq!(
            cell(Some(&entry(Stage::Apply, State::InProgress))),
            "apply …"
        );
        assert_eq!(cell(None), "·");
    }

    #[test]
    fn the_table_has_a_column_per_package_and_a_row_per_node() {
        let text = render(&frame(Stage::Apply, State::InProgress, true));
        let lines: Vec<&str> = text.lines().collect();
        let header = lines
            .iter()
            .find(|l| l.trim_start().starts_with("NODE"))
            .unwrap();
        assert!(header.contains("gpu/driver"), "{text}");
        let row = lines
            .iter()
            .find(|l| l.trim_start().starts_with("n1"))
            .unwrap();
        assert!(
            row.contains("canary") && row.contains("yes") && row.contains("apply …"),
            "{text}"
        );
        assert!(text.contains("gpu: waiting for the operator"), "{text}");
    }

    #[test]
    fn piped_output_prints_only_what_changed() {
        let a = frame(Stage::Apply, State::InProgress, false);
        let b = frame(Stage::Apply, State::Complete, true);
        assert_eq!(
            changes(&a, &b),
            vec![
                "    3 s  n1  cordoned".to_string(),
                "    3 s  n1  gpu/driver: apply ✓".to_string()
            ]
        );
        assert!(changes(&b, &b).is_empty());
    }
}
