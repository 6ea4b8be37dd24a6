//! The operator's two listeners: plain HTTP for metrics and probes, TLS for the admission
//! webhook. Both answer small request/response exchanges with a whole-body handler.
//!
//! A listener may be told to drain: the webhook's, while the replica's node is fenced for a
//! reboot. The API server keeps connections to a webhook open between calls and pools them
//! by the Service's name, not by the endpoint it dialled — so a replica that has left the
//! Service still gets calls over a connection opened before, until its node reboots under
//! one of them ("connection reset by peer", and the fail-closed webhook refuses that write).
//! Draining ends every connection without racing the API server's next call on it: each
//! answer from then on says `Connection: close` and the connection ends after it (the client
//! reads that and does not send on it again); a connection left unused for [`IDLE_GRACE`]
//! after the drain began is closed. The API server dials again and reaches a replica still
//! in the Service. Closing an idle connection at once raced the next call: a call written
//! onto a connection as its close arrives fails with `EOF`, and a POST is not retried (the
//! two-node real-node e2e saw 1 of 636 webhook probes fail so). The connection in use gets a
//! call well within the grace and ends after its answer; one left unused that long is at
//! the bottom of the client's idle pool, so the close rarely meets a call. The grace is
//! shorter than the wait between a fence and the node's reboot (the replica's readiness
//! probe, every 2 s, then the planner's next pass), so no connection outlives the reboot.

use std::future::Future;
use std::sync::Arc;

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls;

use crate::webhook::cert::Resolver;

/// How long a connection left unused may stay open after its listener began draining.
const IDLE_GRACE: std::time::Duration = std::time::Duration::from_secs(1);

/// Largest request body read: an AdmissionReview carries the object and the old object,
/// each at most etcd's 1.5 MiB.
const MAX_BODY: usize = 4 << 20;

/// A handler's answer.
#[derive(Debug)]
pub struct Reply {
    /// HTTP status.
    pub status: StatusCode,
    /// `Content-Type`.
    pub content_type: &'static str,
    /// Body.
    pub body: Vec<u8>,
}

impl Reply {
    /// A plain-text reply.
    pub fn text(status: StatusCode, body: impl Into<String>) -> Reply {
        Reply {
            status,
            content_type: "text/plain; charset=utf-8",
            body: body.into().into_bytes(),
        }
    }
}

/// A TLS acceptor serving the resolver's current certificate (TLS 1.2+, HTTP/1.1).
pub fn tls_acceptor(resolver: Arc<Resolver>) -> TlsAcceptor {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("the aws-lc-rs provider supports the default protocol versions")
        .with_no_client_auth()
        .with_cert_resolver(resolver);
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    TlsAcceptor::from(Arc::new(config))
}

/// Serves `listener` until the process ends, over TLS when `tls` is given. Each request's
/// whole body (at most 4 MiB) is handed to `handler`. While `drain` reads true, no
/// connection stays open past its current response (see the module's comment).
pub async fn serve<F, Fut>(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    drain: Option<watch::Receiver<bool>>,
    handler: F,
) where
    F: Fn(Method, String, Bytes) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Reply> + Send + 'static,
{
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!("accept: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
        };
        let handler = handler.clone();
        let tls = tls.clone();
        let drain = drain.clone();
        tokio::spawn(async move {
            let closing = drain.clone();
            let service = service_fn(move |req: Request<Incoming>| {
                let handler = handler.clone();
                let closing = closing.clone();
                async move {
                    let mut resp = answer(req, handler).await;
                    // Read once the answer is ready: a call in progress when the drain
                    // begins ends its connection too.
                    if closing.is_some_and(|d| *d.borrow()) {
                        resp.headers_mut().insert(
                            hyper::header::CONNECTION,
                            hyper::header::HeaderValue::from_static("close"),
                        );
                    }
                    Ok::<_, std::convert::Infallible>(resp)
                }
            });
            let result = match tls {
                Some(acceptor) => match acceptor.accept(stream).await {
                    Ok(s) => connection(TokioIo::new(s), service, drain).await,
                    Err(e) => {
                        tracing::debug!(%peer, "TLS handshake: {e}");
                        return;
                    }
                },
                None => connection(TokioIo::new(stream), service, drain).await,
            };
            if let Err(e) = result {
                tracing::debug!(%peer, "connection: {e}");
            }
        });
    }
}

