//! `exec` (granted host commands) and `power` (reboot requests).

use nodewright_api::grants::{Capability, CommandRefusal};

use crate::bindings::nodewright::plugin::{exec, power, types};
use crate::state::CapState;

use types::CapError;

use super::checks::clip;

impl exec::Host for CapState {
    async fn run(&mut self, path: String, args: Vec<String>) -> Result<exec::Output, CapError> {
        let target = std::iter::once(path.as_str())
            .chain(args.iter().map(String::as_str))
            .collect::<Vec<_>>()
            .join(" ");
        // Shape and grant: a different spelling of a granted path is refused for what it
        // is, not as a missing grant.
        let (read_only, normalized) = match self.grants.check_command(&path, &args) {
            Ok((rule, normalized)) => (rule.read_only, normalized),
            Err(refusal) => {
                let reason = match refusal {
                    CommandRefusal::Invalid(why) => why,
                    CommandRefusal::Arguments(why) => {
                        format!("arguments do not match the granted patterns for {path}: {why}")
                    }
                    CommandRefusal::NotGranted => {
                        self.grants.source.hint(Capability::Exec, &path, false)
                    }
                };
                return Err(self.deny_with(Capability::Exec, "run", &target, reason));
            }
        };
        // A granted command may do anything: in a read-only stage only commands the admin
        // vouched for (`readOnly: true`) run.
        if !read_only && self.stage.read_only() {
            let message = format!(
                "exec.run changes the host and is refused in the read-only {} stage; grant {path} with readOnly: true if it only inspects the host",
                self.stage
            );
            return Err(self.issue(CapError::WrongStage(message)));
        }
        let limits = self.exec_limits.clone();
        let out = self
            .host(Capability::Exec, "run", &target, move |h| {
                h.exec(&normalized, &args, &limits)
            })
            .await?;
        Ok(exec::Output {
            status: out.status,
            stdout: out.stdout,
            stderr: out.stderr,
        })
    }
}

impl power::Host for CapState {
    async fn request_reboot(&mut self, reason: String) -> Result<(), CapError> {
        if !self.grants.power {
            return Err(self.deny(Capability::Power, "request-reboot", &reason, false));
        }
        if !self.stage.allows_reboot() {
            let message = format!(
                "power.request-reboot is only honoured in the interrupt stage, not in {}",
                self.stage
            );
            return Err(self.issue(CapError::WrongStage(message)));
        }
        // One reboot per stage however often it is asked for.
        if self.reboot_requested {
            return Ok(());
        }
        let r = clip(&reason, 256);
        self.host(Capability::Power, "request-reboot", &reason, move |h| {
            h.request_reboot(&r)
        })
        .await?;
        self.reboot_requested = true;
        Ok(())
    }
}
