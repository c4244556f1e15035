//! The accept loop (HTTP/1.1, optionally over TLS), with the limits a
//! server facing the network needs (issue 13, finding 6):
//!
//! - **a connection cap**: past `max_connections` open connections a new
//!   one is answered `503` (JSON error shape, `Connection: close`) and
//!   closed — over TLS it is closed at once — instead of taking a file
//!   descriptor the server needs for its database and objects;
//! - **a header-read timeout** (hyper's, with a tokio timer): a client that
//!   has not sent a complete request head in time (a slow "trickler", or an
//!   idle keep-alive connection waiting for its next request) is closed; a
//!   TLS handshake gets the same bound;
//! - **an idle timeout**: a connection on which no byte moved either way for
//!   `idle_timeout` is closed (a stalled body upload or a client that stopped
//!   reading). Legitimately long-lived calls keep moving bytes or stay under
//!   it: SSE log streams send a keep-alive every 15 s, agent session streams
//!   ping every second, and a claim long-poll waits at most a minute.
//!
//! HTTP/2 is not offered: no Kiln client speaks it, and serving it behind
//! the preface sniffing of hyper-util's `auto` builder would leave the time
//! before the first bytes without a bound.

use axum::Router;
use axum::extract::ConnectInfo;
use hyper_util::rt::{TokioIo, TokioTimer};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, watch};
use tokio_rustls::TlsAcceptor;

/// The limits of the accept loop (see the module docs).
#[derive(Debug, Clone, Copy)]
pub struct ConnLimits {
    pub header_read_timeout: Duration,
    pub idle_timeout: Duration,
    pub max_connections: usize,
}

/// How many refusals may be in flight at once; past it an excess connection
/// is closed without an answer.
const MAX_REFUSALS: usize = 64;

