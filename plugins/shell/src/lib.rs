//! `shell`: run granted host commands — the escape hatch.
//!
//! Use it only when no typed plugin fits: a granted command can do anything its binary can,
//! and nodewright cannot tell what it changed. The grant is still exact: each command's
//! absolute path (and, optionally, argument patterns) must be listed in
//! `capabilities.commands`. Nothing runs through a shell: `sh -c` only works if `/bin/sh`
//! with those arguments is granted, which admins should treat as granting root.
//!
//! Config (each value is `<absolute path> [args...]`, split on whitespace):
//! - `apply` (required), `config`, `uninstall`, `post-interrupt`: run in that stage;
//!   a non-zero exit fails the stage;
//! - `plan`: exit 0 means converged, exit 1 means changes are needed, anything else fails;
//!   its command must be granted with `readOnly: true`, like `check`'s.
//!   Without it, `plan` reports one change ("apply will run") so the node is never wrongly
//!   skipped;
//! - `check`: verifies apply/config; exit 0 passes;
//! - `interrupt`: what the changes need — `none` (default), `reboot`,
//!   `restart-all-services`, or `services:<unit>,<unit>`.

use nodewright_sdk::{
    Change, Context, Interrupt, Outcome, Package, Stage, StepError, export_package, log,
};

/// Splits a command line into (path, args).
pub fn parse_command(key: &str, line: &str) -> Result<(String, Vec<String>), StepError> {
    let mut parts = line.split_whitespace().map(str::to_string);
    let path = parts
        .next()
        .ok_or_else(|| StepError::invalid_config(format!("{key:?} is empty")))?;
    if !path.starts_with('/') {
        return Err(StepError::invalid_config(format!(
            "{key:?}: {path:?} must be an absolute path"
        )));
    }
    Ok((path, parts.collect()))
}

/// Parses the `interrupt` key.
pub fn parse_interrupt(value: Option<&str>) -> Result<Interrupt, StepError> {
    match value.unwrap_or("none") {
        "none" => Ok(Interrupt::None),
        "reboot" => Ok(Interrupt::Reboot),
        "restart-all-services" => Ok(Interrupt::RestartAllServices),
        other => match other.strip_prefix("services:") {
            Some(list) => Ok(Interrupt::Services(
                list.split(',')
                    .map(|s| s.trim().to_string())
                    .filter(|s| !s.is_empty())
                    .collect(),
            )),
            None => Err(StepError::invalid_config(format!(
                "interrupt {other:?}: expected none, reboot, restart-all-services or services:<units>"
            ))),
        },
    }
}

/// A command's exit code and the last line it wrote to stderr (what a failure quotes).
struct Ran {
    code: i32,
    last_error: Option<String>,
}

impl Ran {
    /// The failure of `key`'s command: its exit code, and its last stderr line if any.
    fn failure(&self, key: &str) -> StepError {
        let mut message = format!("{key} command exited with {}", self.code);
        if let Some(line) = &self.last_error {
            message.push_str(": ");
            message.push_str(line);
        }
        StepError::failed(message)
    }
}

/// How much of a stderr line a failure quotes (the whole output is in the stage's log).
const QUOTED: usize = 240;

/// Runs the command under `key`, if configured.
fn run(ctx: &Context, key: &str) -> Result<Option<Ran>, StepError> {
    let Some(line) = ctx.config(key) else {
        return Ok(None);
    };
    let (path, args) = parse_command(key, line)?;
    let out = ctx.exec().run(&path, &args)?;
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        log::info(line);
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    for line in stderr.lines() {
        log::warn(line);
    }
    let last_error = stderr
        .lines()
        .map(str::trim)
        .rfind(|l| !l.is_empty())
        .map(|l| l.chars().take(QUOTED).collect());
    Ok(Some(Ran {
        code: out.status.unwrap_or(-1),
        last_error,
    }))
}

fn run_required(ctx: &Context, key: &str) -> Result<Outcome, StepError> {
    match run(ctx, key)? {
        None => Ok(Outcome::converged()),
        Some(Ran { code: 0, .. }) => Ok(Outcome::changed(
            vec![Change::new("command", ctx.config(key).unwrap_or(""), "ran")],
            Interrupt::None,
        )),
        Some(failed) => Err(failed.failure(key)),
    }
}

struct Shell;

impl Package for Shell {
    fn plan(ctx: &Context) -> Result<Outcome, StepError> {
        let interrupt = parse_interrupt(ctx.config("interrupt"))?;
        ctx.require("apply")?;
        // The plan command must not change the host, but a granted command could; it is
        // the admin's promise, as with any check script.
        match run(ctx, "plan")? {
            Some(Ran { code: 0, .. }) => Ok(Outcome::converged()),
            Some(Ran { code: 1, .. }) | None => Ok(Outcome::changed(
                vec![Change::new(
                    "command",
                    ctx.config("apply").unwrap_or(""),
                    "apply will run",
                )],
                interrupt,
            )),
            Some(failed) => Err(failed.failure("plan")),
        }
    }

    fn apply(ctx: &Context) -> Result<Outcome, StepError> {
        ctx.require("apply")?;
        let mut outcome = run_required(ctx, "apply")?;
        outcome.interrupt = parse_interrupt(ctx.config("interrupt"))?;
        Ok(outcome)
    }

    fn config(ctx: &Context) -> Result<Outcome, StepError> {
        if ctx.config("config").is_some() {
            run_required(ctx, "config")
        } else {
            Ok(Outcome::converged())
        }
    }

    fn post_interrupt(ctx: &Context) -> Result<Outcome, StepError> {
        run_required(ctx, "post-interrupt")
    }

    fn uninstall(ctx: &Context) -> Result<Outcome, StepError> {
        run_required(ctx, "uninstall")
    }

    fn check(ctx: &Context) -> Result<Outcome, StepError> {
        match ctx.stage {
            Stage::Apply | Stage::Config | Stage::Upgrade => match run(ctx, "check")? {
                None | Some(Ran { code: 0, .. }) => Ok(Outcome::converged()),
                Some(failed) => Err(failed.failure("check")),
            },
            _ => Ok(Outcome::converged()),
        }
    }
}

export_package!(Shell);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_split_and_must_be_absolute() {
        assert_eq!(
            parse_command("apply", "/usr/bin/x -a b").unwrap(),
            (
                "/usr/bin/x".to_string(),
                vec!["-a".to_string(), "b".to_string()]
            )
        );
        assert!(parse_command("apply", "x -a").is_err());
        assert!(parse_command("apply", "  ").is_err());
    }

    #[test]
    fn interrupts_parse() {
        assert_eq!(parse_interrupt(None).unwrap(), Interrupt::None);
        assert_eq!(
            parse_interrupt(Some("services:a.service, b.service")).unwrap(),
            Interrupt::Services(vec!["a.service".into(), "b.service".into()])
        );
        assert!(parse_interrupt(Some("explode")).is_err());
    }
}
