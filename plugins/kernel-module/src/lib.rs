//! `kernel-module`: load kernel modules now and at every boot.
//!
//! Config:
//! - `modules`: comma-separated module names (required), e.g. `br_netfilter,overlay`;
//! - `options.<module>`: parameters for a module, e.g. `options.nvidia: "NVreg_EnableMSI=1"`;
//! - `unload-on-uninstall`: `true` (default) or `false`.
//!
//! `apply`/`config` write `/etc/modules-load.d/nodewright-<package>.conf` (loaded at boot)
//! and, when options are set, `/etc/modprobe.d/nodewright-<package>.conf`, then load every
//! module that is not loaded. A module that is already loaded keeps its old parameters until
//! it is reloaded: when options change for a loaded module, the outcome asks for a `reboot`
//! interrupt. `uninstall` removes both files and unloads the modules.
//!
//! Grants: `files: [{path: /etc/modules-load.d, access: readWrite}, {path: /etc/modprobe.d,
//! access: readWrite}]`, `kernelModules: [<each module>]`.

use nodewright_sdk::{
    Change, Context, Interrupt, Outcome, Package, StepError, describe_file_change, export_package,
    log,
};

/// Parsed configuration.
#[derive(Debug, PartialEq, Eq)]
pub struct Wanted {
    /// Modules in order.
    pub modules: Vec<String>,
    /// (module, parameters).
    pub options: Vec<(String, String)>,
}

/// Parses `modules` and `options.*` keys.
pub fn wanted(config: &std::collections::BTreeMap<String, String>) -> Result<Wanted, StepError> {
    let raw = config
        .get("modules")
        .ok_or_else(|| StepError::invalid_config("config key \"modules\" is required"))?;
    let modules: Vec<String> = raw
        .split(',')
        .map(|m| m.trim().to_string())
        .filter(|m| !m.is_empty())
        .collect();
    if modules.is_empty() {
        return Err(StepError::invalid_config(
            "config key \"modules\" lists no module",
        ));
    }
    if let Some(bad) = modules.iter().find(|m| {
        !m.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    }) {
        return Err(StepError::invalid_config(format!(
            "{bad:?} is not a kernel module name"
        )));
    }
    let mut options = Vec::new();
    for (key, value) in config {
        if let Some(module) = key.strip_prefix("options.") {
            if !modules.iter().any(|m| m == module) {
                return Err(StepError::invalid_config(format!(
                    "{key:?} sets options for a module not in \"modules\""
                )));
            }
            if value.contains('\n') {
                return Err(StepError::invalid_config(format!(
                    "{key:?} contains a newline"
                )));
            }
            options.push((module.to_string(), value.clone()));
        }
    }
    Ok(Wanted { modules, options })
}

fn load_conf(w: &Wanted) -> String {
    let mut s = String::from("# Managed by nodewright.\n");
    for m in &w.modules {
        s.push_str(m);
        s.push('\n');
    }
    s
}

fn options_conf(w: &Wanted) -> String {
    let mut s = String::from("# Managed by nodewright.\n");
    for (m, o) in &w.options {
        s.push_str(&format!("options {m} {o}\n"));
    }
    s
}

fn paths(package: &str) -> (String, String) {
    (
        format!("/etc/modules-load.d/nodewright-{package}.conf"),
        format!("/etc/modprobe.d/nodewright-{package}.conf"),
    )
}

struct Plan {
    changes: Vec<Change>,
    interrupt: Interrupt,
    load_file: (String, String),
    options_file: Option<(String, String)>,
    to_load: Vec<String>,
}

