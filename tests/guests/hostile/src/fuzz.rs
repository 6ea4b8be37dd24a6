//! The invariant fuzzer's guest half: from a seed, a random sequence of every host op with
//! adversarial arguments. It judges nothing itself; it reports what each call returned, so
//! the host side can check blame (a `failed` answer is the host's, and none of these
//! requests should be able to provoke one).

use nodewright_sdk::{CapError, Context, Outcome, ServiceVerb, StepError};

/// xorshift64*: small, seedable, the same sequence on every run of a seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.below(items.len())]
    }
}

/// Paths in and around the grants the host side lays out (`/srv/grant` read-write with a
/// directory another user owns, `/srv/file.conf` a single-file grant, `/etc` protected).
const PATHS: &[&str] = &[
    "/srv/grant",
    "/srv/grant/a",
    "/srv/grant/a/b/c",
    "/srv/grant/new/deep/x.conf",
    "/srv/grant/shared",
    "/srv/grant/shared/d",
    "/srv/grant/shared/d/f",
    "/srv/grant/shared/l",
    "/srv/grant/shared/l/f",
    "/srv/grant/out",
    "/srv/grant/out/x",
    "/srv/grant/hard",
    "/srv/grant/fifo",
    "/srv/grant/../../etc/shadow",
    "/srv/grant/./a",
    "/srv/grant//a",
    "/srv/grant/\u{202e}txt.exe",
    "/srv/grant/bell\u{7}",
    "/srv/grant/new\nline",
    "/srv/grant/nul\0x",
    "/srv/file.conf",
    "/srv/file.conf/below",
    "/srv/file.conf.d/x",
    "/etc/shadow",
    "/etc/cron.d/job",
    "/var/lib/svc/data/x",
    "",
    "relative/path",
];

const UNITS: &[&str] = &[
    "x.service",
    // Granted, but its unit file on the node pulls in reboot.target when it fails.
    "pulls-power.service",
    "poweroff.target",
    "reboot.target",
    "systemd-poweroff.service",
    "a\\x2fb.service",
    "..\\x2f..\\x2fetc.service",
    "-H.service",
    "x.service\n",
    "kubelet.service",
    "",
];

const KEYS: &[&str] = &[
    "net.core.x",
    "-x",
    "net..x",
    "net/core/x",
    "x",
    "kernel.panic",
];
const VALUES: &[&str] = &[
    "1",
    "1\nkernel.panic=1",
    "\u{1b}[2J",
    "",
    "4096 87380 6291456",
];
const MODULES: &[&str] = &["x", "-x", "nvidia/../../x", "x y", "nvidia"];
const PARAMS: &[&str] = &["a=1", "-C", "a=1\ninstall x /bin/sh", "a=\"b c\"", "=1"];
const RELEASES: &[&str] = &[
    "6.8.0-45-generic",
    "-a",
    "../../etc",
    "6..8",
    "",
    "6 8",
    "x/y",
];
/// Host commands, and files of the payload `fw` (an executable script, a planted link
/// out, a file without an exec bit, a directory, a payload the package lacks, other
/// spellings of a granted one).
const COMMANDS: &[&str] = &[
    "/x",
    "/bin/sh",
    "/x/../bin/sh",
    "x",
    "/usr/bin/./x",
    "payload:fw/bin/tool",
    "payload:fw/out",
    "payload:fw/lib/VERSION",
    "payload:fw/lib",
    "payload:none/x",
    "payload:fw/bin/../bin/tool",
    "payload:fw/./bin/tool",
    "payload:fw/fifo",
    "payload:/bin/sh",
    "payload:fw/missing",
];
/// Arguments for a command granted `payload:fw/**`.
const PAYLOAD_ARGS: &[&str] = &[
    "payload:fw/lib/VERSION",
    "payload:fw/bin/tool",
    "payload:fw/out",
    "payload:fw/lib",
    "payload:fw/fifo",
    "payload:fw/missing",
    "payload:fw/../../etc/shadow",
    "payload:fw/lib/../../out",
    "payload:none/x",
    "/etc/shadow",
];
/// Payload sources for `files.install`: the test's payload `fw` holds `lib/VERSION`,
/// `bin/tool` and (planted, as no unpacked tree would) a link out and a FIFO.
const SOURCES: &[&str] = &[
    "/payload/fw/lib/VERSION",
    "/payload/fw/bin/tool",
    "/payload/fw/lib",
    "/payload/fw/out",
    "/payload/fw/fifo",
    "/payload/fw/../../etc/shadow",
    "/payload/fw/lib/../../../etc/shadow",
    "/payload/fw/",
    "/payload/fw",
    "/payload/none/x",
    "/payload/../etc/shadow",
    "/etc/shadow",
    "/payload/fw/missing",
    "/payload/fw/nul\0x",
    "",
];

fn long_path(rng: &mut Rng) -> String {
    match rng.below(3) {
        0 => format!("/srv/grant/{}", "n".repeat(200 + rng.below(200))),
        1 => {
            let depth = 20 + rng.below(30);
            let deep: String = (0..depth).map(|i| format!("/d{i}")).collect();
            format!("/srv/grant{deep}")
        }
        _ => format!("/srv/grant/{}", "é".repeat(130)),
    }
}

