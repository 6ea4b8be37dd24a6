//! The grammar of what a plugin may name on the host.
//!
//! A name a plugin passes to a capability ends up on a command line run as root
//! (`modprobe`, `systemctl`) or in a path under `/proc/sys`. A grant glob such as `nvidia*`
//! says which *names* are allowed; it cannot say that `-C /tmp/evil.conf` is not a name.
//! So every name is checked against the grammar of its kind *before* it is matched
//! against a grant, and the host backends check it again before they build an argv.
//! Each check returns the reason in words, for a typed denial.

mod systemd;

pub use systemd::{MAX_UNIT_NAME, POWER_UNITS, ServiceUnit, UNIT_TYPES, UnitName, UnitPowerProps};

/// The longest kernel module name (`MODULE_NAME_LEN` is 64 − `sizeof(unsigned long)`,
/// including the terminating NUL).
pub const MAX_MODULE_NAME: usize = 55;

/// The longest sysctl key nodewright accepts.
pub const MAX_SYSCTL_KEY: usize = 255;

/// The longest module parameter (`key=value`) nodewright accepts.
pub const MAX_MODULE_PARAM: usize = 1024;

fn ident_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '-')
}

/// A kernel module name: `[A-Za-z0-9_-]`, not starting with `-`, at most
/// [`MAX_MODULE_NAME`] characters. No `/`, no `.`, so it can name neither a file nor an
/// option.
pub fn module_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("a kernel module name must not be empty".into());
    }
    if name.len() > MAX_MODULE_NAME {
        return Err(format!(
            "a kernel module name has at most {MAX_MODULE_NAME} characters"
        ));
    }
    if name.starts_with('-') {
        return Err(format!(
            "{name:?} starts with '-': module names are never options"
        ));
    }
    if let Some(bad) = name.chars().find(|&c| !ident_char(c)) {
        return Err(format!(
            "{name:?} contains {bad:?}; kernel module names use only A-Z, a-z, 0-9, '_' and '-'"
        ));
    }
    Ok(())
}

/// The longest kernel release nodewright accepts (`uname -r`; `__NEW_UTS_LEN` is 64).
pub const MAX_KERNEL_RELEASE: usize = 64;

/// A kernel release as `uname -r` prints it and `/lib/modules/<release>` names it:
/// `[A-Za-z0-9._+~-]`, starting with a letter or digit, no `..`, at most
/// [`MAX_KERNEL_RELEASE`] characters — neither an option nor a path.
pub fn kernel_release(release: &str) -> Result<(), String> {
    let Some(first) = release.chars().next() else {
        return Err("a kernel release must not be empty".into());
    };
    if release.len() > MAX_KERNEL_RELEASE {
        return Err(format!(
            "a kernel release has at most {MAX_KERNEL_RELEASE} characters"
        ));
    }
    if !first.is_ascii_alphanumeric() {
        return Err(format!(
            "{release:?} must start with a letter or a digit, as `uname -r` does"
        ));
    }
    if let Some(bad) = release
        .chars()
        .find(|&c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '+' | '~' | '-')))
    {
        return Err(format!(
            "{release:?} contains {bad:?}; kernel releases use only A-Z, a-z, 0-9, '.', '_', '+', '~' and '-'"
        ));
    }
    if release.contains("..") {
        return Err(format!("{release:?} contains '..'"));
    }
    Ok(())
}

