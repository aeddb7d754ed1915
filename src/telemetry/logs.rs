//! `--log-format json` (set up in main.rs with `tracing_subscriber::fmt().json()`): one JSON
//! object per line with `timestamp`, `level`, `target`, the event's `fields`, and the current
//! `span` and the `spans` list with their fields (tracing-subscriber's defaults, which log
//! collectors rely on; the test below keeps them from changing unnoticed).

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::{Arc, Mutex, PoisonError};

    /// A writer into a shared buffer.
    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl Write for Buffer {
        fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
            self.0
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .extend_from_slice(data);
            Ok(data.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn json_lines_carry_timestamp_level_target_fields_and_spans() {
        let buffer = Buffer::default();
        let writer = buffer.clone();
        // As main.rs builds it for `--log-format json`.
        let subscriber = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new("info"))
            .with_writer(move || writer.clone())
            .json()
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            let span = tracing::info_span!("activity", name = "write_status", twd = "demo/hello");
            let _entered = span.enter();
            tracing::info!(build_id = "v2-abc", "wrote status");
        });
        let output =
            String::from_utf8_lossy(&buffer.0.lock().unwrap_or_else(PoisonError::into_inner))
                .into_owned();
        let line: serde_json::Value = match serde_json::from_str(output.trim()) {
            Ok(line) => line,
            Err(e) => panic!("{e}: {output}"),
        };
        assert!(line["timestamp"].is_string(), "{line}");
        assert_eq!(line["level"], "INFO", "{line}");
        assert_eq!(line["target"], module_path!(), "{line}");
        assert_eq!(line["fields"]["message"], "wrote status", "{line}");
        assert_eq!(line["fields"]["build_id"], "v2-abc", "{line}");
        assert_eq!(line["span"]["name"], "activity", "{line}");
        assert_eq!(line["span"]["twd"], "demo/hello", "{line}");
        assert_eq!(line["spans"][0]["name"], "activity", "{line}");
    }
}
