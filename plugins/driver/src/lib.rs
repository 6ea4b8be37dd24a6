//! `driver`: an out-of-tree kernel module shipped as a payload, put in place the way a
//! driver package does it — compared with the module the kernel has loaded, installed under
//! `/lib/modules/<kernel>/updates`, indexed with `depmod`, loaded, and verified; replaced at
//! a reboot when the loaded module is in use.
//!
//! Config:
//! - `module` (required): the module's name, e.g. `nvidia`;
//! - `payload`: the payload holding `<module>.ko` (default `driver`). The version is the
//!   module's own, its modinfo `version=` entry, read from the payload's file.
//!
//! `plan` reports the module file to install and the version change (`550.54.14 ->
//! 560.35.03`), or `load` when it is not loaded, and asks for a `reboot` when the loaded
//! module is in use (`/sys/module/<module>/refcnt` above 0); it touches nothing. `apply`
//! installs the file (from the payload, without it passing through the plugin), records the
//! version beside it, runs `depmod` for the running kernel, and loads the module — after
//! unloading the old one when it is not in use; when it is, the reboot takes it away and
//! `post-interrupt` loads the new one. The check passes once the loaded module has the
//! payload's version (or, before the interrupt, only the reboot is pending). `uninstall` removes
//! the file and its record, runs `depmod`, and unloads the module when it is not in use.
//!
//! Grants: `files: [{path: /lib/modules, access: readWrite}, {path: /sys/module, access:
//! read}]`, `kernelModules: [<module>]`, and `interrupt: {type: reboot}` on the package.

use nodewright_sdk::{
    Change, Context, Interrupt, Outcome, Package, Stage, StepError, export_package, log,
};

/// What the driver plugin is asked to put in place.
#[derive(Debug, PartialEq, Eq)]
pub struct Wanted {
    /// Module name.
    pub module: String,
    /// Payload name.
    pub payload: String,
}

/// Parses `module` and `payload`.
pub fn wanted(config: &std::collections::BTreeMap<String, String>) -> Result<Wanted, StepError> {
    let module = config
        .get("module")
        .ok_or_else(|| StepError::invalid_config("config key \"module\" is required"))?
        .trim()
        .to_string();
    if module.is_empty()
        || module.starts_with('-')
        || !module
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    {
        return Err(StepError::invalid_config(format!(
            "{module:?} is not a kernel module name"
        )));
    }
    let payload = config
        .get("payload")
        .map_or("driver", String::as_str)
        .to_string();
    Ok(Wanted { module, payload })
}

/// The `version=` entry of a module's modinfo, found while reading it in chunks (a driver's
/// module is tens of megabytes; the plugin never holds it whole).
pub fn modinfo_version(mut module: impl std::io::Read) -> std::io::Result<Option<String>> {
    const KEY: &[u8] = b"\0version=";
    const KEEP: usize = 512;
    let mut chunk = vec![0u8; 1 << 16];
    let mut window: Vec<u8> = Vec::new();
    loop {
        let n = module.read(&mut chunk)?;
        if n == 0 {
            return Ok(None);
        }
        window.extend_from_slice(&chunk[..n]);
        if let Some(at) = window.windows(KEY.len()).position(|w| w == KEY) {
            let start = at + KEY.len();
            if let Some(end) = window[start..].iter().position(|&b| b == 0) {
                return Ok(Some(
                    String::from_utf8_lossy(&window[start..start + end]).into_owned(),
                ));
            }
            // The entry runs on into the next chunk.
            window.drain(..at);
            if window.len() > KEEP * 8 {
                return Ok(None);
            }
            continue;
        }
        let cut = window.len().saturating_sub(KEEP);
        window.drain(..cut);
    }
}

/// Where things are on this node.
struct Places {
    release: String,
    source: String,
    dest: String,
    record: String,
    sys: String,
}

