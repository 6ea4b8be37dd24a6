//! The time budget a task prints at its end: each phase with its wall time, so a
//! regression shows in every CI log.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

/// One timed phase.
#[derive(Debug, Clone)]
pub struct Phase {
    pub name: String,
    pub wall: Duration,
    /// What happened in it: units compiled, tests run, "cached", a failure.
    pub note: String,
    /// Ran beside other phases rather than after them (not summed into the total).
    pub overlapped: bool,
}

/// The phases of one task, in the order they ended.
#[derive(Debug)]
pub struct Budget {
    started: Instant,
    phases: Vec<Phase>,
    /// Extra sections printed under the table (e.g. the slowest tests).
    sections: Vec<(String, Vec<String>)>,
}

impl Budget {
    pub fn new() -> Budget {
        Budget {
            started: Instant::now(),
            phases: Vec::new(),
            sections: Vec::new(),
        }
    }

    /// Runs `f` as the phase `name`; its note is what `f` returns (or its error).
    pub fn phase<T>(
        &mut self,
        name: &str,
        f: impl FnOnce() -> anyhow::Result<(T, String)>,
    ) -> anyhow::Result<T> {
        let start = Instant::now();
        let result = f();
        let wall = start.elapsed();
        match result {
            Ok((value, note)) => {
                self.record(name, wall, note, false);
                Ok(value)
            }
            Err(e) => {
                self.record(name, wall, format!("FAILED: {}", first_line(&e)), false);
                Err(e)
            }
        }
    }

    /// Adds a phase timed elsewhere.
    pub fn record(&mut self, name: &str, wall: Duration, note: String, overlapped: bool) {
        self.phases.push(Phase {
            name: name.into(),
            wall,
            note,
            overlapped,
        });
    }

    /// Adds a section printed after the table.
    pub fn section(&mut self, title: &str, lines: Vec<String>) {
        self.sections.push((title.into(), lines));
    }

    pub fn is_empty(&self) -> bool {
        self.phases.is_empty()
    }

    /// The table: phase, wall time, note; then the sections.
    pub fn render(&self, task: &str) -> String {
        let width = self
            .phases
            .iter()
            .map(|p| p.name.len() + if p.overlapped { 2 } else { 0 })
            .max()
            .unwrap_or(5)
            .max(5);
        let mut out = format!("\n== time budget: cargo xtask {task}\n");
        for p in &self.phases {
            let name = if p.overlapped {
                format!("  {}", p.name)
            } else {
                p.name.clone()
            };
            let _ = writeln!(out, "{name:<width$}  {:>9}  {}", clock(p.wall), p.note);
        }
        let _ = writeln!(
            out,
            "{:<width$}  {:>9}  (indented phases ran beside the others)",
            "total",
            clock(self.started.elapsed())
        );
        for (title, lines) in &self.sections {
            let _ = writeln!(out, "\n{title}");
            for l in lines {
                let _ = writeln!(out, "  {l}");
            }
        }
        out
    }
}

/// `12m05s`, `41.2s`.
pub fn clock(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s >= 60.0 {
        format!("{}m{:02}s", (s / 60.0) as u64, (s % 60.0) as u64)
    } else {
        format!("{s:.1}s")
    }
}

fn first_line(e: &anyhow::Error) -> String {
    format!("{e:#}")
        .lines()
        .next()
        .unwrap_or_default()
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clock_reads_as_minutes_past_a_minute() {
        assert_eq!(clock(Duration::from_millis(41_250)), "41.2s");
        assert_eq!(clock(Duration::from_secs(725)), "12m05s");
    }

    #[test]
    fn a_failed_phase_is_in_the_table_with_its_reason() {
        let mut b = Budget::new();
        b.phase("fmt", || Ok(((), "clean".into()))).unwrap();
        let err = b.phase::<()>("clippy", || anyhow::bail!("lint denied\nmore"));
        assert!(err.is_err());
        b.record("ktest", Duration::from_secs(90), "built".into(), true);
        b.section("slowest tests", vec!["a 10s".into()]);
        let table = b.render("test");
        assert!(table.contains("fmt "), "{table}");
        assert!(table.contains("FAILED: lint denied"), "{table}");
        assert!(!table.contains("more"), "{table}");
        assert!(table.contains("  ktest"), "{table}");
        assert!(table.contains("1m30s"), "{table}");
        assert!(table.contains("slowest tests\n  a 10s"), "{table}");
    }
}
