//! `nodewright plugin keygen|sign|verify`: cosign-compatible, key-based signatures.

use std::io::{IsTerminal, Write as _};
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context as _, bail};
use clap::Args;
use nodewright_oci::Registry;
use nodewright_trust::keys::{KeyPair, PublicKey};
use nodewright_trust::signatures;

use super::source::RegistryArgs;

/// The environment variable holding the private key's password (cosign's name for it).
const PASSWORD_ENV: &str = "COSIGN_PASSWORD";

/// Arguments of `plugin keygen`.
#[derive(Debug, Args)]
pub struct KeygenArgs {
    /// Write `<prefix>.key` (encrypted) and `<prefix>.pub`.
    #[arg(long, default_value = "cosign")]
    output_prefix: PathBuf,
}

/// Arguments of `plugin sign`.
#[derive(Debug, Args)]
pub struct SignArgs {
    /// The plugin: registry/repository:tag or registry/repository@sha256:... (a tag is
    /// resolved and the digest is what gets signed).
    reference: String,
    /// The encrypted private key (`nodewright plugin keygen` or `cosign generate-key-pair`).
    #[arg(long)]
    key: PathBuf,
    #[command(flatten)]
    registry: RegistryArgs,
}

/// Arguments of `plugin verify`.
#[derive(Debug, Args)]
pub struct VerifyArgs {
    /// The plugin: registry/repository:tag or registry/repository@sha256:...
    reference: String,
    /// A public key (PEM). Repeatable: `NAME=FILE` names the signer in the output.
    #[arg(long, required = true)]
    key: Vec<String>,
    #[command(flatten)]
    registry: RegistryArgs,
}

fn password(confirm: bool) -> anyhow::Result<String> {
    if let Ok(p) = std::env::var(PASSWORD_ENV) {
        return Ok(p);
    }
    if !std::io::stdin().is_terminal() {
        bail!("the private key's password: set {PASSWORD_ENV} (no terminal to ask on)");
    }
    let first = rpassword::prompt_password("Password for the private key: ")?;
    if confirm && rpassword::prompt_password("Again: ")? != first {
        bail!("the passwords differ");
    }
    Ok(first)
}

pub fn keygen(args: KeygenArgs) -> anyhow::Result<ExitCode> {
    let with = |ext: &str| PathBuf::from(format!("{}.{ext}", args.output_prefix.display()));
    let (private, public) = (with("key"), with("pub"));
    for p in [&private, &public] {
        if p.exists() {
            bail!("{} exists; not overwriting it", p.display());
        }
    }
    let pair = KeyPair::generate();
    let pem = pair.to_encrypted_pem(password(true)?.as_bytes())?;
    // Owner-only from the start, and never over a file that appeared meanwhile.
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&private)
        .with_context(|| format!("creating {}", private.display()))?;
    file.write_all(pem.as_bytes())
        .with_context(|| format!("writing {}", private.display()))?;
    std::fs::write(&public, pair.public().to_pem())
        .with_context(|| format!("writing {}", public.display()))?;
    println!(
        "wrote {} (encrypted private key) and {} (public key)",
        private.display(),
        public.display()
    );
    Ok(ExitCode::SUCCESS)
}

pub async fn sign(args: SignArgs) -> anyhow::Result<ExitCode> {
    let text = std::fs::read_to_string(&args.key)
        .with_context(|| format!("reading {}", args.key.display()))?;
    let pair = KeyPair::from_encrypted_pem(&text, password(false)?.as_bytes())
        .with_context(|| args.key.display().to_string())?;
    let registry = Registry::new(args.registry.config()?);
    let pinned = registry.pinned(&args.reference).await?;
    signatures::attach(&registry, &pinned, &pair).await?;
    println!("signed {pinned}");
    eprintln!("stored under {}", signatures::signature_reference(&pinned));
    Ok(ExitCode::SUCCESS)
}

pub async fn verify(args: VerifyArgs) -> anyhow::Result<ExitCode> {
    let mut keys = Vec::new();
    for (i, k) in args.key.iter().enumerate() {
        let (name, path) = match k.split_once('=') {
            Some((n, p)) => (n.to_string(), PathBuf::from(p)),
            None => (
                if args.key.len() == 1 {
                    "key".into()
                } else {
                    format!("key{}", i + 1)
                },
                PathBuf::from(k),
            ),
        };
        let pem = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        keys.push((
            name,
            PublicKey::from_pem(&pem).with_context(|| path.display().to_string())?,
        ));
    }
    let registry = Registry::new(args.registry.config()?);
    let pinned = registry.pinned(&args.reference).await?;
    let digest = pinned.digest();
    let found = signatures::signatures(&registry, &pinned).await?;
    let signers = signatures::verified_by(&found, digest, &keys);
    if signers.is_empty() {
        eprintln!(
            "{pinned}: {} signature(s) found, none by the given key(s)",
            found.len()
        );
        return Ok(ExitCode::from(1));
    }
    println!("{pinned}");
    println!("verified: signed by {}", signers.join(", "));
    Ok(ExitCode::SUCCESS)
}