fn plan(ctx: &Context) -> Result<Plan, StepError> {
    let w = wanted(&ctx.config)?;
    let (load_path, options_path) = paths(&ctx.package);
    let files = ctx.files();
    let mut changes = Vec::new();
    let load = load_conf(&w);
    if let Some(d) = describe_file_change(files.read_opt(&load_path)?.as_deref(), load.as_bytes()) {
        changes.push(Change::new("file", &load_path, d));
    }
    let mut options_changed = false;
    let options_file = if w.options.is_empty() {
        if files.stat(&options_path)?.is_some() {
            changes.push(Change::new("file", &options_path, "remove"));
            options_changed = true;
        }
        None
    } else {
        let text = options_conf(&w);
        if let Some(d) =
            describe_file_change(files.read_opt(&options_path)?.as_deref(), text.as_bytes())
        {
            changes.push(Change::new("file", &options_path, d));
            options_changed = true;
        }
        Some((options_path, text))
    };
    let mut to_load = Vec::new();
    let mut interrupt = Interrupt::None;
    for m in &w.modules {
        if ctx.kmod().is_loaded(m)? {
            let has_options = w.options.iter().any(|(om, _)| om == m);
            if options_changed && has_options {
                changes.push(Change::new(
                    "kernel-module",
                    m,
                    "loaded with old options: reboot to reload",
                ));
                interrupt = Interrupt::Reboot;
            }
        } else {
            changes.push(Change::new("kernel-module", m, "load"));
            to_load.push(m.clone());
        }
    }
    Ok(Plan {
        changes,
        interrupt,
        load_file: (load_path, load),
        options_file,
        to_load,
    })
}

struct KernelModule;

impl Package for KernelModule {
    fn plan(ctx: &Context) -> Result<Outcome, StepError> {
        let p = plan(ctx)?;
        Ok(Outcome::changed(p.changes, p.interrupt))
    }

    fn apply(ctx: &Context) -> Result<Outcome, StepError> {
        let p = plan(ctx)?;
        let files = ctx.files();
        files.write(&p.load_file.0, p.load_file.1.as_bytes(), Some(0o644))?;
        match &p.options_file {
            Some((path, text)) => files.write(path, text.as_bytes(), Some(0o644))?,
            None => files.remove(&paths(&ctx.package).1)?,
        }
        for m in &p.to_load {
            ctx.kmod().load(m, &[])?;
            log::info(&format!("loaded {m}"));
        }
        Ok(Outcome::changed(p.changes, p.interrupt))
    }

    fn check(ctx: &Context) -> Result<Outcome, StepError> {
        // A pending reboot for new options is not a failed apply.
        let p = plan(ctx)?;
        let pending: Vec<String> = p
            .changes
            .iter()
            .filter(|c| c.kind != "kernel-module" || c.detail == "load")
            .map(|c| c.target.clone())
            .collect();
        if pending.is_empty() {
            Ok(Outcome::changed(Vec::new(), p.interrupt))
        } else {
            Err(StepError::failed(format!(
                "not converged: {}",
                pending.join(", ")
            )))
        }
    }

    fn uninstall(ctx: &Context) -> Result<Outcome, StepError> {
        let w = wanted(&ctx.config)?;
        let (load_path, options_path) = paths(&ctx.package);
        let mut changes = Vec::new();
        for path in [&load_path, &options_path] {
            if ctx.files().stat(path)?.is_some() {
                ctx.files().remove(path)?;
                changes.push(Change::new("file", path, "removed"));
            }
        }
        if ctx.config("unload-on-uninstall") != Some("false") {
            for m in w.modules.iter().rev() {
                if ctx.kmod().is_loaded(m)? {
                    ctx.kmod().unload(m)?;
                    changes.push(Change::new("kernel-module", m, "unloaded"));
                }
            }
        }
        Ok(Outcome::changed(changes, Interrupt::None))
    }
}

export_package!(KernelModule);

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn cfg(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn parses_modules_and_options() {
        let w = wanted(&cfg(&[
            ("modules", "br_netfilter, nvidia"),
            ("options.nvidia", "NVreg_EnableMSI=1"),
        ]))
        .unwrap();
        assert_eq!(w.modules, ["br_netfilter", "nvidia"]);
        assert_eq!(
            options_conf(&w),
            "# Managed by nodewright.\noptions nvidia NVreg_EnableMSI=1\n"
        );
    }

    #[test]
    fn rejects_bad_config() {
        assert!(wanted(&cfg(&[])).is_err());
        assert!(wanted(&cfg(&[("modules", "a b")])).is_err());
        assert!(wanted(&cfg(&[("modules", "a"), ("options.b", "x=1")])).is_err());
    }
}
