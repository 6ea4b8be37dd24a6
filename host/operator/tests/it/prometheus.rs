//! A real Prometheus (Debian's) on a loopback port, for the tests that need one: health
//! gates that ask it for alerts, and the shipped alert rules evaluated over the operator's
//! own metrics.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// A Prometheus process with a rule file the test writes (and may rewrite).
pub struct Prometheus {
    child: Option<Child>,
    dir: PathBuf,
    port: u16,
}

impl Prometheus {
    /// Starts one in `dir` evaluating `rules` every second and, with `scrape`, scraping the
    /// operator's metrics on that loopback port every second.
    pub fn start(dir: &Path, rules: &str, scrape: Option<u16>) -> Prometheus {
        std::fs::create_dir_all(dir).unwrap();
        let mut config = String::from(
            "global:\n  evaluation_interval: 1s\n  scrape_interval: 1s\nrule_files: [rules.yml]\n",
        );
        if let Some(port) = scrape {
            config.push_str(&format!(
                "scrape_configs:\n- job_name: nodewright\n  static_configs:\n  - targets: ['127.0.0.1:{port}']\n"
            ));
        }
        std::fs::write(dir.join("prometheus.yml"), config).unwrap();
        let mut p = Prometheus {
            child: None,
            dir: dir.to_path_buf(),
            port: nodewright_testregistry::free_port(),
        };
        p.write_rules(rules);
        p.up();
        p
    }

    /// Replaces the rule file (takes effect at the next start, or with [`Self::reload`]).
    pub fn write_rules(&self, rules: &str) {
        std::fs::write(self.dir.join("rules.yml"), rules).unwrap();
    }

    /// Has Prometheus read its rule file again (SIGHUP).
    pub fn reload(&self) {
        let pid = self.child.as_ref().unwrap().id();
        let _ = Command::new("kill")
            .args(["-HUP", &pid.to_string()])
            .status();
    }

    /// Starts the process (again).
    pub fn up(&mut self) {
        let log = std::fs::File::create(self.dir.join("prometheus.log")).unwrap();
        let child = Command::new("/usr/bin/prometheus")
            .arg(format!(
                "--config.file={}",
                self.dir.join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                self.dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{}", self.port))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect(
                "/usr/bin/prometheus (Debian's prometheus package; cargo xtask setup installs it)",
            );
        self.child = Some(child);
    }

    /// Stops the process.
    pub fn down(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Its HTTP API's base URL.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Its log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("prometheus.log")).unwrap_or_default()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        self.down();
    }
}
