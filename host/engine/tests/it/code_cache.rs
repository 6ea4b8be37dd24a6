//! The precompiled-code cache: reused across engines, and never trusted once altered.

use nodewright_engine::{Engine, EngineConfig};

fn engine(dir: &std::path::Path) -> Engine {
    Engine::new(EngineConfig {
        cache_dir: Some(dir.to_path_buf()),
        ..Default::default()
    })
    .unwrap()
}

fn cwasm(dir: &std::path::Path) -> std::path::PathBuf {
    let engine_dir = std::fs::read_dir(dir)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    std::fs::read_dir(engine_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "cwasm"))
        .expect("a .cwasm")
}

#[test]
fn altered_precompiled_code_is_recompiled_not_loaded() {
    let bytes = nodewright_artifacts::read(nodewright_artifacts::SYSCTL);
    let tmp = tempfile::tempdir().unwrap();
    assert!(!engine(tmp.path()).load(&bytes).unwrap().from_cache);
    assert!(engine(tmp.path()).load(&bytes).unwrap().from_cache);
    // One byte of native code changed on disk: the integrity sidecar no longer matches.
    let path = cwasm(tmp.path());
    let mut code = std::fs::read(&path).unwrap();
    let mid = code.len() / 2;
    code[mid] ^= 0xff;
    std::fs::write(&path, &code).unwrap();
    let reloaded = engine(tmp.path()).load(&bytes).unwrap();
    assert!(!reloaded.from_cache, "altered code was loaded");
    // Recompiled and rewritten: the next engine uses the cache again.
    assert_ne!(std::fs::read(&path).unwrap(), code);
    assert!(engine(tmp.path()).load(&bytes).unwrap().from_cache);
}
