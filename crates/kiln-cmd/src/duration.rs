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

/// `--memory-levels`: `off`, or three descending amounts of available
/// memory below which warning, degraded and critical start
/// (`2GiB,1GiB,500MiB`).
pub fn parse_memory_levels(s: &str) -> Result<[u64; 3], String> {
    let t = s.trim();
    if t.eq_ignore_ascii_case("off") {
        return Ok([0; 3]);
    }
    let expected = || format!("`{t}`: expected `off` or WARNING,DEGRADED,CRITICAL sizes, e.g. 2GiB,1GiB,500MiB");
    let parts: Vec<&str> = t.split(',').map(str::trim).collect();
    let [a, b, c] = parts.as_slice() else { return Err(expected()) };
    let mut out = [0u64; 3];
    for (slot, text) in out.iter_mut().zip([a, b, c]) {
        *slot = parse_bytes(text).map_err(|e| format!("{}: {e}", expected()))?;
    }
    if !(out[0] >= out[1] && out[1] >= out[2]) {
        return Err(format!("`{t}`: the levels must not increase (warning >= degraded >= critical)"));
    }
    Ok(out)
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

    #[test]
    fn memory_levels_are_three_descending_sizes_or_off() {
        assert_eq!(parse_memory_levels("2GiB,1GiB,500MiB").unwrap(), [2 << 30, 1 << 30, 500 << 20]);
        assert_eq!(parse_memory_levels(" off ").unwrap(), [0, 0, 0]);
        assert_eq!(parse_memory_levels("1000,1000,0").unwrap(), [1000, 1000, 0]);
        for bad in ["", "1GiB,2GiB,3GiB", "1GiB,1GiB", "a,b,c", "1GiB,1GiB,1GiB,1GiB"] {
            assert!(parse_memory_levels(bad).is_err(), "{bad:?} accepted");
        }
        assert!(parse_memory_levels("1GiB,2GiB,0").unwrap_err().contains("must not increase"));
    }
}
