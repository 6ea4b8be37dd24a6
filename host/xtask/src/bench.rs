//! `cargo xtask bench [--compare FILE] [--save FILE]`: the engine, language, planner,
//! payload and operator-snapshot benchmarks, their figures collected as JSON lines
//! (`nodewright-figures`), compared with a committed baseline or saved as a new one.
//!
//! The comparison is a report, never a verdict: these are wall times on a shared machine,
//! so a ratio is marked when it passes [`MARK`] and nothing fails. The same commit reads up
//! to ×1.7 apart from one machine of the CI kind to the next, so the first bench times
//! three fixed workloads that run none of our code (`tests/figures/benches/machine.rs`);
//! when the baseline has them too, each time is also shown divided by how much faster or
//! slower the machine is today, and that is the ratio marked.

use std::path::Path;

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use crate::budget::Budget;
use crate::cargo::{cargo, musl_triple};
use crate::{polyglot, run, setup_all};

/// A figure this many times its baseline (or more) is marked in the comparison.
const MARK: f64 = 1.5;

/// The bench whose figures are the machine's own speed, not a path of ours.
const MACHINE: &str = "machine";
/// The one-core compute chain (a figure of [`MACHINE`]) and the same on every core at once
/// (the one figure of this bench): how much busier the other cores are than the baseline's.
/// Named as `tests/figures/benches/machine.rs` names them (the task runner stays off the
/// workspace's dependency graph).
const COMPUTE: (&str, &str) = (MACHINE, "compute, 2^25 mul-xorshift rounds");
const EVERY_CORE: (&str, &str) = ("machine-cores", "compute, the same on every core at once");
/// Every core at once this many times slower than one core predicts: someone else is busy.
const BUSY: f64 = 1.3;

/// (package, bench) in the order they run: the machine's first.
const BENCHES: [(&str, &str); 5] = [
    ("nodewright-figures", MACHINE),
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

/// How fast the machine is against the baseline's: the geometric mean of the ratios of
/// their `machine` figures (now / baseline; below 1, today's machine is faster). `None`
/// when either side lacks them.
fn machine_factor(old: &[&Value], now: &[Value]) -> Option<f64> {
    let ratios: Vec<f64> = now
        .iter()
        .filter(|f| f["bench"] == MACHINE)
        .filter_map(|f| ratio_of(old, now, (MACHINE, f["name"].as_str()?)))
        .collect();
    (!ratios.is_empty())
        .then(|| (ratios.iter().map(|r| r.ln()).sum::<f64>() / ratios.len() as f64).exp())
}

/// The median of figure `(bench, name)` among `figures`.
fn median_of<'v>(
    mut figures: impl Iterator<Item = &'v Value>,
    (bench, name): (&str, &str),
) -> Option<f64> {
    figures.find(|f| f["bench"] == bench && f["name"] == name)?["median"].as_f64()
}

/// The ratio of a figure's median now to the baseline's, when both have it.
fn ratio_of(old: &[&Value], now: &[Value], figure: (&str, &str)) -> Option<f64> {
    let was = median_of(old.iter().copied(), figure)?;
    let is = median_of(now.iter(), figure)?;
    (was > 0.0 && is > 0.0).then(|| is / was)
}

/// What a figure's unit says about it: a time (lower is better), a throughput (higher is
/// better) or anything else (sizes, ratios of ratios: not a speed of the machine).
#[derive(Clone, Copy, PartialEq, Debug)]
enum Kind {
    Time,
    Throughput,
    Other,
}

impl Kind {
    fn of(unit: &str) -> Self {
        match unit {
            "ms" => Kind::Time,
            "MiB/s" => Kind::Throughput,
            _ => Kind::Other,
        }
    }

    /// The ratio with the machine's part taken out (`factor`: the machine's time ratio).
    fn of_machine(self, ratio: f64, factor: f64) -> Option<f64> {
        match self {
            Kind::Time => Some(ratio / factor),
            Kind::Throughput => Some(ratio * factor),
            Kind::Other => None,
        }
    }

