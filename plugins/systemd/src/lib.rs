//! `systemd`: unit files and drop-ins, daemon-reload, enable and start.
//!
//! Config:
//! - `unit:<name>`: a unit file written to `/etc/systemd/system/<name>`;
//! - `dropin:<unit>/<file>.conf`: a drop-in written to `/etc/systemd/system/<unit>.d/<file>.conf`;
//! - `enable`: comma-separated units to enable;
//! - `start`: comma-separated units to start (when not active).
//!
//! After writing files it runs `daemon-reload`. It never restarts a running unit itself:
//! units that are active and whose file or drop-in changed are reported as a `services`
//! interrupt, which nodewright performs at the interrupt point (after cordon and drain when
//! the package is disruptive). `uninstall` stops and disables `enable`/`start` units and
//! removes the files it wrote.
//!
//! Grants: `files: [{path: /etc/systemd/system, access: readWrite}]`,
//! `services: [<each unit>]`.

use nodewright_sdk::{
    Change, Context, Interrupt, Outcome, Package, ServiceVerb, StepError, describe_file_change,
    export_package,
};

const UNIT_DIR: &str = "/etc/systemd/system";

/// A file this package manages: (unit it belongs to, host path, content).
#[derive(Debug, PartialEq, Eq)]
pub struct UnitFile {
    /// Unit affected.
    pub unit: String,
    /// Host path.
    pub path: String,
    /// Content.
    pub content: String,
}

fn valid_unit(name: &str) -> bool {
    !name.is_empty()
        && name.contains('.')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '@' | ':' | '\\'))
}

/// Parses `unit:` and `dropin:` keys.
pub fn unit_files(
    config: &std::collections::BTreeMap<String, String>,
) -> Result<Vec<UnitFile>, StepError> {
    let mut out = Vec::new();
    for (key, content) in config {
        if let Some(unit) = key.strip_prefix("unit:") {
            if !valid_unit(unit) {
                return Err(StepError::invalid_config(format!(
                    "{key:?}: {unit:?} is not a unit name"
                )));
            }
            out.push(UnitFile {
                unit: unit.into(),
                path: format!("{UNIT_DIR}/{unit}"),
                content: content.clone(),
            });
        } else if let Some(rest) = key.strip_prefix("dropin:") {
            let (unit, file) = rest
                .split_once('/')
                .filter(|(u, f)| {
                    valid_unit(u) && f.ends_with(".conf") && !f.contains('/') && !f.starts_with('.')
                })
                .ok_or_else(|| {
                    StepError::invalid_config(format!("{key:?} must be dropin:<unit>/<name>.conf"))
                })?;
            out.push(UnitFile {
                unit: unit.into(),
                path: format!("{UNIT_DIR}/{unit}.d/{file}"),
                content: content.clone(),
            });
        }
    }
    Ok(out)
}

fn list(ctx: &Context, key: &str) -> Result<Vec<String>, StepError> {
    let units: Vec<String> = ctx
        .config(key)
        .unwrap_or("")
        .split(',')
        .map(|u| u.trim().to_string())
        .filter(|u| !u.is_empty())
        .collect();
    match units.iter().find(|u| !valid_unit(u)) {
        Some(bad) => Err(StepError::invalid_config(format!(
            "{key}: {bad:?} is not a unit name"
        ))),
        None => Ok(units),
    }
}

struct Plan {
    changes: Vec<Change>,
    write: Vec<UnitFile>,
    enable: Vec<String>,
    start: Vec<String>,
    restart: Vec<String>,
}

