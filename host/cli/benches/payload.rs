//! Payload pull benchmark: one payload of `NODEWRIGHT_PAYLOAD_BENCH_MIB` MiB (default 1024,
//! incompressible) pushed with a plugin to the local registry (Debian's docker-registry),
//! then pulled whole, alternately, by `nodewright plugin pull` — streamed to the cache with
//! its digest computed as it arrives, then unpacked into its read-only tree while hashed
//! again, as a node stages it — and by `crane pull --format oci` (go-containerregistry,
//! built from its Go module: each layer written to an OCI layout, its digest verified).
//! Each run starts from an empty cache or layout. Prints each side's median wall time,
//! throughput and peak RSS (GNU time's maximum resident set), and their ratios pair by pair.
//!
//! Run: `cargo bench -p nodewright-cli --bench payload` (or `cargo xtask bench`).

use std::io::Write;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use nodewright_figures::Figure;

/// Runs `cmd` under GNU time: (wall time, peak RSS in KiB). Panics, with its output, when
/// it fails.
fn measured(cmd: &mut Command) -> (Duration, u64) {
    let report = tempfile::NamedTempFile::new().unwrap();
    let mut timed = Command::new("/usr/bin/time");
    timed
        .args(["-f", "%e %M", "-o"])
        .arg(report.path())
        .arg(cmd.get_program())
        .args(cmd.get_args())
        .envs(cmd.get_envs().filter_map(|(k, v)| Some((k, v?))));
    let out = timed.output().expect("GNU time (/usr/bin/time) is needed");
    assert!(
        out.status.success(),
        "{:?} failed: {}{}",
        cmd,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(report.path()).unwrap();
    let mut fields = text.split_whitespace();
    let secs: f64 = fields.next().unwrap().parse().unwrap();
    let kib: u64 = fields.next().unwrap().parse().unwrap();
    (Duration::from_secs_f64(secs), kib)
}

/// `bytes` of incompressible data (xorshift), written in 1 MiB chunks.
fn write_payload(path: &Path, bytes: u64) {
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut chunk = vec![0u8; 1 << 20];
    for _ in 0..bytes / chunk.len() as u64 {
        for word in chunk.chunks_exact_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            word.copy_from_slice(&x.to_le_bytes());
        }
        f.write_all(&chunk).unwrap();
    }
    f.flush().unwrap();
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

fn main() {
    let mib: u64 = std::env::var("NODEWRIGHT_PAYLOAD_BENCH_MIB").map_or(1024, |v| {
        v.parse().expect("NODEWRIGHT_PAYLOAD_BENCH_MIB is a number")
    });
    let runs: usize = std::env::var("NODEWRIGHT_PAYLOAD_BENCH_RUNS").map_or(5, |v| {
        v.parse()
            .expect("NODEWRIGHT_PAYLOAD_BENCH_RUNS is a number")
    });
    let crane =
        nodewright_testregistry::crane_binary().expect("crane (tests/cluster/build-crane.sh)");
    let reg = nodewright_testregistry::TestRegistry::start();
    let nodewright = env!("CARGO_BIN_EXE_nodewright");
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("big.bin");
    write_payload(&file, mib << 20);
    let reference = format!("{}/bench/payload:1", reg.host());
    let push_cache = tmp.path().join("push-cache");
    let push = Command::new(nodewright)
        .args(["plugin", "push", nodewright_artifacts::SYSCTL, &reference])
        .arg("--payload")
        .arg(format!("big={}", file.display()))
        .args(["--insecure-registry", reg.host()])
        .env("NODEWRIGHT_CACHE_DIR", &push_cache)
        .output()
        .unwrap();
    assert!(
        push.status.success(),
        "push: {}",
        String::from_utf8_lossy(&push.stderr)
    );
    std::fs::remove_file(&file).unwrap();
    println!(
        "payload pull: {mib} MiB from the local registry, {runs} runs each, alternating, each into an empty cache"
    );

    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    for i in 0..runs {
        let cache = tmp.path().join(format!("cache-{i}"));
        ours.push(measured(
            Command::new(nodewright)
                .args([
                    "plugin",
                    "pull",
                    &reference,
                    "--insecure-registry",
                    reg.host(),
                ])
                .env("NODEWRIGHT_CACHE_DIR", &cache),
        ));
        std::fs::remove_dir_all(&cache).unwrap();
        let layout = tmp.path().join(format!("layout-{i}"));
        theirs.push(measured(
            Command::new(&crane)
                .args(["pull", "--insecure", "--format", "oci", &reference])
                .arg(&layout),
        ));
        std::fs::remove_dir_all(&layout).unwrap();
    }
    let mib_s = |d: &Duration| mib as f64 / d.as_secs_f64();
    for (who, xs) in [("nodewright plugin pull", &ours), ("crane pull", &theirs)] {
        let wall = Figure::timed(
            "payload",
            format!("{who}: wall"),
            xs.iter().map(|x| x.0).collect(),
        );
        wall.write();
        let throughput = median(xs.iter().map(|x| mib_s(&x.0)).collect());
        let rss = median(xs.iter().map(|x| x.1 as f64 / 1024.0).collect());
        Figure::value("payload", format!("{who}: throughput"), "MiB/s", throughput).write();
        Figure::value("payload", format!("{who}: peak RSS"), "MiB", rss).write();
        println!(
            "{who:<24} median {:>7.2} s   {throughput:>7.1} MiB/s   peak RSS {rss:>6.1} MiB",
            median(xs.iter().map(|x| x.0.as_secs_f64()).collect())
        );
    }
    let ratio = median(
        ours.iter()
            .zip(&theirs)
            .map(|(a, b)| b.0.as_secs_f64() / a.0.as_secs_f64())
            .collect(),
    );
    Figure::value(
        "payload",
        "throughput ratio, nodewright / crane",
        "x",
        ratio,
    )
    .write();
    println!("throughput ratio nodewright / crane (median of pairs): {ratio:.2}x (goal >= 1.0x)");
}
