//! Literals of visibility queries, shared by the drain and analysis queries: names quoted so a
//! value can never change what a query selects, and times in the form every store parses.

use std::collections::HashSet;

use k8s_openapi::jiff::Timestamp;
use twc_workflows::model::UnixMillis;

/// A value that cannot be written into a visibility query safely.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot put {what} {value:?} into a visibility query: {reason}")]
pub struct UnsafeQueryValue {
    /// What the value is (workflow type, build ID, ...).
    pub what: &'static str,
    /// The value.
    pub value: String,
    /// Why it is refused.
    pub reason: &'static str,
}

/// A single-quoted query string literal, `'` doubled.
///
/// Values with a backslash, a double quote or a control character are refused: visibility
/// stores disagree on how they are unescaped (a SQLite store matched none of their escaped
/// forms), and a value that silently fails to match in `NOT IN` would let a query select a type
/// the user excluded.
pub fn quote(what: &'static str, value: &str) -> Result<String, UnsafeQueryValue> {
    let refuse = |reason| {
        Err(UnsafeQueryValue {
            what,
            value: value.to_owned(),
            reason,
        })
    };
    if value.trim().is_empty() {
        return refuse("it is empty");
    }
    if value.contains('\\') {
        return refuse("backslashes are not supported");
    }
    if value.contains('"') {
        return refuse("double quotes are not supported");
    }
    if value.chars().any(char::is_control) {
        return refuse("control characters are not supported");
    }
    Ok(format!("'{}'", value.replace('\'', "''")))
}

/// `'a', 'b'`: each distinct workflow type once, in the given order.
pub fn quote_list<'a>(
    types: impl IntoIterator<Item = &'a String>,
) -> Result<String, UnsafeQueryValue> {
    let mut seen = HashSet::new();
    let mut quoted = Vec::new();
    for workflow_type in types {
        if seen.insert(workflow_type.as_str()) {
            quoted.push(quote("workflow type", workflow_type)?);
        }
    }
    Ok(quoted.join(", "))
}

/// A quoted RFC 3339 time in UTC (`'2024-05-01T12:00:00.5Z'`, fractions only when not zero).
pub fn time_literal(at: UnixMillis) -> Result<String, UnsafeQueryValue> {
    Timestamp::from_millisecond(at)
        .map(|t| format!("'{t}'"))
        .map_err(|_| UnsafeQueryValue {
            what: "time",
            value: at.to_string(),
            reason: "it is out of range",
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_rfc3339_in_utc_with_milliseconds_when_present() {
        let cases = [
            (0, Ok("'1970-01-01T00:00:00Z'")),
            (1_700_000_000_000, Ok("'2023-11-14T22:13:20Z'")),
            (1_700_000_000_500, Ok("'2023-11-14T22:13:20.5Z'")),
            (1_700_000_000_123, Ok("'2023-11-14T22:13:20.123Z'")),
            (i64::MAX, Err("out of range")),
        ];
        for (at, expected) in cases {
            match (time_literal(at), expected) {
                (Ok(got), Ok(want)) => assert_eq!(got, want, "{at}"),
                (Err(err), Err(part)) => assert!(err.to_string().contains(part), "{err}"),
                (got, want) => panic!("{at}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn lists_name_each_type_once_and_refuse_unsafe_ones() {
        let types = |names: &[&str]| names.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert_eq!(
            quote_list(&types(&["A", "it's", "A"])),
            Ok("'A', 'it''s'".to_owned())
        );
        assert_eq!(quote_list(&types(&[])), Ok(String::new()));
        let err = quote_list(&types(&["ok", "b\\d"])).expect_err("refused");
        assert_eq!(
            (err.what, err.value.as_str(), err.reason),
            ("workflow type", "b\\d", "backslashes are not supported")
        );
    }
}
