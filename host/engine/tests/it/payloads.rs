//! A package's payloads as the plugin meets them: read-only at `/payload/<name>`, installed
//! to a granted path by the host (`files.install`), and run by the host when a grant names
//! one of their files (`commands: [{path: "payload:<name>/<path>"}]`) — each with every way
//! around it refused as the package's fault, naming what to change.

use std::path::Path;

use crate::common::{Run, engine, grants, load, sim};
use crate::hostile::{GRANTS, fixture};
use nodewright_engine::{RunStage, SandboxLimits, StepFailure};
use nodewright_hostops::{HostAction, SimHost};

/// A payload tree holding `files` (path, contents, mode), and a link `out` to the host's
/// `/etc/shadow` — which unpacked trees never hold: planted to show none could leave.
fn payload_tree(files: &[(&str, &[u8], u32)]) -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt as _;
    let tree = tempfile::tempdir().unwrap();
    for (path, contents, mode) in files {
        let file = tree.path().join(path);
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(&file, contents).unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(*mode)).unwrap();
    }
    std::os::unix::fs::symlink("/etc/shadow", tree.path().join("out")).unwrap();
    tree
}

/// A payload is readable at `/payload/<name>` and nothing else of the host's filesystem is:
/// every way of changing it, leaving it (`..`, a link planted in the tree) or reaching the
/// host's root is refused, in `apply` as in `plan`, and the tree is as it was.
#[tokio::test]
async fn a_payload_is_read_only_and_the_only_directory_the_plugin_sees() {
    let plugin = load(nodewright_artifacts::HOSTILE);
    let tmp = fixture();
    let host = sim(tmp.path());
    let tree = payload_tree(&[("lib/VERSION", b"560.35.03", 0o444)]);
    let version = tree.path().join("lib/VERSION");
    let granted = grants(GRANTS, "hostile");
    let prepared = engine().prepare(&plugin, &granted).expect("prepare");
    for stage in [RunStage::Plan, RunStage::Apply] {
        let ctx = nodewright_engine::StageContext::new("node-1", "hostile", "1.0.0")
            .with_config("attack", "payload")
            .with_payload(
                nodewright_api::payload::PayloadName::parse("fw").unwrap(),
                tree.path().to_path_buf(),
            );
        let report = prepared
            .run(
                stage,
                ctx,
                host.clone(),
                granted.clone(),
                &SandboxLimits::default(),
            )
            .await
            .expect("runs");
        let message = report.result.expect("reports").message.unwrap_or_default();
        assert_eq!(
            message,
            "read=Ok(\"560.35.03\") write=refused create=refused remove=refused mkdir=refused \
             escape=refused link-out=refused host-root=refused",
            "{stage}"
        );
    }
    assert_eq!(std::fs::read_to_string(&version).unwrap(), "560.35.03");
    let mut left: Vec<_> = std::fs::read_dir(tree.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    left.sort();
    assert_eq!(left, ["lib", "out"]);

    // Without the payload, the same read is refused: no directory is opened by default.
    let ctx = nodewright_engine::StageContext::new("node-1", "hostile", "1.0.0")
        .with_config("attack", "payload");
    let report = prepared
        .run(
            RunStage::Apply,
            ctx,
            host,
            granted,
            &SandboxLimits::default(),
        )
        .await
        .expect("runs");
    let message = report.result.expect("reports").message.unwrap_or_default();
    assert!(message.starts_with("read=Err("), "{message}");
}

/// `files.install`: a payload file reaches a granted path with its bytes and a mode that
/// follows its execute bit; every other way of using it is refused with a denial naming
/// what a source must be or the grant to add, and nothing outside the grant changes.
#[tokio::test]
async fn a_payload_file_installs_only_from_the_payload_to_a_granted_path() {
    let plugin = load(nodewright_artifacts::HOSTILE);
    let tmp = fixture();
    let host = sim(tmp.path());
    let module: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    let tree = payload_tree(&[
        ("lib/nvidia.ko", &module, 0o444),
        ("bin/tool", b"#!/bin/sh\n", 0o555),
    ]);
    use std::os::unix::fs::PermissionsExt as _;
    let install = |source: &'static str, dest: &'static str, stage, write_bytes| {
        install_one(
            &plugin,
            &host,
            tree.path(),
            (source, dest),
            stage,
            write_bytes,
        )
    };
    let ok = install(
        "/payload/fw/lib/nvidia.ko",
        "/etc/app/modules/nvidia.ko",
        RunStage::Apply,
        None,
    )
    .await;
    assert!(ok.is_ok(), "{ok:?}");
    let placed = tmp.path().join("etc/app/modules/nvidia.ko");
    assert_eq!(std::fs::read(&placed).unwrap(), module);
    assert_eq!(
        std::fs::metadata(&placed).unwrap().permissions().mode() & 0o7777,
        0o644
    );
    let ok = install(
        "/payload/fw/bin/tool",
        "/etc/app/tool",
        RunStage::Apply,
        None,
    )
    .await;
    assert!(ok.is_ok(), "{ok:?}");
    assert_eq!(
        std::fs::metadata(tmp.path().join("etc/app/tool"))
            .unwrap()
            .permissions()
            .mode()
            & 0o7777,
        0o755,
        "an executable payload file installs executable"
    );

    for (source, dest, stage, says) in [
        (
            "/payload/fw/../../etc/shadow",
            "/etc/app/x",
            RunStage::Apply,
            "without `..`",
        ),
        (
            "/payload/fw/lib/../../x",
            "/etc/app/x",
            RunStage::Apply,
            "without `..`",
        ),
        (
            "/etc/shadow",
            "/etc/app/x",
            RunStage::Apply,
            "/payload/<name>/<path>",
        ),
        (
            "/payload/other/x",
            "/etc/app/x",
            RunStage::Apply,
            "no payload named \"other\" (it has: fw)",
        ),
        (
            "/payload/fw/",
            "/etc/app/x",
            RunStage::Apply,
            "must name a file below /payload/fw/",
        ),
        ("/payload/fw/out", "/etc/app/x", RunStage::Apply, "symlink"),
        (
            "/payload/fw/lib",
            "/etc/app/x",
            RunStage::Apply,
            "a directory",
        ),
        (
            "/payload/fw/lib/nvidia.ko",
            "/etc/shadow",
            RunStage::Apply,
            "capabilities.files",
        ),
        (
            "/payload/fw/lib/nvidia.ko",
            "/etc/ro/x",
            RunStage::Apply,
            "readWrite",
        ),
    ] {
        match install(source, dest, stage, None).await {
            Err(StepFailure::Denied(d)) => {
                assert!(
                    d.message.contains(says),
                    "{source} -> {dest}: {}",
                    d.message
                );
                assert_eq!(d.capability, "files", "{source}");
            }
            other => panic!("{source} -> {dest}: expected a denial, got {other:?}"),
        }
    }
    match install(
        "/payload/fw/lib/nvidia.ko",
        "/etc/app/y",
        RunStage::Plan,
        None,
    )
    .await
    {
        Err(StepFailure::WrongStage(_) | StepFailure::Denied(_)) => {}
        other => panic!("install in plan: {other:?}"),
    }
    match install(
        "/payload/fw/lib/nvidia.ko",
        "/etc/app/y",
        RunStage::Apply,
        Some(1000),
    )
    .await
    {
        Err(StepFailure::Denied(d)) => assert!(d.message.contains("writeBytes"), "{}", d.message),
        other => panic!("over the write budget: {other:?}"),
    }
    assert!(!tmp.path().join("etc/app/x").exists() && !tmp.path().join("etc/app/y").exists());
    assert_eq!(
        std::fs::read_to_string(tmp.path().join("etc/shadow")).unwrap(),
        "secret"
    );
}

/// One `install` attack: `source` to `dest` with the payload `fw` at `tree`.
async fn install_one(
    plugin: &nodewright_engine::LoadedPlugin,
    host: &std::sync::Arc<SimHost>,
    tree: &Path,
    (source, dest): (&str, &str),
    stage: RunStage,
    write_bytes: Option<u64>,
) -> Result<nodewright_engine::StageOutcome, StepFailure> {
    let config = [("attack", "install"), ("source", source), ("dest", dest)];
    let mut run = Run::new(plugin, "hostile", GRANTS).config(&config);
    run.payloads = vec![("fw", tree.to_path_buf())];
    if let Some(b) = write_bytes {
        run.limits.write_bytes = b;
    }
    run.stage(host, stage).await.expect("runs").result
}

/// `exec.run("payload:<name>/<path>")`: a grant naming a payload file runs that file from
/// the payload's read-only tree — a script here, so its interpreter reads the same open
/// file — and the host records it under the name the grant gives it. A file the grant
/// names but the package cannot run (a link planted out of the tree, no exec bit, not a
/// program, a directory), a payload the package lacks, another spelling, other arguments or a stage
/// that may not change the host are each refused, with the reason, and nothing runs.
#[tokio::test(flavor = "multi_thread")]
async fn a_payload_command_runs_the_granted_payload_file_and_nothing_else() {
    let plugin = load(nodewright_artifacts::HOSTILE);
    let tmp = fixture();
    let host = sim(tmp.path());
    let tree = payload_tree(&[
        (
            "bin/tool",
            b"#!/bin/sh\necho \"from the payload: $*\"\n",
            0o555,
        ),
        ("lib/VERSION", b"560.35.03", 0o444),
        ("lib/data.bin", b"560.35.03", 0o555),
    ]);
    let mut granted: Vec<&str> = GRANTS.to_vec();
    granted.extend([
        "command=payload:fw/bin/tool:--hello",
        "command=payload:fw/out",
        "command=payload:fw/lib/VERSION",
        "command=payload:fw/lib/data.bin",
        "command=payload:fw/lib",
        "command=payload:other/x",
    ]);
    let run = |command: &'static str, args: &'static str, stage| {
        let host = host.clone();
        let (plugin, granted, tree) = (&plugin, &granted, tree.path().to_path_buf());
        async move {
            let config = [("attack", "run"), ("command", command), ("args", args)];
            let mut run = Run::new(plugin, "hostile", granted).config(&config);
            run.payloads = vec![("fw", tree)];
            run.stage(&host, stage).await.expect("runs").result
        }
    };
    let ok = run("payload:fw/bin/tool", "--hello", RunStage::Apply)
        .await
        .expect("the granted payload file runs");
    assert_eq!(
        ok.message.as_deref(),
        Some("status=Some(0) stdout=from the payload: --hello")
    );
    let ran = || -> Vec<(String, Vec<String>)> {
        host.recorded()
            .into_iter()
            .filter_map(|a| match a {
                HostAction::Exec { path, args, .. } => Some((path, args)),
                _ => None,
            })
            .collect()
    };
    assert_eq!(
        ran(),
        [(
            "payload:fw/bin/tool".to_string(),
            vec!["--hello".to_string()]
        )]
    );

    for (command, args, says) in [
        ("payload:fw/out", "", "symlink"),
        ("payload:fw/lib/VERSION", "", "no exec bit (mode 0444)"),
        (
            "payload:fw/lib/data.bin",
            "",
            "neither an ELF binary nor a script",
        ),
        ("payload:fw/lib", "", "a directory"),
        (
            "payload:other/x",
            "",
            "no payload named \"other\" (it has: fw)",
        ),
        ("payload:fw/bin/tool", "--evil", "arguments do not match"),
        ("payload:fw/bin/../bin/tool", "--hello", "plain names"),
        ("payload:fw/bin/tool2", "", "capabilities.commands"),
        ("/bin/tool", "--hello", "capabilities.commands"),
    ] {
        match run(command, args, RunStage::Apply).await {
            Err(StepFailure::Denied(d)) => {
                assert!(d.message.contains(says), "{command}: {}", d.message);
                assert_eq!(d.capability, "exec", "{command}");
            }
            other => panic!("{command}: expected a denial, got {other:?}"),
        }
    }
    match run("payload:fw/bin/tool", "--hello", RunStage::Plan).await {
        Err(StepFailure::WrongStage(m)) => assert!(m.contains("readOnly: true"), "{m}"),
        other => panic!("a payload command in plan: {other:?}"),
    }
    assert_eq!(ran().len(), 1, "nothing else ran: {:?}", ran());
    // The tree is as it was: running a file of it changes nothing of it.
    assert_eq!(
        std::fs::read(tree.path().join("bin/tool")).unwrap(),
        b"#!/bin/sh\necho \"from the payload: $*\"\n"
    );
}

/// A granted command may take files of a payload as arguments where its grant's pattern
/// starts with `payload:` (`dpkg --install payload:debs/*.deb`): the command reads the
/// payload's file through a descriptor the host opened below the tree, whatever the host's
/// paths are — and only files of that payload matching the pattern, never a host path, a
/// link, another payload or a name with `..`.
#[tokio::test(flavor = "multi_thread")]
async fn a_granted_command_takes_payload_files_only_where_its_grant_says() {
    use std::os::unix::fs::PermissionsExt as _;
    let plugin = load(nodewright_artifacts::HOSTILE);
    let tmp = fixture();
    let host = sim(tmp.path());
    // The node's package tool: prints what it was asked to install, read from the file.
    let tool = tmp.path().join("usr/bin/pkgtool");
    std::fs::create_dir_all(tool.parent().unwrap()).unwrap();
    std::fs::write(&tool, "#!/bin/sh\necho \"$1 $(cat \"$2\")\"\n").unwrap();
    std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o755)).unwrap();
    let debs = payload_tree(&[("nvidia-560.deb", b"deb bytes 560", 0o444)]);
    std::os::unix::fs::symlink("/etc/shadow", debs.path().join("link.deb")).unwrap();
    let mut granted: Vec<&str> = GRANTS.to_vec();
    granted.push("command=/usr/bin/pkgtool:--install,payload:debs/*.deb");
    let run = |args: &'static str| {
        let host = host.clone();
        let (plugin, granted, tree) = (&plugin, &granted, debs.path().to_path_buf());
        async move {
            let config = [
                ("attack", "run"),
                ("command", "/usr/bin/pkgtool"),
                ("args", args),
            ];
            let mut run = Run::new(plugin, "hostile", granted).config(&config);
            run.payloads = vec![("debs", tree)];
            run.stage(&host, RunStage::Apply)
                .await
                .expect("runs")
                .result
        }
    };
    let ok = run("--install payload:debs/nvidia-560.deb")
        .await
        .expect("installs the payload's file");
    assert_eq!(
        ok.message.as_deref(),
        Some("status=Some(0) stdout=--install deb bytes 560")
    );
    let recorded: Vec<_> = host
        .recorded()
        .into_iter()
        .filter_map(|a| match a {
            HostAction::Exec { path, args, .. } => Some((path, args)),
            _ => None,
        })
        .collect();
    assert_eq!(
        recorded,
        [(
            "/usr/bin/pkgtool".to_string(),
            vec![
                "--install".to_string(),
                "payload:debs/nvidia-560.deb".to_string()
            ]
        )],
        "recorded as the plugin named it"
    );
    for (args, says) in [
        ("--install /etc/shadow", "arguments do not match"),
        (
            "--install payload:other/nvidia-560.deb",
            "arguments do not match",
        ),
        (
            "--install payload:debs/../nvidia-560.deb",
            "arguments do not match",
        ),
        ("--install payload:debs/link.deb", "symlink"),
    ] {
        match run(args).await {
            Err(StepFailure::Denied(d)) => {
                assert!(d.message.contains(says), "{args}: {}", d.message);
                assert_eq!(d.capability, "exec", "{args}");
            }
            other => panic!("{args}: expected a denial, got {other:?}"),
        }
    }
    match run("--install payload:debs/missing.deb").await {
        Err(StepFailure::NotFound(m)) => assert!(m.contains("missing.deb"), "{m}"),
        other => panic!("a missing payload file: {other:?}"),
    }
    assert_eq!(host.recorded().len(), 1, "nothing else ran");
}
