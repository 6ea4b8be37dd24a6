//! The registry harness, and whether a test's prerequisites are set up.
//!
//! [`TestRegistry`] is a real OCI registry (Debian's `docker-registry`, the CNCF
//! distribution server) on a free loopback port with its own storage directory, started
//! per test and killed on drop. If the binary is missing and we are root, it is installed
//! with apt (under a lock, so parallel test binaries do not race). [`setup`] says whether the
//! registry, the control plane, helm and cosign are there, and [`require!`] skips a test
//! (saying why) when they are not.

pub mod image;
pub mod setup;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const REGISTRY_BIN: &str = "/usr/bin/docker-registry";

/// The workspace root.
pub fn workspace() -> PathBuf {
    // Cargo names the package under test at run time, and this crate at build time. A
    // target directory shared between checkouts can hold this crate built in another one
    // (cargo finds it fresh), so the run-time answer comes first.
    let built = Path::new(env!("CARGO_MANIFEST_DIR"));
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .and_then(|dir| {
            dir.ancestors()
                .find(|d| d.join("Cargo.lock").is_file())
                .map(Path::to_path_buf)
        })
        .unwrap_or_else(|| {
            built
                .ancestors()
                .nth(2)
                .expect("workspace root")
                .to_path_buf()
        })
}

/// Whether this process runs as root (and may install Debian packages).
fn running_as_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// A running registry.
#[derive(Debug)]
pub struct TestRegistry {
    child: Option<Child>,
    host: String,
    dir: tempfile::TempDir,
    tls: bool,
}

/// Installs `docker-registry` if missing.
pub fn ensure_registry_installed() -> PathBuf {
    let bin = PathBuf::from(REGISTRY_BIN);
    if bin.exists() {
        return bin;
    }
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open("/tmp/nodewright-apt.lock")
        .expect("apt lock file");
    lock.lock().expect("apt lock");
    if !bin.exists() {
        eprintln!("installing docker-registry with apt (test harness)");
        let ok = Command::new("sh")
            .args(["-c", "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker-registry"])
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        assert!(
            ok && bin.exists(),
            "could not install docker-registry; as root run: apt-get install -y docker-registry"
        );
    }
    bin
}

/// A free loopback port for a server we are about to start.
///
/// Chosen at random below the kernel's ephemeral range (`ip_local_port_range`) and checked
/// bindable: a port the kernel handed out with `bind(0)` and we released can be given
/// again as the source port of any outgoing connection before our server binds it (CI saw
/// kube-apiserver fail with "address already in use" that way). Below the range only
/// another explicit pick can collide, which the control plane's start retries.
pub fn free_port() -> u16 {
    use std::hash::{BuildHasher, Hasher};
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    if low > 12_000 {
        let span = u64::from(low - 10_000);
        let seed = std::collections::hash_map::RandomState::new();
        for attempt in 0u64..200 {
            let mut h = seed.build_hasher();
            h.write_u64(attempt);
            h.write_u128(
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap_or_default()
                    .as_nanos(),
            );
            let port = 10_000 + (h.finish() % span) as u16;
            if TcpListener::bind(("127.0.0.1", port)).is_ok() {
                return port;
            }
        }
    }
    TcpListener::bind("127.0.0.1:0")
        .expect("bind loopback")
        .local_addr()
        .unwrap()
        .port()
}

