//! Rollout batches: budget ceilings, strategy batch sizes and batch evaluation
//! (NodeWright's DeploymentPolicy arithmetic).

use nodewright_api::v1alpha1::{BatchParams, BatchState, Budget, Strategy};

/// Nodes a budget allows at once: `count`, or `max(1, floor(matched·percent/100))`
/// (0 when nothing matched). Also the batch size of a compartment without a strategy.
pub fn ceiling(matched: u32, budget: &Budget) -> u32 {
    match (budget.count, budget.percent) {
        (Some(c), _) => c.max(0) as u32,
        (None, Some(_)) if matched == 0 => 0,
        (None, Some(p)) => ((u64::from(matched) * p.max(0) as u64 / 100) as u32).max(1),
        (None, None) => matched,
    }
}

/// Which strategy is set, with its parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Growth<'a> {
    /// Constant batches.
    Fixed(&'a BatchParams),
    /// Grow (or shrink after a failure) by `delta`.
    Linear(&'a BatchParams),
    /// Multiply (or divide after a failure) by `growthFactor`.
    Exponential(&'a BatchParams),
}

impl<'a> Growth<'a> {
    /// The strategy set in `s` (fixed, then linear, then exponential; validation allows one).
    pub fn of(s: &'a Strategy) -> Option<Growth<'a>> {
        s.fixed
            .as_ref()
            .map(Growth::Fixed)
            .or(s.linear.as_ref().map(Growth::Linear))
            .or(s.exponential.as_ref().map(Growth::Exponential))
    }

    fn params(self) -> &'a BatchParams {
        match self {
            Growth::Fixed(p) | Growth::Linear(p) | Growth::Exponential(p) => p,
        }
    }
}

fn progress_percent(state: &BatchState, total: u32) -> u32 {
    (((state.completed_nodes + state.failed_nodes).max(0) as u32) * 100)
        .checked_div(total)
        .unwrap_or(100)
}

/// The size of the next batch: `initialBatch` first; then fixed stays, linear adds `delta`,
/// exponential multiplies by `growthFactor` — or, after a failed batch while progress is
/// below `safetyLimit`, shrinks (min 1). Clamped to `[1, remaining]` (0 when nothing
/// remains). A strategy's batch is not capped by the budget.
pub fn next_batch_size(kind: Growth<'_>, state: &BatchState, total: u32) -> u32 {
    let p = kind.params();
    let remaining =
        total.saturating_sub((state.completed_nodes + state.failed_nodes).max(0) as u32);
    if remaining == 0 {
        return 0;
    }
    let initial = p.initial_batch.unwrap_or(1).max(1) as u32;
    let last = state.last_batch_size.max(0) as u32;
    let shrink = state.last_batch_failed
        && progress_percent(state, total) < p.safety_limit.unwrap_or(50).max(0) as u32;
    let size = if state.current_batch <= 1 || last == 0 {
        initial
    } else {
        match kind {
            Growth::Fixed(_) => initial,
            Growth::Linear(_) => {
                let delta = p.delta.unwrap_or(1).max(1) as u32;
                if shrink {
                    last.saturating_sub(delta).max(1)
                } else {
                    last + delta
                }
            }
            Growth::Exponential(_) => {
                let g = p.growth_factor.unwrap_or(2).max(2) as u32;
                if shrink {
                    (last / g).max(1)
                } else {
                    last.saturating_mul(g).min(total)
                }
            }
        }
    };
    size.clamp(1, remaining)
}

/// Folds a finished batch into the state: `succeeded` and `failed` nodes of a batch of
/// `batch_size` (blocked nodes excluded). The batch failed when `succeeded·100/size` is
/// below `batchThreshold`; consecutive failures reaching `failureThreshold` stop the
/// compartment while progress is below `safetyLimit` (so the last batch never stops it).
pub fn evaluate(
    kind: Growth<'_>,
    state: &BatchState,
    succeeded: u32,
    failed: u32,
    batch_size: u32,
    total: u32,
) -> BatchState {
    let p = kind.params();
    let mut next = state.clone();
    next.completed_nodes += succeeded as i32;
    next.failed_nodes += failed as i32;
    let success_percent = (succeeded * 100).checked_div(batch_size).unwrap_or(100);
    let batch_failed = success_percent < p.batch_threshold.unwrap_or(100).max(0) as u32;
    if batch_failed {
        next.consecutive_failures += 1;
        if let Some(threshold) = p.failure_threshold
            && progress_percent(&next, total) < p.safety_limit.unwrap_or(50).max(0) as u32
            && next.consecutive_failures >= threshold
        {
            next.should_stop = true;
        }
    } else {
        next.consecutive_failures = 0;
    }
    next.current_batch = state.current_batch.max(1) + 1;
    next.last_batch_size = batch_size as i32;
    next.last_batch_failed = batch_failed;
    next
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(
        initial: i32,
        delta: Option<i32>,
        growth: Option<i32>,
        threshold: Option<i32>,
        safety: i32,
    ) -> BatchParams {
        BatchParams {
            initial_batch: Some(initial),
            delta,
            growth_factor: growth,
            batch_threshold: Some(100),
            failure_threshold: threshold,
            safety_limit: Some(safety),
        }
    }

    fn start() -> BatchState {
        BatchState {
            current_batch: 1,
            ..Default::default()
        }
    }

    #[test]
    fn ceilings() {
        assert_eq!(
            ceiling(
                10,
                &Budget {
                    percent: Some(25),
                    count: None
                }
            ),
            2
        );
        assert_eq!(
            ceiling(
                3,
                &Budget {
                    percent: Some(10),
                    count: None
                }
            ),
            1,
            "at least one"
        );
        assert_eq!(
            ceiling(
                0,
                &Budget {
                    percent: Some(50),
                    count: None
                }
            ),
            0
        );
        assert_eq!(
            ceiling(
                10,
                &Budget {
                    percent: None,
                    count: Some(3)
                }
            ),
            3
        );
    }

    #[test]
    fn growth_and_shrink() {
        let lin = params(1, Some(2), None, None, 50);
        let mut s = start();
        assert_eq!(next_batch_size(Growth::Linear(&lin), &s, 20), 1);
        s = evaluate(Growth::Linear(&lin), &s, 1, 0, 1, 20);
        assert_eq!(next_batch_size(Growth::Linear(&lin), &s, 20), 3);
        let exp = params(2, None, Some(3), None, 50);
        let mut s = start();
        assert_eq!(next_batch_size(Growth::Exponential(&exp), &s, 100), 2);
        s = evaluate(Growth::Exponential(&exp), &s, 2, 0, 2, 100);
        assert_eq!(next_batch_size(Growth::Exponential(&exp), &s, 100), 6);
        // A failed batch early on shrinks the next one.
        s = evaluate(Growth::Exponential(&exp), &s, 3, 3, 6, 100);
        assert!(s.last_batch_failed);
        assert_eq!(next_batch_size(Growth::Exponential(&exp), &s, 100), 2);
        // Never more than what remains.
        let fixed = params(5, None, None, None, 50);
        let s = BatchState {
            current_batch: 3,
            completed_nodes: 8,
            last_batch_size: 5,
            ..Default::default()
        };
        assert_eq!(next_batch_size(Growth::Fixed(&fixed), &s, 10), 2);
        assert_eq!(
            next_batch_size(
                Growth::Fixed(&fixed),
                &BatchState {
                    completed_nodes: 10,
                    ..s
                },
                10
            ),
            0
        );
    }

    /// Seed 002: the canary (2 nodes, one at a time, failureThreshold 1, safetyLimit 100)
    /// stops after its first node fails; the second never starts.
    #[test]
    fn canary_stops_on_its_first_failed_batch() {
        let canary = params(1, None, None, Some(1), 100);
        let s = evaluate(Growth::Fixed(&canary), &start(), 0, 1, 1, 2);
        assert!(s.should_stop, "1 of 2 processed = 50% < safetyLimit 100");
    }

    /// Seed 002: production (3 nodes, linear 1 then +1) stops after two failed batches in
    /// a row, with a node still waiting.
    #[test]
    fn production_stops_after_two_failed_batches_in_a_row() {
        let prod = params(1, Some(1), None, Some(2), 100);
        let s1 = evaluate(Growth::Linear(&prod), &start(), 0, 1, 1, 3);
        assert!(!s1.should_stop);
        assert_eq!(
            next_batch_size(Growth::Linear(&prod), &s1, 3),
            1,
            "shrinks after a failure"
        );
        let s2 = evaluate(Growth::Linear(&prod), &s1, 0, 1, 1, 3);
        assert!(s2.should_stop);
        assert_eq!(
            (s2.completed_nodes + s2.failed_nodes),
            2,
            "the third node never ran"
        );
    }

    #[test]
    fn the_last_batch_never_stops_a_compartment() {
        let one = params(1, None, None, Some(1), 100);
        let s = evaluate(Growth::Fixed(&one), &start(), 0, 1, 1, 1);
        assert!(!s.should_stop, "progress reached 100%");
        let ok = evaluate(
            Growth::Fixed(&one),
            &BatchState {
                consecutive_failures: 3,
                ..start()
            },
            1,
            0,
            1,
            5,
        );
        assert_eq!(ok.consecutive_failures, 0, "a good batch resets the count");
    }
}
