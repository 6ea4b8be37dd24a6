//! How long stages, interrupts and evictions take on this cluster, as the leader has seen
//! them: what a preview's time estimate is made of.
//!
//! Every pass the leader reads the Jobs that succeeded (start to completion, the API's whole
//! seconds) before it deletes them, once each, into a count, mean and maximum per package
//! stage (`driver:apply`) and per interrupt (`interrupt:reboot` — its Job spans the reboot).
//! Evictions are timed from the pass that sends one to the first pass that no longer sees
//! the pod (so to a pass's resolution); a pod whose eviction a budget refused is not timed
//! until it is evicted again. Bounded: at most [`KEYS`] keys, the one updated longest ago
//! forgotten first, and at most [`EVICTING`] evictions timed at once.
//!
//! The leader keeps the history in a ConfigMap beside its Lease ([`store`]), so a new leader
//! starts from what the last one saw.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Mutex;

use nodewright_planner::{Action, Snapshot, Work};
use serde::{Deserialize, Serialize};

pub mod store;

/// Most keys kept.
pub const KEYS: usize = 1024;

/// Most evictions timed at once (more are not timed).
pub const EVICTING: usize = 10_000;

/// One key's durations.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Seen {
    /// How many were seen.
    pub count: u64,
    /// Mean seconds.
    pub mean: f64,
    /// Longest, seconds.
    pub max: i64,
    /// When last updated (a counter, for forgetting the oldest key).
    #[serde(default)]
    touched: u64,
}

impl Seen {
    fn add(&mut self, seconds: i64) {
        self.count += 1;
        self.mean += (seconds as f64 - self.mean) / self.count as f64;
        self.max = self.max.max(seconds);
    }
}

/// The durations seen.
#[derive(Debug, Default)]
pub struct History {
    inner: Mutex<Inner>,
}

/// What is kept, and what a ConfigMap holds of it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Record {
    /// Jobs' durations by key.
    #[serde(default)]
    pub stages: BTreeMap<String, Seen>,
    /// Evictions' durations (eviction sent to the pod gone).
    #[serde(default)]
    pub evictions: Seen,
}

