//! Documentation run as a test: the `sh` blocks of a Markdown page, by section, with the
//! names a reader substitutes (the registry, a node) replaced by the test cluster's.
//!
//! A page's `sh` blocks are its commands; any other fence (`yaml`, `text`, none) is not
//! run. A test takes every block of the page ([`DocPage::take`]) and must account for all
//! of them ([`DocPage::finish`]): a block added to the page without a test to run it fails
//! the test that covers the page.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

/// One `sh` block: the section it is under and its commands (continuation lines joined,
/// comments and blank lines dropped).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Block {
    /// The nearest heading above it, without the `#`s.
    pub section: String,
    /// One command per entry, as a reader would type it.
    pub commands: Vec<String>,
}

/// A Markdown page's `sh` blocks.
#[derive(Debug)]
pub struct DocPage {
    path: PathBuf,
    blocks: Vec<Block>,
    taken: BTreeSet<usize>,
}

impl DocPage {
    /// Reads `path`.
    pub fn read(path: &Path) -> Result<DocPage> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        Ok(DocPage {
            path: path.to_path_buf(),
            blocks: parse(&text)?,
            taken: BTreeSet::new(),
        })
    }

    /// The blocks under `section`, in page order, each with `subs` applied; it is an error
    /// for the section to have none.
    pub fn take(&mut self, section: &str, subs: &Substitutions) -> Result<Vec<Block>> {
        let mut out = Vec::new();
        for (i, b) in self.blocks.iter().enumerate() {
            if b.section == section {
                self.taken.insert(i);
                out.push(Block {
                    section: b.section.clone(),
                    commands: b.commands.iter().map(|c| subs.apply(c)).collect(),
                });
            }
        }
        if out.is_empty() {
            bail!(
                "{} has no sh block under \"{section}\"",
                self.path.display()
            );
        }
        Ok(out)
    }

    /// Fails naming every block no test took.
    pub fn finish(&self) -> Result<()> {
        let left: Vec<String> = (0..self.blocks.len())
            .filter(|i| !self.taken.contains(i))
            .map(|i| {
                format!(
                    "under \"{}\": {:?}",
                    self.blocks[i].section, self.blocks[i].commands
                )
            })
            .collect();
        if !left.is_empty() {
            bail!(
                "{} has sh blocks no test runs:\n{}",
                self.path.display(),
                left.join("\n")
            );
        }
        Ok(())
    }
}

/// Reads a page's `sh` blocks.
fn parse(text: &str) -> Result<Vec<Block>> {
    let mut blocks = Vec::new();
    let mut section = String::new();
    let mut lines = text.lines().enumerate();
    while let Some((n, line)) = lines.next() {
        if let Some(fence) = line.trim_start().strip_prefix("```") {
            let shell = fence.trim() == "sh";
            let mut commands = Vec::new();
            let mut pending = String::new();
            let mut closed = false;
            for (_, body) in lines.by_ref() {
                if body.trim_start().starts_with("```") {
                    closed = true;
                    break;
                }
                if !shell {
                    continue;
                }
                let body = body.trim();
                if pending.is_empty() && (body.is_empty() || body.starts_with('#')) {
                    continue;
                }
                match body.strip_suffix('\\') {
                    Some(head) => {
                        pending.push_str(head.trim_end());
                        pending.push(' ');
                    }
                    None => {
                        pending.push_str(body);
                        commands.push(std::mem::take(&mut pending));
                    }
                }
            }
            if !closed {
                bail!("the fence on line {} is never closed", n + 1);
            }
            if !pending.is_empty() {
                bail!(
                    "the sh block on line {} ends in a continuation: {pending}",
                    n + 1
                );
            }
            if shell {
                blocks.push(Block {
                    section: section.clone(),
                    commands,
                });
            }
        } else if let Some(heading) = line.strip_prefix('#') {
            section = heading.trim_start_matches('#').trim().to_string();
        }
    }
    Ok(blocks)
}

/// The names a reader replaces with their own (`registry.example.com/nodewright` → the test
/// registry), applied to commands and to the files they name.
#[derive(Clone, Debug, Default)]
pub struct Substitutions(Vec<(String, String)>);

impl Substitutions {
    /// Replaces `from` with `to`.
    pub fn with(mut self, from: &str, to: &str) -> Self {
        self.0.push((from.to_string(), to.to_string()));
        self
    }

    /// `text` with every substitution made.
    pub fn apply(&self, text: &str) -> String {
        self.0
            .iter()
            .fold(text.to_string(), |t, (from, to)| t.replace(from, to))
    }

    /// Whether `text` holds a name to replace.
    fn applies_to(&self, text: &str) -> bool {
        self.0.iter().any(|(from, _)| text.contains(from))
    }

    /// `command` with each argument that names a file under `base` holding a name to
    /// replace pointed at a copy with the names replaced, written under `copies` — what a
    /// reader does who edits the example before applying it.
    pub fn localize_files(&self, command: &str, base: &Path, copies: &Path) -> Result<String> {
        let mut words = Vec::new();
        for word in command.split(' ') {
            let file = base.join(word);
            let text = match std::fs::read_to_string(&file) {
                Ok(t) if !word.is_empty() && file.is_file() && self.applies_to(&t) => t,
                _ => {
                    words.push(word.to_string());
                    continue;
                }
            };
            let copy = copies.join(word);
            if let Some(dir) = copy.parent() {
                std::fs::create_dir_all(dir)?;
            }
            std::fs::write(&copy, self.apply(&text))
                .with_context(|| format!("writing {}", copy.display()))?;
            words.push(copy.display().to_string());
        }
        Ok(words.join(" "))
    }
}

