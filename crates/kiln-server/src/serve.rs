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
//!   ping every second, and a claim long-poll waits at most a minute;
//! - **a body-read deadline** (issue 39, item 7): a request body must arrive
//!   whole within `body_read_timeout` of its head, however steadily its bytes
//!   trickle (a trickle resets the idle timer, never this one). Past it the
//!   request is answered `408` and the connection closed. The data plane
//!   (`/blob/…`, bodies streamed to disk behind a capability checked before
//!   the first byte is read) is bounded by the idle timeout instead, so a
//!   large artifact part on a slow link is not cut;
//! - **a reserved share** of `max_connections` (issue 39, item 7): the last
//!   `reserved_connections` slots are kept for authenticated calls (agents,
//!   API tokens, the data plane's capabilities) and `/healthz`/`/readyz`. A
//!   connection given one of them is served only for those: an
//!   unauthenticated route (webhooks, the UI, `/metrics`) is answered `503`
//!   without reading its body, and after any answer to a request that did
//!   not authenticate the connection is closed. Its head must come within
//!   [`RESERVED_HEADER_TIMEOUT`]. Flooding the public side (slow bodies,
//!   webhook floods) therefore never takes the slots agents reconnect into.
//!
//! HTTP/2 is not offered: no Kiln client speaks it, and serving it behind
//! the preface sniffing of hyper-util's `auto` builder would leave the time
//! before the first bytes without a bound.

use axum::Router;
use axum::extract::ConnectInfo;
use axum::response::IntoResponse;
use hyper_util::rt::{TokioIo, TokioTimer};
use std::future::Future;
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
    /// A request body must arrive whole within this of its head.
    pub body_read_timeout: Duration,
    /// Slots of `max_connections` kept for authenticated calls (see the
    /// module docs); less than `max_connections`.
    pub reserved_connections: usize,
}

/// The longest a connection on a reserved slot may take to send a request
/// head (or stay idle between requests): agents send theirs at once, and a
/// slow head must not hold a reserved slot for the whole header timeout.
pub const RESERVED_HEADER_TIMEOUT: Duration = Duration::from_secs(5);

/// Marks a request that came on a reserved connection slot (see the module
/// docs); the router's authentication layers call [`Reserved::authenticated`].
#[derive(Clone, Debug, Default)]
pub(crate) struct Reserved(Arc<std::sync::atomic::AtomicBool>);

