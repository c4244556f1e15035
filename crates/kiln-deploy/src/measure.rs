//! One measurement: an instant query against Prometheus's HTTP API and the
//! gate's condition checked on its answer. Every way this can go wrong —
//! Prometheus unreachable, slow, refusing the query, answering something
//! that is not an instant vector or scalar, answering no series — is a
//! *failed measurement* with a message saying which, never an error the
//! caller must handle: the gate's failure limit is what absorbs them.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use reqwest::{StatusCode, Url};
use serde_json::Value;

use crate::condition::{Condition, EvalError};
use crate::gate::{PrometheusGate, fmt_duration};

/// The largest answer read from Prometheus; a query matching more series
/// than fit is a failed measurement (aggregate it with `sum`, `max`, …).
pub const MAX_ANSWER_BYTES: usize = 4 * 1024 * 1024;

/// How many sample values a message quotes before it abbreviates.
const QUOTED_VALUES: usize = 5;

/// The outcome of one query.
#[derive(Debug, Clone, PartialEq)]
pub struct Measurement {
    /// When the query was sent, in milliseconds since the Unix epoch.
    pub at_ms: u64,
    /// The samples' values in Prometheus's order (one for a scalar; empty
    /// when the query failed or returned no series).
    pub values: Vec<f64>,
    /// Whether the answer met the gate's `success` condition.
    pub ok: bool,
    /// What was measured, in words: `result = 0.31 does not meet
    /// `result < 0.05``, `the query returned no series …`, `could not
    /// connect to Prometheus at …`.
    pub message: String,
}

/// Runs the gate's query once against the Prometheus whose base URL is
/// `prometheus` (`http://host:9090`, or with a path prefix such as
/// `http://host/prometheus/`) and checks the answer against the gate's
/// condition. Never fails: see the module docs. The request times out after
/// [`PrometheusGate::query_timeout`], which is also passed to Prometheus as
/// the query's own `timeout`.
pub async fn measure(http: &reqwest::Client, prometheus: &str, gate: &PrometheusGate) -> Measurement {
    let at_ms =
        SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    match query(http, prometheus, &gate.query, gate.query_timeout()).await {
        Ok(answer) => {
            let (ok, mut message) = judge(&gate.success, &answer.values);
            if !answer.warnings.is_empty() {
                message.push_str(&format!(" (Prometheus warned: {})", answer.warnings.join("; ")));
            }
            Measurement { at_ms, values: answer.values, ok, message }
        }
        Err(message) => Measurement { at_ms, values: Vec::new(), ok: false, message },
    }
}

/// Whether `values` meet `condition`, and the message saying so.
pub(crate) fn judge(condition: &Condition, values: &[f64]) -> (bool, String) {
    if values.is_empty() && condition.reads_samples() {
        return (
            false,
            format!(
                "the query returned no series, so `{condition}` cannot be met (is the metric scraped yet, and do its labels match?)"
            ),
        );
    }
    match condition.evaluate(values) {
        Ok(true) => (true, format!("{} meets `{condition}`", describe_values(values))),
        Ok(false) => (false, format!("{} does not meet `{condition}`", describe_values(values))),
        Err(e @ EvalError::MissingSample { .. }) => (false, format!("{e}, so `{condition}` cannot be met")),
    }
}

fn describe_values(values: &[f64]) -> String {
    match values {
        [] => "no series".to_string(),
        [one] => format!("result = {}", fmt_value(*one)),
        many => {
            let shown: Vec<String> = many.iter().take(QUOTED_VALUES).map(|v| fmt_value(*v)).collect();
            if many.len() > QUOTED_VALUES {
                format!("result = [{}, … {} series]", shown.join(", "), many.len())
            } else {
                format!("result = [{}]", shown.join(", "))
            }
        }
    }
}

/// A value as Prometheus writes it (`NaN`, `+Inf`, `-Inf`, `0.31`).
pub(crate) fn fmt_value(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v == f64::INFINITY {
        "+Inf".into()
    } else if v == f64::NEG_INFINITY {
        "-Inf".into()
    } else {
        v.to_string()
    }
}

#[derive(Debug, PartialEq)]
pub(crate) struct Answer {
    pub values: Vec<f64>,
    pub warnings: Vec<String>,
}

async fn query(http: &reqwest::Client, prometheus: &str, query: &str, timeout: Duration) -> Result<Answer, String> {
    let (url, shown) = query_url(prometheus, query, timeout)?;
    let mut response = http.get(url).timeout(timeout).send().await.map_err(|e| transport_error(e, &shown, timeout))?;
    let status = response.status();
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(|e| transport_error(e, &shown, timeout))? {
        if body.len() + chunk.len() > MAX_ANSWER_BYTES {
            return Err(format!(
                "Prometheus's answer is larger than {} MiB; aggregate the query (sum, max, topk, …) so it returns fewer series",
                MAX_ANSWER_BYTES / (1024 * 1024)
            ));
        }
        body.extend_from_slice(&chunk);
    }
    parse_answer(status, &body)
}

