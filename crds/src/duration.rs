//! Go durations (`30s`, `5m`, `1h30m`, `1.5h`) as used in the spec's pause and delay fields,
//! read exactly as the Go controller reads them: Go's `time.ParseDuration`.
//!
//! A port of Go's function rather than a crate: the two crates of the registry that parse Go
//! durations are not exact (`go-parse-duration` 0.1.1 panics on `1µs` and bounds overflow at
//! 2^62; `go-duration` 0.2.0 refuses `0`, saturates instead of refusing an overflow, and adds
//! fraction digits in floating point one at a time). The table in `testdata/go-durations.tsv`
//! is Go's own answers (`go run testdata/go-durations.go`), and the tests hold this port to it.

use std::time::Duration;

/// A duration string that Go's `time.ParseDuration` refuses, or a negative duration where
/// only a length of time makes sense.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid duration {input:?}: {reason}")]
pub struct InvalidDuration {
    /// The rejected text.
    pub input: String,
    /// Why it was rejected.
    pub reason: DurationError,
}

/// Why a duration string was rejected.
#[derive(Debug, Clone, Copy, thiserror::Error, PartialEq, Eq)]
pub enum DurationError {
    /// Not of the form Go accepts (or out of Go's range, about 292 years).
    #[error("expected a number with a unit, such as 30s, 5m or 1h30m")]
    Syntax,
    /// A number without its unit (only `0` may have none).
    #[error("a number has no unit (ns, us, ms, s, m or h)")]
    MissingUnit,
    /// A unit Go does not know (e.g. `d`).
    #[error("unknown unit; use ns, us, ms, s, m or h")]
    UnknownUnit,
    /// A valid Go duration below zero where a length of time is expected.
    #[error("a length of time cannot be negative")]
    Negative,
}

/// Nanoseconds of each unit Go knows (`µs` as the micro sign and as the Greek mu).
const UNITS: &[(&[u8], u64)] = &[
    (b"ns", 1),
    (b"us", 1_000),
    ("\u{b5}s".as_bytes(), 1_000),
    ("\u{3bc}s".as_bytes(), 1_000),
    (b"ms", 1_000_000),
    (b"s", 1_000_000_000),
    (b"m", 60_000_000_000),
    (b"h", 3_600_000_000_000),
];

/// 2^63: the magnitude of Go's most negative duration.
const LIMIT: u64 = 1 << 63;

/// Parses a duration as Go's `time.ParseDuration` does: an optional sign, then one or more
/// `<number><unit>` parts (a number may have a fraction, `.5s` and `1.s` included), units ns,
/// us, µs, ms, s, m, h; a lone `0` needs no unit. Returns signed nanoseconds, as Go does.
pub fn parse_go_duration(input: &str) -> Result<i64, InvalidDuration> {
    let invalid = |reason| InvalidDuration {
        input: input.to_owned(),
        reason,
    };
    let mut s = input.as_bytes();
    let mut negative = false;
    if let Some((&sign @ (b'-' | b'+'), rest)) = s.split_first() {
        negative = sign == b'-';
        s = rest;
    }
    if s == b"0" {
        return Ok(0);
    }
    if s.is_empty() {
        return Err(invalid(DurationError::Syntax));
    }
    let mut total: u64 = 0;
    while !s.is_empty() {
        if !(s[0] == b'.' || s[0].is_ascii_digit()) {
            return Err(invalid(DurationError::Syntax));
        }
        let before = s.len();
        let (whole, rest) = leading_int(s).ok_or(invalid(DurationError::Syntax))?;
        s = rest;
        let has_whole = before != s.len();
        let (mut fraction, mut scale, mut has_fraction) = (0, 1.0, false);
        if let Some((b'.', rest)) = s.split_first() {
            let before = rest.len();
            (fraction, scale, s) = leading_fraction(rest);
            has_fraction = before != s.len();
        }
        if !has_whole && !has_fraction {
            return Err(invalid(DurationError::Syntax));
        }
        let unit_len = s
            .iter()
            .position(|&c| c == b'.' || c.is_ascii_digit())
            .unwrap_or(s.len());
        if unit_len == 0 {
            return Err(invalid(DurationError::MissingUnit));
        }
        let (unit, rest) = s.split_at(unit_len);
        s = rest;
        let nanos_per_unit = UNITS
            .iter()
            .find_map(|&(name, nanos)| (name == unit).then_some(nanos))
            .ok_or(invalid(DurationError::UnknownUnit))?;
        if whole > LIMIT / nanos_per_unit {
            return Err(invalid(DurationError::Syntax));
        }
        let mut part = whole * nanos_per_unit;
        if fraction > 0 {
            // Go's own arithmetic: a float64 is nanosecond accurate for a fraction of an hour.
            part += (fraction as f64 * (nanos_per_unit as f64 / scale)) as u64;
            if part > LIMIT {
                return Err(invalid(DurationError::Syntax));
            }
        }
        total += part;
        if total > LIMIT {
            return Err(invalid(DurationError::Syntax));
        }
    }
    if negative {
        // `total` is at most 2^63, whose negation is i64::MIN.
        return Ok(0i64.wrapping_sub_unsigned(total));
    }
    i64::try_from(total).map_err(|_| invalid(DurationError::Syntax))
}

