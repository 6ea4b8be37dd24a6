//! `exec` (granted host commands) and `power` (reboot requests).

use std::path::PathBuf;

use nodewright_api::grants::{Capability, CommandRefusal, CommandTarget};
use nodewright_api::payload::PayloadName;
use nodewright_hostops::{PayloadArg, Runnable};

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
        let (read_only, normalized, payload_args) = match self.grants.check_command(&path, &args) {
            Ok(c) => (c.rule.read_only, c.target, c.payload_args),
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
        let mut files = Vec::with_capacity(payload_args.len());
        for (index, name, rel) in payload_args {
            let tree = self.payload_tree(&name, &target)?;
            files.push(PayloadArg { index, tree, rel });
        }
        // What runs, found on this node: a host path, or a file of a payload's tree.
        let (program, tree) = match normalized {
            CommandTarget::Host(program) => (program, None),
            CommandTarget::Payload { name, path: rel } => {
                (rel, Some(self.payload_tree(&name, &target)?))
            }
        };
        let limits = self.exec_limits.clone();
        let out = self
            .host(Capability::Exec, "run", &target, move |h| {
                let program = match &tree {
                    None => Runnable::Host(&program),
                    Some(tree) => Runnable::Payload {
                        tree,
                        rel: &program,
                        shown: &path,
                    },
                };
                h.exec(&program, &args, &files, &limits)
            })
            .await?;
        Ok(exec::Output {
            status: out.status,
            stdout: out.stdout,
            stderr: out.stderr,
        })
    }
}

impl CapState {
    /// The tree of the package's payload `name`, which a command or its argument names — or
    /// the denial saying the package carries no such payload on this node.
    fn payload_tree(&mut self, name: &PayloadName, target: &str) -> Result<PathBuf, CapError> {
        if let Some(tree) = self.payloads.get(name) {
            return Ok(tree.clone());
        }
        let has = self.payload_names();
        let reason = format!(
            "the package has no payload named {:?} (it has: {has}); a payload command runs, or takes, a file the package ships",
            name.as_str()
        );
        Err(self.deny_with(Capability::Exec, "run", target, reason))
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
