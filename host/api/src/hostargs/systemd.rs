//! systemd unit names, and the one rule for which units may be started at all.
//!
//! A unit name reaches `systemctl` as root. The grammar ([`UnitName`]) keeps it a name: no
//! option, no path, no escape that decodes to `/`. The power rule keeps a `services` grant
//! from reaching what only `power` may do: a unit whose activation halts, reboots, powers
//! off or isolates the node is never started, restarted, reloaded or enabled for a plugin
//! or an interrupt, whatever the grant says. It is checked twice: by name wherever a unit
//! is named (admission, plan and apply outcomes, the agent), and on the node against
//! what systemd itself reports for the unit ([`UnitPowerProps`]), so a unit file that
//! reboots under an innocent name is refused too.
//!
//! Not finished (issue #35): the name rule is enforced everywhere a unit is named, but the
//! host backends do not yet ask systemd for [`UnitPowerProps`] before a `systemctl` verb,
//! so the second check is a tested rule that nothing on the node calls yet.

use std::fmt;
use std::str::FromStr;

/// The longest systemd unit name (`UNIT_NAME_MAX` is 256 including the NUL).
pub const MAX_UNIT_NAME: usize = 255;

/// The systemd unit types, by suffix.
pub const UNIT_TYPES: [&str; 11] = [
    "service",
    "socket",
    "device",
    "mount",
    "automount",
    "swap",
    "target",
    "path",
    "timer",
    "slice",
    "scope",
];

/// systemd's special units (systemd.special(7)) whose activation ends the running system:
/// shutdown, reboot, power-off, halt, kexec, suspend and hibernate, the emergency and
/// rescue modes, leaving the initrd, and the services behind them. A unit that *is* one of
/// these, or depends on one, changes the node's power state.
pub const POWER_UNITS: [&str; 32] = [
    "shutdown.target",
    "final.target",
    "reboot.target",
    "soft-reboot.target",
    "poweroff.target",
    "halt.target",
    "kexec.target",
    "exit.target",
    "ctrl-alt-del.target",
    "emergency.target",
    "rescue.target",
    "sleep.target",
    "suspend.target",
    "hibernate.target",
    "hybrid-sleep.target",
    "suspend-then-hibernate.target",
    "initrd-switch-root.target",
    "factory-reset.target",
    "systemd-reboot.service",
    "systemd-soft-reboot.service",
    "systemd-poweroff.service",
    "systemd-halt.service",
    "systemd-kexec.service",
    "systemd-exit.service",
    "systemd-suspend.service",
    "systemd-hibernate.service",
    "systemd-hybrid-sleep.service",
    "systemd-suspend-then-hibernate.service",
    "systemd-initrd-switch-root.service",
    "emergency.service",
    "rescue.service",
    "systemd-factory-reset.service",
];

/// A systemd unit name: `prefix[@instance].type` of `[A-Za-z0-9:_.-]` and `\xHH` escapes,
/// with a known type, not starting with `-` or `.`, at most [`MAX_UNIT_NAME`] bytes. An
/// escape never decodes to `/`, `\` or a control character, and the decoded name never
/// holds `..`, so a unit name can name neither an option nor a path.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct UnitName(String);

impl UnitName {
    /// Checks `unit` against the grammar.
    // Long on purpose: one check per rule of the grammar, each with its own reason.
    pub fn parse(unit: &str) -> Result<Self, String> {
        if unit.is_empty() {
            return Err("a unit name must not be empty".into());
        }
        if unit.len() > MAX_UNIT_NAME {
            return Err(format!(
                "a unit name has at most {MAX_UNIT_NAME} characters"
            ));
        }
        if unit.starts_with('-') || unit.starts_with('.') {
            return Err(format!(
                "{unit:?} starts with {:?}: unit names are never options or hidden files",
                &unit[..1]
            ));
        }
        if let Some(bad) = unit.chars().find(|&c| {
            !(c.is_ascii_alphanumeric() || matches!(c, ':' | '_' | '.' | '\\' | '-' | '@'))
        }) {
            return Err(format!(
                "{unit:?} contains {bad:?}, which is not in systemd's unit-name character set"
            ));
        }
        let decoded = unescape(unit)?;
        if decoded.contains("..") {
            return Err(format!("{unit:?} holds '..' (after unescaping)"));
        }
        let Some((stem, kind)) = unit.rsplit_once('.') else {
            return Err(format!(
                "{unit:?} has no unit type suffix (.service, .socket, .timer, ...)"
            ));
        };
        if !UNIT_TYPES.contains(&kind) {
            return Err(format!(
                "{unit:?} ends in .{kind}, which is not a systemd unit type"
            ));
        }
        if stem.is_empty() {
            return Err(format!("{unit:?} has an empty name before .{kind}"));
        }
        if stem.matches('@').count() > 1 || stem.starts_with('@') {
            return Err(format!("{unit:?} is not name[@instance].{kind}"));
        }
        Ok(UnitName(unit.to_string()))
    }

