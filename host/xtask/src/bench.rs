//! `cargo xtask bench [--compare FILE] [--save FILE]`: the engine, language, planner,
//! payload and operator-snapshot benchmarks, their figures collected as JSON lines
//! (`nodewright-figures`), compared with a committed baseline or saved as a new one.
//!
//! The comparison is a report, never a verdict: these are wall times on a shared machine,
//! so a ratio is marked when it passes [`MARK`] and nothing fails.

use std::path::Path;

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use crate::budget::Budget;
use crate::cargo::{cargo, musl_triple};
use crate::{polyglot, run, setup_all};

/// A figure this many times its baseline (or more) is marked in the comparison.
const MARK: f64 = 1.5;

/// (package, bench) in the order they run.
const BENCHES: [(&str, &str); 4] = [
    ("nodewright-cli", "plugin"),
    ("nodewright-cli", "languages"),
    ("nodewright-planner", "plan"),
    ("nodewright-cli", "payload"),
];

/// Benchmarks of a binary crate's private code, written as ignored tests beside it:
/// (package, binary, test).
const TEST_BENCHES: [(&str, &str, &str); 1] = [(
    "nodewright-operator",
    "nodewright-operator",
    "world::tests::bench_snapshot_of_ten_thousand_nodes",
)];

/// What `bench` was asked for.
#[derive(Default)]
struct Args {
    compare: Option<String>,
    save: Option<String>,
}

fn parse(args: &[String]) -> Result<Args> {
    let mut parsed = Args::default();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = |flag: &str| {
            it.next()
                .cloned()
                .with_context(|| format!("{flag} needs a file"))
        };
        match a.as_str() {
            "--compare" => parsed.compare = Some(value("--compare")?),
            "--save" => parsed.save = Some(value("--save")?),
            other => bail!("unknown bench argument {other:?} (--compare FILE, --save FILE)"),
        }
    }
    Ok(parsed)
}

/// `cargo xtask bench`.
pub fn bench(target: &Path, args: &[String], budget: &mut Budget) -> Result<()> {
    let args = parse(args)?;
    setup_all(target, budget)?;
    // The payload benchmark's yardstick.
    crate::setup::go_builds(&[crate::setup::CRANE], &target.join("logs/go"))?.wait(budget)?;
    let tools = polyglot::Tools::at(target);
    let out = target.join("bench/figures.jsonl");
    std::fs::create_dir_all(out.parent().expect("a parent"))?;
    let _ = std::fs::remove_file(&out);
    for (package, name) in BENCHES {
        budget.phase(&format!("bench: {name}"), || {
            run(cargo(target)
                .args(["bench", "--locked", "-p", package, "--bench", name])
                .args(["--target", &musl_triple()])
                .envs(tools.env())
                .env("NODEWRIGHT_REQUIRE_POLYGLOT", "1")
                .env(FIGURES_ENV, &out))?;
            Ok(((), "printed above".into()))
        })?;
    }
    for (package, bin, test) in TEST_BENCHES {
        budget.phase(&format!("bench: {test}"), || {
            run(cargo(target)
                .args(["test", "--locked", "--release", "-p", package, "--bin", bin])
                .args(["--target", &musl_triple()])
                .args(["--", "--ignored", "--exact", "--nocapture", test])
                .env(FIGURES_ENV, &out))?;
            Ok(((), "printed above".into()))
        })?;
    }
    let figures = read_figures(&out)?;
    println!("\nfigures: {} in {}", figures.len(), out.display());
    if let Some(baseline) = &args.compare {
        let base: Value = serde_json::from_str(
            &std::fs::read_to_string(baseline).with_context(|| format!("reading {baseline}"))?,
        )
        .with_context(|| format!("{baseline} is not a baseline file"))?;
        print!("{}", compare(&base, &figures));
    }
    if let Some(path) = &args.save {
        let saved = json!({
            "machine": machine(),
            "commit": git(&["describe", "--always", "--dirty", "--abbrev=40"]),
            "date": git(&["log", "-1", "--format=%cs"]),
            "figures": figures,
        });
        std::fs::write(path, serde_json::to_string_pretty(&saved)? + "\n")
            .with_context(|| format!("writing {path}"))?;
        println!("baseline written to {path}");
    }
    Ok(())
}