impl Reserved {
    /// The request carried a valid credential: its connection may stay open.
    pub(crate) fn authenticated(&self) {
        self.0.store(true, Ordering::Relaxed);
    }
    fn is_authenticated(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// The default reserved share of `max_connections`: a quarter, and at
/// least half of a small cap up to 8 (one agent alone holds a session
/// stream, a claim long-poll and its attempt calls); never all of it.
pub fn default_reserved_connections(max_connections: usize) -> usize {
    let n = (max_connections / 4).max((max_connections / 2).min(8));
    n.min(max_connections.saturating_sub(1))
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
    let reserved = limits.reserved_connections.min(limits.max_connections.saturating_sub(1));
    let permits = Arc::new(Semaphore::new(limits.max_connections.max(1) - reserved));
    let reserved_permits = Arc::new(Semaphore::new(reserved));
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
        let (permit, on_reserve) = match permits.clone().try_acquire_owned() {
            Ok(p) => (p, false),
            Err(_) => match reserved_permits.clone().try_acquire_owned() {
                Ok(p) => (p, true),
                Err(_) => {
                    refuse(tcp, tls.is_none(), &refusals);
                    continue;
                }
            },
        };
        let _ = tcp.set_nodelay(true);
        let (router, tls, shutdown) = (router.clone(), tls.clone(), shutdown.clone());
        let head_timeout = if on_reserve {
            limits.header_read_timeout.min(RESERVED_HEADER_TIMEOUT)
        } else {
            limits.header_read_timeout
        };
        conns.spawn(async move {
            let _permit = permit;
            let conn = Conn { peer, on_reserve, head_timeout };
            match tls {
                None => connection(tcp, conn, router, limits, shutdown).await,
                Some(acceptor) => match tokio::time::timeout(head_timeout, acceptor.accept(tcp)).await {
                    Ok(Ok(stream)) => connection(stream, conn, router, limits, shutdown).await,
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

/// What the accept loop knows of a connection.
#[derive(Clone, Copy)]
struct Conn {
    peer: SocketAddr,
    /// It holds a reserved slot (see the module docs).
    on_reserve: bool,
    head_timeout: Duration,
}

/// The answer to a request whose body did not arrive within the deadline.
fn body_timeout(limit: Duration) -> axum::response::Response {
    let mut res = crate::error::ApiErr::new(
        axum::http::StatusCode::REQUEST_TIMEOUT,
        kiln_api::codes::INVALID,
        format!("the request body did not arrive within {}s (--body-read-timeout)", limit.as_secs_f64()),
    )
    .into_response();
    res.headers_mut().insert(axum::http::header::CONNECTION, axum::http::HeaderValue::from_static("close"));
    res
}

/// One connection: HTTP/1.1 with the header-read timeout, closed when idle.
async fn connection<I>(io: I, conn: Conn, router: Router, limits: ConnLimits, mut shutdown: watch::Receiver<bool>)
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let peer = conn.peer;
    let activity = Arc::new(Activity::new());
    let io = TokioIo::new(Watched { inner: io, activity: activity.clone() });
    let service = hyper::service::service_fn(move |mut req: hyper::Request<hyper::body::Incoming>| {
        req.extensions_mut().insert(ConnectInfo(peer));
        let reserved = conn.on_reserve.then(Reserved::default);
        if let Some(r) = &reserved {
            req.extensions_mut().insert(r.clone());
        }
        // The data plane streams to disk behind its capability; every
        // other body is read under the deadline.
        let timed_out = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let req = if req.uri().path().starts_with("/blob/") {
            req.map(axum::body::Body::new)
        } else {
            let flag = timed_out.clone();
            req.map(|b| axum::body::Body::new(Deadline::new(b, limits.body_read_timeout, flag)))
        };
        let router = router.clone();
        async move {
            let mut res = tower::ServiceExt::oneshot(router, req).await?;
            if timed_out.load(Ordering::Relaxed) {
                tracing::debug!(%peer, "a request body did not arrive within the deadline");
                res = body_timeout(limits.body_read_timeout);
            }
            if reserved.is_some_and(|r| !r.is_authenticated()) {
                res.headers_mut().insert(axum::http::header::CONNECTION, axum::http::HeaderValue::from_static("close"));
            }
            Ok::<_, std::convert::Infallible>(res)
        }
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(conn.head_timeout)
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

/// A request body that fails once `deadline` has passed since the head
/// arrived (its `flag` then says so, for the 408 answer).
struct Deadline {
    inner: hyper::body::Incoming,
    sleep: Pin<Box<tokio::time::Sleep>>,
    flag: Arc<std::sync::atomic::AtomicBool>,
}

impl Deadline {
    fn new(inner: hyper::body::Incoming, deadline: Duration, flag: Arc<std::sync::atomic::AtomicBool>) -> Self {
        Deadline { inner, sleep: Box::pin(tokio::time::sleep(deadline)), flag }
    }
}

impl http_body::Body for Deadline {
    type Data = axum::body::Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        if let Poll::Ready(frame) = Pin::new(&mut self.inner).poll_frame(cx) {
            return Poll::Ready(frame.map(|r| r.map_err(Into::into)));
        }
        if self.sleep.as_mut().poll(cx).is_ready() {
            self.flag.store(true, Ordering::Relaxed);
            let e = std::io::Error::new(std::io::ErrorKind::TimedOut, "the request body did not arrive in time");
            return Poll::Ready(Some(Err(e.into())));
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        http_body::Body::size_hint(&self.inner)
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

    #[test]
    fn the_reserved_share_leaves_a_public_slot() {
        use super::default_reserved_connections as reserved;
        assert_eq!(
            [reserved(1), reserved(2), reserved(8), reserved(16), reserved(64), reserved(4096)],
            [0, 1, 4, 8, 16, 1024]
        );
        assert!((1..200).all(|n| reserved(n) < n));
    }
}
