//! A plugin payload's download cut off part way resumes from the last checkpoint of its
//! staging tree — with a range request, and no copy of the layer kept — and a checkpoint
//! that does not fit its layer, or lies about the hash, never gets wrong bytes used.

use crate::payloads::{push_with, try_stage};
use crate::support::*;

use std::path::Path;
use std::sync::{Arc, Mutex};

use nodewright_api::payload::PayloadName;
use nodewright_api::pinned::PinnedRef;
use nodewright_oci::payload::pack;
use nodewright_oci::{Error, NodeCache, Pulled, Puller, Registry, RegistryConfig};
use nodewright_testregistry::TestRegistry;

/// The blob requests a [`Front`] saw: digest, and the range's first byte if one was asked.
type Seen = Arc<Mutex<Vec<(String, Option<u64>)>>>;

/// A registry in front of a real one's storage that serves manifests and blobs (ranges
/// too) and cuts off the body of blob `cut.0` at byte `cut.1` while a cut is set — a
/// connection lost part way through a download.
struct Front {
    host: String,
    cut: Arc<Mutex<Option<(String, u64)>>>,
    seen: Seen,
}

impl Front {
    fn start(reg: &TestRegistry) -> Front {
        use std::io::Write as _;
        let storage = reg.storage();
        let blob = move |digest: &str| {
            let hex = digest.trim_start_matches("sha256:");
            std::fs::read(storage.join(format!(
                "docker/registry/v2/blobs/sha256/{}/{hex}/data",
                &hex[..2]
            )))
            .ok()
        };
        let cut: Arc<Mutex<Option<(String, u64)>>> = Arc::default();
        let seen: Seen = Arc::default();
        let (cutting, seeing) = (cut.clone(), seen.clone());
        let host = serve(move |_, request, stream| {
            let path = request.line.split(' ').nth(1).unwrap_or_default();
            let digest = path.rsplit('/').next().unwrap_or_default().to_string();
            let bytes = (digest.len() == 71 && digest.starts_with("sha256:"))
                .then(|| blob(&digest))
                .flatten();
            let Some(bytes) = bytes else {
                let status = if path == "/v2/" {
                    "200 OK"
                } else {
                    "404 Not Found"
                };
                let head = format!("HTTP/1.1 {status}\r\ncontent-length: 0\r\n\r\n");
                return stream.write_all(head.as_bytes()).is_ok();
            };
            if path.contains("/manifests/") {
                let kind: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
                let head = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: {}\r\ndocker-content-digest: {digest}\r\ncontent-length: {}\r\n\r\n",
                    kind["mediaType"].as_str().unwrap(),
                    bytes.len()
                );
                let head_only = request.line.starts_with("HEAD ");
                return stream.write_all(head.as_bytes()).is_ok()
                    && (head_only || stream.write_all(&bytes).is_ok());
            }
            let from = request
                .headers
                .iter()
                .find_map(|h| h.strip_prefix("range: bytes="))
                .and_then(|r| r.trim_end_matches('-').parse::<u64>().ok());
            seeing.lock().unwrap().push((digest.clone(), from));
            let start = from.unwrap_or(0);
            let len = bytes.len() as u64;
            let head = match from {
                Some(at) => format!(
                    "HTTP/1.1 206 Partial Content\r\ncontent-range: bytes {at}-{}/{len}\r\ncontent-length: {}\r\n\r\n",
                    len - 1,
                    len - at
                ),
                None => format!("HTTP/1.1 200 OK\r\ncontent-length: {len}\r\n\r\n"),
            };
            let end = match &*cutting.lock().unwrap() {
                Some((d, at)) if *d == digest => (*at).max(start),
                _ => len,
            };
            let body = &bytes[usize::try_from(start).unwrap()..usize::try_from(end).unwrap()];
            let sent = stream.write_all(head.as_bytes()).is_ok() && stream.write_all(body).is_ok();
            // A cut body ends with the connection.
            sent && end == len
        });
        Front { host, cut, seen }
    }

    fn cut(&self, digest: &str, at: u64) {
        *self.cut.lock().unwrap() = Some((digest.to_string(), at));
    }

    fn mend(&self) {
        *self.cut.lock().unwrap() = None;
    }

    /// The ranges asked for blob `digest`, in order (`None`: the whole blob).
    fn ranges(&self, digest: &str) -> Vec<Option<u64>> {
        let seen = self.seen.lock().unwrap();
        seen.iter()
            .filter(|(d, _)| d == digest)
            .map(|(_, r)| *r)
            .collect()
    }
}

/// A driver payload of eight 256 KiB files, each of its own bytes.
fn driver(dir: &Path) -> std::path::PathBuf {
    let root = dir.join("driver");
    std::fs::create_dir_all(root.join("lib/firmware")).unwrap();
    for n in 0..8u32 {
        let bytes: Vec<u8> = (0..256u32 << 10)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> (n + 8)) as u8)
            .collect();
        std::fs::write(root.join(format!("lib/firmware/part{n}.bin")), bytes).unwrap();
    }
    root
}

/// Every file under `root` with its bytes, sorted.
fn files(root: &Path) -> Vec<(std::path::PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let path = e.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else {
                let bytes = std::fs::read(&path).unwrap();
                out.push((path.strip_prefix(root).unwrap().to_path_buf(), bytes));
            }
        }
    }
    out.sort();
    out
}