fn places(ctx: &Context, w: &Wanted) -> Result<Places, StepError> {
    let release = ctx.node_info().kernel_release.trim().to_string();
    if release.is_empty() {
        return Err(StepError::failed("the node reports no kernel release"));
    }
    let updates = format!("/lib/modules/{release}/updates");
    Ok(Places {
        source: format!("/payload/{}/{}.ko", w.payload, w.module),
        dest: format!("{updates}/{}.ko", w.module),
        record: format!("{updates}/.{}.nodewright-version", w.module),
        sys: format!("/sys/module/{}", w.module.replace('-', "_")),
        release,
    })
}

/// What `plan` found.
struct Plan {
    places: Places,
    new: String,
    install: bool,
    loaded: bool,
    swap: bool,
    busy: bool,
    changes: Vec<Change>,
}

impl Plan {
    fn interrupt(&self) -> Interrupt {
        if self.swap && self.busy {
            Interrupt::Reboot
        } else {
            Interrupt::None
        }
    }
}

fn text(ctx: &Context, path: &str) -> Result<Option<String>, StepError> {
    Ok(ctx
        .files()
        .read_opt(path)?
        .map(|b| String::from_utf8_lossy(&b).trim().to_string()))
}

fn plan(ctx: &Context) -> Result<Plan, StepError> {
    let w = wanted(&ctx.config)?;
    let places = places(ctx, &w)?;
    let file = std::fs::File::open(&places.source).map_err(|e| {
        StepError::invalid_config(format!(
            "the payload {:?} has no {}.ko ({}): push it with `plugin push --payload {}=DIR`",
            w.payload, w.module, e, w.payload
        ))
    })?;
    let new = modinfo_version(std::io::BufReader::new(file))
        .map_err(|e| StepError::failed(format!("reading {}: {e}", places.source)))?
        .ok_or_else(|| {
            StepError::invalid_config(format!(
                "{} declares no version (its modinfo has no version= entry)",
                places.source
            ))
        })?;
    let installed = text(ctx, &places.record)?;
    let loaded = ctx.kmod().is_loaded(&w.module)?;
    let running = if loaded {
        text(ctx, &format!("{}/version", places.sys))?
    } else {
        None
    };
    let busy = loaded
        && text(ctx, &format!("{}/refcnt", places.sys))?
            .and_then(|r| r.parse::<u64>().ok())
            .is_some_and(|r| r > 0);
    let mut changes = Vec::new();
    let install = installed.as_deref() != Some(new.as_str());
    if install {
        changes.push(Change::new(
            "file",
            &places.dest,
            format!("install {} {new}", w.module),
        ));
    }
    let swap = loaded && running.as_deref() != Some(new.as_str());
    if !loaded {
        changes.push(Change::new(
            "kernel-module",
            &w.module,
            format!("load {new}"),
        ));
    } else if swap {
        let old = running.as_deref().unwrap_or("unversioned");
        let how = if busy { " (in use: at the reboot)" } else { "" };
        changes.push(Change::new(
            "kernel-module",
            &w.module,
            format!("{old} -> {new}{how}"),
        ));
    }
    Ok(Plan {
        places,
        new,
        install,
        loaded,
        swap,
        busy,
        changes,
    })
}

fn load(ctx: &Context, module: &str, new: &str) -> Result<(), StepError> {
    ctx.kmod().load(module, &[])?;
    log::info(&format!("loaded {module} {new}"));
    Ok(())
}

struct Driver;

impl Package for Driver {
    fn plan(ctx: &Context) -> Result<Outcome, StepError> {
        let p = plan(ctx)?;
        let interrupt = p.interrupt();
        Ok(Outcome::changed(p.changes, interrupt))
    }

