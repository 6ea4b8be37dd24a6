//! The simulated kubelet's HTTPS endpoint — the part of a kubelet's API the apiserver
//! proxies `pods/log` to: `GET /containerLogs/{namespace}/{pod}/{container}` with
//! `tailLines` and `follow`, answered from the container's log file (stdout and stderr, as
//! the process wrote them; a follow ends when the container does). Every simulated node
//! advertises this one listener as its kubelet endpoint; the apiserver skips certificate
//! verification when it has no kubelet CA, as here, so the certificate is self-signed. No
//! timestamps, no exec/attach/port-forward.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// `namespace/pod` → the pod's directory, holding `<container>.log` and, while the
/// container is not running, `<container>.ended`.
pub type LogDirs = Arc<Mutex<HashMap<String, PathBuf>>>;

/// Binds a loopback port and serves it in the background: the port, and the task to abort
/// when the simulated kubelet goes.
pub async fn start(dirs: LogDirs) -> Result<(u16, tokio::task::JoinHandle<()>)> {
    let key = rcgen::KeyPair::generate()?;
    let cert =
        rcgen::CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()])?
            .self_signed(&key)?;
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(
            vec![CertificateDer::from(cert.der().to_vec())],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        )?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let acceptor = TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
        .await
        .context("bind the simulated kubelet endpoint")?;
    let port = listener.local_addr()?.port();
    let task = tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let (acceptor, dirs) = (acceptor.clone(), dirs.clone());
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(stream).await else {
                    return;
                };
                let service = service_fn(move |req: Request<Incoming>| {
                    let dirs = dirs.clone();
                    async move { Ok::<_, std::convert::Infallible>(answer(&dirs, &req)) }
                });
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(tls), service)
                    .await;
            });
        }
    });
    Ok((port, task))
}

type Body = BoxBody<Bytes, std::convert::Infallible>;

fn answer(dirs: &LogDirs, req: &Request<Incoming>) -> Response<Body> {
    let reply = |status: StatusCode, body: String| {
        let mut r = Response::new(Full::new(Bytes::from(body)).boxed());
        *r.status_mut() = status;
        r
    };
    let parts: Vec<&str> = req
        .uri()
        .path()
        .trim_start_matches('/')
        .split('/')
        .collect();
    let ["containerLogs", ns, pod, container] = parts.as_slice() else {
        return reply(
            StatusCode::NOT_FOUND,
            format!(
                "the simulated kubelet serves only /containerLogs, not {}",
                req.uri().path()
            ),
        );
    };
    let Some(dir) = dirs
        .lock()
        .expect("log dirs lock")
        .get(&format!("{ns}/{pod}"))
        .cloned()
    else {
        return reply(
            StatusCode::NOT_FOUND,
            format!("pod {ns}/{pod} is not on this simulated kubelet"),
        );
    };
    let log = dir.join(format!("{container}.log"));
    let Ok(text) = std::fs::read_to_string(&log) else {
        return reply(
            StatusCode::NOT_FOUND,
            format!("container {container} of {ns}/{pod} has not started"),
        );
    };
    let query = req.uri().query().unwrap_or_default();
    let tail = query
        .split('&')
        .find_map(|kv| kv.strip_prefix("tailLines=")?.parse::<usize>().ok());
    let first = tail_lines(&text, tail);
    if !query.split('&').any(|kv| kv == "follow=true") {
        return reply(StatusCode::OK, first);
    }
    // Follow: what is there, then what the container appends, until it has ended and
    // nothing more came (or the client went away).
    let ended = dir.join(format!("{container}.ended"));
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(16);
    tokio::spawn(async move {
        let mut offset = text.len() as u64;
        if tx.send(Bytes::from(first)).await.is_err() {
            return;
        }
        loop {
            let done = ended.exists();
            let more = read_from(&log, offset);
            offset += more.len() as u64;
            if !more.is_empty() && tx.send(Bytes::from(more)).await.is_err() {
                return;
            }
            if done {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
    });
    let frames = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|b| (Ok(Frame::data(b)), rx))
    });
    Response::new(BodyExt::boxed(StreamBody::new(frames)))
}

/// The bytes of `path` from `offset` on.
fn read_from(path: &std::path::Path, offset: u64) -> Vec<u8> {
    use std::io::{Read, Seek, SeekFrom};
    let mut out = Vec::new();
    if let Ok(mut f) = std::fs::File::open(path)
        && f.seek(SeekFrom::Start(offset)).is_ok()
    {
        let _ = f.read_to_end(&mut out);
    }
    out
}

/// The last `n` lines of `text` (all of it without `n`), each ending in a newline.
fn tail_lines(text: &str, n: Option<usize>) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let from = n.map_or(0, |n| lines.len().saturating_sub(n));
    lines[from..].iter().map(|l| format!("{l}\n")).collect()
}

#[cfg(test)]
mod tests {
    use super::tail_lines;

    #[test]
    fn tail_lines_counts_from_the_end() {
        assert_eq!(tail_lines("a\nb\nc\n", Some(2)), "b\nc\n");
        assert_eq!(tail_lines("a\nb", None), "a\nb\n");
        assert_eq!(tail_lines("a\n", Some(5)), "a\n");
        assert_eq!(tail_lines("", Some(1)), "");
    }
}
