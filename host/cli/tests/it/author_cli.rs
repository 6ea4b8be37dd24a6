//! The author loop from the outside: `plugin new` and `build` in each language, `push` and
//! running by reference, `validate`, and one cache shared by two processes.

use crate::plugin_support;
use nodewright_testregistry::image::{TestImage, gzip_layer};

use std::path::Path;
use std::process::Command;

use plugin_support::{nodewright, text};

#[test]
fn new_build_run() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let new = nodewright(
        &cache,
        &[
            "plugin",
            "new",
            "demo",
            "--dir",
            tmp.path().to_str().unwrap(),
        ],
    );
    assert!(new.status.success(), "{}", text(&new));
    let crate_dir = tmp.path().join("demo");
    let build = nodewright(
        &cache,
        &["plugin", "build", "--path", crate_dir.to_str().unwrap()],
    );
    let out = text(&build);
    assert!(build.status.success(), "{out}");
    assert!(out.contains("needs    files"), "{out}");
    let wasm = out
        .lines()
        .find_map(|l| l.strip_prefix("built    "))
        .expect("built line")
        .trim()
        .to_string();
    let root = tmp.path().join("root");
    let run = nodewright(
        &cache,
        &[
            "plugin",
            "run",
            &wasm,
            "--stage",
            "apply",
            "--root",
            root.to_str().unwrap(),
            "--grant",
            "files=/etc/demo.conf:rw",
            "--config",
            "message=hi",
        ],
    );
    assert!(run.status.success(), "{}", text(&run));
    assert_eq!(
        std::fs::read_to_string(root.join("etc/demo.conf")).unwrap(),
        "hi\n"
    );
    let again = nodewright(
        &cache,
        &[
            "plugin",
            "new",
            "demo",
            "--dir",
            tmp.path().to_str().unwrap(),
        ],
    );
    assert!(text(&again).contains("already exists"));
}

/// The author loop in Python and JavaScript as on a clean machine: `plugin new --lang`, then
/// `plugin build` in the new directory with no tools set up (it installs them into the
/// project), then `plugin run`; and the errors an author meets first.
#[test]
fn new_build_run_in_python_and_javascript() {
    if nodewright_artifacts::port(nodewright_artifacts::SYSCTL_PY, "the Python tools").is_none() {
        return;
    }
    for (lang, source, unexport, unexported) in [
        (
            "python",
            "plugin.py",
            "@nodewright.export\n",
            "decorate one nodewright.Package subclass with @nodewright.export",
        ),
        (
            "js",
            "plugin.js",
            "exportPackage(Plugin);\n",
            "call exportPackage(YourPackage) once",
        ),
    ] {
        let tmp = tempfile::tempdir().unwrap();
        let cache = tmp.path().join("cache");
        let new = nodewright(
            &cache,
            &[
                "plugin",
                "new",
                "demo",
                "--lang",
                lang,
                "--dir",
                tmp.path().to_str().unwrap(),
            ],
        );
        assert!(new.status.success(), "{lang}: {}", text(&new));
        let dir = tmp.path().join("demo");
        let build_in = |dir: &Path, extra: &[&str]| {
            Command::new(env!("CARGO_BIN_EXE_nodewright"))
                .current_dir(dir)
                .args(["plugin", "build"])
                .args(extra)
                .env("NODEWRIGHT_CACHE_DIR", &cache)
                .env_remove("NODEWRIGHT_COMPONENTIZE_PY")
                .env_remove("NODEWRIGHT_JS_TOOLS")
                .output()
                .expect("run nodewright")
        };
        // Refusing to install names what to install.
        let refused = build_in(&dir, &["--no-install"]);
        let out = text(&refused);
        if lang == "js" {
            assert!(!refused.status.success(), "{out}");
            assert!(
                out.contains("npm install --save-dev @bytecodealliance/componentize-js@"),
                "{out}"
            );
        }
        let build = build_in(&dir, &[]);
        let out = text(&build);
        assert!(build.status.success(), "{lang}: {out}");
        assert!(
            out.contains("needs    files") && out.contains(&format!("language {lang}")),
            "{out}"
        );
        let wasm = out
            .lines()
            .find_map(|l| l.strip_prefix("built    "))
            .expect("built line")
            .trim()
            .to_string();
        assert_eq!(wasm, dir.join("build/demo.wasm").display().to_string());
        let root = tmp.path().join("root");
        let run = nodewright(
            &cache,
            &[
                "plugin",
                "run",
                &wasm,
                "--stage",
                "apply",
                "--root",
                root.to_str().unwrap(),
                "--grant",
                "files=/etc/demo.conf:rw",
                "--config",
                "message=hi",
            ],
        );
        assert!(run.status.success(), "{lang}: {}", text(&run));
        assert_eq!(
            std::fs::read_to_string(root.join("etc/demo.conf")).unwrap(),
            "hi\n"
        );
        // A source that exports no package does not build, and says what to add.
        let file = dir.join(source);
        let code = std::fs::read_to_string(&file).unwrap();
        std::fs::write(&file, code.replace(unexport, "")).unwrap();
        let broken = build_in(&dir, &[]);
        let out = text(&broken);
        assert!(!broken.status.success(), "{lang}: {out}");
        assert!(out.contains(unexported), "{lang}: {out}");
    }
}

