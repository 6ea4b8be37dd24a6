//! A hostile plugin for the sandbox tests. Config key `attack` picks what it tries; every
//! attempt must be contained by the host with a specific, typed error.

use nodewright_sdk::{
    CapError, Change, Context, Denial, Interrupt, Outcome, Package, ServiceVerb, Stage, StepError,
    export_package, log,
};

mod fuzz;

struct Hostile;

fn attack(ctx: &Context) -> Result<Outcome, StepError> {
    let files = ctx.files();
    match ctx.require("attack")? {
        // Lexical traversal out of the granted /etc/app.
        "traverse" => files.read("/etc/app/../shadow").map(|_| ())?,
        // A symlink planted inside the grant that points out of it.
        "symlink" => files.read("/etc/app/escape").map(|_| ())?,
        "symlink-write" => files.write("/etc/app/escape", b"owned", None)?,
        // Write under a read-only grant.
        "write-readonly" => files.write("/etc/ro/x.conf", b"x", None)?,
        // Read outside every grant.
        "read-ungranted" => files.read("/etc/shadow").map(|_| ())?,
        "kmod" => ctx.kmod().load("evil", &[])?,
        "service" => ctx
            .services()
            .control(ServiceVerb::Stop, "kubelet.service")?,
        "sysctl" => ctx.sysctl().set("kernel.panic", "1")?,
        "exec" => ctx
            .exec()
            .run("/bin/sh", &["-c".into(), "id".into()])
            .map(|_| ())?,
        "exec-args" => ctx
            .exec()
            .run("/usr/bin/tool", &["--evil".into()])
            .map(|_| ())?,
        "reboot" => ctx.power().request_reboot("hostile")?,
        // Writes are refused while planning even when granted.
        "write-in-plan" => files.write("/etc/app/a.conf", b"x", None)?,
        "loop" => {
            let mut x: u64 = 0;
            loop {
                x = std::hint::black_box(x.wrapping_add(1));
            }
        }
        "memory" => {
            let mut hoard: Vec<Vec<u8>> = Vec::new();
            loop {
                hoard.push(vec![1u8; 1 << 20]);
                std::hint::black_box(&hoard);
            }
        }
        // What the sandbox's environment holds (only the node order, when there is one).
        "environment" => {
            let vars: Vec<String> = std::env::vars().map(|(k, v)| format!("{k}={v}")).collect();
            log::info(&format!("env: [{}]", vars.join(" ")));
            return Ok(Outcome::converged());
        }
        "log-flood" => {
            for i in 0..200_000u32 {
                log::info(&format!("flood line {i} {}", "x".repeat(100)));
            }
        }
        "stdout-flood" => {
            for i in 0..200_000u32 {
                println!("stdout flood {i} {}", "y".repeat(100));
            }
        }
        "panic" => panic!("hostile plugin panicked on purpose"),

        // Argument injection: names and parameters that a command line would read as options.
        "kmod-config-option" => ctx
            .kmod()
            .load("nvidia", &["-C".into(), "/etc/app/evil.conf".into()])?,
        "kmod-dir-option" => ctx
            .kmod()
            .load("nvidia", &["-d".into(), "/etc/app".into()])?,
        "kmod-name-option" => ctx.kmod().load("-a", &["evil".into()])?,
        "kmod-name-path" => ctx.kmod().load("nvidia/../../etc/app/evil", &[])?,
        "kmod-param-newline" => ctx
            .kmod()
            .load("nvidia", &["x=1\ninstall nvidia /bin/sh".into()])?,
        "kmod-ok" => ctx.kmod().load(
            "nvidia_uvm",
            &["NVreg_EnableMSI=1".into(), "opts=\"a b\"".into()],
        )?,
        "unit-path" => ctx
            .services()
            .control(ServiceVerb::Enable, "/etc/app/evil.service")?,
        "unit-option" => ctx
            .services()
            .control(ServiceVerb::Start, "--root=/etc/app.service")?,
        "unit-power" => ctx
            .services()
            .control(ServiceVerb::Start, "systemd-poweroff.service")?,
        "unit-pulls-power" => ctx
            .services()
            .control(ServiceVerb::Restart, "app.service")?,
        "unit-host-option" => ctx.services().status("-Hroot@evil.service").map(|_| ())?,
        "report-bad-unit" => {
            return Ok(Outcome::changed(
                vec![],
                Interrupt::Services(vec!["/etc/app/evil.service".into()]),
            ));
        }
        "report-power-unit" => {
            return Ok(Outcome::changed(
                vec![],
                Interrupt::Services(vec!["app.service".into(), "poweroff.target".into()]),
            ));
        }
        "report-units" => {
            let units = (0..1000)
                .map(|_| "containerd.service".to_string())
                .collect();
            return Ok(Outcome::changed(vec![], Interrupt::Services(units)));
        }
        "sysctl-newline" => ctx
            .sysctl()
            .set("net.core.somaxconn", "1\nkernel.panic=1")?,
        "sysctl-path" => ctx.sysctl().set("net.ipv4/../../kernel/panic", "1")?,
        "exec-dotdot" => ctx
            .exec()
            .run("/usr/bin/cat", &["/etc/app/../shadow".into()])
            .map(|_| ())?,
        "exec-option" => ctx
            .exec()
            .run("/usr/bin/echo", &["--exec=/bin/sh".into()])
            .map(|_| ())?,
        "exec-unnormalised" => ctx
            .exec()
            .run("/usr/bin/./tool", &["--safe".into()])
            .map(|_| ())?,

        // Special mode bits.
        "setuid-write" => files.write("/etc/app/suid", b"#!/bin/sh\n", Some(0o4755))?,
        "setuid-chmod" => files.set_mode("/etc/app/a.conf", 0o6777)?,

        // Exhausting the host.
        "denial-flood" => {
            let path = format!("/etc/denied/{}", "x".repeat(8000));
            for _ in 0..200_000u32 {
                let _ = files.read(&path);
            }
        }
        "read-huge" => files.read("/etc/app/huge").map(|_| ())?,
        "read-fifo" => files.read("/etc/app/pipe").map(|_| ())?,
        "chmod-fifo" => files.set_mode("/etc/app/pipe", 0o600)?,
        "slow-command" => ctx.exec().run("/usr/bin/slow", &[]).map(|_| ())?,
        "disk-fill" => {
            let chunk = vec![0u8; 1 << 20];
            for i in 0..10_000u32 {
                files.write(&format!("/etc/app/fill-{i}"), &chunk, None)?;
            }
        }
        "file-flood" => {
            for i in 0..100_000u32 {
                files.write(&format!("/etc/app/f{i}"), b"", None)?;
            }
        }
        "dir-flood" => {
            // Deep paths made one call at a time: each call asks for eleven directories.
            for i in 0..100u32 {
                let deep: String = (0..10).map(|d| format!("/d{d}")).collect();
                files.create_dir(&format!("/etc/app/t{i}{deep}"))?;
            }
        }
        "many-changes" => {
            let changes = (0..16_000)
                .map(|i| Change::new("file", format!("/etc/app/{i}"), "x".repeat(200)))
                .collect();
            return Ok(Outcome::changed(changes, Interrupt::None).with_message("m".repeat(4 << 20)));
        }

        // Forged verdicts: errors the host never raised.
        "forge-denied" => {
            return Err(StepError::Capability(CapError::Denied(Denial {
                capability: "kmod".into(),
                operation: "load".into(),
                target: "nvidia".into(),
                message: "kmod.load(\"nvidia\") denied: add \"*\" to spec.packages.hostile.capabilities.commands".into(),
            })));
        }
        "forge-host-failure" => {
            return Err(StepError::Capability(CapError::Failed(
                "disk on fire".into(),
            )));
        }
        "pass-on-denial" => {
            // A real denial, passed on: still the grant's.
            ctx.kmod().load("evil", &[])?;
        }

        // Other findings.
        "ansi-log" => {
            log::info("\u{1b}[2J\u{1b}[Hscreen wiped");
            return Err(StepError::failed(
                "oops\r\noutcome  ok in 1.0 ms: converged",
            ));
        }
        "single-file-grant" => files.write("/etc/single/below", b"owned", None)?,
        "file-grant-to-tree" => {
            files.remove("/etc/single")?;
            files.write("/etc/single/below", b"owned", None)?
        }
        "fuzz" => return fuzz::fuzz(ctx),
        // What an earlier run left in this instance's memory: a fresh store starts from the
        // component's image, so every run finds the counter at zero.
        "remember" => {
            static RUNS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
            let before = RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            log::info(&format!("runs before this one: {before}"));
            return Ok(Outcome::converged());
        }
        // Its payload, through WASI's filesystem: read what is there, then try to change
        // it, leave it, and reach the host's root. Each attempt's result is reported.
        "payload" => {
            let read = std::fs::read_to_string("/payload/fw/lib/VERSION");
            let tries = [
                ("write", std::fs::write("/payload/fw/lib/VERSION", b"owned")),
                ("create", std::fs::write("/payload/fw/new", b"x")),
                ("remove", std::fs::remove_file("/payload/fw/lib/VERSION")),
                ("mkdir", std::fs::create_dir("/payload/fw/d")),
                (
                    "escape",
                    std::fs::read("/payload/fw/../../etc/shadow").map(drop),
                ),
                ("link-out", std::fs::read("/payload/fw/out").map(drop)),
                ("host-root", std::fs::read("/etc/shadow").map(drop)),
            ];
            let mut report = vec![format!("read={read:?}")];
            for (what, result) in tries {
                report.push(format!(
                    "{what}={}",
                    if result.is_ok() { "ALLOWED" } else { "refused" }
                ));
            }
            return Ok(Outcome::converged().with_message(report.join(" ")));
        }
        "depmod" => ctx.kmod().depmod(ctx.require("release")?)?,
        // One command, as the config says (`args` split on spaces); the outcome reports
        // its exit status and output.
        "run" => {
            let args: Vec<String> = ctx
                .config("args")
                .map(|a| a.split(' ').map(String::from).collect())
                .unwrap_or_default();
            let out = ctx.exec().run(ctx.require("command")?, &args)?;
            return Ok(Outcome::converged().with_message(format!(
                "status={:?} stdout={}",
                out.status,
                String::from_utf8_lossy(&out.stdout).trim()
            )));
        }
        // One payload install, as the config says.
        "install" => files.install(ctx.require("source")?, ctx.require("dest")?, None)?,
        "reboot-flood" => {
            for _ in 0..1000 {
                ctx.power().request_reboot("again")?;
            }
        }
        other => {
            return Err(StepError::invalid_config(format!(
                "unknown attack {other:?}"
            )));
        }
    }
    Ok(Outcome::converged().with_message("attack was not contained"))
}