/// The query URL under the base (whose path prefix is kept), and the base
/// as messages show it (without a password).
fn query_url(prometheus: &str, query: &str, timeout: Duration) -> Result<(Url, String), String> {
    let mut base =
        Url::parse(prometheus.trim()).map_err(|e| format!("the Prometheus URL `{prometheus}` is not valid: {e}"))?;
    if !matches!(base.scheme(), "http" | "https") {
        return Err(format!("the Prometheus URL `{prometheus}` is not an http:// or https:// URL"));
    }
    if !base.path().ends_with('/') {
        let path = format!("{}/", base.path());
        base.set_path(&path);
    }
    base.set_query(None);
    base.set_fragment(None);
    let mut shown = base.clone();
    let _ = shown.set_password(None);
    let mut url = base.join("api/v1/query").map_err(|e| format!("the Prometheus URL `{shown}` is not valid: {e}"))?;
    url.query_pairs_mut().append_pair("query", query).append_pair("timeout", &format!("{}ms", timeout.as_millis()));
    Ok((url, shown.to_string()))
}

fn transport_error(e: reqwest::Error, shown: &str, timeout: Duration) -> String {
    if e.is_timeout() {
        return format!("Prometheus at {shown} did not answer within {}", fmt_duration(timeout));
    }
    // reqwest's own message repeats the whole URL (query included); the
    // causes below it say what happened.
    let mut causes = Vec::new();
    let mut source = std::error::Error::source(&e);
    while let Some(s) = source {
        let text = s.to_string();
        if !causes.contains(&text) {
            causes.push(text);
        }
        source = s.source();
    }
    let what =
        if e.is_connect() { "could not connect to Prometheus at" } else { "the request to Prometheus failed at" };
    if causes.is_empty() {
        format!("{what} {shown}: {}", e.without_url())
    } else {
        format!("{what} {shown}: {}", causes.join(": "))
    }
}

/// Reads an answer of `/api/v1/query` (any HTTP status: Prometheus's errors
/// come as JSON with 400, 422 or 503).
pub(crate) fn parse_answer(status: StatusCode, body: &[u8]) -> Result<Answer, String> {
    let json: Option<Value> = serde_json::from_slice(body).ok();
    let Some(Value::Object(json)) = json else {
        return Err(if status.is_success() {
            format!("Prometheus's answer is not JSON: {}", snippet(body))
        } else {
            format!("Prometheus answered {status}: {}", snippet(body))
        });
    };
    match json.get("status").and_then(Value::as_str) {
        Some("success") => {}
        Some("error") => {
            let kind = json.get("errorType").and_then(Value::as_str).unwrap_or("unknown");
            let error = json.get("error").and_then(Value::as_str).unwrap_or("(no message)");
            return Err(format!("Prometheus refused the query ({kind}, HTTP {}): {error}", status.as_u16()));
        }
        _ if !status.is_success() => {
            return Err(format!("Prometheus answered {status}: {}", snippet(body)));
        }
        _ => return Err(format!("Prometheus's answer has no `status`: {}", snippet(body))),
    }
    let warnings = json
        .get("warnings")
        .and_then(Value::as_array)
        .map(|w| w.iter().filter_map(Value::as_str).map(str::to_string).collect())
        .unwrap_or_default();
    let data = json.get("data");
    let result = data.and_then(|d| d.get("result"));
    let values = match data.and_then(|d| d.get("resultType")).and_then(Value::as_str) {
        Some("vector") => {
            let samples =
                result.and_then(Value::as_array).ok_or("Prometheus's vector answer has no `data.result` list")?;
            samples
                .iter()
                .map(|s| match s.get("value") {
                    Some(pair) => sample_value(pair),
                    None if s.get("histogram").is_some() => Err(
                        "the query returned a native histogram; compare a float such as histogram_quantile(…) or histogram_count(…)"
                            .to_string(),
                    ),
                    None => Err(format!("a series in Prometheus's answer has no value: {s}")),
                })
                .collect::<Result<Vec<f64>, String>>()?
        }
        Some("scalar") => vec![sample_value(result.unwrap_or(&Value::Null))?],
        Some("matrix") => {
            return Err(
                "the query returned a range vector; a gate needs an instant vector or a scalar (remove the `[…]` range, or wrap it in rate(), avg_over_time(), …)"
                    .into(),
            );
        }
        Some(other) => {
            return Err(format!("the query returned a {other}; a gate needs an instant vector or a scalar"));
        }
        None => return Err(format!("Prometheus's answer has no `data.resultType`: {}", snippet(body))),
    };
    Ok(Answer { values, warnings })
}

/// `[<unix time>, "<value>"]`, the value as Prometheus writes floats.
fn sample_value(pair: &Value) -> Result<f64, String> {
    let text = pair
        .as_array()
        .and_then(|p| p.get(1))
        .and_then(Value::as_str)
        .ok_or_else(|| format!("a sample in Prometheus's answer is not [time, \"value\"]: {pair}"))?;
    parse_float(text).ok_or_else(|| format!("Prometheus answered `{text}`, which is not a number"))
}

fn parse_float(text: &str) -> Option<f64> {
    match text {
        "NaN" => Some(f64::NAN),
        "+Inf" | "Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        t => t.parse().ok(),
    }
}

