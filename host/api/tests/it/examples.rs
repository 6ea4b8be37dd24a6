//! Every manifest under examples/ passes validation.

use std::path::Path;

#[test]
fn examples_validate() {
    let dir = Path::new(
        &std::env::var("CARGO_MANIFEST_DIR").expect("cargo test sets CARGO_MANIFEST_DIR"),
    )
    .join("../../examples/manifests");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        for doc in serde_yaml_ng::Deserializer::from_str(&text) {
            let value: serde_json::Value = serde::Deserialize::deserialize(doc).unwrap();
            if let Err(errs) = nodewright_api::validate::validate_manifest(&value) {
                panic!("{}: {errs:?}", path.display());
            }
            seen += 1;
        }
    }
    assert!(seen >= 3, "expected the example manifests, found {seen}");
}

#[test]
fn a_broken_manifest_reports_field_paths() {
    let doc = serde_json::json!({
        "apiVersion": "nodewright.io/v1alpha1", "kind": "NodeWright", "metadata": {"name": "x"},
        "spec": {"packages": {"pk": {"version": "one", "plugin": "r.example/p:1", "capabilities": {"kernelModules": ["a b"]}}}}
    });
    let errs = nodewright_api::validate::validate_manifest(&doc).unwrap_err();
    let paths: Vec<&str> = errs.iter().map(|e| e.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "spec.packages.pk.version",
            "spec.packages.pk.capabilities.kernelModules[0]"
        ]
    );
    let wrong = serde_json::json!({"apiVersion": "v1", "kind": "Pod"});
    assert_eq!(
        nodewright_api::validate::validate_manifest(&wrong).unwrap_err()[0].path,
        "apiVersion"
    );
}