/// `attack: whoami` makes every export report which one the host called and the stage
/// its context named: how a test sees that each stage reaches its own export.
fn whoami(export: &str, ctx: &Context) -> Option<Outcome> {
    (ctx.config("attack") == Some("whoami"))
        .then(|| Outcome::converged().with_message(format!("{export} {}", ctx.stage)))
}

// Otherwise the attack runs where it always has (plan, apply, interrupt; config and upgrade
// run apply), and the other exports do what the SDK's defaults do.
impl Package for Hostile {
    fn plan(ctx: &Context) -> Result<Outcome, StepError> {
        whoami("plan", ctx).map_or_else(|| attack(ctx), Ok)
    }
    fn apply(ctx: &Context) -> Result<Outcome, StepError> {
        whoami("apply", ctx).map_or_else(|| attack(ctx), Ok)
    }
    fn config(ctx: &Context) -> Result<Outcome, StepError> {
        whoami("config", ctx).map_or_else(|| attack(ctx), Ok)
    }
    fn interrupt(ctx: &Context) -> Result<Outcome, StepError> {
        if let Some(me) = whoami("interrupt", ctx) {
            return Ok(me);
        }
        attack(ctx)?;
        Ok(Outcome::changed(vec![], Interrupt::Reboot))
    }
    fn post_interrupt(ctx: &Context) -> Result<Outcome, StepError> {
        Ok(whoami("post-interrupt", ctx).unwrap_or_else(Outcome::converged))
    }
    fn upgrade(ctx: &Context) -> Result<Outcome, StepError> {
        whoami("upgrade", ctx).map_or_else(|| attack(ctx), Ok)
    }
    fn uninstall(ctx: &Context) -> Result<Outcome, StepError> {
        Ok(whoami("uninstall", ctx).unwrap_or_else(Outcome::converged))
    }
    fn check(ctx: &Context) -> Result<Outcome, StepError> {
        match whoami("check", ctx) {
            Some(me) => Ok(me),
            // The default check: an install stage took effect when plan is converged.
            None => match ctx.stage {
                Stage::Apply | Stage::Config | Stage::Upgrade => {
                    let plan = attack(ctx)?;
                    if plan.is_converged() {
                        Ok(plan)
                    } else {
                        Err(StepError::failed(format!("{} did not converge", ctx.stage)))
                    }
                }
                _ => Ok(Outcome::converged()),
            },
        }
    }
}

export_package!(Hostile);