    /// The name as written.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The unit type: `service`, `target`, ...
    pub fn unit_type(&self) -> &str {
        self.0.rsplit_once('.').map_or("", |(_, t)| t)
    }

    /// Whether this is one of systemd's [`POWER_UNITS`].
    pub fn is_power_unit(&self) -> bool {
        POWER_UNITS.contains(&self.0.as_str())
    }
}

/// Decodes systemd's `\xHH` escapes, refusing any other backslash and any escape that
/// decodes to `/`, `\` or a control character.
fn unescape(unit: &str) -> Result<String, String> {
    let mut out = Vec::with_capacity(unit.len());
    let mut bytes = unit.bytes();
    while let Some(b) = bytes.next() {
        if b != b'\\' {
            out.push(b);
            continue;
        }
        let (x, h, l) = (bytes.next(), bytes.next(), bytes.next());
        let hex = |c: Option<u8>| c.and_then(|c| (c as char).to_digit(16));
        let (Some(b'x'), Some(h), Some(l)) = (x, hex(h), hex(l)) else {
            return Err(format!("{unit:?} has a '\\' that is not a \\xHH escape"));
        };
        let decoded = (h * 16 + l) as u8;
        if decoded == b'/' || decoded == b'\\' || decoded.is_ascii_control() {
            return Err(format!(
                "{unit:?} has an escape that decodes to {:?}",
                decoded as char
            ));
        }
        out.push(decoded);
    }
    Ok(String::from_utf8_lossy(&out).into_owned())
}

impl FromStr for UnitName {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        UnitName::parse(s)
    }
}

impl fmt::Display for UnitName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for UnitName {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

/// A unit a service interrupt may restart: a `.service` unit that is not one of
/// systemd's [`POWER_UNITS`]. Targets, mounts, timers and the rest are refused: restarting
/// a target can isolate the system or shut it down, which is `power`'s to ask for.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServiceUnit(UnitName);

impl ServiceUnit {
    /// Checks `unit`: the unit grammar, then the service-only rule.
    pub fn parse(unit: &str) -> Result<Self, String> {
        let name = UnitName::parse(unit)?;
        if name.unit_type() != "service" {
            return Err(format!(
                "{unit:?} is a .{} unit; an interrupt restarts .service units only (a reboot is interrupt type reboot, with the power grant)",
                name.unit_type()
            ));
        }
        if name.is_power_unit() {
            return Err(format!(
                "{unit:?} halts, reboots or powers off the node; that is interrupt type reboot, with the power grant"
            ));
        }
        Ok(ServiceUnit(name))
    }

    /// The name as written.
    pub fn as_str(&self) -> &str {
        self.0.as_str()
    }
}

impl fmt::Display for ServiceUnit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// The properties of a unit that say whether activating it changes the node's power state,
/// as `systemctl show` prints them. [`UnitPowerProps::PROPERTIES`] is the `--property` list
/// to ask for.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UnitPowerProps {
    /// `AllowIsolate=yes`: the unit can be isolated to (a system state, not a service).
    pub allow_isolate: bool,
    /// Each `*Action=` setting that is not `none`, as `Name=value`.
    pub actions: Vec<String>,
    /// Every unit named by a dependency that pulls in, triggers or follows the unit.
    pub dependencies: Vec<String>,
}

/// The `*Action=` properties: what systemd does to the system when the unit succeeds,
/// fails, restarts too often or times out.
const ACTION_PROPERTIES: [&str; 4] = [
    "SuccessAction",
    "FailureAction",
    "StartLimitAction",
    "JobTimeoutAction",
];

/// The dependencies activating a unit follows.
const DEPENDENCY_PROPERTIES: [&str; 8] = [
    "Requires",
    "Requisite",
    "Wants",
    "BindsTo",
    "Upholds",
    "OnSuccess",
    "OnFailure",
    "Triggers",
];

impl UnitPowerProps {
    /// The `--property=` value that asks `systemctl show` for these.
    pub fn properties() -> String {
        let mut all = vec!["AllowIsolate"];
        all.extend(ACTION_PROPERTIES);
        all.extend(DEPENDENCY_PROPERTIES);
        all.join(",")
    }

