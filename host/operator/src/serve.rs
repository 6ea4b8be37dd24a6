//! The operator's two listeners: plain HTTP for metrics and probes, TLS for the admission
//! webhook. Both answer small request/response exchanges with a whole-body handler.

use std::future::Future;
use std::sync::Arc;

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls;

use crate::webhook::cert::Resolver;

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
/// whole body (at most 4 MiB) is handed to `handler`.
pub async fn serve<F, Fut>(listener: TcpListener, tls: Option<TlsAcceptor>, handler: F)
where
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
        tokio::spawn(async move {
            let service = service_fn(move |req: Request<Incoming>| {
                let handler = handler.clone();
                async move { Ok::<_, std::convert::Infallible>(answer(req, handler).await) }
            });
            let result = match tls {
                Some(acceptor) => match acceptor.accept(stream).await {
                    Ok(s) => {
                        http1::Builder::new()
                            .serve_connection(TokioIo::new(s), service)
                            .await
                    }
                    Err(e) => {
                        tracing::debug!(%peer, "TLS handshake: {e}");
                        return;
                    }
                },
                None => {
                    http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await
                }
            };
            if let Err(e) = result {
                tracing::debug!(%peer, "connection: {e}");
            }
        });
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
