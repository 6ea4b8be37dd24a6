//! The committed CRDs are what the types generate (run `cargo xtask crds` after changing
//! the types), and their schemas keep the shape admins rely on.

use std::path::Path;

/// With `NODEWRIGHT_UPDATE_CRDS=1` (what `cargo xtask crds` sets) the generated CRDs are
/// written instead of compared.
#[test]
fn committed_crds_match_the_types() {
    let update = std::env::var_os("NODEWRIGHT_UPDATE_CRDS").is_some_and(|v| v == "1");
    for rel in ["deploy/crds", "deploy/chart/nodewright/crds"] {
        let dir = Path::new(
            &std::env::var("CARGO_MANIFEST_DIR").expect("cargo test sets CARGO_MANIFEST_DIR"),
        )
        .join("../..")
        .join(rel);
        for (name, yaml) in nodewright_api::crdgen::generated() {
            if update {
                std::fs::create_dir_all(&dir).unwrap();
                std::fs::write(dir.join(name), &yaml).unwrap();
                println!("wrote {rel}/{name}");
                continue;
            }
            let committed = std::fs::read_to_string(dir.join(name)).unwrap_or_default();
            assert!(
                committed == yaml,
                "{rel}/{name} is stale: run `cargo xtask crds` and commit the result"
            );
        }
    }
}

#[test]
fn schema_snapshot() {
    let (_, yaml) = &nodewright_api::crdgen::generated()[0];
    let crd: serde_json::Value = serde_yaml_ng::from_str(yaml).unwrap();
    let version = &crd["spec"]["versions"][0];
    assert_eq!(crd["spec"]["group"], "nodewright.io");
    assert_eq!(crd["spec"]["scope"], "Cluster");
    assert_eq!(version["name"], "v1alpha1");
    assert!(version["subresources"]["status"].is_object());
    let columns: Vec<&str> = version["additionalPrinterColumns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        columns,
        [
            "Status",
            "Priority",
            "Complete",
            "In-Progress",
            "Packages",
            "Policy",
            "Age"
        ]
    );
    let pkg = &version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["packages"]
        ["additionalProperties"];
    let mut fields: Vec<&str> = pkg["properties"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    fields.sort();
    assert_eq!(
        fields,
        [
            "capabilities",
            "configInterrupts",
            "configMap",
            "dependsOn",
            "gracefulShutdown",
            "interrupt",
            "payloads",
            "plugin",
            "resources",
            "sandbox",
            "stageTimeout",
            "uninstall",
            "version"
        ]
    );
    let mut required: Vec<&str> = pkg["required"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    required.sort();
    assert_eq!(required, ["plugin", "version"]);
    let caps: Vec<&str> = pkg["properties"]["capabilities"]["properties"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        caps,
        ["commands", "files", "kernelModules", "services", "sysctl"]
    );
}
