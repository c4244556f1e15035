//! Diagnostic output of the daemons (issue 19): the log lines on stderr,
//! as text or one JSON object per line, and, with `--otlp-endpoint`, the
//! spans exported over OTLP.
//!
//! A JSON line carries the correlation ids of the run it is about at its
//! top level, `run_id`, `job_id`, `epoch` and `trace_id`, taken from the
//! event's own fields and from every span it happens in (the innermost
//! wins), so a log pipeline can select one run's lines across server and
//! agents without knowing which span said what.

use crate::cli::{Cli, LogFormat, OtlpProtocol};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::trace::SdkTracerProvider;
use serde_json::{Map, Value};
use std::fmt;
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::Layer;
use tracing_subscriber::fmt::format::{JsonFields, Writer};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, FormattedFields};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;

/// Field names lifted to a JSON line's top level, and their names there
/// (`run` is what most server lines call the run's id).
const CORRELATION: [(&str, &str); 5] =
    [("run", "run_id"), ("run_id", "run_id"), ("job_id", "job_id"), ("epoch", "epoch"), ("trace_id", "trace_id")];

/// What must live until the process ends: the span exporter, flushed by
/// [`Telemetry::shutdown`].
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Telemetry {
    /// Send the spans still buffered (a daemon's last ones) and stop the
    /// exporter. Waits at most the exporter's timeout.
    pub async fn shutdown(self) {
        if let Some(p) = self.provider {
            let _ = tokio::task::spawn_blocking(move || {
                if let Err(e) = p.shutdown() {
                    eprintln!("kiln: exporting the last spans failed: {e}");
                }
            })
            .await;
        }
    }
}

/// Install the log subscriber (and the OTLP layer when asked for). Must be
/// called inside the Tokio runtime (the gRPC exporter needs it).
pub fn init(cli: &Cli) -> Result<Telemetry, String> {
    let daemon = cli.command.is_daemon();
    let filter = tracing_subscriber::EnvFilter::try_from_env("KILN_LOG").unwrap_or_else(|_| {
        // PostgreSQL's "there is no transaction in progress" notice (a
        // ROLLBACK after a failed serializable COMMIT) is not worth a line each.
        tracing_subscriber::EnvFilter::new(if daemon {
            "info,sqlx=warn,sqlx::postgres::notice=error"
        } else {
            "warn,sqlx::postgres::notice=error"
        })
    });
    // Colours only on a terminal (a redirected log stays plain text), and never with NO_COLOR.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr()) && std::env::var_os("NO_COLOR").is_none();
    type Boxed = Box<dyn Layer<tracing_subscriber::Registry> + Send + Sync>;
    let logs: Boxed = match cli.log_format {
        LogFormat::Text => {
            Box::new(tracing_subscriber::fmt::layer().with_writer(std::io::stderr).with_ansi(ansi).with_filter(filter))
        }
        LogFormat::Json => Box::new(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .fmt_fields(JsonFields::new())
                .event_format(JsonLines)
                .with_filter(filter),
        ),
    };
    let (otel, provider): (Option<Boxed>, _) = match &cli.otlp_endpoint {
        None => (None, None),
        Some(_) if !daemon => {
            return Err("--otlp-endpoint is for `kiln up`, `kiln server` and `kiln agent` (their spans)".into());
        }
        Some(endpoint) => {
            let provider = provider(endpoint, cli.otlp_protocol, service_name(cli))?;
            let tracer = provider.tracer("kiln");
            // Spans at info and above: the run lifecycle, claim, prepare,
            // steps, upload, completion; not the store's debug detail.
            let layer = tracing_opentelemetry::layer().with_tracer(tracer).with_filter(
                tracing_subscriber::EnvFilter::new("info,sqlx=off,h2=off,tonic=off,hyper=off,reqwest=off"),
            );
            (Some(Box::new(layer)), Some(provider))
        }
    };
    let layers: Vec<Boxed> = std::iter::once(logs).chain(otel).collect();
    tracing_subscriber::registry().with(layers).try_init().map_err(|e| e.to_string())?;
    Ok(Telemetry { provider })
}

