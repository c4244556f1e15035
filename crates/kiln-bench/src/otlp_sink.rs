//! A loopback OTLP/HTTP sink for `kiln bench dispatch`'s `otlp`
//! configuration: it accepts `POST /v1/traces`, reads the whole body and
//! answers 200 with an empty `application/x-protobuf` body, as a collector
//! that accepts everything would. It decodes nothing, so the figure is the
//! exporting side's cost (building spans, encoding, sending), not a
//! collector's; it counts requests and body bytes so that the bench can show
//! the spans really left the processes.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

#[derive(Default)]
struct Counts {
    requests: AtomicU64,
    bytes: AtomicU64,
}

/// The running sink; stops when dropped.
pub(crate) struct OtlpSink {
    /// `http://127.0.0.1:PORT` (the exporter adds `/v1/traces`).
    pub(crate) url: String,
    counts: Arc<Counts>,
    task: tokio::task::JoinHandle<()>,
}

impl OtlpSink {
    pub(crate) async fn start() -> anyhow::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        let counts = Arc::new(Counts::default());
        let c = counts.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(serve(stream, c.clone()));
            }
        });
        Ok(Self { url, counts, task })
    }

    /// Export requests answered so far (`POST /v1/traces`).
    pub(crate) fn requests(&self) -> u64 {
        self.counts.requests.load(Relaxed)
    }

    /// Request body bytes read so far.
    pub(crate) fn bytes(&self) -> u64 {
        self.counts.bytes.load(Relaxed)
    }
}

impl Drop for OtlpSink {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One keep-alive connection: requests until the peer closes it.
async fn serve(stream: TcpStream, counts: Arc<Counts>) -> std::io::Result<()> {
    let mut r = BufReader::new(stream);
    let mut line = String::new();
    loop {
        line.clear();
        if r.read_line(&mut line).await? == 0 {
            return Ok(());
        }
        let traces = line.starts_with("POST /v1/traces ") || line.starts_with("POST /v1/traces?");
        let (mut len, mut chunked) = (0u64, false);
        loop {
            line.clear();
            if r.read_line(&mut line).await? == 0 {
                return Ok(());
            }
            let header = line.trim_end();
            if header.is_empty() {
                break;
            }
            if let Some((k, v)) = header.split_once(':') {
                let (k, v) = (k.trim().to_ascii_lowercase(), v.trim());
                if k == "content-length" {
                    len = v.parse().map_err(|_| std::io::Error::other("bad content-length"))?;
                } else if k == "transfer-encoding" {
                    chunked = v.to_ascii_lowercase().contains("chunked");
                }
            }
        }
        let body = if chunked { read_chunked(&mut r).await? } else { drain(&mut r, len).await? };
        let status = if traces {
            counts.requests.fetch_add(1, Relaxed);
            counts.bytes.fetch_add(body, Relaxed);
            "200 OK"
        } else {
            "404 Not Found"
        };
        let head = format!("HTTP/1.1 {status}\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n");
        r.get_mut().write_all(head.as_bytes()).await?;
    }
}

async fn drain(r: &mut BufReader<TcpStream>, len: u64) -> std::io::Result<u64> {
    let n = tokio::io::copy(&mut (&mut *r).take(len), &mut tokio::io::sink()).await?;
    if n < len {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    Ok(n)
}

/// A `transfer-encoding: chunked` body; its length.
async fn read_chunked(r: &mut BufReader<TcpStream>) -> std::io::Result<u64> {
    let mut total = 0;
    let mut line = String::new();
    loop {
        line.clear();
        r.read_line(&mut line).await?;
        let size = line.trim_end().split(';').next().unwrap_or_default();
        let size = u64::from_str_radix(size.trim(), 16).map_err(|_| std::io::Error::other("bad chunk size"))?;
        if size == 0 {
            // Trailers up to the blank line.
            loop {
                line.clear();
                if r.read_line(&mut line).await? == 0 || line.trim_end().is_empty() {
                    return Ok(total);
                }
            }
        }
        total += drain(r, size).await?;
        line.clear();
        r.read_line(&mut line).await?; // the CRLF after the chunk
    }
}