#[derive(Debug, Default)]
struct Inner {
    record: Record,
    /// Jobs already counted that the caches still show.
    counted: HashSet<String>,
    /// Pods evicted (namespace, name) and when, not gone yet.
    evicting: HashMap<(String, String), i64>,
    clock: u64,
    /// Bumped by every change: what the store compares to know it has something to write.
    changes: u64,
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
    /// A history that starts from `record` (what an earlier leader kept), bounded as any.
    pub fn from_record(mut record: Record) -> Self {
        let mut by_age: Vec<(u64, String)> = record
            .stages
            .iter()
            .map(|(k, s)| (s.touched, k.clone()))
            .collect();
        by_age.sort();
        for (_, k) in by_age.iter().take(by_age.len().saturating_sub(KEYS)) {
            record.stages.remove(k);
        }
        let clock = record.stages.values().map(|s| s.touched).max().unwrap_or(0);
        History {
            inner: Mutex::new(Inner {
                record,
                clock,
                ..Inner::default()
            }),
        }
    }

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
            inner.changes += 1;
            let clock = inner.clock;
            let seen = inner.record.stages.entry(key(work)).or_default();
            seen.add(*seconds);
            seen.touched = clock;
            if inner.record.stages.len() > KEYS
                && let Some(oldest) = inner
                    .record
                    .stages
                    .iter()
                    .min_by_key(|(_, s)| s.touched)
                    .map(|(k, _)| k.clone())
            {
                inner.record.stages.remove(&oldest);
            }
        }
    }

    /// Times evictions across passes: the pods `snapshot` no longer shows are counted from
    /// their eviction to `now`, the ones a budget refused are forgotten, and the pods
    /// `actions` evict or delete are noted at `now`.
    pub fn drains(&self, snapshot: &Snapshot, actions: &[Action], now: i64) {
        let mut inner = self.inner.lock().expect("history lock");
        if !inner.evicting.is_empty() {
            let present: HashSet<(&str, &str)> = snapshot
                .pods
                .iter()
                .map(|p| (p.namespace.as_str(), p.name.as_str()))
                .collect();
            let mut gone = Vec::new();
            inner.evicting.retain(|(namespace, pod), at| {
                if !present.contains(&(namespace.as_str(), pod.as_str())) {
                    gone.push(now - *at);
                    false
                } else {
                    !snapshot
                        .refusals
                        .contains_key(&format!("{namespace}/{pod}"))
                }
            });
            for seconds in gone {
                inner.record.evictions.add(seconds);
                inner.changes += 1;
            }
        }
        for a in actions {
            if let Action::Evict { namespace, pod, .. } = a
                && inner.evicting.len() < EVICTING
            {
                inner
                    .evicting
                    .entry((namespace.clone(), pod.clone()))
                    .or_insert(now);
            }
        }
    }

    /// What was seen for `work`'s key.
    pub fn get(&self, work: &Work) -> Option<Seen> {
        let inner = self.inner.lock().expect("history lock");
        inner.record.stages.get(&key(work)).copied()
    }

    /// Evictions timed, if any.
    pub fn evictions(&self) -> Option<Seen> {
        let inner = self.inner.lock().expect("history lock");
        Some(inner.record.evictions).filter(|s| s.count > 0)
    }

    /// Jobs counted over every key, and the mean of every Job counted (seconds).
    pub fn overall(&self) -> Option<(u64, i64)> {
        let inner = self.inner.lock().expect("history lock");
        let stages = &inner.record.stages;
        let count: u64 = stages.values().map(|s| s.count).sum();
        let total: f64 = stages.values().map(|s| s.mean * s.count as f64).sum();
        (count > 0).then(|| (count, (total / count as f64).round() as i64))
    }

    /// What is kept now, if it changed since `since` (the change count it returns).
    pub fn changed_since(&self, since: u64) -> Option<(Record, u64)> {
        let inner = self.inner.lock().expect("history lock");
        (inner.changes != since).then(|| (inner.record.clone(), inner.changes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nodewright_api::node_state::Stage;
    use nodewright_api::v1alpha1::InterruptType;
    use nodewright_planner::{ObservedPod, PodFacts, Refusal};

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
        assert_eq!(h.inner.lock().unwrap().record.stages.len(), KEYS);
        // A record kept with more keys than the bound (an older build's) is cut to it,
        // the oldest first, and goes on from its clock.
        let mut record = h.changed_since(0).unwrap().0;
        record.stages.insert(
            "old:apply".into(),
            Seen {
                count: 1,
                touched: 0,
                ..Seen::default()
            },
        );
        let again = History::from_record(record);
        assert_eq!(again.get(&apply("old")), None);
        assert_eq!(again.inner.lock().unwrap().record.stages.len(), KEYS);
        again.observe(&[("new".into(), apply("newest"), 1)]);
        assert!(again.get(&apply("newest")).is_some() && again.get(&apply("p1")).is_none());
    }

    fn pod(name: &str) -> ObservedPod {
        ObservedPod::new(PodFacts {
            namespace: "default".into(),
            name: name.into(),
            active: true,
            ..PodFacts::default()
        })
    }

    fn evict(name: &str) -> Action {
        Action::Evict {
            node: "n1".into(),
            namespace: "default".into(),
            pod: name.into(),
            delete: false,
            grace_seconds: None,
        }
    }

    #[test]
    fn an_eviction_is_timed_to_the_first_pass_without_its_pod_and_a_refused_one_not_at_all() {
        let h = History::default();
        let mut snap = Snapshot {
            pods: vec![pod("web"), pod("db")],
            ..Snapshot::default()
        };
        h.drains(&snap, &[evict("web"), evict("db")], 100);
        // The budget refuses db's eviction; web is still terminating.
        snap.refusals.insert(
            "default/db".into(),
            Refusal {
                at: 100,
                message: "budget".into(),
            },
        );
        h.drains(&snap, &[], 104);
        assert_eq!(h.evictions(), None, "nothing gone yet");
        snap.pods.retain(|p| p.name != "web");
        h.drains(&snap, &[], 112);
        let seen = h.evictions().unwrap();
        assert_eq!((seen.count, seen.mean, seen.max), (1, 12.0, 12));
        // db leaves long after its refusal (its budget lifted, evicted again at 300).
        snap.refusals.clear();
        h.drains(&snap, &[evict("db")], 300);
        snap.pods.clear();
        h.drains(&snap, &[], 306);
        let seen = h.evictions().unwrap();
        assert_eq!(
            (seen.count, seen.max),
            (2, 12),
            "timed from the eviction that took"
        );
        assert_eq!(seen.mean, 9.0);
    }

    #[test]
    fn what_is_kept_reads_back_as_it_was_and_only_changes_are_written() {
        let h = History::default();
        assert!(h.changed_since(0).is_none(), "nothing to write yet");
        h.observe(&[("a".into(), apply("driver"), 10)]);
        let snap = Snapshot {
            pods: vec![pod("web")],
            ..Snapshot::default()
        };
        h.drains(&snap, &[evict("web")], 0);
        h.drains(&Snapshot::default(), &[], 6);
        let (record, n) = h.changed_since(0).unwrap();
        assert!(h.changed_since(n).is_none(), "unchanged since it was taken");
        let text = serde_json::to_string(&record).unwrap();
        let back: Record = serde_json::from_str(&text).unwrap();
        assert_eq!(back, record);
        let again = History::from_record(back);
        assert_eq!(again.get(&apply("driver")).unwrap().mean, 10.0);
        assert_eq!(again.evictions().unwrap().max, 6);
        assert_eq!(again.overall(), Some((1, 10)));
        // A Job the new leader sees again (still in its caches) counts again: it cannot
        // know the old leader counted it — one duplicate per Job left at the hand-over.
        assert!(again.changed_since(0).is_none());
    }
}
