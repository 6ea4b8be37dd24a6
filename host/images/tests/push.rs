//! `nodewright-images --push` against a real registry that needs a login: refused
//! anonymously (saying so), pushed with the login from the environment or from a docker
//! config; what lands is one index per image naming its amd64 and arm64 manifests.

use std::path::Path;
use std::process::{Command, Output};

use nodewright_images::Arch;
use nodewright_oci::{Credentials, Registry, RegistryConfig};
use nodewright_testregistry::TestRegistry;

fn push(dir: &Path, reg: &TestRegistry, env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_nodewright-images"));
    for arch in Arch::ALL {
        let bins = dir.join(arch.oci());
        std::fs::create_dir_all(&bins).unwrap();
        for name in ["nodewright-operator", "nodewright-agent"] {
            std::fs::write(bins.join(name), nodewright_images::minimal_elf(arch, false)).unwrap();
        }
        cmd.arg("--binaries").arg(&bins);
    }
    cmd.arg("--out")
        .arg(dir.join("out"))
        .args(["--version", "0.1.0", "--push"])
        .arg(format!("{}/nodewright", reg.host()))
        .args(["--insecure-registry", reg.host()])
        // Nothing from the machine running the test: its own docker config or login.
        .env("DOCKER_CONFIG", dir.join("no-docker-config"))
        .env_remove("NODEWRIGHT_REGISTRY_USERNAME")
        .env_remove("NODEWRIGHT_REGISTRY_PASSWORD");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

#[test]
fn a_push_to_a_registry_with_a_login_uses_the_environments_credentials() {
    nodewright_testregistry::require!(Registry);
    let reg = TestRegistry::start_with_auth("publisher", "s3cret");
    let dir = tempfile::tempdir().unwrap();

    let anonymous = push(dir.path(), &reg, &[]);
    let err = String::from_utf8_lossy(&anonymous.stderr);
    assert!(!anonymous.status.success());
    assert!(
        err.contains("not authorized") && err.contains("/nodewright/"),
        "the refusal names the registry's answer and the image: {err}"
    );

    let half = push(
        dir.path(),
        &reg,
        &[("NODEWRIGHT_REGISTRY_USERNAME", "publisher")],
    );
    assert!(
        String::from_utf8_lossy(&half.stderr).contains("go together"),
        "{}",
        String::from_utf8_lossy(&half.stderr)
    );

    let login = push(
        dir.path(),
        &reg,
        &[
            ("NODEWRIGHT_REGISTRY_USERNAME", "publisher"),
            ("NODEWRIGHT_REGISTRY_PASSWORD", "s3cret"),
        ],
    );
    assert!(
        login.status.success(),
        "{}",
        String::from_utf8_lossy(&login.stderr)
    );
    let out = String::from_utf8_lossy(&login.stdout);
    let agent = format!("{}/nodewright/agent", reg.host());
    assert!(out.contains(&format!("pushed {agent}:0.1.0")), "{out}");

    // The tag names the index; each platform's manifest is in the registry by its digest.
    // The agent's block: `agent <index> index of …`, then a line per platform.
    let block = out
        .split_once("\nagent ")
        .map(|(_, rest)| rest)
        .unwrap_or_else(|| panic!("no agent block: {out}"));
    let second = |line: &str| {
        line.split_whitespace()
            .nth(1)
            .unwrap_or_default()
            .to_string()
    };
    let agent_index = block.split_whitespace().next().unwrap().to_string();
    let registry = Registry::new(RegistryConfig {
        insecure: vec![reg.host().into()],
        credentials: Credentials::Basic {
            username: "publisher".into(),
            password: "s3cret".into(),
        },
        ..Default::default()
    });
    let rt = tokio::runtime::Runtime::new().unwrap();
    let tagged = rt
        .block_on(registry.resolve(&format!("{agent}:0.1.0")))
        .unwrap();
    assert_eq!(tagged, agent_index, "{out}");
    for platform in ["linux/amd64", "linux/arm64/v8"] {
        let line = block
            .lines()
            .find(|l| l.trim_start().starts_with(&format!("{platform} ")))
            .unwrap_or_else(|| panic!("no {platform} line: {out}"));
        let digest = second(line);
        rt.block_on(registry.fetch_manifest(&format!("{agent}@{digest}")))
            .unwrap_or_else(|e| panic!("{platform} {digest}: {e}"));
    }
    // A manifest is pushed by digest only under its own: any other is refused, naming it.
    let moved = rt
        .block_on(registry.push_manifest(
            &format!("{agent}@{agent_index}"),
            &[],
            b"{}".to_vec(),
            nodewright_images::media::MANIFEST,
            &|_| {},
        ))
        .unwrap_err();
    assert!(
        matches!(moved, nodewright_oci::Error::InvalidReference { .. })
            && moved.to_string().contains("the manifest's own digest"),
        "{moved}"
    );

    let docker = dir.path().join("docker");
    std::fs::create_dir_all(&docker).unwrap();
    std::fs::write(
        docker.join("config.json"),
        format!(
            r#"{{"auths": {{"{}": {{"username": "publisher", "password": "s3cret"}}}}}}"#,
            reg.host()
        ),
    )
    .unwrap();
    let from_config = push(
        dir.path(),
        &reg,
        &[("DOCKER_CONFIG", docker.to_str().unwrap())],
    );
    assert!(
        from_config.status.success(),
        "{}",
        String::from_utf8_lossy(&from_config.stderr)
    );
}