/// A module parameter as `modprobe` takes it: `key=value`. The key is `[A-Za-z0-9_-]`
/// and does not start with `-`; the value has no control characters and no whitespace
/// unless the whole value is in double quotes (the kernel's own quoting), and no other
/// double quote.
pub fn module_param(param: &str) -> Result<(), String> {
    if param.len() > MAX_MODULE_PARAM {
        return Err(format!(
            "a module parameter has at most {MAX_MODULE_PARAM} characters"
        ));
    }
    if param.starts_with('-') {
        return Err(format!(
            "{param:?} starts with '-': parameters are key=value, never modprobe options"
        ));
    }
    let Some((key, value)) = param.split_once('=') else {
        return Err(format!("{param:?} is not key=value"));
    };
    if key.is_empty() || !key.chars().all(ident_char) {
        return Err(format!(
            "parameter name {key:?} must be non-empty and use only A-Z, a-z, 0-9, '_' and '-'"
        ));
    }
    if let Some(bad) = value.chars().find(|c| c.is_control()) {
        return Err(format!(
            "the value of {key} contains the control character {bad:?}"
        ));
    }
    let inner = match value.strip_prefix('"').and_then(|v| v.strip_suffix('"')) {
        Some(quoted) if value.len() >= 2 => quoted,
        _ => {
            if value.contains(char::is_whitespace) {
                return Err(format!(
                    "the value of {key} contains whitespace; quote the whole value: {key}=\"...\""
                ));
            }
            value
        }
    };
    if inner.contains('"') {
        return Err(format!(
            "the value of {key} contains a '\"' that is not the quoting of the whole value"
        ));
    }
    Ok(())
}

/// A systemd unit name; see [`UnitName`].
pub fn unit_name(unit: &str) -> Result<(), String> {
    UnitName::parse(unit).map(drop)
}

/// A sysctl key in dotted form: non-empty segments of `[A-Za-z0-9_-]` separated by single
/// dots, not starting with `-`, at most [`MAX_SYSCTL_KEY`] characters. No `/` and no `..`,
/// so it maps to exactly one file below `/proc/sys`.
pub fn sysctl_key(key: &str) -> Result<(), String> {
    if key.is_empty() {
        return Err("a sysctl key must not be empty".into());
    }
    if key.len() > MAX_SYSCTL_KEY {
        return Err(format!(
            "a sysctl key has at most {MAX_SYSCTL_KEY} characters"
        ));
    }
    if key.starts_with('-') {
        return Err(format!("{key:?} starts with '-'"));
    }
    if let Some(bad) = key.chars().find(|&c| !(ident_char(c) || c == '.')) {
        return Err(format!(
            "{key:?} contains {bad:?}; sysctl keys are dotted names of A-Z, a-z, 0-9, '_' and '-'"
        ));
    }
    if key.split('.').any(str::is_empty) {
        return Err(format!(
            "{key:?} has an empty segment (leading, trailing or doubled '.')"
        ));
    }
    if let Some(seg) = key.split('.').find(|s| s.starts_with('-')) {
        return Err(format!(
            "{key:?} has the segment {seg:?}, which starts with '-'"
        ));
    }
    Ok(())
}

/// The longest sysctl value nodewright writes (the kernel reads at most a page).
pub const MAX_SYSCTL_VALUE: usize = 4096;

/// A sysctl value: at most [`MAX_SYSCTL_VALUE`] bytes, printable, words separated by
/// spaces or tabs (`4096 87380 6291456`). No newline or other control character, so one
/// write sets one key and nothing a reader of `sysctl.d` or `/proc/sys` splits on.
pub fn sysctl_value(value: &str) -> Result<(), String> {
    if value.len() > MAX_SYSCTL_VALUE {
        return Err(format!(
            "a sysctl value has at most {MAX_SYSCTL_VALUE} bytes"
        ));
    }
    if let Some(bad) = value.chars().find(|&c| c.is_control() && c != '\t') {
        return Err(format!(
            "the value contains the control character {bad:?}; a sysctl value is one line"
        ));
    }
    Ok(())
}

/// A granted command's argument: anything a process can receive, so no NUL byte (which
/// `execve` cannot pass, and which would otherwise fail the spawn as if the host had).
pub fn command_arg(arg: &str) -> Result<(), String> {
    match arg.find('\0') {
        Some(at) => Err(format!(
            "contains a NUL byte at {at}, which no command can receive"
        )),
        None => Ok(()),
    }
}