/// `plugin push` + `plugin run <ref>` against a real registry, the second run from cache.
#[test]
fn push_then_run_by_reference() {
    nodewright_testregistry::require!(Registry);
    let reg = nodewright_testregistry::TestRegistry::start();
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let insecure = ["--insecure-registry", reg.host()];
    let reference = format!("{}/plugins/sysctl:1.0.0", reg.host());
    let push = nodewright(
        &cache,
        &[
            &["plugin", "push", nodewright_artifacts::SYSCTL, &reference][..],
            &insecure,
        ]
        .concat(),
    );
    assert!(push.status.success(), "{}", text(&push));
    let pinned = String::from_utf8(push.stdout.clone())
        .unwrap()
        .trim()
        .to_string();
    assert!(
        pinned.starts_with(&format!("{}/plugins/sysctl@sha256:", reg.host())),
        "{pinned}"
    );
    assert!(
        text(&push).contains("layer    sha256:"),
        "push shows progress: {}",
        text(&push)
    );

    let resolve = nodewright(
        &cache,
        &[&["plugin", "resolve", &reference][..], &insecure].concat(),
    );
    assert_eq!(String::from_utf8_lossy(&resolve.stdout).trim(), pinned);

    let root = tmp.path().join("root");
    std::fs::create_dir_all(root.join("proc/sys/vm")).unwrap();
    std::fs::write(root.join("proc/sys/vm/swappiness"), "60").unwrap();
    let run = |r: &str| {
        nodewright(
            &cache,
            &[
                &[
                    "plugin",
                    "run",
                    r,
                    "--stage",
                    "apply",
                    "--root",
                    root.to_str().unwrap(),
                    "-g",
                    "files=/etc/sysctl.d:rw",
                    "-g",
                    "sysctl=vm.swappiness",
                    "-c",
                    "vm.swappiness=10",
                ][..],
                &insecure,
            ]
            .concat(),
        )
    };
    let first = run(&reference);
    assert!(first.status.success(), "{}", text(&first));
    assert!(text(&first).contains("artifact pulled"), "{}", text(&first));
    let second = run(&pinned);
    assert!(
        text(&second).contains("artifact from the local cache, code loaded from cache"),
        "{}",
        text(&second)
    );
    assert_eq!(
        std::fs::read_to_string(root.join("proc/sys/vm/swappiness")).unwrap(),
        "10"
    );

    // Without --insecure-registry the CLI never falls back to plain HTTP.
    let refused = nodewright(&cache, &["plugin", "resolve", &reference]);
    assert!(!refused.status.success());
    assert!(
        text(&refused).contains("list it as insecure"),
        "{}",
        text(&refused)
    );
    // A tag that does not exist names the reference.
    let missing = nodewright(
        &cache,
        &[
            &["plugin", "pull", &format!("{}/plugins/nope:1", reg.host())][..],
            &insecure,
        ]
        .concat(),
    );
    assert!(
        text(&missing).contains("plugins/nope:1: not found in the registry"),
        "{}",
        text(&missing)
    );
}

