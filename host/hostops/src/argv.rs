//! The command lines the Linux backend runs for host helpers, built in one place.
//!
//! Every name is checked against its grammar ([`nodewright_api::hostargs`]) again here,
//! whatever the caller checked, and every command ends its options with `--`, so nothing
//! a plugin passes can be read as an option of `modprobe` or `systemctl`. The simulated
//! node records exactly these argvs, so tests can assert on what a real node would run.

use nodewright_api::hostargs;

use crate::error::{HostError, Result};
use crate::ops::ServiceVerb;

/// `modprobe` on the host.
pub const MODPROBE: &str = "/sbin/modprobe";
/// `depmod` on the host.
pub const DEPMOD: &str = "/sbin/depmod";
/// `systemctl` on the host.
pub const SYSTEMCTL: &str = "/bin/systemctl";

fn invalid(what: &str, reason: String) -> HostError {
    HostError::InvalidName(format!("{what}: {reason}"))
}

fn owned(parts: &[&str]) -> Vec<String> {
    parts.iter().map(|s| s.to_string()).collect()
}

/// `modprobe -- NAME KEY=VALUE...`
pub fn modprobe_load(name: &str, params: &[String]) -> Result<Vec<String>> {
    hostargs::module_name(name).map_err(|r| invalid("kernel module", r))?;
    for p in params {
        hostargs::module_param(p).map_err(|r| invalid("module parameter", r))?;
    }
    let mut argv = owned(&[MODPROBE, "--", name]);
    argv.extend(params.iter().cloned());
    Ok(argv)
}

/// `modprobe -r -- NAME`
pub fn modprobe_unload(name: &str) -> Result<Vec<String>> {
    hostargs::module_name(name).map_err(|r| invalid("kernel module", r))?;
    Ok(owned(&[MODPROBE, "-r", "--", name]))
}

/// `depmod -a -- RELEASE`
pub fn depmod(release: &str) -> Result<Vec<String>> {
    hostargs::kernel_release(release).map_err(|r| invalid("kernel release", r))?;
    Ok(owned(&[DEPMOD, "-a", "--", release]))
}

/// `systemctl VERB -- UNIT`
pub fn systemctl(verb: ServiceVerb, unit: &str) -> Result<Vec<String>> {
    hostargs::unit_name(unit).map_err(|r| invalid("unit", r))?;
    Ok(owned(&[SYSTEMCTL, verb.as_str(), "--", unit]))
}

/// `systemctl show --property=ActiveState,UnitFileState,LoadState -- UNIT`
pub fn systemctl_show(unit: &str) -> Result<Vec<String>> {
    hostargs::unit_name(unit).map_err(|r| invalid("unit", r))?;
    Ok(owned(&[
        SYSTEMCTL,
        "show",
        "--property=ActiveState,UnitFileState,LoadState",
        "--",
        unit,
    ]))
}

/// `systemctl show` of the properties by which a unit could reach the node's power state.
pub fn systemctl_show_power(unit: &str) -> Result<Vec<String>> {
    hostargs::unit_name(unit).map_err(|r| invalid("unit", r))?;
    let properties = format!("--property={}", hostargs::UnitPowerProps::properties());
    Ok(owned(&[SYSTEMCTL, "show", &properties, "--", unit]))
}

/// `systemctl daemon-reload`
pub fn daemon_reload() -> Vec<String> {
    owned(&[SYSTEMCTL, "daemon-reload"])
}

/// `systemctl reboot --no-wall`
pub fn reboot() -> Vec<String> {
    owned(&[SYSTEMCTL, "reboot", "--no-wall"])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_end_before_anything_a_plugin_chose() {
        assert_eq!(
            modprobe_load("nvidia", &["NVreg_X=1".into()]).unwrap(),
            ["/sbin/modprobe", "--", "nvidia", "NVreg_X=1"]
        );
        assert_eq!(
            modprobe_unload("nvidia").unwrap(),
            ["/sbin/modprobe", "-r", "--", "nvidia"]
        );
        assert_eq!(
            systemctl(ServiceVerb::Restart, "a.service").unwrap(),
            ["/bin/systemctl", "restart", "--", "a.service"]
        );
        assert_eq!(
            systemctl_show("a.service").unwrap().last().unwrap(),
            "a.service"
        );
    }

    #[test]
    fn injected_names_never_reach_an_argv() {
        assert!(matches!(
            modprobe_load("-C", &[]),
            Err(HostError::InvalidName(_))
        ));
        assert!(matches!(
            modprobe_load("nvidia", &["-d".into(), "/tmp".into()]),
            Err(HostError::InvalidName(_))
        ));
        assert!(matches!(
            modprobe_unload("../x"),
            Err(HostError::InvalidName(_))
        ));
        assert!(matches!(
            systemctl(ServiceVerb::Enable, "/tmp/evil.service"),
            Err(HostError::InvalidName(_))
        ));
        assert!(matches!(
            systemctl_show("--root=/x"),
            Err(HostError::InvalidName(_))
        ));
    }
}
