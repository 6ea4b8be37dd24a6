//! Empty: a build script makes cargo apply this crate's build-dependencies section.

fn main() {}
