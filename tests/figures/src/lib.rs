//! Benchmark figures, printed for people and written for machines.
//!
//! Every benchmark reports what it measured through [`Figure::report`]: a line on stdout,
//! and — when `NODEWRIGHT_BENCH_OUT` names a file — one JSON object per line appended to it
//! (`{"bench", "name", "unit", "median", "p90", "n"}`). `cargo xtask bench` collects those
//! lines and compares them with a committed baseline (`--compare`), so a change that
//! doubles a path shows in its own review without any test timing anything.

use std::io::Write;
use std::time::Duration;

/// The environment variable naming the file figures are appended to.
pub const OUT_ENV: &str = "NODEWRIGHT_BENCH_OUT";

/// One measured figure: a median (and p90) over `n` samples, in `unit`.
#[derive(Clone, Debug)]
pub struct Figure {
    /// The benchmark (`plugin`, `languages`, `plan`).
    pub bench: &'static str,
    /// What was measured, stable across runs (the key a baseline is matched on).
    pub name: String,
    /// `ms`, `MB`, `x` (a ratio).
    pub unit: &'static str,
    /// The median.
    pub median: f64,
    /// The 90th percentile, when there were enough samples for one.
    pub p90: Option<f64>,
    /// Samples taken.
    pub n: usize,
}

impl Figure {
    /// The median and p90 of `samples`, in milliseconds.
    pub fn timed(bench: &'static str, name: impl Into<String>, mut samples: Vec<Duration>) -> Self {
        assert!(!samples.is_empty(), "a figure needs samples");
        samples.sort();
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        Figure {
            bench,
            name: name.into(),
            unit: "ms",
            median: ms(samples[samples.len() / 2]),
            p90: (samples.len() >= 10).then(|| ms(samples[samples.len() * 9 / 10])),
            n: samples.len(),
        }
    }

    /// A single value (a size, a ratio, a one-off time).
    pub fn value(bench: &'static str, name: impl Into<String>, unit: &'static str, v: f64) -> Self {
        Figure {
            bench,
            name: name.into(),
            unit,
            median: v,
            p90: None,
            n: 1,
        }
    }

    /// The figure as one line for people.
    pub fn line(&self) -> String {
        match self.p90 {
            Some(p90) => format!(
                "{:<40} median {:>9.3} {u}   p90 {:>9.3} {u}   n={}",
                self.name,
                self.median,
                p90,
                self.n,
                u = self.unit
            ),
            None => format!("{:<40} {:>9.3} {}", self.name, self.median, self.unit),
        }
    }

    /// The figure as one JSON object.
    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "bench": self.bench,
            "name": self.name,
            "unit": self.unit,
            "median": self.median,
            "p90": self.p90,
            "n": self.n,
        })
    }

    /// Prints the line, and appends the JSON to `$NODEWRIGHT_BENCH_OUT` when it is set.
    pub fn report(&self) {
        println!("{}", self.line());
        self.write();
    }

    /// Appends the JSON to `$NODEWRIGHT_BENCH_OUT` when it is set (for a bench that prints
    /// its own table).
    pub fn write(&self) {
        let Some(path) = std::env::var_os(OUT_ENV) else {
            return;
        };
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .unwrap_or_else(|e| panic!("{}: {e}", std::path::Path::new(&path).display()));
        writeln!(file, "{}", self.json()).expect("writing a figure");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_timed_figure_takes_the_median_and_p90() {
        let samples = (1..=20).map(Duration::from_millis).collect();
        let f = Figure::timed("b", "x", samples);
        assert_eq!((f.median, f.p90, f.n), (11.0, Some(19.0), 20));
        assert_eq!(f.json()["p90"], 19.0);
        let few = Figure::timed("b", "x", vec![Duration::from_millis(3)]);
        assert_eq!((few.median, few.p90), (3.0, None));
    }
}