/// Serves one connection: kept alive between requests until `drain` reads true; then each
/// answer ends it (the service says `Connection: close`), and if none comes within
/// [`IDLE_GRACE`] it is closed (once the response in progress, if any, is sent).
async fn connection<I, S>(
    io: I,
    service: S,
    drain: Option<watch::Receiver<bool>>,
) -> hyper::Result<()>
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    S: hyper::service::HttpService<Incoming, ResBody = Full<Bytes>>,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let Some(mut drain) = drain else {
        return http1::Builder::new().serve_connection(io, service).await;
    };
    let draining = *drain.borrow_and_update();
    let conn = http1::Builder::new()
        .keep_alive(!draining)
        .serve_connection(io, service);
    let mut conn = std::pin::pin!(conn);
    if draining {
        return conn.await;
    }
    tokio::select! {
        done = conn.as_mut() => done,
        started = async { drain.wait_for(|d| *d).await.is_ok() } => {
            if started {
                tokio::select! {
                    done = conn.as_mut() => return done,
                    () = tokio::time::sleep(IDLE_GRACE) => conn.as_mut().graceful_shutdown(),
                }
            }
            conn.await
        }
    }
}

async fn answer<F, Fut>(req: Request<Incoming>, handler: F) -> Response<Full<Bytes>>
where
    F: Fn(Method, String, Bytes) -> Fut,
    Fut: Future<Output = Reply>,
{
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let reply = match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(body) => handler(method, path, body.to_bytes()).await,
        Err(e) => Reply::text(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("reading the request body: {e}"),
        ),
    };
    let mut resp = Response::new(Full::new(Bytes::from(reply.body)));
    *resp.status_mut() = reply.status;
    if let Ok(v) = hyper::header::HeaderValue::from_str(reply.content_type) {
        resp.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
    }
    resp
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;
    use tokio::sync::Notify;

    use super::*;

    /// Sends a request for `path` on `conn` and reads its whole response: the head (status
    /// line and headers, lower-cased) is returned.
    async fn exchange(conn: &mut TcpStream, path: &str) -> String {
        let request = format!("GET {path} HTTP/1.1\r\nHost: t\r\n\r\n");
        conn.write_all(request.as_bytes()).await.unwrap();
        let mut buf = Vec::new();
        let mut chunk = [0u8; 1024];
        loop {
            let n = conn.read(&mut chunk).await.unwrap();
            assert!(
                n > 0,
                "closed mid-response: {:?}",
                String::from_utf8_lossy(&buf)
            );
            buf.extend_from_slice(&chunk[..n]);
            let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
                continue;
            };
            let head = String::from_utf8_lossy(&buf[..end]).to_lowercase();
            let body = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .map_or(0, |v| v.trim().parse::<usize>().unwrap());
            if buf.len() >= end + 4 + body {
                return head;
            }
        }
    }

    /// Whether the server has closed `conn` (end of stream) within `wait`.
    async fn closed_within(conn: &mut TcpStream, wait: Duration) -> bool {
        let mut b = [0u8; 1];
        match tokio::time::timeout(wait, conn.read(&mut b)).await {
            Ok(Ok(0) | Err(_)) => true,
            Ok(Ok(_)) => panic!("unexpected bytes from the server"),
            Err(_) => false,
        }
    }

    /// Sends a request on `conn`, which is answered, says it closes, and is closed.
    async fn last_answer(conn: &mut TcpStream) {
        let head = exchange(conn, "/").await;
        assert!(head.starts_with("http/1.1 200"), "{head}");
        assert!(head.contains("connection: close"), "{head}");
        assert!(closed_within(conn, CLOSES).await, "closed after its answer");
    }

    const STAYS_OPEN: Duration = Duration::from_millis(300);
    const CLOSES: Duration = Duration::from_secs(10);

    /// A listener that answers `/slow` once `release` is notified, anything else at once.
    async fn listener(drain: watch::Receiver<bool>, release: Arc<Notify>) -> std::net::SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(serve(
            listener,
            None,
            Some(drain),
            move |_, path: String, _| {
                let release = release.clone();
                async move {
                    if path == "/slow" {
                        release.notified().await;
                    }
                    Reply::text(StatusCode::OK, "ok")
                }
            },
        ));
        addr
    }

    #[tokio::test]
    async fn draining_ends_a_connection_after_its_next_answer_or_an_idle_grace_and_keeps_no_new_one()
     {
        let (fenced, drain) = watch::channel(false);
        let addr = listener(drain, Arc::new(Notify::new())).await;
        // Not draining: a connection is kept for the next request.
        let mut kept = TcpStream::connect(addr).await.unwrap();
        let head = exchange(&mut kept, "/").await;
        assert!(head.starts_with("http/1.1 200"), "{head}");
        assert!(!head.contains("connection: close"), "{head}");
        exchange(&mut kept, "/").await;
        assert!(!closed_within(&mut kept, STAYS_OPEN).await, "kept alive");
        let mut used = TcpStream::connect(addr).await.unwrap();
        exchange(&mut used, "/").await;

        // Draining: a connection used again answers, says it closes, and closes ...
        fenced.send_replace(true);
        last_answer(&mut used).await;
        // ... no idle one is closed at once (the close would race a call the client may be
        // sending on it) ...
        assert!(STAYS_OPEN < IDLE_GRACE);
        assert!(
            !closed_within(&mut kept, STAYS_OPEN).await,
            "an idle connection is not closed as the drain begins"
        );
        // ... and one left unused is closed after the grace.
        assert!(
            closed_within(&mut kept, CLOSES).await,
            "the idle connection closed"
        );
        // A new connection gets one answer, says it closes, and closes.
        let mut fresh = TcpStream::connect(addr).await.unwrap();
        last_answer(&mut fresh).await;

        // No longer fenced: connections are kept again.
        fenced.send_replace(false);
        let mut again = TcpStream::connect(addr).await.unwrap();
        let head = exchange(&mut again, "/").await;
        assert!(!head.contains("connection: close"), "{head}");
        assert!(!closed_within(&mut again, STAYS_OPEN).await, "kept alive");
    }

    #[tokio::test]
    async fn a_call_in_progress_when_draining_starts_gets_its_answer_before_the_close() {
        let (fenced, drain) = watch::channel(false);
        let release = Arc::new(Notify::new());
        let addr = listener(drain, release.clone()).await;
        let mut busy = TcpStream::connect(addr).await.unwrap();
        exchange(&mut busy, "/").await;
        let call = tokio::spawn(async move {
            let head = exchange(&mut busy, "/slow").await;
            (head, busy)
        });
        // The call has reached the handler (it waits there) when the drain starts.
        tokio::time::sleep(Duration::from_millis(100)).await;
        fenced.send_replace(true);
        tokio::time::sleep(Duration::from_millis(100)).await;
        release.notify_one();
        let (head, mut busy) = call.await.unwrap();
        assert!(
            head.starts_with("http/1.1 200"),
            "the call is answered: {head}"
        );
        assert!(
            head.contains("connection: close"),
            "the answer ends the connection, not the grace: {head}"
        );
        assert!(
            closed_within(&mut busy, CLOSES).await,
            "then the connection closes"
        );
    }
}