/// The first pull of a fresh cache, its payload's download cut off at [`CUT`].
async fn cut_off(front: &Front, puller: &Puller, pinned: &PinnedRef, digest: &str) -> Pulled {
    front.cut(digest, CUT);
    let listed = puller.pull_pinned(pinned, &|_| {}).await.unwrap();
    let err = try_stage(puller, &listed).await.unwrap_err();
    assert!(
        matches!(err, Error::Unavailable { .. }) && err.is_retryable(),
        "{err}"
    );
    front.mend();
    listed
}

const EVERY: u64 = 300 << 10;
const CUT: u64 = 1536 << 10;

#[tokio::test(flavor = "multi_thread")]
async fn a_cut_off_payload_download_resumes_from_its_last_checkpoint() {
    nodewright_testregistry::require!(Registry);
    let reg = TestRegistry::start();
    let src = tempfile::tempdir().unwrap();
    let root = driver(src.path());
    let name = PayloadName::parse("driver").unwrap();
    let tar = pack(&name, &root).unwrap();
    let digest = nodewright_oci::sha256_digest(&tar);
    let registry = Registry::new(config(&reg));
    let pushed = push_with(
        &registry,
        &format!("{}/plugins/driver:1", reg.host()),
        vec![(name, tar.clone())],
    )
    .await;
    let front = Front::start(&reg);
    let pinned = pin(&format!(
        "{}/plugins/driver@{}",
        front.host, pushed.manifest_digest
    ));
    let puller_for = |cache: &Path| {
        let mut c = RegistryConfig {
            insecure: vec![front.host.clone()],
            ..Default::default()
        };
        c.limits.checkpoint_every = EVERY;
        Puller::new(Registry::new(c), NodeCache::open(cache).unwrap())
    };
    let hex = digest.trim_start_matches("sha256:");
    let kept = |cache: &Path| {
        (
            cache.join(format!("blobs/sha256/{hex}.checkpoint")),
            cache.join(format!("trees/sha256/.{hex}.staging")),
        )
    };
    // Cut off: the staging tree and its checkpoint stay, and no copy of the layer.
    let cache = tempfile::tempdir().unwrap();
    let puller = puller_for(cache.path());
    let listed = cut_off(&front, &puller, &pinned, &digest).await;
    let (checkpoint, staging) = kept(cache.path());
    assert!(checkpoint.is_file() && staging.is_dir());
    let blobs: Vec<_> = std::fs::read_dir(cache.path().join("blobs/sha256"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        !blobs
            .iter()
            .any(|b| b.starts_with(hex) && !b.ends_with(".checkpoint")),
        "no copy of the payload's layer is kept: {blobs:?}"
    );
    // The next pull asks for the rest from the checkpoint, and the tree is the payload.
    let staged = try_stage(&puller, &listed).await.unwrap();
    let ranges = front.ranges(&digest);
    let [None, Some(from)] = ranges[..] else {
        panic!("one whole request, then one range: {ranges:?}")
    };
    assert!(
        (EVERY..=CUT).contains(&from) && from % 512 == 0,
        "resumed at an entry boundary past a checkpoint before the cut: {from}"
    );
    assert_eq!(files(&staged[0].tree), files(&root));
    assert!(
        !checkpoint.exists() && !staging.exists(),
        "nothing left to resume"
    );

    // A checkpoint that names another layer is not used: the pull starts over.
    let other = tempfile::tempdir().unwrap();
    let puller = puller_for(other.path());
    let listed = cut_off(&front, &puller, &pinned, &digest).await;
    let (checkpoint, staging) = kept(other.path());
    let text = std::fs::read_to_string(&checkpoint).unwrap();
    std::fs::write(&checkpoint, text.replace(hex, &"0".repeat(64))).unwrap();
    let before = front.ranges(&digest).len();
    let staged = try_stage(&puller, &listed).await.unwrap();
    assert_eq!(front.ranges(&digest)[before..], [None], "started over");
    assert_eq!(files(&staged[0].tree), files(&root));
    assert!(!checkpoint.exists() && !staging.exists());

    // A checkpoint whose hash state lies: resumed, but the digest check over the whole
    // layer refuses it; the staging tree is thrown away and the next pull starts over.
    let lied = tempfile::tempdir().unwrap();
    let puller = puller_for(lied.path());
    let listed = cut_off(&front, &puller, &pinned, &digest).await;
    let (checkpoint, staging) = kept(lied.path());
    let mut record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&checkpoint).unwrap()).unwrap();
    let state = record["sha256_state"].as_str().unwrap();
    let flipped = if state.starts_with('0') { "1" } else { "0" };
    record["sha256_state"] = format!("{flipped}{}", &state[1..]).into();
    std::fs::write(&checkpoint, serde_json::to_vec(&record).unwrap()).unwrap();
    let before = front.ranges(&digest).len();
    let err = try_stage(&puller, &listed).await.unwrap_err();
    assert!(
        matches!(&err, Error::DigestMismatch { expected, .. } if *expected == digest),
        "{err}"
    );
    assert!(matches!(front.ranges(&digest)[before..], [Some(_)]));
    assert!(
        !checkpoint.exists() && !staging.exists(),
        "wrong bytes are not kept"
    );
    assert!(!lied.path().join(format!("trees/sha256/{hex}")).exists());
    let staged = try_stage(&puller, &listed).await.unwrap();
    assert_eq!(front.ranges(&digest).last(), Some(&None));
    assert_eq!(files(&staged[0].tree), files(&root));
}
