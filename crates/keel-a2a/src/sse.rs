//! A small Server-Sent Events decoder: bytes in, the `data` of each event out.

/// Longest event accepted, in bytes (a larger one is an error, not unbounded memory).
pub const MAX_EVENT_BYTES: usize = 16 * 1024 * 1024;

/// Incremental SSE decoder. Feed it chunks; it returns the data of every complete event.
#[derive(Debug, Default)]
pub struct SseDecoder {
    buffer: Vec<u8>,
    data: String,
    has_data: bool,
}

impl SseDecoder {
    /// A decoder with nothing buffered.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a chunk; returns the data of the events it completed, in order.
    pub fn feed(&mut self, chunk: &[u8]) -> Result<Vec<String>, String> {
        self.buffer.extend_from_slice(chunk);
        let mut events = Vec::new();
        while let Some(end) = self.buffer.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = self.buffer.drain(..=end).collect();
            let line = String::from_utf8_lossy(&line);
            let line = line.trim_end_matches(['\n', '\r']);
            if line.is_empty() {
                if self.has_data {
                    events.push(std::mem::take(&mut self.data));
                    self.has_data = false;
                }
                continue;
            }
            if line.starts_with(':') {
                continue;
            }
            let (field, value) = match line.split_once(':') {
                Some((field, value)) => (field, value.strip_prefix(' ').unwrap_or(value)),
                None => (line, ""),
            };
            if field == "data" {
                if self.has_data {
                    self.data.push('\n');
                }
                self.data.push_str(value);
                self.has_data = true;
            }
        }
        if self.buffer.len() + self.data.len() > MAX_EVENT_BYTES {
            return Err(format!(
                "an event stream event exceeds {MAX_EVENT_BYTES} bytes"
            ));
        }
        Ok(events)
    }

    /// The data of an event left unterminated when the stream ended.
    pub fn finish(&mut self) -> Option<String> {
        if !self.buffer.is_empty() {
            let rest = std::mem::take(&mut self.buffer);
            let _ = self.feed(&rest);
            let _ = self.feed(b"\n");
        }
        self.has_data.then(|| {
            self.has_data = false;
            std::mem::take(&mut self.data)
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn splits_events_across_chunks_and_joins_data_lines() {
        let mut decoder = SseDecoder::new();
        assert!(decoder.feed(b": ping\r\nda").unwrap().is_empty());
        assert_eq!(
            decoder
                .feed(b"ta: {\"a\":1}\r\n\r\nevent: x\ndata: one\ndata:two\n\n")
                .unwrap(),
            ["{\"a\":1}", "one\ntwo"]
        );
        assert!(decoder.feed(b"data: tail").unwrap().is_empty());
        assert_eq!(decoder.finish().as_deref(), Some("tail"));
    }
}
