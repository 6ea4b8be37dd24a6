//! `nodewright plugin run --grant` values as capabilities.

use super::spec::{Capabilities, CommandGrant, FileAccess, FileGrant, GrantError};

impl Capabilities {
    /// Builds capabilities from `nodewright plugin run --grant` values. Returns the
    /// capabilities and whether `power` was granted.
    ///
    /// Syntax, one grant per flag:
    /// - `files=/etc/sysctl.d` (read) or `files=/etc/sysctl.d:rw` (`:rw+special` also
    ///   allows setuid/setgid/sticky modes)
    /// - `kmod=br_netfilter`, `service=containerd.service`, `sysctl=net.ipv4.*`
    /// - `command=/usr/bin/nvidia-smi` or `command=/usr/bin/nvidia-smi:-pm,1`; a file of a
    ///   payload: `command=payload:driver/install.run[:args]`
    /// - `probe=/usr/bin/nvidia-smi[:args]`: a command vouched read-only (`readOnly: true`)
    /// - `power`
    pub fn from_flags<S: AsRef<str>>(flags: &[S]) -> Result<(Capabilities, bool), GrantError> {
        let mut caps = Capabilities::default();
        let mut power = false;
        for (i, flag) in flags.iter().enumerate() {
            let flag = flag.as_ref();
            let field = format!("--grant[{i}]");
            if flag == "power" {
                power = true;
                continue;
            }
            let Some((key, value)) = flag.split_once('=') else {
                return Err(GrantError::new(
                    field,
                    format!("{flag:?} is not KEY=VALUE (or `power`)"),
                ));
            };
            if value.is_empty() {
                return Err(GrantError::new(
                    field,
                    format!("{flag:?} has an empty value"),
                ));
            }
            match key {
                "files" | "file" => {
                    let (path, access, special_modes) = match value.rsplit_once(':') {
                        Some((p, "rw")) => (p, FileAccess::ReadWrite, false),
                        Some((p, "rw+special")) => (p, FileAccess::ReadWrite, true),
                        Some((p, "ro")) => (p, FileAccess::Read, false),
                        Some((_, other)) => {
                            return Err(GrantError::new(
                                field,
                                format!("access {other:?} must be `ro`, `rw` or `rw+special`"),
                            ));
                        }
                        None => (value, FileAccess::Read, false),
                    };
                    caps.files.push(FileGrant {
                        path: path.to_string(),
                        access,
                        special_modes,
                    });
                }
                "kmod" | "kernelModule" => caps.kernel_modules.push(value.to_string()),
                "service" | "services" => caps.services.push(value.to_string()),
                "sysctl" => caps.sysctl.push(value.to_string()),
                "command" | "exec" | "probe" => {
                    // `payload:<name>/<path>` carries a colon of its own.
                    let (prefix, rest) = match value.strip_prefix(super::PAYLOAD_COMMAND) {
                        Some(rest) => (super::PAYLOAD_COMMAND, rest),
                        None => ("", value),
                    };
                    let (path, args) = match rest.split_once(':') {
                        Some((p, a)) => (p, Some(a.split(',').map(str::to_string).collect())),
                        None => (rest, None),
                    };
                    let path = format!("{prefix}{path}");
                    caps.commands.push(CommandGrant {
                        path,
                        args,
                        read_only: key == "probe",
                    });
                }
                other => {
                    return Err(GrantError::new(
                        field,
                        format!(
                            "unknown grant {other:?}; expected files, kmod, service, sysctl, command, probe or power"
                        ),
                    ));
                }
            }
        }
        Ok((caps, power))
    }
}
