//! How long stages and interrupts take on this cluster, as the leader has seen them: what a
//! preview's time estimate is made of.
//!
//! Every pass the leader reads the Jobs that succeeded (start to completion, the API's whole
//! seconds) before it deletes them, once each, into a count, mean and maximum per package
//! stage (`driver:apply`) and per interrupt (`interrupt:reboot` — its Job spans the reboot).
//! Bounded: at most [`KEYS`] keys, the one updated longest ago forgotten first. Kept in
//! memory only: a new leader starts without history (a preview then says so).

use std::collections::{BTreeMap, HashSet};
use std::sync::Mutex;

use nodewright_planner::Work;

/// Most keys kept.
pub const KEYS: usize = 1024;

/// One key's durations.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Seen {
    /// Jobs seen.
    pub count: u64,
    /// Mean seconds.
    pub mean: f64,
    /// Longest, seconds.
    pub max: i64,
    /// When last updated (a counter, for forgetting the oldest key).
    touched: u64,
}

/// The durations seen, by key.
#[derive(Debug, Default)]
pub struct History {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    keys: BTreeMap<String, Seen>,
    /// Jobs already counted that the caches still show.
    counted: HashSet<String>,
    clock: u64,
}

/// What a Job's duration counts toward: `package:stage`, `interrupt:kind`, `prestage`.
pub fn key(work: &Work) -> String {
    match work {
        Work::Package { package, stage, .. } => format!("{package}:{}", stage.as_str()),
        Work::Interrupt { kind, .. } => format!("interrupt:{}", kind.as_str()),
        Work::Prestage { .. } => "prestage".into(),
    }
}

impl History {
    /// Counts each finished Job of `finished` (name, what it did, seconds) not counted yet;
    /// `finished` is every succeeded Job the caches show now.
    pub fn observe(&self, finished: &[(String, Work, i64)]) {
        let mut inner = self.inner.lock().expect("history lock");
        let present: HashSet<&str> = finished.iter().map(|(n, ..)| n.as_str()).collect();
        inner.counted.retain(|n| present.contains(n.as_str()));
        for (name, work, seconds) in finished {
            if !inner.counted.insert(name.clone()) {
                continue;
            }
            inner.clock += 1;
            let clock = inner.clock;
            let seen = inner.keys.entry(key(work)).or_default();
            seen.count += 1;
            seen.mean += (*seconds as f64 - seen.mean) / seen.count as f64;
            seen.max = seen.max.max(*seconds);
            seen.touched = clock;
            if inner.keys.len() > KEYS
                && let Some(oldest) = inner
                    .keys
                    .iter()
                    .min_by_key(|(_, s)| s.touched)
                    .map(|(k, _)| k.clone())
            {
                inner.keys.remove(&oldest);
            }
        }
    }

    /// What was seen for `work`'s key.
    pub fn get(&self, work: &Work) -> Option<Seen> {
        let inner = self.inner.lock().expect("history lock");
        inner.keys.get(&key(work)).copied()
    }

    /// Jobs counted over every key, and the mean of every Job counted (seconds).
    pub fn overall(&self) -> Option<(u64, i64)> {
        let inner = self.inner.lock().expect("history lock");
        let count: u64 = inner.keys.values().map(|s| s.count).sum();
        let total: f64 = inner.keys.values().map(|s| s.mean * s.count as f64).sum();
        (count > 0).then(|| (count, (total / count as f64).round() as i64))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nodewright_api::node_state::Stage;
    use nodewright_api::v1alpha1::InterruptType;

    fn apply(package: &str) -> Work {
        Work::Package {
            package: package.into(),
            version: "1.0.0".into(),
            stage: Stage::Apply,
        }
    }

    #[test]
    fn each_job_counts_once_toward_its_stage_mean_and_max() {
        let h = History::default();
        let reboot = Work::Interrupt {
            stage: Stage::Interrupt,
            kind: InterruptType::Reboot,
            owner: "driver".into(),
        };
        h.observe(&[
            ("a".into(), apply("driver"), 10),
            ("r".into(), reboot.clone(), 300),
        ]);
        // Seen again by the next pass, with a new one: the first ones are not counted twice.
        h.observe(&[
            ("a".into(), apply("driver"), 10),
            ("b".into(), apply("driver"), 30),
        ]);
        let seen = h.get(&apply("driver")).unwrap();
        assert_eq!((seen.count, seen.mean, seen.max), (2, 20.0, 30));
        assert_eq!(h.get(&reboot).unwrap().max, 300);
        assert_eq!(h.get(&apply("tools")), None);
        assert_eq!(h.overall(), Some((3, 113)));
        // A Job gone from the caches and a new one of the same name counts again.
        h.observe(&[]);
        h.observe(&[("a".into(), apply("driver"), 50)]);
        assert_eq!(h.get(&apply("driver")).unwrap().count, 3);
    }

    #[test]
    fn the_key_updated_longest_ago_is_forgotten_past_the_bound() {
        let h = History::default();
        for i in 0..=KEYS {
            h.observe(&[(format!("job-{i}"), apply(&format!("p{i}")), 1)]);
        }
        assert_eq!(h.get(&apply("p0")), None, "the oldest went");
        assert!(h.get(&apply("p1")).is_some() && h.get(&apply(&format!("p{KEYS}"))).is_some());
        assert_eq!(h.inner.lock().unwrap().keys.len(), KEYS);
    }
}
