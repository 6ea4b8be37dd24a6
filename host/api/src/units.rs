//! The one grammar for durations and sizes: the API's fields, the CLI's flags and the
//! agent's arguments all parse with these.
//!
//! Durations are Go's (`90s`, `5m`, `1h30m`, `500ms`; `0` alone is zero), as Kubernetes
//! writes them. Sizes are Kubernetes quantities (`128Mi`, `1Gi`, `64M`, `1000`).

use std::time::Duration;

/// Parses a Go-style duration (`1h30m`, `45s`, `500ms`, `0s`) into seconds.
pub fn parse_duration(s: &str) -> Result<f64, String> {
    let s = s.trim();
    if s == "0" {
        return Ok(0.0);
    }
    if s.is_empty() {
        return Err("empty duration".into());
    }
    let (mut total, mut rest) = (0.0, s);
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        if num_len == 0 {
            return Err(format!("{s:?} is not a duration like 30s, 5m or 1h30m"));
        }
        let n: f64 = rest[..num_len]
            .parse()
            .map_err(|_| format!("{s:?} is not a duration like 30s, 5m or 1h30m"))?;
        rest = &rest[num_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let mult = match &rest[..unit_len] {
            "h" => 3600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 0.001,
            "us" | "µs" => 1e-6,
            "ns" => 1e-9,
            u => return Err(format!("{s:?}: unknown unit {u:?} (use h, m, s, ms)")),
        };
        rest = &rest[unit_len..];
        total += n * mult;
    }
    Ok(total)
}

/// Parses a Kubernetes quantity (`100m`, `0.5`, `64Mi`, `1G`) into base units.
pub fn parse_quantity(s: &str) -> Result<f64, String> {
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, suffix) = s.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a quantity like 100m, 1, 64Mi"))?;
    let mult = match suffix {
        "" => 1.0,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "Ki" => 1024.0,
        "Mi" => 1024.0 * 1024.0,
        "Gi" => 1024.0 * 1024.0 * 1024.0,
        "Ti" => 1024f64.powi(4),
        u => return Err(format!("{s:?}: unknown suffix {u:?}")),
    };
    Ok(n * mult)
}

/// A positive duration (`30s`, `5m`, `1h30m`, `500ms`), for flags and limits.
pub fn duration(s: &str) -> Result<Duration, String> {
    let secs = parse_duration(s)?;
    if !(secs > 0.0 && secs.is_finite() && secs < u64::MAX as f64) {
        return Err(format!("{s:?} must be a positive duration"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// Writes a duration so that [`duration`] reads it back exactly (`1.5s`, `3600s`).
pub fn format_duration(d: Duration) -> String {
    if d.subsec_nanos() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_secs_f64() * 1000.0)
    }
}

/// A whole, positive number of bytes (`128Mi`, `1Gi`, `64M`, `1000`).
pub fn bytes(s: &str) -> Result<u64, String> {
    match parse_quantity(s.trim()) {
        Ok(q) if q >= 1.0 && q.fract() == 0.0 && q < u64::MAX as f64 => Ok(q as u64),
        Ok(_) => Err(format!("{s:?} must be a whole, positive number of bytes")),
        Err(e) => Err(e),
    }
}

/// A byte count for people: `512 B`, `1.5 KiB`, `210.0 MiB`, `2.00 GiB`.
pub fn format_bytes(n: u64) -> String {
    const UNITS: [(&str, u32, usize); 4] = [
        ("TiB", 40, 2),
        ("GiB", 30, 2),
        ("MiB", 20, 1),
        ("KiB", 10, 1),
    ];
    UNITS
        .iter()
        .find(|(_, shift, _)| n >= 1 << shift)
        .map_or_else(
            || format!("{n} B"),
            |(unit, shift, places)| {
                format!("{:.*} {unit}", places, n as f64 / (1u64 << shift) as f64)
            },
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_are_gos() {
        assert_eq!(parse_duration("1h30m"), Ok(5400.0));
        assert_eq!(parse_duration("0"), Ok(0.0));
        assert_eq!(duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(duration("2m"), Ok(Duration::from_secs(120)));
        assert!(duration("0s").unwrap_err().contains("positive"));
        assert!(duration("7").is_err(), "a bare number has no unit");
        assert!(duration("5 years").is_err());
        for d in [
            Duration::from_secs(3600),
            Duration::from_millis(1500),
            Duration::from_millis(1),
        ] {
            assert_eq!(duration(&format_duration(d)), Ok(d));
        }
    }

    #[test]
    fn byte_counts_read_in_their_largest_whole_unit() {
        assert_eq!(format_bytes(0), "0 B");
        assert_eq!(format_bytes(1023), "1023 B");
        assert_eq!(format_bytes(1536), "1.5 KiB");
        assert_eq!(format_bytes(210 << 20), "210.0 MiB");
        assert_eq!(format_bytes(2 << 30), "2.00 GiB");
        assert_eq!(format_bytes(3 << 40), "3.00 TiB");
    }

    #[test]
    fn sizes_are_quantities() {
        assert_eq!(bytes("128Mi"), Ok(128 << 20));
        assert_eq!(bytes("64M"), Ok(64_000_000));
        assert_eq!(bytes("4096"), Ok(4096));
        assert!(bytes("12Xi").is_err());
        assert!(bytes("0").unwrap_err().contains("positive"));
        assert!(bytes("0.5Ki").is_ok(), "512 bytes is whole");
        assert!(bytes("1.5").is_err());
    }
}