    /// Reads `systemctl show` output (`Key=value` lines).
    pub fn from_show(text: &str) -> Self {
        let mut props = UnitPowerProps::default();
        for line in text.lines() {
            let Some((key, value)) = line.split_once('=') else {
                continue;
            };
            let value = value.trim();
            if key == "AllowIsolate" {
                props.allow_isolate = value == "yes";
            } else if ACTION_PROPERTIES.contains(&key) {
                if !(value.is_empty() || value == "none") {
                    props.actions.push(format!("{key}={value}"));
                }
            } else if DEPENDENCY_PROPERTIES.contains(&key) {
                props
                    .dependencies
                    .extend(value.split_whitespace().map(str::to_string));
            }
        }
        props
    }

    /// Why activating `unit` would change the node's power state, if it would.
    pub fn power_effect(&self, unit: &UnitName) -> Option<String> {
        if unit.is_power_unit() {
            return Some(format!("{unit} is a systemd power unit"));
        }
        if self.allow_isolate {
            return Some(format!("{unit} can be isolated to (AllowIsolate=yes)"));
        }
        if let Some(action) = self.actions.first() {
            return Some(format!("{unit} acts on the system ({action})"));
        }
        self.dependencies
            .iter()
            .find(|d| POWER_UNITS.contains(&d.as_str()))
            .map(|d| format!("{unit} pulls in {d}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Strings near the grammar: its alphabet, escapes of every byte, and the bytes that
    /// must never get through (`/`, `\`, newline, space).
    fn near_unit() -> impl Strategy<Value = String> {
        let piece = prop_oneof![
            "[a-zA-Z0-9:_.@-]{1,6}",
            any::<u8>().prop_map(|b| format!("\\x{b:02x}")),
            Just("\\".to_string()),
            Just("/".to_string()),
            Just("..".to_string()),
            Just("\n".to_string()),
        ];
        let kind = prop_oneof![
            Just(".service"),
            Just(".target"),
            Just(".mount"),
            Just(""),
            Just(".exe")
        ];
        (proptest::collection::vec(piece, 1..6), kind)
            .prop_map(|(pieces, kind)| pieces.concat() + kind)
    }

    proptest! {
        #[test]
        fn an_accepted_unit_name_is_a_name(s in prop_oneof![near_unit(), any::<String>()]) {
            if let Ok(unit) = UnitName::parse(&s) {
                let decoded = unescape(unit.as_str()).unwrap();
                prop_assert!(!s.starts_with('-') && !s.starts_with('.'));
                prop_assert!(!decoded.contains('/') && !decoded.contains('\\'));
                prop_assert!(!decoded.contains(".."));
                prop_assert!(!decoded.chars().any(char::is_control));
                prop_assert!(UNIT_TYPES.contains(&unit.unit_type()));
            }
        }

        #[test]
        fn an_interrupt_unit_is_a_plain_service(s in near_unit()) {
            if let Ok(unit) = ServiceUnit::parse(&s) {
                prop_assert!(unit.as_str().ends_with(".service"));
                prop_assert!(!POWER_UNITS.contains(&unit.as_str()));
            }
        }
    }

    #[test]
    fn interrupts_restart_services_never_power() {
        for ok in [
            "containerd.service",
            "getty@tty1.service",
            "kubelet.service",
        ] {
            assert!(ServiceUnit::parse(ok).is_ok(), "{ok}");
        }
        for bad in [
            "poweroff.target",
            "reboot.target",
            "emergency.target",
            "multi-user.target",
            "systemd-reboot.service",
            "emergency.service",
            "home.mount",
            "x.timer",
        ] {
            assert!(ServiceUnit::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn power_is_read_from_what_systemd_reports() {
        let unit = UnitName::parse("innocent.service").unwrap();
        let plain = UnitPowerProps::from_show(
            "AllowIsolate=no\nSuccessAction=none\nFailureAction=none\nWants=network-online.target\nRequires=sysinit.target\n",
        );
        assert_eq!(plain.power_effect(&unit), None);
        for (show, why) in [
            ("SuccessAction=reboot-force\n", "SuccessAction=reboot-force"),
            ("FailureAction=poweroff\n", "FailureAction=poweroff"),
            ("StartLimitAction=reboot\n", "StartLimitAction=reboot"),
            ("AllowIsolate=yes\n", "AllowIsolate"),
            ("Requires=shutdown.target final.target\n", "shutdown.target"),
            ("OnFailure=emergency.target\n", "emergency.target"),
            (
                "Triggers=systemd-poweroff.service\n",
                "systemd-poweroff.service",
            ),
        ] {
            let effect = UnitPowerProps::from_show(show).power_effect(&unit);
            assert!(
                effect.as_deref().is_some_and(|e| e.contains(why)),
                "{show}: {effect:?}"
            );
        }
        let power = UnitName::parse("reboot.target").unwrap();
        assert!(UnitPowerProps::default().power_effect(&power).is_some());
        assert!(UnitPowerProps::properties().contains("SuccessAction,"));
    }
}
