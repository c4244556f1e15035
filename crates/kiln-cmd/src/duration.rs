//! Duration and size flags (`--lease-ttl 30s`, `--kill-grace 1m30s`,
//! `--log-limit 100MiB`): the same syntax as workflow files, through the one
//! parser of `kiln_workflow` (humantime and bytesize underneath).

/// A positive duration: `30s`, `500ms`, `1m30s`, `2h`, or plain seconds.
pub fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    let d = kiln_workflow::parse_duration(s)?;
    if d.is_zero() {
        return Err(format!("duration `{}` must be greater than zero", s.trim()));
    }
    Ok(d)
}

/// A duration, or `off` / `0` for none (`Duration::ZERO`).
pub fn parse_duration_or_off(s: &str) -> Result<std::time::Duration, String> {
    match s.trim() {
        "off" | "0" => Ok(std::time::Duration::ZERO),
        _ => parse_duration(s),
    }
}

/// A byte size: `100MiB`, `16 MiB`, `1GB`, or plain bytes.
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    kiln_workflow::parse_bytes(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("30s").unwrap().as_millis(), 30_000);
        assert_eq!(parse_duration("500ms").unwrap().as_millis(), 500);
        assert_eq!(parse_duration("2m").unwrap().as_secs(), 120);
        assert_eq!(parse_duration("1m30s").unwrap().as_secs(), 90);
        assert_eq!(parse_duration("7").unwrap().as_secs(), 7);
        assert!(parse_duration("fast").is_err());
        assert!(parse_duration("0s").is_err());
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_bytes("100MiB"), Ok(100 << 20));
        assert_eq!(parse_bytes("100 MiB"), Ok(100 << 20));
        assert!(parse_bytes("much").is_err());
    }
}