/// Go's `leadingInt`: the leading digits as a number; `None` past 2^63.
fn leading_int(s: &[u8]) -> Option<(u64, &[u8])> {
    let digits = s.iter().take_while(|c| c.is_ascii_digit()).count();
    let mut x: u64 = 0;
    for &c in &s[..digits] {
        if x > LIMIT / 10 {
            return None;
        }
        x = x * 10 + u64::from(c - b'0');
        if x > LIMIT {
            return None;
        }
    }
    Some((x, &s[digits..]))
}

/// Go's `leadingFraction`: the leading digits as a numerator and its scale (10^digits);
/// digits past the precision of a u64 are consumed and ignored.
fn leading_fraction(s: &[u8]) -> (u64, f64, &[u8]) {
    let digits = s.iter().take_while(|c| c.is_ascii_digit()).count();
    let (mut x, mut scale) = (0u64, 1.0f64);
    for &c in &s[..digits] {
        if x > (LIMIT - 1) / 10 {
            break;
        }
        let y = x * 10 + u64::from(c - b'0');
        if y > LIMIT {
            break;
        }
        x = y;
        scale *= 10.0;
    }
    (x, scale, &s[digits..])
}

/// Parses a length of time written as a Go duration ([`parse_go_duration`]); a negative one
/// (which Go accepts) is refused.
pub fn parse_duration(input: &str) -> Result<Duration, InvalidDuration> {
    let nanos = parse_go_duration(input)?;
    u64::try_from(nanos)
        .map(Duration::from_nanos)
        .map_err(|_| InvalidDuration {
            input: input.to_owned(),
            reason: DurationError::Negative,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Go's answers: `<input>\t<nanoseconds>` or `<input>\terror`, inputs quoted as Go strings.
    const GO_TABLE: &str = include_str!("../testdata/go-durations.tsv");

    /// The inputs of [`GO_TABLE`] with Go's answer: `Some(nanoseconds)` or `None` (refused).
    fn go_answers() -> Vec<(String, Option<i64>)> {
        GO_TABLE
            .lines()
            .filter(|line| !line.is_empty() && !line.starts_with('#'))
            .map(|line| {
                let (quoted, answer) = line
                    .rsplit_once('\t')
                    .unwrap_or_else(|| panic!("malformed line {line:?}"));
                let input: String = serde_json::from_str(quoted)
                    .unwrap_or_else(|e| panic!("input {quoted:?} is not a quoted string: {e}"));
                let answer = (answer != "error").then(|| {
                    answer
                        .parse()
                        .unwrap_or_else(|e| panic!("answer {answer:?}: {e}"))
                });
                (input, answer)
            })
            .collect()
    }

    #[test]
    fn accepts_and_refuses_exactly_what_go_does() {
        let answers = go_answers();
        assert!(answers.len() > 60, "the table has {} rows", answers.len());
        for (input, go) in answers {
            assert_eq!(
                parse_go_duration(&input).ok(),
                go,
                "{input:?}: Go answered {go:?}"
            );
        }
    }

    #[test]
    fn a_length_of_time_is_what_go_reads_and_never_negative() {
        for (input, go) in go_answers() {
            let ours = parse_duration(&input);
            match go {
                Some(nanos) if nanos >= 0 => {
                    assert_eq!(ours, Ok(Duration::from_nanos(nanos as u64)), "{input:?}")
                }
                Some(_) => assert_eq!(
                    ours.map_err(|e| e.reason),
                    Err(DurationError::Negative),
                    "{input:?}"
                ),
                None => assert!(ours.is_err(), "{input:?}"),
            }
        }
    }

    #[test]
    fn says_why_a_duration_is_refused() {
        let reason = |text| parse_duration(text).map_err(|e| e.reason);
        assert_eq!(reason("10"), Err(DurationError::MissingUnit));
        assert_eq!(reason("1d"), Err(DurationError::UnknownUnit));
        assert_eq!(reason("5 m"), Err(DurationError::UnknownUnit));
        assert_eq!(reason(""), Err(DurationError::Syntax));
        assert_eq!(reason("-1s"), Err(DurationError::Negative));
        let message = parse_duration("1d").map_err(|e| e.to_string());
        assert_eq!(
            message,
            Err("invalid duration \"1d\": unknown unit; use ns, us, ms, s, m or h".to_owned())
        );
    }
}
