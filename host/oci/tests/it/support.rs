//! Helpers the registry and transport tests share.

use nodewright_api::pinned::PinnedRef;
use nodewright_oci::artifact::ComponentInfo;
use nodewright_oci::{Registry, RegistryConfig};
use nodewright_testregistry::TestRegistry;

/// `text`, a reference the test knows is pinned.
pub fn pin(text: &str) -> PinnedRef {
    text.parse().unwrap()
}

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

/// One request as a fake registry sees it: the request line and the header lines, lower-cased.
pub struct Request {
    pub line: String,
    pub headers: Vec<String>,
}

impl Request {
    pub fn has(&self, header: &str) -> bool {
        self.headers.iter().any(|h| h == header)
    }
}

/// A fake registry on loopback, for what the real one never does (endless bodies, a token
/// service): `answer` writes the response to each request on a kept-alive connection and
/// says whether to keep it open. `answer` gets the server's own `host:port`.
pub fn serve(
    answer: impl Fn(&str, &Request, &mut std::net::TcpStream) -> bool + Clone + Send + 'static,
) -> String {
    use std::io::{BufRead, BufReader};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let host = listener.local_addr().unwrap().to_string();
    let served = host.clone();
    std::thread::spawn(move || {
        for mut stream in listener.incoming().flatten() {
            let (host, answer) = (served.clone(), answer.clone());
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                loop {
                    let mut line = String::new();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 {
                        return;
                    }
                    let mut headers = Vec::new();
                    let mut header = String::new();
                    while reader.read_line(&mut header).is_ok() && header != "\r\n" {
                        headers.push(header.trim().to_ascii_lowercase());
                        header.clear();
                    }
                    if !answer(&host, &Request { line, headers }, &mut stream) {
                        return;
                    }
                }
            });
        }
    });
    host
}
