//! What the image builder reads from a binary's ELF header: the architecture it runs on
//! and whether it needs a dynamic loader.

/// A CPU architecture nodewright's images are built for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Arch {
    /// x86-64: `linux/amd64`.
    Amd64,
    /// AArch64: `linux/arm64/v8` (Grace, Graviton, Ampere).
    Arm64,
}

impl Arch {
    /// Every architecture, in the order an index lists them.
    pub const ALL: [Arch; 2] = [Arch::Amd64, Arch::Arm64];

    /// The OCI platform's `architecture`.
    pub fn oci(self) -> &'static str {
        match self {
            Arch::Amd64 => "amd64",
            Arch::Arm64 => "arm64",
        }
    }

    /// The OCI platform's `variant` (arm64's is `v8`, what runtimes normalise it to).
    pub fn variant(self) -> Option<&'static str> {
        match self {
            Arch::Amd64 => None,
            Arch::Arm64 => Some("v8"),
        }
    }

    /// `linux/amd64`, `linux/arm64/v8`: how `docker`, `crane` and containerd name it.
    pub fn platform(self) -> String {
        match self.variant() {
            Some(v) => format!("linux/{}/{v}", self.oci()),
            None => format!("linux/{}", self.oci()),
        }
    }

    /// The ELF `e_machine` of its executables.
    fn elf_machine(self) -> u16 {
        match self {
            Arch::Amd64 => 62,
            Arch::Arm64 => 183,
        }
    }

    /// The architecture an ELF executable is for: `Err(machine)` when it is none of these
    /// (`None` when `elf` is not a 64-bit little-endian ELF file at all).
    pub fn of_elf(elf: &[u8]) -> Result<Arch, Option<u16>> {
        if !is_elf64_le(elf) {
            return Err(None);
        }
        let machine = u16::from_le_bytes([elf[0x12], elf[0x13]]);
        Arch::ALL
            .into_iter()
            .find(|a| a.elf_machine() == machine)
            .ok_or(Some(machine))
    }

    /// The architecture of the machine running this program.
    pub fn host() -> Arch {
        if cfg!(target_arch = "aarch64") {
            Arch::Arm64
        } else {
            Arch::Amd64
        }
    }
}

impl std::fmt::Display for Arch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.platform())
    }
}

/// Whether `elf` is a whole 64-bit little-endian ELF header, the only kind the fields
/// below are read from.
fn is_elf64_le(elf: &[u8]) -> bool {
    elf.len() >= 64 && elf[..4] == *b"\x7fELF" && elf[4] == 2 && elf[5] == 1
}

/// Whether `elf` is an executable that needs no dynamic loader (no `PT_INTERP`).
pub fn is_static(elf: &[u8]) -> bool {
    if !is_elf64_le(elf) {
        return false;
    }
    let u16_at = |o: usize| u16::from_le_bytes([elf[o], elf[o + 1]]) as usize;
    let u64_at = |o: usize| u64::from_le_bytes(elf[o..o + 8].try_into().expect("8 bytes")) as usize;
    let (phoff, phentsize, phnum) = (u64_at(0x20), u16_at(0x36), u16_at(0x38));
    (0..phnum).all(|i| {
        let at = phoff + i * phentsize;
        // PT_INTERP = 3
        elf.get(at..at + 4)
            .is_some_and(|t| u32::from_le_bytes(t.try_into().expect("4 bytes")) != 3)
    })
}

/// A minimal ELF header for `arch` (64-bit, little-endian, one `PT_LOAD`, a `PT_INTERP` when
/// `interp`, so dynamically linked): the smallest input the image builder accepts or
/// refuses. For tests.
#[doc(hidden)]
pub fn minimal_elf(arch: Arch, interp: bool) -> Vec<u8> {
    let mut e = vec![0u8; 64 + 56 * 2];
    e[..4].copy_from_slice(b"\x7fELF");
    e[4] = 2;
    e[5] = 1;
    e[0x12..0x14].copy_from_slice(&arch.elf_machine().to_le_bytes());
    e[0x20..0x28].copy_from_slice(&64u64.to_le_bytes());
    e[0x36..0x38].copy_from_slice(&56u16.to_le_bytes());
    e[0x38..0x3a].copy_from_slice(&2u16.to_le_bytes());
    e[64..68].copy_from_slice(&1u32.to_le_bytes());
    e[120..124].copy_from_slice(&(if interp { 3u32 } else { 1 }).to_le_bytes());
    e
}