    fn apply(ctx: &Context) -> Result<Outcome, StepError> {
        let p = plan(ctx)?;
        let w = wanted(&ctx.config)?;
        let files = ctx.files();
        if p.install {
            files.install(&p.places.source, &p.places.dest, Some(0o644))?;
            files.write(
                &p.places.record,
                format!("{}\n", p.new).as_bytes(),
                Some(0o644),
            )?;
            ctx.kmod().depmod(&p.places.release)?;
            log::info(&format!("installed {} {}", p.places.dest, p.new));
        }
        if p.swap && !p.busy {
            ctx.kmod().unload(&w.module)?;
            load(ctx, &w.module, &p.new)?;
        } else if !p.loaded {
            load(ctx, &w.module, &p.new)?;
        }
        let interrupt = p.interrupt();
        Ok(Outcome::changed(p.changes, interrupt))
    }

    fn post_interrupt(ctx: &Context) -> Result<Outcome, StepError> {
        let p = plan(ctx)?;
        let w = wanted(&ctx.config)?;
        if !p.loaded {
            load(ctx, &w.module, &p.new)?;
            return Ok(Outcome::changed(p.changes, Interrupt::None));
        }
        Ok(Outcome::converged())
    }

    fn check(ctx: &Context) -> Result<Outcome, StepError> {
        let p = plan(ctx)?;
        // Before the interrupt (after apply or upgrade, and the config that follows), a
        // module in use waits for the reboot: installed, swap pending.
        let before_interrupt = matches!(ctx.stage, Stage::Apply | Stage::Upgrade | Stage::Config);
        if before_interrupt && !p.install && p.swap && p.busy {
            return Ok(Outcome::changed(Vec::new(), Interrupt::Reboot));
        }
        if p.changes.is_empty() {
            return Ok(Outcome::converged());
        }
        let pending: Vec<String> = p
            .changes
            .iter()
            .map(|c| format!("{} {}: {}", c.kind, c.target, c.detail))
            .collect();
        Err(StepError::failed(format!(
            "not converged: {}",
            pending.join("; ")
        )))
    }

    fn uninstall(ctx: &Context) -> Result<Outcome, StepError> {
        let w = wanted(&ctx.config)?;
        let places = places(ctx, &w)?;
        let mut changes = Vec::new();
        for path in [&places.dest, &places.record] {
            if ctx.files().stat(path)?.is_some() {
                ctx.files().remove(path)?;
                changes.push(Change::new("file", path, "removed"));
            }
        }
        if !changes.is_empty() {
            ctx.kmod().depmod(&places.release)?;
        }
        if ctx.kmod().is_loaded(&w.module)? {
            let busy = text(ctx, &format!("{}/refcnt", places.sys))?
                .and_then(|r| r.parse::<u64>().ok())
                .is_some_and(|r| r > 0);
            if busy {
                changes.push(Change::new(
                    "kernel-module",
                    &w.module,
                    "in use: stays loaded until the next reboot",
                ));
            } else {
                ctx.kmod().unload(&w.module)?;
                changes.push(Change::new("kernel-module", &w.module, "unloaded"));
            }
        }
        Ok(Outcome::changed(changes, Interrupt::None))
    }
}

export_package!(Driver);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_version_is_found_across_chunks() {
        let mut module = vec![0x7fu8; 200_000];
        let at = (1 << 16) - 5;
        let entry = b"\0version=560.35.03\0";
        module[at..at + entry.len()].copy_from_slice(entry);
        assert_eq!(
            modinfo_version(module.as_slice()).unwrap().as_deref(),
            Some("560.35.03")
        );
        assert_eq!(modinfo_version(&b"no modinfo here"[..]).unwrap(), None);
    }

    #[test]
    fn config() {
        let cfg = |pairs: &[(&str, &str)]| {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        assert_eq!(
            wanted(&cfg(&[("module", "nvidia")])).unwrap(),
            Wanted {
                module: "nvidia".into(),
                payload: "driver".into()
            }
        );
        assert!(wanted(&cfg(&[])).is_err());
        assert!(wanted(&cfg(&[("module", "-r")])).is_err());
        assert!(wanted(&cfg(&[("module", "a/b")])).is_err());
    }
}