fn service_name(cli: &Cli) -> &'static str {
    match cli.command {
        crate::cli::Command::Server(_) => "kiln-server",
        crate::cli::Command::Agent(_) => "kiln-agent",
        _ => "kiln",
    }
}

/// The exporter: OTLP over gRPC (tonic) or HTTP/protobuf, batched.
fn provider(endpoint: &str, protocol: OtlpProtocol, service: &'static str) -> Result<SdkTracerProvider, String> {
    let exporter = match protocol {
        OtlpProtocol::Grpc => {
            opentelemetry_otlp::SpanExporter::builder().with_tonic().with_endpoint(endpoint.to_string()).build()
        }
        OtlpProtocol::Http => opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_endpoint(http_traces_url(endpoint))
            .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
            .build(),
    }
    .map_err(|e| format!("--otlp-endpoint {endpoint}: {e}"))?;
    let resource = opentelemetry_sdk::Resource::builder().with_service_name(service).build();
    Ok(SdkTracerProvider::builder().with_batch_exporter(exporter).with_resource(resource).build())
}

/// An OTLP/HTTP base URL (`http://collector:4318`) gets the traces path,
/// as `OTEL_EXPORTER_OTLP_ENDPOINT` does; a URL with a path is used as is.
fn http_traces_url(endpoint: &str) -> String {
    let trimmed = endpoint.trim_end_matches('/');
    let after_scheme = trimmed.split_once("://").map_or(trimmed, |(_, rest)| rest);
    if after_scheme.contains('/') { endpoint.to_string() } else { format!("{trimmed}/v1/traces") }
}

/// `--log-format json`: one object per line with `timestamp`, `level`,
/// `target`, `fields` (the event's), `spans` (outermost first, each with
/// its `name` and fields) and the correlation ids at the top level.
struct JsonLines;

impl<S, N> FormatEvent<S, N> for JsonLines
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(&self, ctx: &FmtContext<'_, S, N>, mut w: Writer<'_>, event: &Event<'_>) -> fmt::Result {
        let meta = event.metadata();
        let mut line = Map::new();
        line.insert(
            "timestamp".into(),
            humantime::format_rfc3339_micros(std::time::SystemTime::now()).to_string().into(),
        );
        line.insert("level".into(), meta.level().as_str().into());
        line.insert("target".into(), meta.target().into());
        let mut spans = Vec::new();
        if let Some(scope) = ctx.event_scope() {
            for span in scope.from_root() {
                let mut obj = Map::new();
                obj.insert("name".into(), span.name().into());
                if let Some(f) = span.extensions().get::<FormattedFields<N>>()
                    && let Ok(Value::Object(m)) = serde_json::from_str::<Value>(f)
                {
                    obj.extend(m);
                }
                lift(&obj, &mut line);
                spans.push(Value::Object(obj));
            }
        }
        let mut fields = Map::new();
        event.record(&mut Fields(&mut fields));
        lift(&fields, &mut line);
        line.insert("fields".into(), Value::Object(fields));
        if !spans.is_empty() {
            line.insert("spans".into(), Value::Array(spans));
        }
        writeln!(w, "{}", Value::Object(line))
    }
}

fn lift(from: &Map<String, Value>, line: &mut Map<String, Value>) {
    for (name, top) in CORRELATION {
        if let Some(v) = from.get(name) {
            line.insert(top.into(), v.clone());
        }
    }
}

/// An event's fields as JSON values (numbers and booleans kept as such).
struct Fields<'a>(&'a mut Map<String, Value>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0.insert(field.name().into(), format!("{value:?}").into());
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.insert(field.name().into(), value.into());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_http_base_url_gets_the_traces_path() {
        assert_eq!(http_traces_url("http://127.0.0.1:4318"), "http://127.0.0.1:4318/v1/traces");
        assert_eq!(http_traces_url("http://127.0.0.1:4318/"), "http://127.0.0.1:4318/v1/traces");
        assert_eq!(http_traces_url("https://c.example/otlp/v1/traces"), "https://c.example/otlp/v1/traces");
    }
}
