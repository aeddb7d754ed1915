//! Go-style durations (`30s`, `5m`, `1h30m`, `1.5h`) as used in the spec's pause and delay fields.

use std::time::Duration;

/// A duration string that is not of the Go form.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid duration {input:?}: expected a number with a unit, such as 30s, 5m or 1h30m")]
pub struct InvalidDuration {
    /// The rejected text.
    pub input: String,
}

/// Parses a Go-style duration: one or more `<number><unit>` parts, units ns, us, µs, ms, s, m, h.
pub fn parse_duration(input: &str) -> Result<Duration, InvalidDuration> {
    let invalid = || InvalidDuration {
        input: input.to_owned(),
    };
    if input == "0" {
        return Ok(Duration::ZERO);
    }
    let mut rest = input;
    let mut total_nanos: f64 = 0.0;
    if rest.is_empty() {
        return Err(invalid());
    }
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(invalid)?;
        if number_len == 0 {
            return Err(invalid());
        }
        let number: f64 = rest[..number_len].parse().map_err(|_| invalid())?;
        rest = &rest[number_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let nanos_per_unit = match &rest[..unit_len] {
            "ns" => 1.0,
            "us" | "µs" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3600e9,
            _ => return Err(invalid()),
        };
        rest = &rest[unit_len..];
        total_nanos += number * nanos_per_unit;
    }
    if !total_nanos.is_finite() || total_nanos > u64::MAX as f64 {
        return Err(invalid());
    }
    Ok(Duration::from_nanos(total_nanos.round() as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_go_style_durations() {
        let cases = [
            ("30s", Duration::from_secs(30)),
            ("5m", Duration::from_secs(300)),
            ("1h30m", Duration::from_secs(5400)),
            ("1.5h", Duration::from_secs(5400)),
            ("250ms", Duration::from_millis(250)),
            ("0s", Duration::ZERO),
            ("0", Duration::ZERO),
            ("24h", Duration::from_secs(86400)),
        ];
        for (text, expected) in cases {
            assert_eq!(parse_duration(text), Ok(expected), "{text}");
        }
    }

    #[test]
    fn rejects_text_that_is_not_a_duration() {
        for text in ["", "abc", "10", "5 m", "m5", "1d", "-1s", "1h-30m"] {
            assert!(parse_duration(text).is_err(), "{text} should be rejected");
        }
    }
}