/// A package with a payload, from the outside: pushed with `--payload`, listed by
/// `inspect`, read by the plugin at /payload/NAME when run by reference, and the same when
/// run from the file with a local `--payload`; a payload a node would refuse is refused at
/// push, naming it.
#[test]
fn a_payload_is_pushed_listed_and_read_by_the_plugin() {
    nodewright_testregistry::require!(Registry);
    let reg = nodewright_testregistry::TestRegistry::start();
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let insecure = ["--insecure-registry", reg.host()];
    let fw = tmp.path().join("fw");
    std::fs::create_dir_all(fw.join("lib")).unwrap();
    std::fs::write(fw.join("lib/VERSION"), "560.35.03").unwrap();
    let payload = format!("fw={}", fw.display());
    let reference = format!("{}/plugins/hostile:1.0.0", reg.host());
    let push = nodewright(
        &cache,
        &[
            &["plugin", "push", nodewright_artifacts::HOSTILE, &reference][..],
            &["--payload", &payload],
            &insecure,
        ]
        .concat(),
    );
    assert!(push.status.success(), "{}", text(&push));
    assert!(text(&push).contains("payload  fw ("), "{}", text(&push));

    let inspect = nodewright(
        &cache,
        &[
            &["plugin", "inspect", &reference, "-o", "json"][..],
            &insecure,
        ]
        .concat(),
    );
    assert!(inspect.status.success(), "{}", text(&inspect));
    let v: serde_json::Value = serde_json::from_slice(&inspect.stdout).unwrap();
    assert_eq!(v["payloads"][0]["name"], "fw");
    assert!(
        v["payloads"][0]["digest"]
            .as_str()
            .unwrap()
            .starts_with("sha256:")
    );
    assert!(v["payloads"][0]["size"].as_u64().unwrap() > 9);

    // `plugin pull` stages the payloads as a node does: fetched, verified, unpacked.
    let pull = nodewright(
        &cache,
        &[&["plugin", "pull", &reference][..], &insecure].concat(),
    );
    assert!(pull.status.success(), "{}", text(&pull));
    let tree = text(&pull)
        .lines()
        .find_map(|l| {
            l.strip_prefix("payload fw ")?
                .rsplit_once(": ")
                .map(|(_, t)| t.to_string())
        })
        .unwrap_or_else(|| panic!("no payload line: {}", text(&pull)));
    assert_eq!(
        std::fs::read_to_string(Path::new(&tree).join("lib/VERSION")).unwrap(),
        "560.35.03"
    );

    let root = tmp.path().join("root");
    let grants: Vec<&str> = nodewright_artifacts::HOSTILE_GRANTS
        .iter()
        .flat_map(|g| ["--grant", g])
        .collect();
    let run = |source: &str, extra: &[&str]| {
        let out = nodewright(
            &cache,
            &[
                &[
                    "plugin",
                    "run",
                    source,
                    "--stage",
                    "plan",
                    "--root",
                    root.to_str().unwrap(),
                    "-c",
                    "attack=payload",
                    "-o",
                    "json",
                ][..],
                &grants,
                extra,
                &insecure,
            ]
            .concat(),
        );
        assert!(out.status.success(), "{}", text(&out));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v["report"]["result"]["Ok"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    let seen = "read=Ok(\"560.35.03\") write=refused";
    let by_reference = run(&reference, &[]);
    assert!(by_reference.starts_with(seen), "{by_reference}");
    let from_file = run(nodewright_artifacts::HOSTILE, &["--payload", &payload]);
    assert!(from_file.starts_with(seen), "{from_file}");
    // The same payload taken from a vendor's image: the upper layer replaces the file and
    // whites out what the plugin must not see; only /opt/fw is served.
    let image = TestImage::new(vec![
        gzip_layer(&[
            ("opt/fw/lib/VERSION", b"550.54.14"),
            ("opt/fw/lib/old", b"x"),
        ]),
        gzip_layer(&[
            ("opt/fw/lib/VERSION", b"560.35.03"),
            ("opt/fw/lib/.wh.old", b""),
        ]),
    ]);
    let image_ref = format!("{}/vendor/fw:560", reg.host());
    let registry = nodewright_oci::Registry::new(nodewright_oci::RegistryConfig {
        insecure: vec![reg.host().into()],
        ..Default::default()
    });
    tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(nodewright_localcluster::push_image(
            &registry, &image_ref, &image,
        ))
        .unwrap();
    let from_image = run(
        nodewright_artifacts::HOSTILE,
        &["--payload-image", &format!("fw={image_ref}#/opt/fw")],
    );
    assert!(from_image.starts_with(seen), "{from_image}");

    std::os::unix::fs::symlink("/etc/shadow", fw.join("lib/link")).unwrap();
    let refused = nodewright(
        &cache,
        &[
            &["plugin", "push", nodewright_artifacts::HOSTILE, &reference][..],
            &["--payload", &payload],
            &insecure,
        ]
        .concat(),
    );
    assert!(!refused.status.success());
    assert!(
        text(&refused).contains("payload fw: entry") && text(&refused).contains("it is a link"),
        "{}",
        text(&refused)
    );
}

#[test]
fn validate_accepts_the_examples_and_names_bad_fields() {
    let tmp = tempfile::tempdir().unwrap();
    let examples = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../examples/manifests/staged-rollout-policy.yaml"
    );
    let ok = nodewright(tmp.path(), &["validate", examples]);
    assert!(ok.status.success(), "{}", text(&ok));
    assert!(text(&ok).contains("DeploymentPolicy/staged-rollout is valid"));
    let bad = tmp.path().join("bad.yaml");
    std::fs::write(&bad, "apiVersion: nodewright.io/v1alpha1\nkind: NodeWright\nmetadata: {name: bad}\nspec:\n  packages:\n    driver:\n      version: 1.0.0\n      plugin: r.example/p/d:1\n      capabilities: {kernelModules: [ok, 'nv[idia']}\n").unwrap();
    let out = nodewright(tmp.path(), &["validate", bad.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out).contains(
            "spec.packages.driver.capabilities.kernelModules[1]: \"nv[idia\" is not a valid glob"
        ),
        "{}",
        text(&out)
    );
}

/// Two processes pulling into (and compiling into) one cache at once: both succeed and
/// the cache stays consistent (every file hashes to its name).
#[test]
fn two_processes_share_one_cache() {
    nodewright_testregistry::require!(Registry);
    let reg = nodewright_testregistry::TestRegistry::start();
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let reference = format!("{}/plugins/kmod:1", reg.host());
    let push = nodewright(
        &cache,
        &[
            "plugin",
            "push",
            nodewright_artifacts::KERNEL_MODULE,
            &reference,
            "--insecure-registry",
            reg.host(),
        ],
    );
    assert!(push.status.success(), "{}", text(&push));
    std::fs::remove_dir_all(&cache).unwrap();
    for _ in 0..3 {
        let children: Vec<_> = (0..2)
            .map(|_| {
                Command::new(env!("CARGO_BIN_EXE_nodewright"))
                    .args([
                        "plugin",
                        "pull",
                        &reference,
                        "--insecure-registry",
                        reg.host(),
                    ])
                    .env("NODEWRIGHT_CACHE_DIR", &cache)
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        for child in children {
            let out = child.wait_with_output().unwrap();
            assert!(out.status.success(), "{}", text(&out));
        }
    }
    for entry in std::fs::read_dir(cache.join("blobs/sha256")).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        assert!(!name.contains("tmp"), "a temp file was left behind: {name}");
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(
            nodewright_oci::sha256_digest(&bytes),
            format!("sha256:{name}")
        );
    }
}
