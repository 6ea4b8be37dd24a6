//! `exec` (granted host commands) and `power` (reboot requests).

use nodewright_api::grants::{Capability, normalize_abs_path};
use nodewright_api::hostargs;

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
        // Commands are granted by exact path: a different spelling of a granted path is
        // refused for what it is, not as a missing grant.
        let normalized = match normalize_abs_path(&path) {
            Ok(p) if p.as_os_str() == path.as_str() => p,
            Ok(p) => {
                let reason = format!(
                    "command paths must be exact and normalised; call {} as granted",
                    p.display()
                );
                return Err(self.deny_with(Capability::Exec, "run", &target, reason));
            }
            Err(why) => {
                let reason = format!("command paths must be exact and normalised: {why}");
                return Err(self.deny_with(Capability::Exec, "run", &target, reason));
            }
        };
        if let Some(why) = args.iter().enumerate().find_map(|(i, a)| {
            hostargs::command_arg(a)
                .err()
                .map(|why| format!("argument {i} {why}"))
        }) {
            return Err(self.deny_with(Capability::Exec, "run", &target, why));
        }
        let Some(read_only) = self
            .grants
            .command_rule(&normalized, &args)
            .map(|r| r.read_only)
        else {
            let mismatch = self
                .grants
                .commands
                .iter()
                .filter(|c| c.path == normalized)
                .find_map(|c| c.check_args(&args).err());
            let reason = match mismatch {
                Some(why) => {
                    format!("arguments do not match the granted patterns for {path}: {why}")
                }
                None => self.grants.source.hint(Capability::Exec, &path, false),
            };
            return Err(self.deny_with(Capability::Exec, "run", &target, reason));
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
