//! Diagnostic output of the daemons (issue 19): the log lines on stderr,
//! as text or one JSON object per line, and, with `--otlp-endpoint`, the
//! spans exported over OTLP.
//!
//! A JSON line carries the correlation ids of the run it is about at its
//! top level, `run_id`, `job_id`, `epoch` and `trace_id`, taken from the
//! event's own fields and from every span it happens in (the innermost
//! wins), so a log pipeline can select one run's lines across server and
//! agents without knowing which span said what.

use crate::cli::{DaemonLog, LogFormat, OtlpProtocol};
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

/// Install the log subscriber (and the OTLP layer when asked for) of a
/// daemon with its logging flags `daemon` (`None`: a client command), whose
/// spans say `service`. Must be called inside the Tokio runtime (the gRPC
/// exporter needs it).
pub fn init(daemon_log: Option<&DaemonLog>, service: &'static str) -> Result<Telemetry, String> {
    let daemon = daemon_log.is_some();
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
    // A client command has no --log-format (it is a daemon flag), but honours KILN_LOG_FORMAT.
    let client_log = DaemonLog {
        log_format: match std::env::var("KILN_LOG_FORMAT").as_deref() {
            Ok("json") => LogFormat::Json,
            _ => LogFormat::Text,
        },
        otlp_endpoint: None,
        otlp_protocol: OtlpProtocol::Http,
    };
    let log = daemon_log.unwrap_or(&client_log);
    let logs: Boxed = match log.log_format {
        LogFormat::Text => {
            Box::new(tracing_subscriber::fmt::layer().with_writer(std::io::stderr).with_ansi(ansi).with_filter(filter))
        }
        LogFormat::Json => Box::new(
            Correlate
                .and_then(
                    tracing_subscriber::fmt::layer()
                        .with_writer(std::io::stderr)
                        .fmt_fields(JsonFields::new())
                        .event_format(JsonLines),
                )
                .with_filter(filter),
        ),
    };
    let (otel, provider): (Option<Boxed>, _) = match &log.otlp_endpoint {
        None => (None, None),
        Some(endpoint) => {
            let provider = provider(endpoint, log.otlp_protocol, service)?;
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
/// `target`, the correlation ids at the top level, `fields` (the event's)
/// and `spans` (outermost first, each with its `name` and fields).
///
/// The line is written straight to the output: a span's fields were
/// formatted as a JSON object once, when the span was made, and are
/// spliced in as they are; its correlation ids were picked out once too
/// (by [`Correlate`]), so an event costs no parse of its spans.
struct JsonLines;

impl<S, N> FormatEvent<S, N> for JsonLines
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(&self, ctx: &FmtContext<'_, S, N>, mut w: Writer<'_>, event: &Event<'_>) -> fmt::Result {
        let meta = event.metadata();
        let mut fields = Map::new();
        event.record(&mut Fields(&mut fields));
        let mut ids = Ids::default();
        let mut spans = String::new();
        if let Some(scope) = ctx.event_scope() {
            for span in scope.from_root() {
                let ext = span.extensions();
                if let Some(found) = ext.get::<Ids>() {
                    ids.update(found);
                }
                spans.push_str(if spans.is_empty() { "[" } else { "," });
                spans.push_str("{\"name\":");
                spans.push_str(&json_str(span.name()));
                match ext.get::<FormattedFields<N>>().map(|f| f.as_str().trim()) {
                    Some(f) if f.len() > 2 && f.starts_with('{') => {
                        spans.push(',');
                        spans.push_str(&f[1..]);
                    }
                    _ => spans.push('}'),
                }
            }
        }
        ids.lift(&fields);
        write!(
            w,
            "{{\"timestamp\":\"{}\",\"level\":\"{}\",\"target\":{}",
            humantime::format_rfc3339_micros(std::time::SystemTime::now()),
            meta.level().as_str(),
            json_str(meta.target())
        )?;
        for ((_, top), v) in CORRELATION[1..].iter().zip(&ids.0) {
            if let Some(v) = v {
                write!(w, ",\"{top}\":{v}")?;
            }
        }
        write!(w, ",\"fields\":{}", Value::Object(fields))?;
        if !spans.is_empty() {
            write!(w, ",\"spans\":{spans}]")?;
        }
        writeln!(w, "}}")
    }
}

fn json_str(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into())
}

/// The correlation ids found in a span's or an event's fields, in the
/// order of their top-level names (`run_id`, `job_id`, `epoch`, `trace_id`).
#[derive(Default, Clone)]
struct Ids([Option<Value>; 4]);

impl Ids {
    fn slot(name: &str) -> Option<usize> {
        let top = CORRELATION.iter().find(|(n, _)| *n == name)?.1;
        CORRELATION[1..].iter().position(|(_, t)| *t == top)
    }
    fn update(&mut self, other: &Ids) {
        for (mine, theirs) in self.0.iter_mut().zip(&other.0) {
            if theirs.is_some() {
                mine.clone_from(theirs);
            }
        }
    }
    fn lift(&mut self, from: &Map<String, Value>) {
        for (name, _) in CORRELATION {
            if let (Some(v), Some(i)) = (from.get(name), Self::slot(name)) {
                self.0[i] = Some(v.clone());
            }
        }
    }
    fn is_empty(&self) -> bool {
        self.0.iter().all(Option::is_none)
    }
}

/// Picks a span's correlation ids out of its fields once, when it is made
/// or recorded, for [`JsonLines`].
struct Correlate;

impl<S> Layer<S> for Correlate
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        id: &tracing::span::Id,
        ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        let mut found = Map::new();
        attrs.record(&mut Fields(&mut found));
        let mut ids = Ids::default();
        ids.lift(&found);
        if let (false, Some(span)) = (ids.is_empty(), ctx.span(id)) {
            span.extensions_mut().insert(ids);
        }
    }

    fn on_record(
        &self,
        id: &tracing::span::Id,
        values: &tracing::span::Record<'_>,
        ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        let mut found = Map::new();
        values.record(&mut Fields(&mut found));
        let mut ids = Ids::default();
        ids.lift(&found);
        if let (false, Some(span)) = (ids.is_empty(), ctx.span(id)) {
            let mut ext = span.extensions_mut();
            match ext.get_mut::<Ids>() {
                Some(have) => have.update(&ids),
                None => ext.insert(ids),
            }
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

    /// What `--log-format json` writes for an event in two spans.
    fn json_line(f: impl FnOnce()) -> Value {
        #[derive(Clone, Default)]
        struct Buf(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);
        impl std::io::Write for Buf {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let buf = Buf::default();
        let out = buf.clone();
        let layer = Correlate.and_then(
            tracing_subscriber::fmt::layer()
                .with_writer(move || out.clone())
                .fmt_fields(JsonFields::new())
                .event_format(JsonLines),
        );
        tracing::subscriber::with_default(tracing_subscriber::registry().with(layer), f);
        let text = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        assert_eq!(text.lines().count(), 1, "{text}");
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
    }

    #[test]
    fn a_json_line_lifts_the_innermost_ids_and_keeps_every_span() {
        let line = json_line(|| {
            let outer = tracing::info_span!("attempt", run = "r1", job_id = "j1", epoch = 1, trace_id = "t\"1");
            let _o = outer.enter();
            let inner = tracing::info_span!("step", epoch = 2, number = 3, job_id = tracing::field::Empty);
            inner.record("job_id", "j2");
            let _i = inner.enter();
            tracing::info!(run_id = "r9", bytes = 7u64, "a \"quoted\" message");
        });
        assert_eq!(line["level"], "INFO");
        // The event's own run_id beats the spans' `run`; the inner span's
        // epoch and (recorded later) job id beat the outer span's.
        assert_eq!(line["run_id"], "r9");
        assert_eq!(line["job_id"], "j2");
        assert_eq!(line["epoch"], 2);
        assert_eq!(line["trace_id"], "t\"1");
        assert_eq!(line["fields"]["message"], "a \"quoted\" message");
        assert_eq!(line["fields"]["bytes"], 7);
        assert_eq!(line["spans"][0]["name"], "attempt");
        assert_eq!(line["spans"][0]["run"], "r1");
        assert_eq!(line["spans"][1]["name"], "step");
        assert_eq!(line["spans"][1]["number"], 3);
        assert_eq!(line["spans"].as_array().unwrap().len(), 2);
    }

    #[test]
    fn a_json_line_outside_spans_has_no_ids_and_no_spans() {
        let line = json_line(|| {
            let empty = tracing::info_span!("quiet");
            let _e = empty.enter();
            tracing::warn!("plain");
        });
        assert_eq!(line["spans"], serde_json::json!([{"name": "quiet"}]));
        assert!(line.get("run_id").is_none() && line.get("trace_id").is_none(), "{line}");
        let line = json_line(|| tracing::warn!(epoch = 4, "bare"));
        assert!(line.get("spans").is_none(), "{line}");
        assert_eq!(line["epoch"], 4);
    }

    #[test]
    fn an_http_base_url_gets_the_traces_path() {
        assert_eq!(http_traces_url("http://127.0.0.1:4318"), "http://127.0.0.1:4318/v1/traces");
        assert_eq!(http_traces_url("http://127.0.0.1:4318/"), "http://127.0.0.1:4318/v1/traces");
        assert_eq!(http_traces_url("https://c.example/otlp/v1/traces"), "https://c.example/otlp/v1/traces");
    }
}
