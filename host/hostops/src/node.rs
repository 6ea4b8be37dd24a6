//! What the host says about itself: the node's facts and identity, `/etc/os-release`.

use serde::{Deserialize, Serialize};

/// Facts about the node.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeInfo {
    /// Kubernetes node name.
    pub name: String,
    /// Node labels.
    pub labels: Vec<(String, String)>,
    /// Running kernel release.
    pub kernel_release: String,
    /// `/etc/os-release` pairs.
    pub os_release: Vec<(String, String)>,
    /// Current boot ID.
    pub boot_id: String,
    /// CPU architecture.
    pub architecture: String,
}

/// Who the node is, as the agent learnt it from the Node object (or the CLI's flags).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeIdentity {
    /// Kubernetes node name.
    pub name: String,
    /// Node labels.
    pub labels: Vec<(String, String)>,
}

/// Parses `/etc/os-release` content into pairs, unquoting values.
pub fn parse_os_release(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter_map(|line| {
            let line = line.trim();
            if line.starts_with('#') {
                return None;
            }
            let (k, v) = line.split_once('=')?;
            let v = v.trim().trim_matches('"').trim_matches('\'');
            Some((k.trim().to_string(), v.to_string()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn os_release_is_unquoted() {
        let pairs =
            parse_os_release("# c\nID=debian\nPRETTY_NAME=\"Debian GNU/Linux 12\"\n\nbad\n");
        assert_eq!(
            pairs,
            vec![
                ("ID".into(), "debian".into()),
                ("PRETTY_NAME".into(), "Debian GNU/Linux 12".into())
            ]
        );
    }
}
