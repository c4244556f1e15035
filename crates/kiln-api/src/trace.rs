//! Trace context (issue 19): one W3C `traceparent` per run, carried from
//! the trigger through the agent protocol, so the server's and the agent's
//! log lines and spans for a run share one trace id.
//!
//! The context travels as a `traceparent` header
//! (`00-<32 hex trace id>-<16 hex parent span id>-<2 hex flags>`, W3C Trace
//! Context level 1) on a submission and on an attempt's calls, and as
//! [`crate::Assignment::traceparent`] in a claim. [`enter`] makes a
//! `tracing` span part of that trace: with an OpenTelemetry layer installed
//! (`--otlp-endpoint`) the span is exported as a child of the remote parent;
//! without one, the ids are made here and only logged, at no cost beyond a
//! random number.

use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState};
use std::fmt;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The header's name.
pub const HEADER: &str = "traceparent";

/// A parsed `traceparent`: the trace, the span that is the parent of
/// whatever receives it, and the sampled flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceParent {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    pub flags: u8,
}

impl TraceParent {
    /// Parse a header value. Anything that is not a valid version-00 value
    /// (wrong length, upper-case or non-hex digits, all-zero ids, version
    /// `ff`) is `None`: per the W3C rule the receiver then starts a new
    /// trace rather than refusing the request. A future version's value is
    /// read by its first four fields, as the specification asks.
    pub fn parse(value: &str) -> Option<TraceParent> {
        let value = value.trim();
        let mut parts = value.split('-');
        let (version, trace, span, flags) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        let lower_hex =
            |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        if !lower_hex(version, 2)
            || version == "ff"
            || !lower_hex(trace, 32)
            || !lower_hex(span, 16)
            || !lower_hex(flags, 2)
        {
            return None;
        }
        if version == "00" && (parts.next().is_some() || value.len() != 55) {
            return None;
        }
        let mut tp = TraceParent { trace_id: [0; 16], span_id: [0; 8], flags: 0 };
        let mut f = [0u8; 1];
        hex::decode_to_slice(trace, &mut tp.trace_id).ok()?;
        hex::decode_to_slice(span, &mut tp.span_id).ok()?;
        hex::decode_to_slice(flags, &mut f).ok()?;
        tp.flags = f[0];
        if tp.trace_id == [0; 16] || tp.span_id == [0; 8] {
            return None;
        }
        Some(tp)
    }

    /// A new trace (its first span id random too), sampled.
    pub fn random() -> TraceParent {
        let mut tp = TraceParent { trace_id: rand::random(), span_id: rand::random(), flags: 1 };
        // All-zero ids are invalid; the odds are nil, but be exact.
        tp.trace_id[15] |= u8::from(tp.trace_id == [0; 16]);
        tp.span_id[7] |= u8::from(tp.span_id == [0; 8]);
        tp
    }

    /// The same trace with a new (random) parent span.
    pub fn child(self) -> TraceParent {
        let mut span_id: [u8; 8] = rand::random();
        span_id[7] |= u8::from(span_id == [0; 8]);
        TraceParent { span_id, ..self }
    }

    /// The trace id as 32 lower-case hex digits (what log lines carry).
    pub fn trace_id_hex(&self) -> String {
        hex::encode(self.trace_id)
    }

    fn span_context(&self) -> SpanContext {
        SpanContext::new(
            TraceId::from_bytes(self.trace_id),
            SpanId::from_bytes(self.span_id),
            TraceFlags::new(self.flags),
            true,
            TraceState::default(),
        )
    }
}

impl fmt::Display for TraceParent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "00-{}-{}-{:02x}", hex::encode(self.trace_id), hex::encode(self.span_id), self.flags)
    }
}

/// Make `span` part of the trace: a child of `parent` when given (a remote
/// parent: the submitter's, the claim's, the attempt's), else of whatever
/// the OpenTelemetry layer picks (the current span) or a new trace. Records
/// the span's `trace_id` field (declare it `trace_id = tracing::field::Empty`)
/// and returns the context to hand on to the span's children elsewhere.
///
/// Call it right after creating the span, before it is first entered.
pub fn enter(span: &tracing::Span, parent: Option<TraceParent>) -> TraceParent {
    if let Some(p) = parent {
        let cx = opentelemetry::Context::new().with_remote_span_context(p.span_context());
        // Fails only for a disabled span or one already started: then it is
        // simply not linked.
        let _ = span.set_parent(cx);
    }
    let cx = span.context();
    let sc = cx.span().span_context().clone();
    let tp = if sc.is_valid() {
        TraceParent {
            trace_id: sc.trace_id().to_bytes(),
            span_id: sc.span_id().to_bytes(),
            flags: sc.trace_flags().to_u8(),
        }
    } else {
        match parent {
            Some(p) => p.child(),
            None => TraceParent::random(),
        }
    };
    span.record("trace_id", tp.trace_id_hex().as_str());
    tp
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_w3c_example_round_trips() {
        let tp = TraceParent::parse(GOOD).unwrap();
        assert_eq!(tp.trace_id_hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(tp.flags, 1);
        assert_eq!(tp.to_string(), GOOD);
    }

    #[test]
    fn invalid_values_start_a_new_trace() {
        for bad in [
            "",
            "00",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1",
            "0-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ] {
            assert_eq!(TraceParent::parse(bad), None, "{bad:?}");
        }
        // A later version is read by its first four fields.
        let later = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-ever";
        assert_eq!(TraceParent::parse(later).unwrap().trace_id_hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
    }

    #[test]
    fn without_an_exporter_children_keep_the_trace() {
        let parent = TraceParent::parse(GOOD).unwrap();
        let span = tracing::info_span!("x", trace_id = tracing::field::Empty);
        let tp = enter(&span, Some(parent));
        assert_eq!(tp.trace_id, parent.trace_id);
        assert_ne!(tp.span_id, parent.span_id);
        let fresh = enter(&tracing::Span::none(), None);
        assert_ne!(fresh.trace_id, [0; 16]);
        assert_eq!(TraceParent::parse(&fresh.to_string()), Some(fresh));
    }
}
