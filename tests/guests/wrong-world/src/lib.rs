//! A valid component that is not a nodewright plugin: it exports `run` of another world.
#![allow(missing_docs, unsafe_code, reason = "wit-bindgen generated glue")]
// Only meaningful as a component; natively the crate is empty.
#![cfg(target_arch = "wasm32")]

wit_bindgen::generate!({
    inline: "package other:thing@1.0.0; world greeter { export run: func() -> string; }",
});

struct Greeter;

impl Guest for Greeter {
    fn run() -> String {
        "hello".into()
    }
}

export!(Greeter);
