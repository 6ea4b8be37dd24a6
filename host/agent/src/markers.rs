//! State the agent keeps on the host, under `<host root>/var/lib/nodewright`.
//!
//! ## Idempotence markers
//!
//! `markers/<cr uid>/<generation>[.<run>]/<package>-<version>-<stage>.json` holds the
//! result of a stage that succeeded. A Job pod that runs again (a retried attempt, a pod
//! recreated after a node restart) finds it and reports the recorded result without running
//! the plugin again. `run` is the node state entry's epoch: when the entry is made again (a
//! node reset, a package rerun, a reapply after reboot) the key changes and the stages run.
//!
//! ## The reboot protocol
//!
//! Expected flow, for the node's merged reboot interrupt:
//! 1. First run: no pending marker. Write `reboot-pending.json` with the current boot ID,
//!    request the reboot through the host-ops seam, and wait for the node to go down. If it
//!    is still up after the wait (10 s by default), fail (blame: host) — the Job retries.
//! 2. Next run (the pod restarted after the reboot): the pending marker's boot ID differs
//!    from the current one, so the reboot happened: remove the marker, report complete.
//! 3. A next run that finds the *same* boot ID means the request did not take: remove the
//!    stale marker and start again at 1.
//!
//! Guarantees: a node reboots at most once per successful interrupt (a completed
//! interrupt leaves an idempotence marker); the stage completes only on a changed boot ID.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use nodewright_api::result::StageResult;

/// The agent's state directory under the host root.
pub fn state_dir(host_root: &Path) -> PathBuf {
    host_root.join("var/lib/nodewright")
}

/// Identifies one stage execution for idempotence.
#[derive(Clone, Debug)]
pub struct MarkerKey {
    /// CR uid.
    pub cr_uid: String,
    /// CR generation.
    pub generation: i64,
    /// The state entry's run epoch (0: none given).
    pub run: i64,
    /// Package (or `node` for the merged interrupt).
    pub package: String,
    /// Version.
    pub version: String,
    /// Stage.
    pub stage: String,
}

fn safe(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_') {
                c
            } else {
                '_'
            }
        })
        .collect()
}

impl MarkerKey {
    fn path(&self, state: &Path) -> PathBuf {
        state
            .join("markers")
            .join(safe(&self.cr_uid))
            .join(if self.run == 0 {
                self.generation.to_string()
            } else {
                format!("{}.{}", self.generation, self.run)
            })
            .join(format!(
                "{}-{}-{}.json",
                safe(&self.package),
                safe(&self.version),
                safe(&self.stage)
            ))
    }

    /// The recorded result of this stage, if it already succeeded.
    pub fn done(&self, state: &Path) -> Option<StageResult> {
        serde_json::from_str(&std::fs::read_to_string(self.path(state)).ok()?).ok()
    }

    /// Records success.
    pub fn record(&self, state: &Path, result: &StageResult) -> std::io::Result<()> {
        let path = self.path(state);
        std::fs::create_dir_all(path.parent().expect("marker has a parent"))?;
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, serde_json::to_vec(result).expect("results serialize"))?;
        std::fs::rename(tmp, path)
    }
}

/// A reboot requested but not yet observed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RebootPending {
    /// Boot ID when the reboot was requested.
    pub boot_id: String,
    /// CR uid that asked.
    pub cr_uid: String,
}

/// Where the pending-reboot marker lives.
pub fn reboot_marker(state: &Path) -> PathBuf {
    state.join("reboot-pending.json")
}

/// Reads the pending-reboot marker.
pub fn read_pending(state: &Path) -> Option<RebootPending> {
    serde_json::from_str(&std::fs::read_to_string(reboot_marker(state)).ok()?).ok()
}

/// Writes the pending-reboot marker (durably, before the reboot is requested).
pub fn write_pending(state: &Path, pending: &RebootPending) -> std::io::Result<()> {
    std::fs::create_dir_all(state)?;
    let tmp = reboot_marker(state).with_extension("tmp");
    let f = std::fs::File::create(&tmp)?;
    serde_json::to_writer(&f, pending).map_err(std::io::Error::other)?;
    f.sync_all()?;
    std::fs::rename(tmp, reboot_marker(state))
}