/// A command argument that may be matched against a wildcard pattern: no control
/// characters, and no `..` path component (a pattern like `/var/lib/app/*` must not be
/// widened to `/var/lib/app/../../etc/shadow`).
pub fn wildcard_arg(arg: &str) -> Result<(), String> {
    if let Some(bad) = arg.chars().find(|c| c.is_control()) {
        return Err(format!(
            "argument {arg:?} contains the control character {bad:?}"
        ));
    }
    if arg.split(['/', '=']).any(|part| part == "..") {
        return Err(format!("argument {arg:?} contains a '..' path component"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_argument_holds_anything_but_nul() {
        assert!(command_arg("--flag=a b\n").is_ok());
        assert!(command_arg("a\0b").unwrap_err().contains("NUL byte at 1"));
    }

    #[test]
    fn kernel_releases() {
        for ok in [
            "6.8.0-45-generic",
            "5.14.0-427.13.1.el9_4.x86_64",
            "6.1.0+rpt-arm64",
            "6.6~rc1",
        ] {
            assert_eq!(kernel_release(ok), Ok(()), "{ok}");
        }
        for bad in [
            "",
            "-a",
            ".6",
            "6.8/../..",
            "6..8",
            "6 8",
            "6.8\n",
            "x/y",
            &"1".repeat(65),
        ] {
            assert!(kernel_release(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn module_names() {
        for ok in ["nvidia", "br_netfilter", "nvidia-uvm", "a1"] {
            assert_eq!(module_name(ok), Ok(()), "{ok}");
        }
        for bad in [
            "",
            "-C",
            "-a",
            "../evil",
            "x/y",
            "nv.ko",
            "a b",
            "nvidia\n",
            &"x".repeat(56),
        ] {
            assert!(module_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn module_params() {
        for ok in [
            "NVreg_EnableGpuFirmware=0",
            "modeset=1",
            "opt=",
            "name=\"a b\"",
            "list=1,2,3",
            "path=/lib/fw",
        ] {
            assert_eq!(module_param(ok), Ok(()), "{ok}");
        }
        for bad in [
            "-C",
            "--config=/tmp/x",
            "x",
            "=1",
            "a b=1",
            "k=a b",
            "k=\"a",
            "k=a\"b\"",
            "k=\"a\"b\"",
            "k=1\ninstall x /bin/sh",
        ] {
            assert!(module_param(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn unit_names() {
        for ok in [
            "containerd.service",
            "getty@tty1.service",
            "nvidia-persistenced.service",
            "foo@.service",
            "dev-sda1.device",
            "a:b\\x2d.mount",
        ] {
            assert_eq!(unit_name(ok), Ok(()), "{ok}");
        }
        for bad in [
            "",
            "/etc/evil.service",
            "--root=/x",
            "-H",
            "evil",
            "evil.exe",
            ".service",
            "@x.service",
            "a@b@c.service",
            "a b.service",
            "../x.service",
            "a\\x2fb.service",
            "a\\b.service",
            "a\\x0a.service",
            "a\\x5c.service",
            "a\\x2.service",
            "x\\x2e\\x2e.service",
            "x..y.service",
        ] {
            assert!(unit_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn sysctl_keys() {
        for ok in [
            "net.ipv4.ip_forward",
            "vm.swappiness",
            "net.ipv4.conf.eth-0.rp_filter",
        ] {
            assert_eq!(sysctl_key(ok), Ok(()), "{ok}");
        }
        for bad in [
            "",
            "net/ipv4/ip_forward",
            "net..x",
            ".net",
            "net.",
            "-w",
            "kernel.x y",
            "a.*",
            "net.-x",
            "kernel.-w.y",
        ] {
            assert!(sysctl_key(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn sysctl_values() {
        for ok in [
            "1",
            "4096 87380 6291456",
            "a\tb",
            "",
            "/usr/lib/systemd/systemd-coredump %P",
        ] {
            assert_eq!(sysctl_value(ok), Ok(()), "{ok:?}");
        }
        for bad in ["1\nkernel.x=2", "1\r", "\u{7f}", "x\0y", &"9".repeat(4097)] {
            assert!(sysctl_value(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn wildcard_args() {
        assert_eq!(wildcard_arg("/var/lib/app/x.conf"), Ok(()));
        assert_eq!(wildcard_arg("--level=3"), Ok(()));
        assert!(wildcard_arg("/var/lib/app/../../etc/shadow").is_err());
        assert!(wildcard_arg("--out=../x").is_err());
        assert!(wildcard_arg("a\nb").is_err());
    }
}
