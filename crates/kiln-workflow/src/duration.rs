//! Durations and byte sizes as people write them — in workflow files
//! (`timeout: 1h30m`) and on the command line (`--lease-ttl 30s`,
//! `--log-limit 100MiB`). One parser for each, from maintained crates
//! (`humantime`, `bytesize`), so the CLI and the workflow language accept
//! the same syntax.

use std::time::Duration;

/// `90s`, `1m30s`, `2h 30m`, `500ms`, `1.5h`, `7d`, or a bare number of
/// seconds (`120`). Zero is allowed here; callers that need a positive
/// duration say so.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    if !t.is_empty() && t.chars().all(|c| c.is_ascii_digit()) {
        return t.parse::<u64>().map(Duration::from_secs).map_err(|_| format!("duration `{t}` is too large"));
    }
    humantime::parse_duration(t).map_err(|e| {
        format!("invalid duration `{t}` ({e}): write e.g. `90s`, `1m30s`, `2h`, `500ms` or a number of seconds")
    })
}

/// A duration as workflows write it, the inverse of [`parse_duration`] for
/// whole units: `500ms`, `90s`, `5m`, `2h`, `1h30m` (others in seconds).
pub fn format_duration(d: Duration) -> String {
    if d < Duration::from_secs(1) {
        return format!("{}ms", d.as_millis());
    }
    let s = d.as_secs();
    match (s / 3600, s % 3600 / 60, s % 60) {
        (0, 0, sec) => format!("{sec}s"),
        (0, m, 0) => format!("{m}m"),
        (h, 0, 0) => format!("{h}h"),
        (h, m, 0) => format!("{h}h{m}m"),
        _ => format!("{s}s"),
    }
}

/// `100MiB`, `100 MiB`, `1.5GB`, `64KiB`, `16M` or a bare number of bytes.
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let t = text.trim();
    t.parse::<bytesize::ByteSize>()
        .map(|b| b.as_u64())
        .map_err(|e| format!("invalid size `{t}` ({e}): write e.g. `100MiB`, `16 MiB`, `1GB` or a number of bytes"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_format_as_written_and_parse_back() {
        for (secs_ms, text) in [
            (400, "400ms"),
            (90_000, "90s"),
            (300_000, "5m"),
            (7_200_000, "2h"),
            (5_400_000, "1h30m"),
            (3_661_000, "3661s"),
        ] {
            let d = Duration::from_millis(secs_ms);
            assert_eq!(format_duration(d), text);
            assert_eq!(parse_duration(text).unwrap(), d);
        }
    }

    #[test]
    fn durations_people_write() {
        let secs = |t: &str| parse_duration(t).map(|d| d.as_secs_f64());
        assert_eq!(secs("90s"), Ok(90.0));
        assert_eq!(secs("1m30s"), Ok(90.0));
        assert_eq!(secs("2h30m"), Ok(9000.0));
        assert_eq!(secs("2h 30m"), Ok(9000.0));
        assert_eq!(secs("500ms"), Ok(0.5));
        assert_eq!(secs("1d"), Ok(86400.0));
        assert_eq!(secs("120"), Ok(120.0));
        assert_eq!(secs("0"), Ok(0.0));
        for bad in ["", "fast", "30x", "h", "-5s", "99999999999999999999999h"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn sizes_people_write() {
        assert_eq!(parse_bytes("100MiB"), Ok(100 << 20));
        assert_eq!(parse_bytes("100 MiB"), Ok(100 << 20));
        assert_eq!(parse_bytes("1GB"), Ok(1_000_000_000));
        assert_eq!(parse_bytes("64KiB"), Ok(64 << 10));
        assert_eq!(parse_bytes("20000000"), Ok(20_000_000));
        for bad in ["", "lots", "-1MiB"] {
            assert!(parse_bytes(bad).is_err(), "{bad}");
        }
    }
}
