//! Helpers the registry and transport tests share.

use nodewright_oci::artifact::ComponentInfo;
use nodewright_oci::{Registry, RegistryConfig};
use nodewright_testregistry::TestRegistry;

pub fn config(reg: &TestRegistry) -> RegistryConfig {
    RegistryConfig {
        insecure: vec![reg.host().to_string()],
        ..Default::default()
    }
}

pub fn info() -> ComponentInfo {
    ComponentInfo {
        imports: vec!["nodewright:plugin/files@0.1.0".into()],
        exports: vec!["nodewright:plugin/stages@0.1.0".into()],
        target: None,
    }
}

pub async fn push(registry: &Registry, reference: &str, bytes: &[u8]) -> nodewright_oci::Pushed {
    registry
        .push(reference, bytes, info(), &|_| {})
        .await
        .expect("push")
}
