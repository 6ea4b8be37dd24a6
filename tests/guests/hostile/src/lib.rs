//! A hostile plugin for the sandbox tests. Config key `attack` picks what it tries; every
//! attempt must be contained by the host with a specific, typed error.

use nodewright_sdk::{export_package, log, Context, Interrupt, Outcome, Package, StepError};

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
        "service" => ctx.services().control(nodewright_sdk::ServiceVerb::Stop, "kubelet.service")?,
        "sysctl" => ctx.sysctl().set("kernel.panic", "1")?,
        "exec" => ctx.exec().run("/bin/sh", &["-c".into(), "id".into()]).map(|_| ())?,
        "exec-args" => ctx.exec().run("/usr/bin/tool", &["--evil".into()]).map(|_| ())?,
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
        other => return Err(StepError::invalid_config(format!("unknown attack {other:?}"))),
    }
    Ok(Outcome::converged().with_message("attack was not contained"))
}

impl Package for Hostile {
    fn plan(ctx: &Context) -> Result<Outcome, StepError> {
        attack(ctx)
    }
    fn apply(ctx: &Context) -> Result<Outcome, StepError> {
        attack(ctx)
    }
    fn interrupt(ctx: &Context) -> Result<Outcome, StepError> {
        attack(ctx)?;
        Ok(Outcome::changed(vec![], Interrupt::Reboot))
    }
}

export_package!(Hostile);
