//! Previewing: `preview -f` of the running NodeWright, of a new one, and of one the
//! webhook refuses — the operator's forecast printed, nothing persisted.

use kube::api::Api;
use nodewright_api::v1alpha1::NodeWright;
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
    let out = ok(env, &["preview", "-f", &tools]);
    assert!(
        out.starts_with("nodewright preview of tools: 2 nodes: 0 change, 2 converged, 0 blocked\n"),
        "{out}"
    );
    // A new one: both nodes change, one batch each way the default budget allows; JSON.
    let more = file(
        "more",
        &shell_cr(env, "more", "/usr/local/bin/count", json!({})),
    );
    let out = ok(env, &["preview", "-f", &more, "-o", "json"]);
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
    assert!(
        Api::<NodeWright>::all(env.cluster.client.clone())
            .get_opt("more")
            .await
            .unwrap()
            .is_none(),
        "a preview creates nothing"
    );
    // Refused by the webhook: said, and the verb fails.
    let mut cyclic = shell_cr(env, "cyclic", "/usr/local/bin/count", json!({}));
    cyclic["spec"]["packages"]["tool"]["dependsOn"] = json!({"tool": "1.0.0"});
    let cyclic = file("cyclic", &cyclic);
    let (success, out, _) = cli(env, &["preview", "-f", &cyclic]);
    assert!(!success && out.contains("cyclic: refused: "), "{out}");
}