    /// The mark a ratio earns, if any: a time `MARK` times longer, a throughput `MARK`
    /// times lower, anything else `MARK` times larger.
    fn mark(self, ratio: f64) -> &'static str {
        match self {
            Kind::Time if ratio >= MARK => "  <-- slower",
            Kind::Throughput if ratio <= 1.0 / MARK => "  <-- slower",
            Kind::Other if ratio >= MARK => "  <-- larger",
            _ => "",
        }
    }
}

/// The comparison table: each figure of `now` beside its baseline, with the ratio.
fn compare(base: &Value, now: &[Value]) -> String {
    let old: Vec<&Value> = base["figures"]
        .as_array()
        .map(|a| a.iter().collect())
        .unwrap_or_default();
    let factor = machine_factor(&old, now);
    let mut out = format!(
        "\ncompared with the baseline of {} ({}, {}); ratio = now / baseline, marked from x{MARK}\n",
        base["date"].as_str().unwrap_or("?"),
        base["commit"]
            .as_str()
            .map_or("?", |c| &c[..c.len().min(12)]),
        base["machine"].as_str().unwrap_or("?"),
    );
    out.push_str(&match factor {
        Some(f) => format!(
            "the machine runs at x{f:.2} of the baseline's time (its `{MACHINE}` figures); \
             \"of machine\" is a speed's ratio with that taken out, and is the one marked\n"
        ),
        None => format!(
            "no `{MACHINE}` figures on both sides: the ratios include however much faster or \
             slower the machine is today\n"
        ),
    });
    let every_core = ratio_of(&old, now, EVERY_CORE).zip(ratio_of(&old, now, COMPUTE));
    if let Some((all, one)) = every_core {
        let busy = all / one;
        out.push_str(&format!(
            "every core at once ran x{busy:.2} of what one core's ratio predicts{}\n",
            if busy >= BUSY {
                ": something else is using the other cores, and a path on several of them \
                 (Cranelift's compile, the payload pull) slows with it; run again on a quiet \
                 machine before reading its mark"
            } else {
                ""
            }
        ));
    }
    for f in now {
        let (bench, name) = key(f);
        let unit = f["unit"].as_str().unwrap_or_default();
        let median = f["median"].as_f64().unwrap_or(f64::NAN);
        let was = median_of(old.iter().copied(), (&bench, &name));
        let row = match was {
            Some(was) if was > 0.0 => {
                let ratio = median / was;
                let kind = Kind::of(unit);
                let adjusted = factor
                    .filter(|_| bench != MACHINE && bench != EVERY_CORE.0)
                    .and_then(|m| kind.of_machine(ratio, m));
                format!(
                    "{was:>10.3} -> {median:>10.3} {unit:<5}  x{ratio:.2}{}{}",
                    adjusted.map_or(String::new(), |a| format!("  (x{a:.2} of machine)")),
                    kind.mark(adjusted.unwrap_or(ratio))
                )
            }
            _ => format!("{:>10} -> {median:>10.3} {unit:<5}  (new)", "-"),
        };
        out.push_str(&format!("  {bench:<13} {name:<48} {row}\n"));
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
        let line = |n: &str| row(&table, n);
        assert!(line("a").contains("x2.00  <-- slower"), "{table}");
        assert!(
            line("b").contains("x1.10") && !line("b").contains("slower"),
            "{table}"
        );
        assert!(line("c").contains("(new)"), "{table}");
    }

    /// One row of `table`: the one naming `name`.
    fn row<'t>(table: &'t str, name: &str) -> &'t str {
        table
            .lines()
            .find(|l| l.contains(&format!(" {name} ")))
            .unwrap_or_else(|| panic!("no row {name} in {table}"))
    }

    #[test]
    fn on_a_faster_machine_a_path_that_held_still_in_raw_time_is_marked() {
        let m = |name: &str, median: f64| json!({"bench": "machine", "name": name, "unit": "ms", "median": median});
        let base = json!({"date": "2026-12-07", "commit": "abc", "machine": "2 cores",
            "figures": [m("compute", 40.0), m("memory", 160.0), m("kernel", 20.0),
                {"bench": "plugin", "name": "run", "unit": "ms", "median": 1.0},
                {"bench": "plugin", "name": "steady", "unit": "ms", "median": 1.0},
                {"bench": "payload", "name": "pull", "unit": "MiB/s", "median": 600.0},
                {"bench": "plan", "name": "growth", "unit": "x", "median": 11.0}]});
        // Every machine figure at half its time: the machine runs twice as fast today.
        let now = [
            m("compute", 20.0),
            m("memory", 80.0),
            m("kernel", 10.0),
            // Raw x1.00 on a machine twice as fast: the path itself doubled.
            json!({"bench": "plugin", "name": "run", "unit": "ms", "median": 1.0}),
            // Raw x0.55: no more than the machine explains.
            json!({"bench": "plugin", "name": "steady", "unit": "ms", "median": 0.55}),
            // Raw x1.05 while the machine doubled: the pull lost half its speed.
            json!({"bench": "payload", "name": "pull", "unit": "MiB/s", "median": 630.0}),
            json!({"bench": "plan", "name": "growth", "unit": "x", "median": 11.5}),
        ];
        let table = compare(&base, &now);
        assert!(table.contains("the machine runs at x0.50"), "{table}");
        assert!(
            row(&table, "run").contains("x1.00  (x2.00 of machine)  <-- slower"),
            "{table}"
        );
        assert!(
            row(&table, "steady").contains("(x1.10 of machine)")
                && !row(&table, "steady").contains("<--"),
            "{table}"
        );
        assert!(
            row(&table, "pull").contains("(x0.53 of machine)  <-- slower"),
            "{table}"
        );
        // The machine's own rows and a ratio of ratios are shown raw.
        assert!(!row(&table, "compute").contains("of machine"), "{table}");
        let growth = row(&table, "growth");
        assert!(
            growth.contains("x1.05") && !growth.contains("of machine"),
            "{table}"
        );

        // Against a baseline without machine figures the raw ratio is the one marked.
        let mut old = base.clone();
        old["figures"]
            .as_array_mut()
            .unwrap()
            .retain(|f| f["bench"] != "machine");
        let table = compare(&old, &now);
        assert!(table.contains("no `machine` figures"), "{table}");
        assert!(!row(&table, "run").contains("<--"), "{table}");
    }

    #[test]
    fn every_core_slower_than_one_core_predicts_says_the_machine_is_busy() {
        let fig = |(bench, name): (&str, &str), median: f64| json!({"bench": bench, "name": name, "unit": "ms", "median": median});
        let base = json!({"date": "2026-12-07", "commit": "abc", "machine": "2 cores",
            "figures": [fig(COMPUTE, 40.0), fig(EVERY_CORE, 40.0)]});
        // One core as fast as then; every core at once twice as slow: a neighbour.
        let busy = compare(&base, &[fig(COMPUTE, 40.0), fig(EVERY_CORE, 80.0)]);
        assert!(
            busy.contains(
                "every core at once ran x2.00 of what one core's ratio predicts: \
                 something else is using the other cores"
            ),
            "{busy}"
        );
        // A machine half as fast on every core alike is slower, not busy.
        let slower = compare(&base, &[fig(COMPUTE, 80.0), fig(EVERY_CORE, 80.0)]);
        assert!(
            slower.contains("every core at once ran x1.00 of what one core's ratio predicts\n"),
            "{slower}"
        );
        // The every-core figure is shown raw, never adjusted by the machine's speed.
        assert!(!row(&busy, "every").contains("of machine"), "{busy}");
    }
}
