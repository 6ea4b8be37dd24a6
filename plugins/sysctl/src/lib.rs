//! `sysctl`: kernel parameters, persisted and applied live.
//!
//! Every config key is a sysctl key in dotted form and its value the wanted value:
//! `net.ipv4.ip_forward: "1"`. `apply`/`config` write them all to
//! `/etc/sysctl.d/60-nodewright-<package>.conf` (so they survive a reboot) and set any live
//! value that differs. `plan` reports drift of the file and of each live value; no
//! interrupt is ever needed. `uninstall` removes the drop-in (live values stay until the
//! next boot).
//!
//! Grants: `files: [{path: /etc/sysctl.d, access: readWrite}]`, `sysctl: [<each key>]`.

use nodewright_sdk::{
    Change, Context, Interrupt, Outcome, Package, StepError, describe_file_change, export_package,
    log,
};

/// The drop-in path for a package.
pub fn dropin_path(package: &str) -> String {
    format!("/etc/sysctl.d/60-nodewright-{package}.conf")
}

/// The drop-in content for the settings (sorted by key).
pub fn render(settings: &[(&str, &str)]) -> String {
    let mut out = String::from("# Managed by nodewright. Local edits are overwritten.\n");
    for (k, v) in settings {
        out.push_str(&format!("{k} = {v}\n"));
    }
    out
}

fn settings(ctx: &Context) -> Result<Vec<(&str, &str)>, StepError> {
    if ctx.config.is_empty() {
        return Err(StepError::invalid_config(
            "no sysctl keys configured: add `<key>: <value>` entries to the package config",
        ));
    }
    for (k, v) in &ctx.config {
        if k.contains('/') || k.contains(' ') || k.starts_with('.') || k.ends_with('.') {
            return Err(StepError::invalid_config(format!(
                "config key {k:?} is not a dotted sysctl key"
            )));
        }
        if v.contains('\n') {
            return Err(StepError::invalid_config(format!(
                "value of {k:?} contains a newline"
            )));
        }
    }
    Ok(ctx
        .config
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect())
}

/// Live values compare after whitespace normalisation (`"4096 87380"` vs tabs in /proc).
fn same_value(live: &str, wanted: &str) -> bool {
    live.split_whitespace().eq(wanted.split_whitespace())
}

fn drift(ctx: &Context) -> Result<(Vec<Change>, String), StepError> {
    let settings = settings(ctx)?;
    let path = dropin_path(&ctx.package);
    let wanted = render(&settings);
    let mut changes = Vec::new();
    let current = ctx.files().read_opt(&path)?;
    if let Some(detail) = describe_file_change(current.as_deref(), wanted.as_bytes()) {
        changes.push(Change::new("file", &path, detail));
    }
    for (key, value) in &settings {
        let live = ctx.sysctl().get(key)?;
        if !same_value(&live, value) {
            changes.push(Change::new("sysctl", *key, format!("{live} -> {value}")));
        }
    }
    Ok((changes, wanted))
}

struct Sysctl;

impl Package for Sysctl {
    fn plan(ctx: &Context) -> Result<Outcome, StepError> {
        let (changes, _) = drift(ctx)?;
        Ok(Outcome::changed(changes, Interrupt::None))
    }

    fn apply(ctx: &Context) -> Result<Outcome, StepError> {
        let (changes, wanted) = drift(ctx)?;
        for change in &changes {
            match change.kind.as_str() {
                "file" => ctx
                    .files()
                    .write(&change.target, wanted.as_bytes(), Some(0o644))?,
                _ => {
                    let value = ctx.config(&change.target).unwrap_or_default();
                    ctx.sysctl().set(&change.target, value)?;
                    log::info(&format!("{} = {value}", change.target));
                }
            }
        }
        Ok(Outcome::changed(changes, Interrupt::None))
    }

    fn uninstall(ctx: &Context) -> Result<Outcome, StepError> {
        let path = dropin_path(&ctx.package);
        if ctx.files().stat(&path)?.is_none() {
            return Ok(Outcome::converged());
        }
        ctx.files().remove(&path)?;
        Ok(Outcome::changed(
            vec![Change::new("file", &path, "removed")],
            Interrupt::None,
        ))
    }
}

export_package!(Sysctl);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_sorted_settings() {
        let text = render(&[("net.ipv4.ip_forward", "1"), ("vm.swappiness", "10")]);
        assert!(
            text.ends_with("net.ipv4.ip_forward = 1\nvm.swappiness = 10\n"),
            "{text}"
        );
    }

    #[test]
    fn values_compare_by_fields() {
        assert!(same_value("4096\t87380\t6291456", "4096 87380 6291456"));
        assert!(!same_value("0", "1"));
    }
}
