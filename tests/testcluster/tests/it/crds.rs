//! The generated CRDs install on the real apiserver, and the example manifests are
//! accepted by it (server-side dry run against the installed schemas).

use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use nodewright_testcluster::ControlPlane;

#[tokio::test(flavor = "multi_thread")]
async fn crds_install_and_examples_are_accepted() {
    nodewright_testregistry::require!(ControlPlane, Registry);
    let client = ControlPlane::shared().client().await.unwrap();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for (name, yaml) in nodewright_api::crdgen::generated() {
        let crd: CustomResourceDefinition = serde_yaml_ng::from_str(&yaml).unwrap();
        crds.patch(
            crd.metadata.name.as_deref().unwrap(),
            &PatchParams::apply("nodewright-tests").force(),
            &Patch::Apply(&crd),
        )
        .await
        .unwrap_or_else(|e| panic!("{name} rejected by the apiserver: {e}"));
    }
    for crd in nodewright_api::crdgen::CRD_NAMES {
        let start = std::time::Instant::now();
        loop {
            let c = crds.get(crd).await.unwrap();
            let established = c
                .status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True");
            if established {
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "{crd} not established"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let dir = nodewright_testregistry::workspace().join("examples/manifests");
    let mut created = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let text = std::fs::read_to_string(entry.unwrap().path()).unwrap();
        for doc in serde_yaml_ng::Deserializer::from_str(&text) {
            let obj: DynamicObject = serde::Deserialize::deserialize(doc).unwrap();
            let kind = obj.types.as_ref().unwrap().kind.clone();
            let ar =
                ApiResource::from_gvk(&GroupVersionKind::gvk("nodewright.io", "v1alpha1", &kind));
            let api: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
            let pp = PostParams {
                dry_run: true,
                ..Default::default()
            };
            api.create(&pp, &obj)
                .await
                .unwrap_or_else(|e| panic!("{kind} {:?} rejected: {e}", obj.metadata.name));
            created += 1;
        }
    }
    assert!(created >= 3);
    // The schema rejects what the types forbid: an unknown package field.
    let ar = ApiResource::from_gvk(&GroupVersionKind::gvk(
        "nodewright.io",
        "v1alpha1",
        "NodeWright",
    ));
    let api: Api<DynamicObject> = Api::all_with(client, &ar);
    let bad: DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": "nodewright.io/v1alpha1", "kind": "NodeWright", "metadata": {"name": "bad"},
        "spec": {"packages": {"p": {"version": "1.0.0"}}}
    }))
    .unwrap();
    let err = api
        .create(
            &PostParams {
                dry_run: true,
                ..Default::default()
            },
            &bad,
        )
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("plugin"),
        "a package without a plugin must be refused by the schema: {err}"
    );
}