/// The variable the benches append their figures to: `nodewright_figures::OUT_ENV`, named
/// again here because the task runner stays off the workspace's dependency graph.
const FIGURES_ENV: &str = "NODEWRIGHT_BENCH_OUT";

fn read_figures(path: &Path) -> Result<Vec<Value>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("the benches wrote no figures to {}", path.display()))?;
    text.lines()
        .map(|l| serde_json::from_str(l).with_context(|| format!("a figure line: {l}")))
        .collect()
}

fn key(f: &Value) -> (String, String) {
    let s = |k: &str| f[k].as_str().unwrap_or_default().to_string();
    (s("bench"), s("name"))
}

/// The comparison table: each figure of `now` beside its baseline, with the ratio.
fn compare(base: &Value, now: &[Value]) -> String {
    let old: Vec<&Value> = base["figures"]
        .as_array()
        .map(|a| a.iter().collect())
        .unwrap_or_default();
    let mut out = format!(
        "\ncompared with the baseline of {} ({}, {}); ratio = now / baseline, marked from x{MARK}\n",
        base["date"].as_str().unwrap_or("?"),
        base["commit"]
            .as_str()
            .map_or("?", |c| &c[..c.len().min(12)]),
        base["machine"].as_str().unwrap_or("?"),
    );
    for f in now {
        let (bench, name) = key(f);
        let unit = f["unit"].as_str().unwrap_or_default();
        let median = f["median"].as_f64().unwrap_or(f64::NAN);
        let was = old
            .iter()
            .find(|o| key(o) == (bench.clone(), name.clone()))
            .and_then(|o| o["median"].as_f64());
        let row = match was {
            Some(was) if was > 0.0 => {
                let ratio = median / was;
                let mark = if ratio >= MARK { "  <-- slower" } else { "" };
                format!("{was:>10.3} -> {median:>10.3} {unit:<2}  x{ratio:.2}{mark}")
            }
            _ => format!("{:>10} -> {median:>10.3} {unit:<2}  (new)", "-"),
        };
        out.push_str(&format!("  {bench:<9} {name:<48} {row}\n"));
    }
    out
}

fn git(args: &[&str]) -> String {
    std::process::Command::new("git")
        .args(args)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

/// Cores and CPU model, for the reader of a baseline.
fn machine() -> String {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("model name")?.split_once(':'))
                .map(|(_, m)| m.trim().to_string())
        })
        .unwrap_or_default();
    format!("{cores} cores, {model}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_comparison_marks_a_doubled_figure_and_names_new_ones() {
        let base = json!({"date": "2026-12-03", "commit": "abc", "machine": "2 cores",
            "figures": [{"bench": "plugin", "name": "a", "unit": "ms", "median": 1.0},
                        {"bench": "plugin", "name": "b", "unit": "ms", "median": 2.0}]});
        let now = [
            json!({"bench": "plugin", "name": "a", "unit": "ms", "median": 2.0}),
            json!({"bench": "plugin", "name": "b", "unit": "ms", "median": 2.2}),
            json!({"bench": "plan", "name": "c", "unit": "ms", "median": 5.0}),
        ];
        let table = compare(&base, &now);
        let line = |n: &str| {
            table
                .lines()
                .find(|l| l.contains(&format!(" {n} ")))
                .unwrap()
                .to_string()
        };
        assert!(line("a").contains("x2.00  <-- slower"), "{table}");
        assert!(
            line("b").contains("x1.10") && !line("b").contains("slower"),
            "{table}"
        );
        assert!(line("c").contains("(new)"), "{table}");
    }
}
