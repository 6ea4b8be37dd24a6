//! Which nodes a verb's NODE arguments mean: each is a node's name or a regular expression
//! matched against whole names (`gpu-[0-3]`, `pool-a-.*`), as NodeWright's node verbs take
//! them. A pattern that matches nothing is an error, never silently no node.

use k8s_openapi::api::core::v1::Node;
use regex::Regex;

/// The nodes `patterns` name, by name, each once. No patterns: every node.
pub fn nodes<'a>(all: &'a [Node], patterns: &[String]) -> Result<Vec<&'a Node>, String> {
    let name = |n: &Node| n.metadata.name.clone().unwrap_or_default();
    let mut picked: Vec<&Node> = if patterns.is_empty() {
        all.iter().collect()
    } else {
        Vec::new()
    };
    for p in patterns {
        let re =
            Regex::new(&format!("^(?:{p})$")).map_err(|e| format!("node pattern {p:?}: {e}"))?;
        let matched: Vec<&Node> = all.iter().filter(|n| re.is_match(&name(n))).collect();
        if matched.is_empty() {
            return Err(format!("no node matches {p:?}"));
        }
        picked.extend(matched);
    }
    picked.sort_by_key(|n| name(n));
    picked.dedup_by_key(|n| name(n));
    Ok(picked)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str) -> Node {
        serde_json::from_value(serde_json::json!({"metadata": {"name": name}})).unwrap()
    }

    fn names(ns: &[&Node]) -> Vec<String> {
        ns.iter()
            .map(|n| n.metadata.name.clone().unwrap())
            .collect()
    }

    #[test]
    fn names_and_patterns_match_whole_names() {
        let all = [node("gpu-10"), node("gpu-1"), node("gpu-2"), node("cpu-1")];
        assert_eq!(
            names(&nodes(&all, &["gpu-1".into()]).unwrap()),
            ["gpu-1"],
            "a name is not a prefix"
        );
        assert_eq!(
            names(&nodes(&all, &["gpu-[12]".into(), "gpu-1".into()]).unwrap()),
            ["gpu-1", "gpu-2"],
            "sorted, each once"
        );
        assert_eq!(
            names(&nodes(&all, &[".*-1".into()]).unwrap()),
            ["cpu-1", "gpu-1"]
        );
        assert_eq!(nodes(&all, &[]).unwrap().len(), 4, "no pattern: every node");
    }

    #[test]
    fn a_pattern_that_matches_nothing_or_does_not_parse_is_an_error() {
        let all = [node("gpu-1")];
        assert_eq!(
            nodes(&all, &["gpu-1".into(), "gpu-9".into()]).unwrap_err(),
            "no node matches \"gpu-9\""
        );
        assert!(
            nodes(&all, &["gpu-(".into()])
                .unwrap_err()
                .starts_with("node pattern \"gpu-(\"")
        );
    }
}
