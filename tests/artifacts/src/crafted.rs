//! Components crafted from bytes for the hostile suite: attacks a Rust guest cannot
//! express (several memories, a compile bomb, an import of another interface version).
//! Each is a valid component, so only nodewright's own bounds stop it.

use wasm_encoder::{
    CodeSection, Component, Function, FunctionSection, InstanceSection, Instruction, MemorySection,
    MemoryType, Module, ModuleSection, TypeSection, ValType,
};
use wasmparser::{Parser, Payload};

/// `component` with `memories` more core modules appended, each declaring one memory of
/// `pages` 64-KiB pages and instantiated when the component is: a component whose
/// memories together exceed the sandbox limit while each alone stays under it.
pub fn with_extra_memories(component: &[u8], memories: u32, pages: u64) -> Vec<u8> {
    let first = top_level_core_modules(component);
    let mut extra = Component::new();
    for _ in 0..memories {
        let mut mem = MemorySection::new();
        mem.memory(MemoryType {
            minimum: pages,
            maximum: None,
            memory64: false,
            shared: false,
            page_size_log2: None,
        });
        let mut module = Module::new();
        module.section(&mem);
        extra.section(&ModuleSection(&module));
    }
    let mut instances = InstanceSection::new();
    for i in 0..memories {
        instances.instantiate(first + i, Vec::<(&str, wasm_encoder::ModuleArg)>::new());
    }
    extra.section(&instances);
    let extra = extra.finish();
    // Component sections may come in any order: append ours after the original's, without
    // the second preamble.
    let mut out = component.to_vec();
    out.extend_from_slice(&extra[8..]);
    out
}

/// A component holding one core module of `functions` empty functions: cheap to send,
/// very expensive to compile.
pub fn many_functions(functions: u32) -> Vec<u8> {
    let mut types = TypeSection::new();
    types
        .ty()
        .function(Vec::<ValType>::new(), Vec::<ValType>::new());
    let mut funcs = FunctionSection::new();
    let mut code = CodeSection::new();
    for _ in 0..functions {
        funcs.function(0);
        let mut body = Function::new(Vec::<(u32, ValType)>::new());
        body.instruction(&Instruction::End);
        code.function(&body);
    }
    let mut module = Module::new();
    module.section(&types).section(&funcs).section(&code);
    let mut component = Component::new();
    component.section(&ModuleSection(&module));
    component.finish()
}

/// `component` with every occurrence of the import name `from` replaced by `to` (same
/// length, so every length prefix stays right).
pub fn renamed(component: &[u8], from: &str, to: &str) -> Vec<u8> {
    assert_eq!(from.len(), to.len(), "names must have the same length");
    let (from, to) = (from.as_bytes(), to.as_bytes());
    let mut out = component.to_vec();
    let mut i = 0;
    let mut replaced = 0;
    while i + from.len() <= out.len() {
        if &out[i..i + from.len()] == from {
            out[i..i + from.len()].copy_from_slice(to);
            replaced += 1;
            i += from.len();
        } else {
            i += 1;
        }
    }
    assert!(
        replaced > 0,
        "{} does not occur",
        String::from_utf8_lossy(from)
    );
    out
}

/// Core modules defined directly in the top-level component.
fn top_level_core_modules(component: &[u8]) -> u32 {
    let mut depth = 0u32;
    let mut count = 0;
    for payload in Parser::new(0).parse_all(component) {
        match payload.expect("a valid component") {
            Payload::Version { .. } => depth += 1,
            Payload::End(_) => depth -= 1,
            Payload::ModuleSection { .. } if depth == 1 => count += 1,
            _ => {}
        }
    }
    count
}
