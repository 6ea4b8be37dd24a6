//! The sandbox bounds of a package's stages: defaults, the per-package override
//! (`spec.packages.<name>.sandbox`) and the operator's ceilings, in one place.
//!
//! The engine applies them, the agent receives them as flags, the operator checks a
//! package against its ceilings before any node is touched, and validation checks that
//! the agent container's memory limit leaves room for the agent beside the sandbox.

use crate::v1alpha1::Package;

/// Default cap on a plugin's linear memory (all memories together).
pub const DEFAULT_MEMORY: u64 = 128 << 20;
/// Default bytes one stage may write through `files`.
pub const DEFAULT_WRITE_BYTES: u64 = 256 << 20;
/// Default files and directories one stage may write or create.
pub const DEFAULT_WRITE_FILES: u32 = 4096;
/// Default free space a write must leave on its filesystem.
pub const DEFAULT_MIN_FREE_BYTES: u64 = 256 << 20;
/// Memory the agent needs beside the sandbox (wasmtime, the runtime, buffers). An agent
/// container limit below sandbox memory + this would let the OOM killer end the pod
/// before the sandbox's typed memory error.
pub const AGENT_HEADROOM: u64 = 64 << 20;

/// The largest single `files.read`, given the sandbox memory: the bytes must fit in the
/// guest next to everything else it holds, so half of it.
pub fn max_read_bytes(memory: u64) -> u64 {
    memory / 2
}

/// One package's stage bounds, defaults applied (with the `cli` feature, the agent's
/// `--memory`, `--write-bytes` and `--write-files`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
pub struct StageLimits {
    /// Sandbox memory limit: all the plugin's memories together (a size: `128Mi`).
    #[cfg_attr(feature = "cli", arg(long, default_value = "128Mi", value_parser = crate::units::bytes))]
    pub memory: u64,
    /// Bytes the stage may write through `files`.
    #[cfg_attr(feature = "cli", arg(long, default_value = "256Mi", value_parser = crate::units::bytes))]
    pub write_bytes: u64,
    /// Files and directories the stage may write or create.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = DEFAULT_WRITE_FILES))]
    pub write_files: u32,
}

impl Default for StageLimits {
    fn default() -> Self {
        StageLimits {
            memory: DEFAULT_MEMORY,
            write_bytes: DEFAULT_WRITE_BYTES,
            write_files: DEFAULT_WRITE_FILES,
        }
    }
}

/// The operator's ceilings on [`StageLimits`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ceilings {
    /// Highest `sandbox.memory`.
    pub memory: u64,
    /// Highest `sandbox.writeBytes`.
    pub write_bytes: u64,
    /// Highest `sandbox.writeFiles`.
    pub write_files: u32,
}

impl Default for Ceilings {
    /// 1 GiB of memory, 4 GiB and 100,000 files written per stage.
    fn default() -> Self {
        Ceilings {
            memory: 1 << 30,
            write_bytes: 4 << 30,
            write_files: 100_000,
        }
    }
}

fn bytes(field: &str, raw: &str) -> Result<u64, (String, String)> {
    crate::units::bytes(raw).map_err(|e| (field.to_string(), e))
}

impl StageLimits {
    /// The limits of `package`, defaults applied. Errors carry the field below
    /// `spec.packages.<name>` (`sandbox.memory`) and the reason.
    pub fn of(package: &Package) -> Result<StageLimits, Vec<(String, String)>> {
        let mut limits = StageLimits::default();
        let Some(spec) = &package.sandbox else {
            return Ok(limits);
        };
        let mut errors = Vec::new();
        if let Some(raw) = &spec.memory {
            match bytes("sandbox.memory", raw) {
                Ok(v) if v < 16 << 20 => {
                    errors.push(("sandbox.memory".into(), "must be at least 16Mi".into()))
                }
                Ok(v) => limits.memory = v,
                Err(e) => errors.push(e),
            }
        }
        if let Some(raw) = &spec.write_bytes {
            match bytes("sandbox.writeBytes", raw) {
                Ok(v) => limits.write_bytes = v,
                Err(e) => errors.push(e),
            }
        }
        if let Some(files) = spec.write_files {
            limits.write_files = files;
        }
        if errors.is_empty() {
            Ok(limits)
        } else {
            Err(errors)
        }
    }

    /// The first field above its ceiling, as (field below the package, message).
    pub fn check(&self, ceilings: &Ceilings) -> Result<(), (String, String)> {
        let over = |field: &str, value: u64, max: u64| {
            (value > max).then(|| {
                (
                    field.to_string(),
                    format!("{value} is above the operator's ceiling of {max}"),
                )
            })
        };
        match over("sandbox.memory", self.memory, ceilings.memory)
            .or_else(|| over("sandbox.writeBytes", self.write_bytes, ceilings.write_bytes))
            .or_else(|| {
                over(
                    "sandbox.writeFiles",
                    u64::from(self.write_files),
                    u64::from(ceilings.write_files),
                )
            }) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::v1alpha1::SandboxSpec;

    #[test]
    fn defaults_overrides_and_ceilings() {
        let mut p = Package::default();
        assert_eq!(StageLimits::of(&p).unwrap(), StageLimits::default());
        p.sandbox = Some(SandboxSpec {
            memory: Some("512Mi".into()),
            write_bytes: Some("2Gi".into()),
            write_files: Some(10),
        });
        let l = StageLimits::of(&p).unwrap();
        assert_eq!(
            (l.memory, l.write_bytes, l.write_files),
            (512 << 20, 2 << 30, 10)
        );
        assert_eq!(l.check(&Ceilings::default()), Ok(()));
        let low = Ceilings {
            memory: 256 << 20,
            ..Default::default()
        };
        assert_eq!(l.check(&low).unwrap_err().0, "sandbox.memory");
        p.sandbox = Some(SandboxSpec {
            memory: Some("1Mi".into()),
            write_bytes: Some("lots".into()),
            write_files: None,
        });
        let errs = StageLimits::of(&p).unwrap_err();
        assert_eq!(
            errs.iter().map(|e| e.0.as_str()).collect::<Vec<_>>(),
            ["sandbox.memory", "sandbox.writeBytes"]
        );
        assert_eq!(max_read_bytes(128 << 20), 64 << 20);
    }
}
