//! The node's merged interrupt: the reboot protocol (see [`crate::markers`]) or service
//! restarts.

use nodewright_api::agent::{InterruptCall, RunStage};
use nodewright_api::hostargs;
use nodewright_api::result::{Blame, Needs, StageResult};
use nodewright_api::v1alpha1::{Interrupt, InterruptType};
use nodewright_hostops::{HostError, ServiceVerb};

use crate::host::host;
use crate::markers::{self, RebootPending};

/// Carries out `call` on the host.
// Long on purpose: one arm per interrupt type; the reboot arm writes its pending marker
// before it asks the host, so a reboot that comes sooner than the answer is still seen.
pub(crate) async fn interrupt(call: &InterruptCall) -> StageResult {
    let fail = |blame, msg: String| StageResult::failed(RunStage::Interrupt, "node", blame, msg);
    let host = match host(&call.common) {
        Ok(h) => h,
        Err(e) => return fail(Blame::Host, format!("host: {e:#}")),
    };
    let state = markers::state_dir(&call.common.host_root);
    let ok = |message: String| StageResult {
        interrupt: Some(Needs::Interrupt(Interrupt {
            kind: call.ask.kind,
            services: call.ask.services.clone(),
        })),
        ..StageResult::passed(RunStage::Interrupt, "node", message)
    };
    match call.ask.kind {
        InterruptType::Reboot => {
            let boot = host.node_info().boot_id;
            if let Some(pending) = markers::read_pending(&state) {
                let _ = std::fs::remove_file(markers::reboot_marker(&state));
                if pending.boot_id != boot {
                    return ok(format!("rebooted: boot ID {} -> {boot}", pending.boot_id));
                }
                eprintln!("stale reboot marker (boot ID unchanged): requesting the reboot again");
            }
            if let Err(e) = markers::write_pending(
                &state,
                &RebootPending {
                    boot_id: boot.clone(),
                    cr_uid: call.common.cr_uid.clone(),
                },
            ) {
                return fail(
                    Blame::Host,
                    format!("cannot record the pending reboot: {e}"),
                );
            }
            if let Err(e) =
                host.request_reboot(&format!("nodewright interrupt for {}", call.common.cr_uid))
            {
                return fail(Blame::Host, format!("reboot request failed: {e}"));
            }
            eprintln!(
                "reboot requested (boot ID {boot}); waiting up to {:?} for shutdown",
                call.reboot_wait
            );
            tokio::time::sleep(call.reboot_wait).await;
            fail(
                Blame::Host,
                format!(
                    "the node did not go down within {:?} of the reboot request",
                    call.reboot_wait
                ),
            )
        }
        InterruptType::Service | InterruptType::RestartAllServices => {
            // For restartAllServices the operator passes its configured list.
            let units = &call.ask.services;
            if units.is_empty() {
                return fail(
                    Blame::Config,
                    format!("{} interrupt without units", call.ask.kind),
                );
            }
            if let Some(reason) = units
                .iter()
                .find_map(|u| hostargs::ServiceUnit::parse(u).err())
            {
                return fail(Blame::Config, format!("--service: {reason}"));
            }
            for unit in units {
                // The host refuses a unit whose restart would reach the node's power state
                // (a `*Action=`, or a power unit it pulls in, as the node has the unit):
                // that is a refusal, not a host failure to retry.
                match host.service(ServiceVerb::Restart, unit) {
                    Ok(()) => {}
                    Err(e @ HostError::PowerUnit { .. }) => {
                        return fail(Blame::Denied, format!("restart {unit}: {e}"));
                    }
                    // systemctl ran and systemd refused the unit (not found, masked, its
                    // start failed): a verdict on the unit the package named, counted
                    // against the retries like a failed stage — not a host hiccup to
                    // retry for ever.
                    Err(e @ HostError::Command { .. }) => {
                        return fail(Blame::Package, format!("restart {unit}: {e}"));
                    }
                    Err(e) => return fail(Blame::Host, format!("restart {unit}: {e}")),
                }
            }
            ok(format!("restarted {}", units.join(", ")))
        }
        InterruptType::Noop => fail(
            Blame::Config,
            "a noop interrupt has nothing to carry out".into(),
        ),
    }
}