fn snippet(body: &[u8]) -> String {
    const MAX: usize = 200;
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    if text.is_empty() {
        return "(empty body)".into();
    }
    match text.char_indices().nth(MAX) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cond(s: &str) -> Condition {
        s.parse().unwrap()
    }

    #[test]
    fn judging_says_what_was_measured() {
        let c = cond("result < 0.05");
        assert_eq!(judge(&c, &[0.01]), (true, "result = 0.01 meets `result < 0.05`".into()));
        assert_eq!(judge(&c, &[0.31]), (false, "result = 0.31 does not meet `result < 0.05`".into()));
        assert_eq!(judge(&c, &[f64::NAN]), (false, "result = NaN does not meet `result < 0.05`".into()));
        let (ok, msg) = judge(&c, &[]);
        assert!(!ok);
        assert!(msg.starts_with("the query returned no series, so `result < 0.05` cannot be met"), "{msg}");
        assert_eq!(judge(&cond("len(result) == 0"), &[]), (true, "no series meets `len(result) == 0`".into()));
        assert_eq!(
            judge(&cond("result[1] > 0"), &[1.0]),
            (false, "`result[1]` does not exist: the query returned 1 series, so `result[1] > 0` cannot be met".into())
        );
        assert_eq!(
            judge(&cond("len(result) > 0"), &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]).1,
            "result = [1, 2, 3, 4, 5, … 6 series] meets `len(result) > 0`"
        );
    }

    #[test]
    fn answers_are_read_as_prometheus_writes_them() {
        let ok = StatusCode::OK;
        let vector = br#"{"status":"success","data":{"resultType":"vector","result":[
            {"metric":{"a":"1"},"value":[1700000000.5,"0.31"]},
            {"metric":{"a":"2"},"value":[1700000000.5,"NaN"]},
            {"metric":{"a":"3"},"value":[1700000000.5,"+Inf"]},
            {"metric":{"a":"4"},"value":[1700000000.5,"-Inf"]},
            {"metric":{"a":"5"},"value":[1700000000.5,"1e-7"]}]}}"#;
        let a = parse_answer(ok, vector).unwrap();
        assert_eq!(a.values[0], 0.31);
        assert!(a.values[1].is_nan());
        assert_eq!(a.values[2..], [f64::INFINITY, f64::NEG_INFINITY, 1e-7]);
        let scalar = br#"{"status":"success","data":{"resultType":"scalar","result":[1.5,"2"]},"warnings":["w1"]}"#;
        assert_eq!(parse_answer(ok, scalar).unwrap(), Answer { values: vec![2.0], warnings: vec!["w1".into()] });
    }

    #[test]
    fn bad_answers_are_said() {
        let cases: [(u16, &[u8], &str); 7] = [
            (
                400,
                br#"{"status":"error","errorType":"bad_data","error":"1:5: parse error: unexpected"}"#,
                "Prometheus refused the query (bad_data, HTTP 400): 1:5: parse error: unexpected",
            ),
            (
                503,
                br#"{"status":"error","errorType":"timeout","error":"query timed out in expression evaluation"}"#,
                "Prometheus refused the query (timeout, HTTP 503): query timed out in expression evaluation",
            ),
            (502, b"<html>Bad Gateway</html>", "Prometheus answered 502 Bad Gateway: <html>Bad Gateway</html>"),
            (404, b"", "Prometheus answered 404 Not Found: (empty body)"),
            (200, b"hello", "Prometheus's answer is not JSON: hello"),
            (
                200,
                br#"{"status":"success","data":{"resultType":"matrix","result":[]}}"#,
                "the query returned a range vector; a gate needs an instant vector or a scalar (remove the `[…]` range, or wrap it in rate(), avg_over_time(), …)",
            ),
            (
                200,
                br#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[1,"x"]}]}}"#,
                "Prometheus answered `x`, which is not a number",
            ),
        ];
        for (status, body, want) in cases {
            assert_eq!(parse_answer(StatusCode::from_u16(status).unwrap(), body).unwrap_err(), want);
        }
    }

    #[test]
    fn query_url_keeps_the_path_prefix_and_hides_the_password() {
        let t = Duration::from_secs(10);
        for (base, want) in [
            ("http://127.0.0.1:9090", "http://127.0.0.1:9090/api/v1/query?query=up+%3E+0&timeout=10000ms"),
            ("http://h/prom", "http://h/prom/api/v1/query?query=up+%3E+0&timeout=10000ms"),
            ("http://h/prom/", "http://h/prom/api/v1/query?query=up+%3E+0&timeout=10000ms"),
        ] {
            assert_eq!(query_url(base, "up > 0", t).unwrap().0.as_str(), want);
        }
        let (_, shown) = query_url("https://u:secret@h/p", "up", t).unwrap();
        assert_eq!(shown, "https://u@h/p/");
        assert!(query_url("localhost:9090", "up", t).unwrap_err().contains("not an http:// or https:// URL"));
        assert!(query_url("::", "up", t).unwrap_err().starts_with("the Prometheus URL `::` is not valid"));
    }
}