/// The answer to a connection past the cap.
const REFUSAL: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
retry-after: 1\r\nconnection: close\r\ncontent-length: 83\r\n\r\n\
{\"error\":{\"code\":\"unavailable\",\"message\":\"too many open connections; retry later\"}}";

/// Serve `router` on `listener` until `shutdown` turns true, then stop
/// accepting, ask every connection to close after its current request and
/// wait for them (the caller bounds that wait).
pub(crate) async fn serve(
    listener: TcpListener,
    router: Router,
    tls: Option<TlsAcceptor>,
    limits: ConnLimits,
    mut shutdown: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let permits = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let refusals = Arc::new(Semaphore::new(MAX_REFUSALS));
    let mut conns = tokio::task::JoinSet::new();
    loop {
        let accepted = tokio::select! {
            r = listener.accept() => r,
            _ = shutdown.wait_for(|v| *v) => break,
        };
        while conns.try_join_next().is_some() {}
        let (tcp, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                // EMFILE and friends: back off instead of spinning; the
                // connections we hold will free descriptors.
                tracing::warn!("accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            refuse(tcp, tls.is_none(), &refusals);
            continue;
        };
        let _ = tcp.set_nodelay(true);
        let (router, tls, shutdown) = (router.clone(), tls.clone(), shutdown.clone());
        conns.spawn(async move {
            let _permit = permit;
            match tls {
                None => connection(tcp, peer, router, limits, shutdown).await,
                Some(acceptor) => match tokio::time::timeout(limits.header_read_timeout, acceptor.accept(tcp)).await {
                    Ok(Ok(stream)) => connection(stream, peer, router, limits, shutdown).await,
                    Ok(Err(e)) => tracing::debug!(%peer, "TLS handshake failed: {e}"),
                    Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                },
            }
        });
    }
    drop(listener);
    while conns.join_next().await.is_some() {}
    Ok(())
}

/// Answer a connection past the cap with a 503 and close it (plain HTTP),
/// or just close it (TLS: an answer would need a handshake first).
fn refuse(mut tcp: TcpStream, plain: bool, refusals: &Arc<Semaphore>) {
    let Ok(slot) = refusals.clone().try_acquire_owned() else { return };
    if !plain {
        return;
    }
    tokio::spawn(async move {
        let _slot = slot;
        let _ = tokio::time::timeout(Duration::from_secs(1), async {
            tcp.write_all(REFUSAL).await?;
            tcp.shutdown().await?;
            // Drain what the client sent so closing does not reset the
            // connection before it read the answer.
            let mut buf = [0u8; 4096];
            while tcp.read(&mut buf).await? > 0 {}
            Ok::<_, std::io::Error>(())
        })
        .await;
    });
}

/// One connection: HTTP/1.1 with the header-read timeout, closed when idle.
async fn connection<I>(io: I, peer: SocketAddr, router: Router, limits: ConnLimits, mut shutdown: watch::Receiver<bool>)
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let activity = Arc::new(Activity::new());
    let io = TokioIo::new(Watched { inner: io, activity: activity.clone() });
    let service = hyper::service::service_fn(move |mut req: hyper::Request<hyper::body::Incoming>| {
        req.extensions_mut().insert(ConnectInfo(peer));
        let router = router.clone();
        async move { tower::ServiceExt::oneshot(router, req).await }
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .serve_connection(io, service);
    tokio::pin!(conn);
    let tick = (limits.idle_timeout / 4).clamp(Duration::from_millis(100), Duration::from_secs(5));
    let mut closing = false;
    loop {
        tokio::select! {
            r = conn.as_mut() => {
                if let Err(e) = r {
                    tracing::debug!(%peer, "connection ended: {e}");
                }
                return;
            }
            _ = tokio::time::sleep(tick) => {
                if activity.idle_for() >= limits.idle_timeout {
                    tracing::debug!(%peer, "closing an idle connection");
                    return;
                }
            }
            _ = shutdown.wait_for(|v| *v), if !closing => {
                closing = true;
                conn.as_mut().graceful_shutdown();
            }
        }
    }
}

/// When bytes last moved on a connection.
struct Activity {
    start: Instant,
    last_ms: AtomicU64,
}

impl Activity {
    fn new() -> Self {
        Activity { start: Instant::now(), last_ms: AtomicU64::new(0) }
    }
    fn touch(&self) {
        self.last_ms.store(self.start.elapsed().as_millis() as u64, Ordering::Relaxed);
    }
    fn idle_for(&self) -> Duration {
        let now = self.start.elapsed().as_millis() as u64;
        Duration::from_millis(now.saturating_sub(self.last_ms.load(Ordering::Relaxed)))
    }
}

/// An IO stream that records when bytes moved.
struct Watched<I> {
    inner: I,
    activity: Arc<Activity>,
}

impl<I: AsyncRead + Unpin> AsyncRead for Watched<I> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.touch();
        }
        r
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for Watched<I> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        r
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        r
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// A TLS acceptor from PEM files (certificate chain, private key), HTTP/1.1
/// by ALPN; rustls with the aws-lc-rs provider.
pub(crate) fn tls_acceptor(cert: &std::path::Path, key: &std::path::Path) -> anyhow::Result<TlsAcceptor> {
    use anyhow::Context as _;
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .with_context(|| format!("--tls-cert {}: cannot read", cert.display()))?
        .collect::<Result<_, _>>()
        .with_context(|| format!("--tls-cert {}: not a PEM certificate chain", cert.display()))?;
    anyhow::ensure!(!certs.is_empty(), "--tls-cert {}: no certificate in the file", cert.display());
    let key = PrivateKeyDer::from_pem_file(key)
        .with_context(|| format!("--tls-key {}: not a PEM private key", key.display()))?;
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .context("--tls-cert/--tls-key: the key does not match the certificate, or is unsupported")?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// The default connection cap: a quarter of the file-descriptor limit (the
/// rest stays for the database, objects, git and agents' uploads), between
/// 64 and 4096.
pub fn default_max_connections() -> usize {
    let soft = std::fs::read_to_string("/proc/self/limits").ok().and_then(|s| {
        s.lines()
            .find(|l| l.starts_with("Max open files"))
            .and_then(|l| l.split_whitespace().nth(3).and_then(|v| v.parse::<usize>().ok()))
    });
    soft.map_or(1024, |n| n / 4).clamp(64, 4096)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_refusal_is_well_formed() {
        let s = std::str::from_utf8(super::REFUSAL).unwrap();
        let (head, body) = s.split_once("\r\n\r\n").unwrap();
        assert!(head.contains(&format!("content-length: {}", body.len())), "{head}");
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(v["error"]["code"], "unavailable");
        assert!((64..=4096).contains(&super::default_max_connections()));
    }
}
