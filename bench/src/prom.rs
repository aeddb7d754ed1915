//! Reading counters out of Prometheus text pages (the controller's, Temporal's and the
//! kube-apiserver's `/metrics`).

/// One sample line: metric name, labels, value.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// Metric name.
    pub name: String,
    /// Label pairs in page order.
    pub labels: Vec<(String, String)>,
    /// Value.
    pub value: f64,
}

impl Sample {
    /// The value of label `key`.
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// Every sample of a page (comments and malformed lines skipped).
pub fn parse(page: &str) -> Vec<Sample> {
    page.lines().filter_map(parse_line).collect()
}

fn parse_line(line: &str) -> Option<Sample> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let (series, rest) = match line.find('{') {
        Some(_) => {
            let close = line.rfind('}')?;
            (&line[..close + 1], &line[close + 1..])
        }
        None => line.split_once(' ')?,
    };
    let value = rest.split_whitespace().next()?.parse().ok()?;
    let (name, labels) = match series.split_once('{') {
        Some((name, labels)) => (name, parse_labels(labels.strip_suffix('}')?)?),
        None => (series, Vec::new()),
    };
    Some(Sample {
        name: name.to_owned(),
        labels,
        value,
    })
}

/// `a="x",b="y\"z"` into pairs.
fn parse_labels(text: &str) -> Option<Vec<(String, String)>> {
    let mut labels = Vec::new();
    let mut rest = text.trim_start_matches(',');
    while !rest.is_empty() {
        let (key, after) = rest.split_once("=\"")?;
        let mut value = String::new();
        let mut chars = after.char_indices();
        let mut end = None;
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, other)) => value.push(other),
                    None => return None,
                },
                '"' => {
                    end = Some(i);
                    break;
                }
                other => value.push(other),
            }
        }
        let end = end?;
        labels.push((key.trim().to_owned(), value));
        rest = after[end + 1..].trim_start_matches(',').trim_start();
    }
    Some(labels)
}

/// Sum of the samples named `name` whose labels satisfy `keep`.
pub fn sum(samples: &[Sample], name: &str, keep: impl Fn(&Sample) -> bool) -> f64 {
    samples
        .iter()
        .filter(|s| s.name == name && keep(s))
        .map(|s| s.value)
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_labels_values_and_skips_comments() {
        let page = "# HELP x y\n# TYPE x counter\nx_total{op=\"Describe\",outcome=\"success\"} 12\nx_total{op=\"a\\\"b\",outcome=\"not_found\"} 3\nplain 4.5\nbad{\n";
        let samples = parse(page);
        assert_eq!(samples.len(), 3);
        assert_eq!(samples[1].label("op"), Some("a\"b"));
        assert_eq!(sum(&samples, "x_total", |_| true), 15.0);
        assert_eq!(
            sum(&samples, "x_total", |s| s.label("outcome")
                == Some("success")),
            12.0
        );
        assert_eq!(sum(&samples, "plain", |_| true), 4.5);
    }
}