/// `GET /v2/` status code, or `None` when nothing listens.
fn v2_status(host: &str) -> Option<u16> {
    let mut s = TcpStream::connect_timeout(&host.parse().ok()?, Duration::from_millis(200)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(s, "GET /v2/ HTTP/1.0\r\nHost: {host}\r\n\r\n").ok()?;
    let mut buf = [0u8; 64];
    let n = s.read(&mut buf).ok()?;
    let line = String::from_utf8_lossy(&buf[..n]);
    line.split_whitespace().nth(1)?.parse().ok()
}

impl TestRegistry {
    /// An anonymous registry.
    pub fn start() -> Self {
        Self::launch(None)
    }

    /// An anonymous registry listening on every interface (a real test node in a network
    /// namespace of its own reaches it on its link's address); [`TestRegistry::host`] is
    /// still its loopback address.
    pub fn start_on_all_interfaces() -> Self {
        Self::launch_with_listen(None, false, true)
    }

    /// A registry requiring HTTP basic auth for `user`/`password` (htpasswd, bcrypt).
    pub fn start_with_auth(user: &str, password: &str) -> Self {
        Self::launch(Some((user, password)))
    }

    /// A registry serving HTTPS with a certificate for 127.0.0.1 signed by a fresh test CA
    /// (made with the openssl CLI); [`TestRegistry::ca_file`] is that CA.
    pub fn start_tls() -> Self {
        Self::launch_with(None, true)
    }

    /// A TLS registry (as [`TestRegistry::start_tls`]) that also requires HTTP basic auth
    /// for `user`/`password`: a private registry with an internal CA.
    pub fn start_tls_with_auth(user: &str, password: &str) -> Self {
        Self::launch_with(Some((user, password)), true)
    }

    /// The CA that signed a TLS registry's certificate.
    pub fn ca_file(&self) -> PathBuf {
        self.dir.path().join("ca.crt")
    }

    fn launch(auth: Option<(&str, &str)>) -> Self {
        Self::launch_with(auth, false)
    }

    fn make_certs(dir: &Path) {
        let run = |args: &[&str]| {
            let ok = Command::new("openssl")
                .args(args)
                .current_dir(dir)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .map(|s| s.success())
                .unwrap_or(false);
            assert!(ok, "openssl {args:?} failed");
        };
        run(&[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
            "-days",
            "2",
            "-subj",
            "/CN=nodewright-test-ca",
        ]);
        run(&[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "tls.key",
            "-out",
            "tls.csr",
            "-subj",
            "/CN=127.0.0.1",
        ]);
        std::fs::write(
            dir.join("ext.cnf"),
            "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
        )
        .unwrap();
        run(&[
            "x509",
            "-req",
            "-in",
            "tls.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "tls.crt",
            "-days",
            "2",
            "-extfile",
            "ext.cnf",
        ]);
    }

    fn launch_with(auth: Option<(&str, &str)>, tls: bool) -> Self {
        Self::launch_with_listen(auth, tls, false)
    }

    fn launch_with_listen(auth: Option<(&str, &str)>, tls: bool, all_interfaces: bool) -> Self {
        ensure_registry_installed();
        let dir = tempfile::tempdir().expect("registry dir");
        let port = free_port();
        let host = format!("127.0.0.1:{port}");
        let listen = if all_interfaces {
            format!("0.0.0.0:{port}")
        } else {
            host.clone()
        };
        let mut config = format!(
            "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: {listen}\n  secret: nodewright-test\n",
            dir.path().join("data").display()
        );
        if tls {
            Self::make_certs(dir.path());
            config.push_str(&format!(
                "  tls:\n    certificate: {}\n    key: {}\n",
                dir.path().join("tls.crt").display(),
                dir.path().join("tls.key").display()
            ));
        }
        if let Some((user, password)) = auth {
            let hash = bcrypt::hash(password, 5).expect("bcrypt");
            std::fs::write(dir.path().join("htpasswd"), format!("{user}:{hash}\n")).unwrap();
            config.push_str(&format!(
                "auth:\n  htpasswd:\n    realm: nodewright-test\n    path: {}\n",
                dir.path().join("htpasswd").display()
            ));
        }
        std::fs::write(dir.path().join("config.yml"), config).unwrap();
        let mut reg = TestRegistry {
            child: None,
            host,
            dir,
            tls,
        };
        reg.serve();
        reg
    }

    /// Starts the registry process on this registry's address and storage, and waits until
    /// it answers.
    fn serve(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("registry.log"))
            .unwrap();
        let child = Command::new(ensure_registry_installed())
            .arg("serve")
            .arg(self.dir.path().join("config.yml"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start docker-registry");
        self.child = Some(child);
        let started = Instant::now();
        loop {
            let up = if self.tls {
                TcpStream::connect(&self.host).is_ok().then_some(200)
            } else {
                v2_status(&self.host)
            };
            match up {
                Some(200 | 401) => break,
                _ if started.elapsed() > Duration::from_secs(20) => {
                    panic!("registry did not start on {}: {}", self.host, self.log());
                }
                _ => std::thread::sleep(Duration::from_millis(50)),
            }
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("registry exited with {status}: {}", self.log());
            }
        }
    }

    /// Starts a stopped registry again at the same address, with the same content.
    pub fn restart(&mut self) {
        self.stop();
        self.serve();
    }

    /// `127.0.0.1:<port>`.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The registry's storage directory (to tamper with blobs).
    pub fn storage(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// The registry's log.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("registry.log")).unwrap_or_default()
    }

    /// Stops the registry (the port then refuses connections).
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Path of a blob in the registry's filesystem storage.
    pub fn blob_path(&self, digest: &str) -> PathBuf {
        let hex = digest.trim_start_matches("sha256:");
        self.storage().join(format!(
            "docker/registry/v2/blobs/sha256/{}/{hex}/data",
            &hex[..2]
        ))
    }
}

impl Drop for TestRegistry {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Builds (once, cached) the `cosign` CLI from its Go module and returns its path.
pub fn cosign_binary() -> Result<PathBuf, String> {
    go_tool("cosign")
}

/// Builds (once, cached) the `crane` CLI from its Go module and returns its path.
pub fn crane_binary() -> Result<PathBuf, String> {
    go_tool("crane")
}

/// A Go tool `tests/cluster/build-<name>.sh` builds once and caches; its path.
fn go_tool(name: &str) -> Result<PathBuf, String> {
    let script = workspace().join(format!("tests/cluster/build-{name}.sh"));
    let out = Command::new("bash")
        .arg(&script)
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("run {}: {e}", script.display()))?;
    if !out.status.success() {
        return Err(format!("building {name} failed ({})", script.display()));
    }
    Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

/// Reads a file or panics naming it.
pub fn read(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}