fn plan(ctx: &Context) -> Result<Plan, StepError> {
    let files = unit_files(&ctx.config)?;
    let (enable, start) = (list(ctx, "enable")?, list(ctx, "start")?);
    if files.is_empty() && enable.is_empty() && start.is_empty() {
        return Err(StepError::invalid_config(
            "nothing configured: add unit:, dropin:, enable or start keys",
        ));
    }
    let mut p = Plan {
        changes: Vec::new(),
        write: Vec::new(),
        enable: Vec::new(),
        start: Vec::new(),
        restart: Vec::new(),
    };
    for f in files {
        if let Some(d) = describe_file_change(
            ctx.files().read_opt(&f.path)?.as_deref(),
            f.content.as_bytes(),
        ) {
            p.changes.push(Change::new("file", &f.path, d));
            let active = ctx.services().status(&f.unit)?.active_state == "active";
            if active && !p.restart.contains(&f.unit) {
                p.restart.push(f.unit.clone());
            }
            p.write.push(f);
        }
    }
    for unit in enable {
        if !ctx.services().status(&unit)?.enabled {
            p.changes.push(Change::new("service", &unit, "enable"));
            p.enable.push(unit);
        }
    }
    for unit in start {
        if ctx.services().status(&unit)?.active_state != "active" {
            p.changes.push(Change::new("service", &unit, "start"));
            p.start.push(unit);
        }
    }
    Ok(p)
}

fn interrupt(restart: &[String]) -> Interrupt {
    if restart.is_empty() {
        Interrupt::None
    } else {
        Interrupt::Services(restart.to_vec())
    }
}

struct Systemd;

impl Package for Systemd {
    fn plan(ctx: &Context) -> Result<Outcome, StepError> {
        let p = plan(ctx)?;
        Ok(Outcome::changed(p.changes, interrupt(&p.restart)))
    }

    fn apply(ctx: &Context) -> Result<Outcome, StepError> {
        let p = plan(ctx)?;
        for f in &p.write {
            ctx.files()
                .write(&f.path, f.content.as_bytes(), Some(0o644))?;
        }
        if !p.write.is_empty() {
            ctx.services().daemon_reload()?;
        }
        for unit in &p.enable {
            ctx.services().control(ServiceVerb::Enable, unit)?;
        }
        for unit in &p.start {
            ctx.services().control(ServiceVerb::Start, unit)?;
        }
        Ok(Outcome::changed(p.changes, interrupt(&p.restart)))
    }

    fn uninstall(ctx: &Context) -> Result<Outcome, StepError> {
        let mut changes = Vec::new();
        let mut units = list(ctx, "start")?;
        units.extend(list(ctx, "enable")?);
        units.dedup();
        for unit in &units {
            let status = ctx.services().status(unit)?;
            if status.active_state == "active" {
                ctx.services().control(ServiceVerb::Stop, unit)?;
                changes.push(Change::new("service", unit, "stop"));
            }
            if status.enabled {
                ctx.services().control(ServiceVerb::Disable, unit)?;
                changes.push(Change::new("service", unit, "disable"));
            }
        }
        for f in unit_files(&ctx.config)? {
            if ctx.files().stat(&f.path)?.is_some() {
                ctx.files().remove(&f.path)?;
                changes.push(Change::new("file", &f.path, "removed"));
            }
        }
        if changes.iter().any(|c| c.kind == "file") {
            ctx.services().daemon_reload()?;
        }
        Ok(Outcome::changed(changes, Interrupt::None))
    }
}

export_package!(Systemd);

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn maps_units_and_dropins_to_paths() {
        let cfg: BTreeMap<String, String> = [
            ("unit:tuned.service".to_string(), "[Unit]\n".to_string()),
            (
                "dropin:containerd.service/10-limits.conf".to_string(),
                "[Service]\nLimitNOFILE=1048576\n".to_string(),
            ),
        ]
        .into();
        let files = unit_files(&cfg).unwrap();
        assert_eq!(
            files[0].path,
            "/etc/systemd/system/containerd.service.d/10-limits.conf"
        );
        assert_eq!(files[0].unit, "containerd.service");
        assert_eq!(files[1].path, "/etc/systemd/system/tuned.service");
    }

    #[test]
    fn rejects_traversal_in_dropins() {
        let cfg: BTreeMap<String, String> =
            [("dropin:a.service/../../x.conf".to_string(), String::new())].into();
        assert!(unit_files(&cfg).is_err());
        let cfg: BTreeMap<String, String> = [("unit:../evil".to_string(), String::new())].into();
        assert!(unit_files(&cfg).is_err());
    }
}
