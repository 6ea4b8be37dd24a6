//! Registry credentials: explicit, or a docker `config.json`.

use std::path::PathBuf;

use base64::Engine as _;
use oci_client::secrets::RegistryAuth;

use crate::error::{Error, Result};

/// Where credentials come from. Its `Debug` names the sources, never a password or a
/// config's text (a Secret's content must not reach a log).
#[derive(Clone, Default, PartialEq, Eq)]
pub enum Credentials {
    /// No credentials.
    #[default]
    Anonymous,
    /// A username and password for every registry this client talks to.
    Basic {
        /// User.
        username: String,
        /// Password.
        password: String,
    },
    /// A docker `config.json` (`auths.<registry>.auth` or `username`/`password`).
    /// Registries without an entry are accessed anonymously. Credential helpers
    /// (`credsStore`, `credHelpers`) are not run: a registry that only has a helper is an
    /// error naming it, rather than a silent anonymous pull.
    DockerConfig(PathBuf),
    /// A docker config's text already in hand: a `kubernetes.io/dockerconfigjson` Secret's
    /// `.dockerconfigjson`, read the same way as a `config.json`; `origin` names it in errors
    /// (e.g. `secret nodewright/regcred`).
    DockerConfigText {
        /// Where the text came from.
        origin: String,
        /// The JSON.
        json: String,
    },
    /// Several sources asked in order: the first that has credentials for a registry gives
    /// them; a registry none of them knows is accessed anonymously. A source that fails
    /// (unreadable, malformed, helper-only) is an error, never skipped.
    Chain(Vec<Credentials>),
}

impl Credentials {
    /// The docker config at `$DOCKER_CONFIG/config.json` or `~/.docker/config.json`, when it
    /// exists; anonymous otherwise.
    pub fn from_environment() -> Credentials {
        let dir = std::env::var_os("DOCKER_CONFIG")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".docker")));
        match dir.map(|d| d.join("config.json")) {
            Some(p) if p.exists() => Credentials::DockerConfig(p),
            _ => Credentials::Anonymous,
        }
    }

    /// A username and password when both are given, the environment's docker config when
    /// neither is; one without the other is an error (never a silent anonymous push).
    pub fn explicit_or_environment(
        username: Option<String>,
        password: Option<String>,
    ) -> Result<Credentials> {
        match (username, password) {
            (Some(username), Some(password)) => Ok(Credentials::Basic { username, password }),
            (None, None) => Ok(Credentials::from_environment()),
            _ => Err(Error::Config {
                path: "registry login".into(),
                reason: "a username and a password go together".into(),
            }),
        }
    }

    /// The auth to use for `registry` (`host[:port]`).
    pub(crate) fn for_registry(&self, registry: &str) -> Result<RegistryAuth> {
        match self {
            Credentials::Anonymous => Ok(RegistryAuth::Anonymous),
            Credentials::Basic { username, password } => {
                Ok(RegistryAuth::Basic(username.clone(), password.clone()))
            }
            Credentials::DockerConfig(path) => {
                let text = std::fs::read_to_string(path).map_err(|e| {
                    config_err(&path.display(), format!("cannot read docker config: {e}"))
                })?;
                docker_config_auth(&path.display(), &text, registry)
            }
            Credentials::DockerConfigText { origin, json } => {
                docker_config_auth(origin, json, registry)
            }
            Credentials::Chain(sources) => {
                for source in sources {
                    match source.for_registry(registry)? {
                        RegistryAuth::Anonymous => continue,
                        auth => return Ok(auth),
                    }
                }
                Ok(RegistryAuth::Anonymous)
            }
        }
    }
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Credentials::Anonymous => f.write_str("Anonymous"),
            Credentials::Basic { username, .. } => f
                .debug_struct("Basic")
                .field("username", username)
                .finish_non_exhaustive(),
            Credentials::DockerConfig(path) => f.debug_tuple("DockerConfig").field(path).finish(),
            Credentials::DockerConfigText { origin, .. } => f
                .debug_struct("DockerConfigText")
                .field("origin", origin)
                .finish_non_exhaustive(),
            Credentials::Chain(sources) => f.debug_list().entries(sources).finish(),
        }
    }
}

fn config_err(origin: &dyn std::fmt::Display, reason: impl Into<String>) -> Error {
    Error::Config {
        path: origin.to_string(),
        reason: reason.into(),
    }
}

/// Normalises a docker config key (`https://host/v1/`, `host`) to `host[:port]`.
fn key_host(key: &str) -> &str {
    let k = key
        .strip_prefix("https://")
        .or_else(|| key.strip_prefix("http://"))
        .unwrap_or(key);
    k.split('/').next().unwrap_or(k)
}

