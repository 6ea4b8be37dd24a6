//! nodewright-engine's integration tests, one binary (each file here was once its own binary,
//! each linking the whole dependency tree). Test names read `<file>::<test>`.

// The allocator the agent runs the engine with (see the workspace's `mimalloc`).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod common;

mod boundary_args;
mod boundary_limits;
mod code_cache;
mod fuzz;
mod hostile;
mod payloads;
mod plugins;
mod polyglot;
mod pool;
