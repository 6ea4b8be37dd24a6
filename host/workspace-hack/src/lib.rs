//! Empty: this crate exists for its dependencies (see its Cargo.toml).
