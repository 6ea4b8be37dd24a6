//! Parsing durations (`90s`, `5m`, `500ms`) and sizes (`128Mi`, `1Gi`) for flags.

use std::time::Duration;

/// Parses `500ms`, `30s`, `5m`, `1h` (a bare number is seconds).
pub fn duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a duration like 30s, 5m or 500ms"))?;
    let secs = match unit {
        "ms" => n / 1000.0,
        "" | "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        _ => return Err(format!("{s:?}: unknown unit {unit:?} (use ms, s, m or h)")),
    };
    if !(secs > 0.0 && secs.is_finite()) {
        return Err(format!("{s:?} must be positive"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// Parses `128Mi`, `1Gi`, `64M`, or a byte count.
pub fn bytes(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a size like 128Mi"))?;
    let mult: u64 = match unit {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "K" | "k" => 1000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        _ => return Err(format!("{s:?}: unknown unit {unit:?} (use Ki, Mi, Gi)")),
    };
    n.checked_mul(mult)
        .filter(|b| *b > 0)
        .ok_or_else(|| format!("{s:?} is out of range"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_durations_and_sizes() {
        assert_eq!(duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(duration("7").unwrap(), Duration::from_secs(7));
        assert!(duration("5 years").is_err());
        assert!(duration("0s").is_err());
        assert_eq!(bytes("128Mi").unwrap(), 128 << 20);
        assert!(bytes("12Xi").is_err());
    }
}