/// The auth a docker config's JSON (`origin` names it) gives `registry`.
fn docker_config_auth(
    path: &dyn std::fmt::Display,
    text: &str,
    registry: &str,
) -> Result<RegistryAuth> {
    let json: serde_json::Value =
        serde_json::from_str(text).map_err(|e| config_err(path, format!("not valid JSON: {e}")))?;
    let entry = json["auths"].as_object().and_then(|auths| {
        auths
            .iter()
            .find(|(k, _)| key_host(k) == registry)
            .map(|(_, v)| v)
    });
    if let Some(entry) = entry {
        if let (Some(u), Some(p)) = (entry["username"].as_str(), entry["password"].as_str()) {
            return Ok(RegistryAuth::Basic(u.into(), p.into()));
        }
        if let Some(encoded) = entry["auth"].as_str().filter(|s| !s.is_empty()) {
            let decoded = base64::engine::general_purpose::STANDARD
                .decode(encoded)
                .map_err(|e| {
                    config_err(path, format!("auths.{registry}.auth is not base64: {e}"))
                })?;
            let decoded = String::from_utf8(decoded)
                .map_err(|_| config_err(path, format!("auths.{registry}.auth is not UTF-8")))?;
            let (u, p) = decoded.split_once(':').ok_or_else(|| {
                config_err(
                    path,
                    format!("auths.{registry}.auth does not decode to user:password"),
                )
            })?;
            return Ok(RegistryAuth::Basic(u.into(), p.into()));
        }
        if entry["identitytoken"].is_string() {
            return Err(config_err(
                path,
                format!(
                    "auths.{registry} has only an identity token, which nodewright does not exchange; use a username/password"
                ),
            ));
        }
    }
    let helper = json["credHelpers"]
        .get(registry)
        .and_then(|v| v.as_str())
        .or_else(|| json["credsStore"].as_str());
    match helper {
        Some(h) => Err(config_err(
            path,
            format!(
                "{registry} uses credential helper docker-credential-{h}, which nodewright does not run; put the credentials in auths or pass them explicitly"
            ),
        )),
        None => Ok(RegistryAuth::Anonymous),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(json: &str) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("config.json");
        std::fs::write(&p, json).unwrap();
        (dir, p)
    }

    fn basic(a: RegistryAuth) -> Option<(String, String)> {
        match a {
            RegistryAuth::Basic(u, p) => Some((u, p)),
            _ => None,
        }
    }

    #[test]
    fn reads_auth_and_username_password_entries() {
        let (_d, p) = write(
            r#"{"auths": {"https://reg.example:5000/v1/": {"auth": "YWxpY2U6czNjcmV0"}, "other.example": {"username": "bob", "password": "pw"}}}"#,
        );
        let c = Credentials::DockerConfig(p);
        assert_eq!(
            basic(c.for_registry("reg.example:5000").unwrap()),
            Some(("alice".into(), "s3cret".into()))
        );
        assert_eq!(
            basic(c.for_registry("other.example").unwrap()),
            Some(("bob".into(), "pw".into()))
        );
        assert!(matches!(
            c.for_registry("unknown.example").unwrap(),
            RegistryAuth::Anonymous
        ));
    }

    #[test]
    fn helpers_are_a_clear_error_not_a_silent_anonymous_pull() {
        let (_d, p) = write(r#"{"auths": {}, "credHelpers": {"gcr.io": "gcloud"}}"#);
        let err = Credentials::DockerConfig(p)
            .for_registry("gcr.io")
            .unwrap_err();
        assert!(
            err.to_string().contains("docker-credential-gcloud"),
            "{err}"
        );
    }

    #[test]
    fn malformed_entries_name_the_field() {
        let (_d, p) = write(r#"{"auths": {"r.example": {"auth": "!!!"}}}"#);
        let err = Credentials::DockerConfig(p)
            .for_registry("r.example")
            .unwrap_err();
        assert!(
            err.to_string()
                .contains("auths.r.example.auth is not base64"),
            "{err}"
        );
    }

    #[test]
    fn debug_output_holds_no_secret() {
        let c = Credentials::Chain(vec![
            Credentials::Basic {
                username: "u".into(),
                password: "hunter2".into(),
            },
            Credentials::DockerConfigText {
                origin: "secret nodewright/login".into(),
                json: r#"{"auths": {"r": {"auth": "c2VjcmV0"}}}"#.into(),
            },
        ]);
        let text = format!("{c:?}");
        assert!(
            !text.contains("hunter2")
                && !text.contains("c2VjcmV0")
                && text.contains("nodewright/login"),
            "{text}"
        );
    }

    #[test]
    fn a_chain_takes_the_first_source_that_knows_the_registry() {
        let (_d, p) = write(r#"{"auths": {"a.example": {"username": "file", "password": "1"}}}"#);
        let secret = Credentials::DockerConfigText {
            origin: "secret nodewright/regcred".into(),
            json: r#"{"auths": {"a.example": {"username": "secret", "password": "2"}, "b.example": {"username": "bee", "password": "3"}}}"#.into(),
        };
        let chain = Credentials::Chain(vec![secret, Credentials::DockerConfig(p)]);
        assert_eq!(
            basic(chain.for_registry("a.example").unwrap()),
            Some(("secret".into(), "2".into()))
        );
        assert_eq!(
            basic(chain.for_registry("b.example").unwrap()),
            Some(("bee".into(), "3".into()))
        );
        assert!(matches!(
            chain.for_registry("c.example").unwrap(),
            RegistryAuth::Anonymous
        ));
        let broken = Credentials::Chain(vec![
            Credentials::DockerConfigText {
                origin: "secret nodewright/broken".into(),
                json: "{".into(),
            },
            Credentials::Basic {
                username: "u".into(),
                password: "p".into(),
            },
        ]);
        let err = broken.for_registry("a.example").unwrap_err();
        assert!(
            err.to_string().contains("secret nodewright/broken"),
            "a malformed source is named, not skipped: {err}"
        );
    }
}