/// Whether `printed` is `doc` as a reader would see it printed: the same words, where the
/// doc's `sha256:...` stands for any digest and `path` for any path ending in it, and
/// `printed` may add the `--set NAME=…` pairs named in `extra_sets`.
pub fn same_shape(doc: &str, printed: &str, extra_sets: &[&str]) -> bool {
    let mut printed: Vec<&str> = printed.split_whitespace().collect();
    // Drop the pairs the doc says may be added.
    let mut i = 0;
    while i + 1 < printed.len() {
        if printed[i] == "--set" && extra_sets.iter().any(|s| printed[i + 1].starts_with(s)) {
            printed.drain(i..i + 2);
        } else {
            i += 1;
        }
    }
    let doc: Vec<&str> = doc.split_whitespace().collect();
    doc.len() == printed.len()
        && doc.iter().zip(&printed).all(|(d, p)| {
            if let Some(prefix) = d.strip_suffix("sha256:...") {
                return p.strip_prefix(prefix).is_some_and(|rest| {
                    rest.strip_prefix("sha256:").is_some_and(|hex| {
                        hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit())
                    })
                });
            }
            d == p || (d.contains('/') && p.ends_with(&format!("/{d}")))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: &str = "# Title\n\n## Publish\n\n```sh\ncargo xtask publish --registry registry.example.com/nodewright\n# a comment\n```\n\n```yaml\nnot: run\n```\n\n## Install\n\n```sh\nkubectl create namespace nodewright\nhelm install nodewright deploy/chart/nodewright \\\n  --set image.digest=sha256:...\n```\n";

    #[test]
    fn sh_blocks_are_read_by_section_with_continuations_joined() {
        let blocks = parse(PAGE).unwrap();
        assert_eq!(
            blocks,
            vec![
                Block {
                    section: "Publish".into(),
                    commands: vec![
                        "cargo xtask publish --registry registry.example.com/nodewright".into()
                    ],
                },
                Block {
                    section: "Install".into(),
                    commands: vec![
                        "kubectl create namespace nodewright".into(),
                        "helm install nodewright deploy/chart/nodewright --set image.digest=sha256:..."
                            .into()
                    ],
                },
            ]
        );
        assert!(
            parse("## A\n```sh\nls \\\n```\n").is_err(),
            "a dangling continuation"
        );
        assert!(parse("## A\n```sh\nls\n").is_err(), "an unclosed fence");
    }

    #[test]
    fn a_block_no_test_took_fails_the_page() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("page.md");
        std::fs::write(&path, PAGE).unwrap();
        let subs =
            Substitutions::default().with("registry.example.com/nodewright", "10.0.0.1:5000/nw");
        let mut page = DocPage::read(&path).unwrap();
        let publish = page.take("Publish", &subs).unwrap();
        assert_eq!(
            publish[0].commands,
            ["cargo xtask publish --registry 10.0.0.1:5000/nw"]
        );
        let left = page.finish().unwrap_err().to_string();
        assert!(left.contains("under \"Install\""), "{left}");
        page.take("Install", &subs).unwrap();
        page.finish().unwrap();
        assert!(
            page.take("Upgrade", &subs).is_err(),
            "a section with no block"
        );
    }

    #[test]
    fn files_a_command_names_are_copied_with_the_names_replaced() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("examples")).unwrap();
        std::fs::write(
            dir.path().join("examples/a.yaml"),
            "plugin: registry.example.com/nodewright/plugins/sysctl:0.1.0\n",
        )
        .unwrap();
        std::fs::write(dir.path().join("examples/b.yaml"), "untouched\n").unwrap();
        let subs = Substitutions::default().with("registry.example.com/nodewright", "r:1/nw");
        let copies = dir.path().join("copies");
        let line = subs
            .localize_files(
                "kubectl apply -f examples/a.yaml -f examples/b.yaml",
                dir.path(),
                &copies,
            )
            .unwrap();
        let copy = copies.join("examples/a.yaml");
        assert_eq!(
            line,
            format!("kubectl apply -f {} -f examples/b.yaml", copy.display())
        );
        assert_eq!(
            std::fs::read_to_string(copy).unwrap(),
            "plugin: r:1/nw/plugins/sysctl:0.1.0\n"
        );
    }

    /// The real-node test runs these sections of docs/getting-started.md, and it runs only
    /// where a real node can start: a block added elsewhere on the page fails here first.
    #[test]
    fn getting_started_has_only_the_blocks_the_real_node_test_runs() {
        let path = nodewright_testregistry::workspace().join("docs/getting-started.md");
        let mut page = DocPage::read(&path).unwrap();
        let subs = Substitutions::default();
        for section in ["Publish", "Install", "A first rollout", "Uninstalling"] {
            page.take(section, &subs).unwrap();
        }
        page.finish().unwrap();
    }

    #[test]
    fn printed_commands_match_the_documented_shape() {
        let doc = "helm install nodewright deploy/chart/nodewright --namespace nodewright --set registry=r/nw --set image.digest=sha256:...";
        let digest = "a".repeat(64);
        let printed = format!(
            "helm install nodewright /src/deploy/chart/nodewright --namespace nodewright --set registry=r/nw --set image.digest=sha256:{digest} --set insecureRegistries[0]=r"
        );
        assert!(same_shape(doc, &printed, &["insecureRegistries["]));
        assert!(
            !same_shape(doc, &printed, &[]),
            "an extra value not allowed"
        );
        let short = printed.replace(&digest, "abc");
        assert!(
            !same_shape(doc, &short, &["insecureRegistries["]),
            "not a digest"
        );
        let other = printed.replace("--namespace nodewright", "--namespace other");
        assert!(!same_shape(doc, &other, &["insecureRegistries["]));
    }
}