fn path(rng: &mut Rng) -> String {
    if rng.below(8) == 0 {
        long_path(rng)
    } else {
        rng.pick(PATHS).to_string()
    }
}

/// Counts of what the calls returned.
#[derive(Default)]
struct Tally {
    ok: u32,
    denied: u32,
    not_found: u32,
    wrong_stage: u32,
    failed: Vec<String>,
}

impl Tally {
    fn record<T>(&mut self, op: &str, arg: &str, r: Result<T, CapError>) {
        match r {
            Ok(_) => self.ok += 1,
            Err(CapError::Denied(_)) => self.denied += 1,
            Err(CapError::NotFound(_)) => self.not_found += 1,
            Err(CapError::WrongStage(_)) => self.wrong_stage += 1,
            Err(CapError::Failed(m)) => {
                if self.failed.len() < 8 {
                    self.failed.push(format!("{op}({arg:?}): {m}"));
                } else {
                    self.failed.push(String::new());
                }
            }
        }
    }
}

/// Runs `ops` random calls from `seed`; the message reports the tally.
pub fn fuzz(ctx: &Context) -> Result<Outcome, StepError> {
    let seed: u64 = ctx
        .require("seed")?
        .parse()
        .map_err(|_| StepError::invalid_config("seed is a number"))?;
    let ops: u32 = ctx.config("ops").unwrap_or("200").parse().unwrap_or(200);
    let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let mut t = Tally::default();
    let files = ctx.files();
    for _ in 0..ops {
        let p = path(&mut rng);
        match rng.below(21) {
            0 => t.record("read", &p, files.read(&p)),
            1 => {
                let size = [0usize, 10, 4096, 1 << 20][rng.below(4)];
                t.record("write", &p, files.write(&p, &vec![b'x'; size], None));
            }
            2 => {
                let mode = [0o644u32, 0o4755, 0o777, 0o7777, 0o100644][rng.below(5)];
                t.record("write+mode", &p, files.write(&p, b"m", Some(mode)));
            }
            3 => t.record("stat", &p, files.stat(&p)),
            4 => t.record("list-dir", &p, files.list_dir(&p)),
            5 => t.record("create-dir", &p, files.create_dir(&p)),
            6 => t.record("remove", &p, files.remove(&p)),
            7 => t.record("set-owner", &p, files.set_owner(&p, 1000, 1000)),
            8 => {
                let mode = [0o600u32, 0o666, 0o4755, 0o7777][rng.below(4)];
                t.record("set-mode", &p, files.set_mode(&p, mode));
            }
            9 => {
                let m = rng.pick(MODULES);
                let params = vec![rng.pick(PARAMS).to_string()];
                t.record("kmod.load", m, ctx.kmod().load(m, &params));
            }
            10 if rng.below(2) == 0 => {
                let m = rng.pick(MODULES);
                t.record("kmod.is-loaded", m, ctx.kmod().is_loaded(m));
            }
            10 => {
                let m = rng.pick(MODULES);
                t.record("kmod.unload", m, ctx.kmod().unload(m));
            }
            11 => {
                let u = rng.pick(UNITS);
                let verb = [
                    ServiceVerb::Start,
                    ServiceVerb::Restart,
                    ServiceVerb::Enable,
                ][rng.below(3)];
                t.record("services.control", u, ctx.services().control(verb, u));
            }
            12 => {
                let u = rng.pick(UNITS);
                t.record("services.status", u, ctx.services().status(u));
            }
            13 => t.record("daemon-reload", "", ctx.services().daemon_reload()),
            14 => {
                let k = rng.pick(KEYS);
                t.record("sysctl.get", k, ctx.sysctl().get(k));
            }
            15 => {
                let (k, v) = (rng.pick(KEYS), rng.pick(VALUES));
                t.record("sysctl.set", k, ctx.sysctl().set(k, v));
            }
            16 => {
                let c = rng.pick(COMMANDS);
                let args = vec![p.clone()];
                t.record("exec.run", c, ctx.exec().run(c, &args));
            }
            // A command granted to take payload files, given one of every kind.
            19 => {
                let arg = rng.pick(PAYLOAD_ARGS);
                let args = vec![arg.to_string()];
                t.record("exec.run", arg, ctx.exec().run("/usr/bin/takes", &args));
            }
            17 => {
                let src = rng.pick(SOURCES);
                let mode = [None, Some(0o644u32), Some(0o4755)][rng.below(3)];
                t.record("install", src, files.install(src, &p, mode));
            }
            18 => {
                let r = rng.pick(RELEASES);
                t.record("kmod.depmod", r, ctx.kmod().depmod(r));
            }
            _ => t.record("request-reboot", "", ctx.power().request_reboot("fuzz")),
        }
    }
    let shown: Vec<&String> = t.failed.iter().filter(|f| !f.is_empty()).collect();
    Ok(Outcome::converged().with_message(format!(
        "fuzz ok={} denied={} not-found={} wrong-stage={} failed={} {shown:?}",
        t.ok,
        t.denied,
        t.not_found,
        t.wrong_stage,
        t.failed.len()
    )))
}
