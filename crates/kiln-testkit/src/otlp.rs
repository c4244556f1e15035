//! An OTLP trace receiver for tests (issue 19): what a collector would
//! get from `--otlp-endpoint`, decoded from the protobuf wire format by the
//! OpenTelemetry project's own message types. One receiver listens for both
//! transports: OTLP/HTTP (`POST /v1/traces`, `application/x-protobuf`) and
//! OTLP/gRPC (`TraceService/Export`).

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{TraceService, TraceServiceServer};
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use prost::Message;
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// One exported span, ids in lower-case hex (the parent empty for a root).
#[derive(Debug, Clone)]
pub struct ReceivedSpan {
    /// The resource's `service.name` (`kiln-server`, `kiln-agent`, `kiln`).
    pub service: String,
    pub name: String,
    pub trace_id: String,
    pub span_id: String,
    pub parent_span_id: String,
    pub attributes: BTreeMap<String, String>,
    /// Which transport brought it: `http` or `grpc`.
    pub transport: &'static str,
}

type Spans = Arc<Mutex<Vec<ReceivedSpan>>>;

/// A running receiver; stops when dropped (its threads and tasks die with
/// the test process).
pub struct OtlpReceiver {
    /// Base URL for `--otlp-protocol http` (the exporter adds /v1/traces).
    pub http_url: String,
    /// URL for `--otlp-protocol grpc`.
    pub grpc_url: String,
    spans: Spans,
    grpc: tokio::task::JoinHandle<()>,
}

impl OtlpReceiver {
    /// Listen on two loopback ports. Must be called inside a Tokio runtime.
    pub async fn start() -> anyhow::Result<OtlpReceiver> {
        let spans: Spans = Arc::default();
        let http = TcpListener::bind("127.0.0.1:0")?;
        let http_url = format!("http://{}", http.local_addr()?);
        let s = spans.clone();
        std::thread::spawn(move || {
            for conn in http.incoming().flatten() {
                let s = s.clone();
                std::thread::spawn(move || serve_http(conn, &s));
            }
        });
        let grpc = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let grpc_url = format!("http://{}", grpc.local_addr()?);
        let service = TraceServiceServer::new(Collector(spans.clone()));
        let grpc = tokio::spawn(async move {
            let incoming = tokio_stream::wrappers::TcpListenerStream::new(grpc);
            let _ = tonic::transport::Server::builder().add_service(service).serve_with_incoming(incoming).await;
        });
        Ok(OtlpReceiver { http_url, grpc_url, spans, grpc })
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<ReceivedSpan> {
        self.spans.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Wait (bounded) until the spans received satisfy `f`; the spans then.
    pub async fn wait_for(&self, timeout: Duration, f: impl Fn(&[ReceivedSpan]) -> bool) -> Vec<ReceivedSpan> {
        let deadline = Instant::now() + timeout;
        loop {
            let spans = self.spans();
            if f(&spans) || Instant::now() > deadline {
                return spans;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for OtlpReceiver {
    fn drop(&mut self) {
        self.grpc.abort();
    }
}

fn record(spans: &Spans, req: ExportTraceServiceRequest, transport: &'static str) {
    let mut out = spans.lock().unwrap_or_else(|e| e.into_inner());
    for rs in req.resource_spans {
        let service = rs
            .resource
            .iter()
            .flat_map(|r| &r.attributes)
            .find(|kv| kv.key == "service.name")
            .map(|kv| any_text(kv.value.as_ref().and_then(|v| v.value.as_ref())))
            .unwrap_or_default();
        for ss in rs.scope_spans {
            for span in ss.spans {
                out.push(ReceivedSpan {
                    service: service.clone(),
                    name: span.name,
                    trace_id: hex(&span.trace_id),
                    span_id: hex(&span.span_id),
                    parent_span_id: hex(&span.parent_span_id),
                    attributes: span
                        .attributes
                        .iter()
                        .map(|kv| (kv.key.clone(), any_text(kv.value.as_ref().and_then(|v| v.value.as_ref()))))
                        .collect(),
                    transport,
                });
            }
        }
    }
}

fn any_text(v: Option<&AnyValue>) -> String {
    match v {
        Some(AnyValue::StringValue(s)) => s.clone(),
        Some(AnyValue::IntValue(i)) => i.to_string(),
        Some(AnyValue::BoolValue(b)) => b.to_string(),
        Some(AnyValue::DoubleValue(d)) => d.to_string(),
        Some(other) => format!("{other:?}"),
        None => String::new(),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

struct Collector(Spans);

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        record(&self.0, request.into_inner(), "grpc");
        Ok(tonic::Response::new(ExportTraceServiceResponse { partial_success: None }))
    }
}

/// A minimal HTTP/1.1 server for `POST /v1/traces` (keep-alive, bodies by
/// Content-Length): enough for the exporter, strict about the rest.
fn serve_http(mut conn: std::net::TcpStream, spans: &Spans) {
    let _ = conn.set_read_timeout(Some(Duration::from_secs(30)));
    let mut buf = Vec::new();
    loop {
        let head_end = loop {
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            let mut chunk = [0u8; 8192];
            match conn.read(&mut chunk) {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
        let mut lines = head.lines();
        let request_line = lines.next().unwrap_or_default().to_string();
        let mut length = 0usize;
        let mut content_type = String::new();
        for l in lines {
            if let Some((k, v)) = l.split_once(':') {
                match k.trim().to_ascii_lowercase().as_str() {
                    "content-length" => length = v.trim().parse().unwrap_or(0),
                    "content-type" => content_type = v.trim().to_string(),
                    _ => {}
                }
            }
        }
        while buf.len() < head_end + length {
            let mut chunk = [0u8; 65536];
            match conn.read(&mut chunk) {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        let body: Vec<u8> = buf.drain(..head_end + length).skip(head_end).collect();
        let status = if !request_line.starts_with("POST /v1/traces ") {
            "404 Not Found"
        } else if content_type != "application/x-protobuf" {
            "415 Unsupported Media Type"
        } else {
            match ExportTraceServiceRequest::decode(body.as_slice()) {
                Ok(req) => {
                    record(spans, req, "http");
                    "200 OK"
                }
                Err(_) => "400 Bad Request",
            }
        };
        let reply = ExportTraceServiceResponse { partial_success: None }.encode_to_vec();
        let head = format!(
            "HTTP/1.1 {status}\r\nContent-Type: application/x-protobuf\r\nContent-Length: {}\r\n\r\n",
            reply.len()
        );
        if conn.write_all(head.as_bytes()).and_then(|_| conn.write_all(&reply)).is_err() {
            return;
        }
    }
}
