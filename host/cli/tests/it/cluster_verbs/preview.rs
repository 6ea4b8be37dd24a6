//! Previewing: `preview --quick -f` (the dry run's forecast) of the running NodeWright, of a
//! new one, and of one the webhook refuses; `preview -f` (a NodeWrightPreview the operator
//! answers) of a new one and of a refused one — the report printed, nothing kept.

use kube::api::{Api, ListParams};
use nodewright_api::v1alpha1::{NodeWright, NodeWrightPreview};
use serde_json::json;

use super::*;

pub async fn verbs(env: &Env) {
    let file = |name: &str, doc: &Value| {
        let path = env.work.path().join(format!("{name}.yaml"));
        std::fs::write(&path, serde_yaml_ng::to_string(doc).unwrap()).unwrap();
        path.display().to_string()
    };
    // The running NodeWright as it is: nothing to do.
    let tools = file(
        "tools",
        &shell_cr(env, "tools", "/usr/local/bin/count", json!({})),
    );
    let out = ok(env, &["preview", "--quick", "-f", &tools]);
    assert!(
        out.starts_with("nodewright preview of tools: 2 nodes: 0 change, 2 converged, 0 blocked\n"),
        "{out}"
    );
    // A new one: both nodes change, one batch each way the default budget allows; JSON.
    let more = file(
        "more",
        &shell_cr(env, "more", "/usr/local/bin/count", json!({})),
    );
    let out = ok(env, &["preview", "--quick", "-f", &more, "-o", "json"]);
    let v: Value = serde_json::from_str(&out).unwrap();
    let lines: Vec<&str> = v[0]["preview"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l.as_str().unwrap())
        .collect();
    assert_eq!(
        lines[0], "nodewright preview of more: 2 nodes: 2 change, 0 converged, 0 blocked",
        "{out}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains("2 node(s), 2 stages -> complete: n1, n2")),
        "no cordon for a package without an interrupt: {out}"
    );
    let nodewrights = Api::<NodeWright>::all(env.cluster.client.clone());
    let absent = async |name: &str| nodewrights.get_opt(name).await.unwrap().is_none();
    assert!(absent("more").await, "a quick preview creates nothing");
    // Refused by the webhook: said, and the verb fails.
    let mut cyclic = shell_cr(env, "cyclic", "/usr/local/bin/count", json!({}));
    cyclic["spec"]["packages"]["tool"]["dependsOn"] = json!({"tool": "1.0.0"});
    let cyclic = file("cyclic", &cyclic);
    let (success, out, _) = cli(env, &["preview", "--quick", "-f", &cyclic]);
    assert!(!success && out.contains("cyclic: refused: "), "{out}");

    // The full preview: a NodeWrightPreview answered by the operator, printed, then deleted.
    let out = ok(env, &["preview", "-f", &more]);
    assert!(
        out.starts_with("more: 2 nodes: 2 change, 0 converged;"),
        "{out}"
    );
    assert!(
        out.contains("  NODE  COMPARTMENT/BATCH  OUTCOME"),
        "a few nodes are listed: {out}"
    );
    assert!(
        out.contains("  n1  __default__/1  ") && out.contains("  n2  __default__/1  "),
        "each node's compartment and batch: {out}"
    );
    let previews = Api::<NodeWrightPreview>::all(env.cluster.client.clone());
    let left = previews.list(&ListParams::default()).await.unwrap().items;
    assert!(
        left.is_empty(),
        "the CLI deletes the preview it read: {left:?}"
    );
    assert!(absent("more").await, "a preview creates no NodeWright");
    // Refused at its admission, as applying the NodeWright would be.
    let (success, out, _) = cli(env, &["preview", "-f", &cyclic]);
    assert!(!success && out.contains("cyclic: refused: "), "{out}");
    let left = previews.list(&ListParams::default()).await.unwrap().items;
    assert!(
        left.is_empty(),
        "a refused preview is not created: {left:?}"
    );
}
