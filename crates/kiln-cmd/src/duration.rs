//! Duration flags (`--lease-ttl 30s`, `--hold 5s`).

/// `30s`, `500ms`, `2m`, `1h` or plain seconds.
pub fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    let s = s.trim();
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(s.len()));
    let n: f64 = num.parse().map_err(|_| format!("invalid duration `{s}` (try 30s, 500ms, 2m)"))?;
    let secs = match unit {
        "" | "s" => n,
        "ms" => n / 1000.0,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        _ => {
            return Err(format!("invalid duration unit in `{s}` (use ms, s, m or h)"));
        }
    };
    if !(secs > 0.0 && secs < 1e7) {
        return Err(format!("duration `{s}` out of range"));
    }
    Ok(std::time::Duration::from_secs_f64(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("30s").unwrap().as_millis(), 30_000);
        assert_eq!(parse_duration("500ms").unwrap().as_millis(), 500);
        assert_eq!(parse_duration("2m").unwrap().as_secs(), 120);
        assert_eq!(parse_duration("7").unwrap().as_secs(), 7);
        assert!(parse_duration("fast").is_err());
        assert!(parse_duration("0s").is_err());
    }
}
