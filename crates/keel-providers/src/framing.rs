//! Incremental wire framing: Server-Sent Events and newline-delimited JSON.
//!
//! Both parsers accept bytes in arbitrary chunks (a chunk may end in the middle of a line
//! or of a multi-byte UTF-8 character) and return the complete frames found so far. They
//! never panic and never buffer more than one unfinished line plus one unfinished event.

/// One Server-Sent Event (comments and `retry:` lines are dropped).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SseEvent {
    /// The `event:` field, when present.
    pub event: Option<String>,
    /// The `data:` lines joined with `\n`.
    pub data: String,
    /// The `id:` field, when present.
    pub id: Option<String>,
}

/// One frame of a response body, whatever the framing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// A Server-Sent Event.
    Sse(SseEvent),
    /// One non-empty NDJSON line.
    Line(String),
}

/// Splits bytes into lines (`\n`, `\r\n` or `\r`), keeping the unfinished tail.
#[derive(Debug, Default)]
struct LineBuffer {
    pending: Vec<u8>,
    /// The previous chunk ended in `\r`; a leading `\n` in the next one belongs to it.
    skip_lf: bool,
}

impl LineBuffer {
    fn push(&mut self, chunk: &[u8], out: &mut Vec<String>) {
        for &byte in chunk {
            if self.skip_lf {
                self.skip_lf = false;
                if byte == b'\n' {
                    continue;
                }
            }
            match byte {
                b'\n' => out.push(self.take()),
                b'\r' => {
                    out.push(self.take());
                    self.skip_lf = true;
                }
                other => self.pending.push(other),
            }
        }
    }

    fn take(&mut self) -> String {
        let bytes = std::mem::take(&mut self.pending);
        String::from_utf8(bytes).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into())
    }

    fn finish(&mut self) -> Option<String> {
        if self.pending.is_empty() {
            None
        } else {
            Some(self.take())
        }
    }
}

/// Incremental Server-Sent Events parser (the WHATWG `text/event-stream` rules).
#[derive(Debug, Default)]
pub struct SseParser {
    lines: LineBuffer,
    current: SseEvent,
    has_data: bool,
    scratch: Vec<String>,
}

impl SseParser {
    /// A new parser.
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds a chunk of bytes; returns the events completed by it.
    pub fn push(&mut self, chunk: &[u8]) -> Vec<SseEvent> {
        let mut lines = std::mem::take(&mut self.scratch);
        self.lines.push(chunk, &mut lines);
        let mut events = Vec::new();
        for line in lines.drain(..) {
            self.line(&line, &mut events);
        }
        self.scratch = lines;
        events
    }

    /// Ends the input: a final event not followed by a blank line is still dispatched.
    pub fn finish(&mut self) -> Vec<SseEvent> {
        let mut events = Vec::new();
        if let Some(line) = self.lines.finish() {
            self.line(&line, &mut events);
        }
        self.dispatch(&mut events);
        events
    }

    fn line(&mut self, line: &str, events: &mut Vec<SseEvent>) {
        if line.is_empty() {
            self.dispatch(events);
            return;
        }
        if line.starts_with(':') {
            return; // comment, e.g. `: OPENROUTER PROCESSING`
        }
        let (field, value) = match line.split_once(':') {
            Some((field, value)) => (field, value.strip_prefix(' ').unwrap_or(value)),
            None => (line, ""),
        };
        match field {
            "event" => self.current.event = Some(value.to_owned()),
            "data" => {
                if self.has_data {
                    self.current.data.push('\n');
                }
                self.current.data.push_str(value);
                self.has_data = true;
            }
            "id" => self.current.id = Some(value.to_owned()),
            _ => {} // `retry:` and unknown fields are ignored
        }
    }

    fn dispatch(&mut self, events: &mut Vec<SseEvent>) {
        let event = std::mem::take(&mut self.current);
        if std::mem::take(&mut self.has_data) {
            events.push(event);
        }
    }
}

/// Incremental newline-delimited JSON splitter: returns each non-blank line.
#[derive(Debug, Default)]
pub struct NdjsonParser {
    lines: LineBuffer,
}

impl NdjsonParser {
    /// A new parser.
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds a chunk of bytes; returns the complete non-blank lines in it.
    pub fn push(&mut self, chunk: &[u8]) -> Vec<String> {
        let mut lines = Vec::new();
        self.lines.push(chunk, &mut lines);
        lines.retain(|line| !line.trim().is_empty());
        lines
    }

    /// Ends the input: a last line without a newline is still returned.
    pub fn finish(&mut self) -> Vec<String> {
        self.lines
            .finish()
            .filter(|line| !line.trim().is_empty())
            .into_iter()
            .collect()
    }
}

/// Which framing a response body uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// `text/event-stream`.
    Sse,
    /// `application/x-ndjson`.
    Ndjson,
}

/// A parser for either framing.
#[derive(Debug)]
pub enum FrameParser {
    /// SSE.
    Sse(SseParser),
    /// NDJSON.
    Ndjson(NdjsonParser),
}

impl FrameParser {
    /// A parser for a framing.
    pub fn new(framing: Framing) -> Self {
        match framing {
            Framing::Sse => Self::Sse(SseParser::new()),
            Framing::Ndjson => Self::Ndjson(NdjsonParser::new()),
        }
    }

    /// Feeds bytes.
    pub fn push(&mut self, chunk: &[u8]) -> Vec<Frame> {
        match self {
            Self::Sse(p) => p.push(chunk).into_iter().map(Frame::Sse).collect(),
            Self::Ndjson(p) => p.push(chunk).into_iter().map(Frame::Line).collect(),
        }
    }

    /// Ends the input.
    pub fn finish(&mut self) -> Vec<Frame> {
        match self {
            Self::Sse(p) => p.finish().into_iter().map(Frame::Sse).collect(),
            Self::Ndjson(p) => p.finish().into_iter().map(Frame::Line).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sse_basics() {
        let mut p = SseParser::new();
        let input = b": OPENROUTER PROCESSING\n\nevent: ping\ndata: {}\n\ndata: a\ndata: b\r\n\r\nretry: 5\nid: 7\ndata:x\n\n";
        let events = p.push(input);
        assert_eq!(events.len(), 3);
        assert_eq!(events[0].event.as_deref(), Some("ping"));
        assert_eq!(events[1].data, "a\nb");
        assert_eq!(events[2].data, "x");
        assert_eq!(events[2].id.as_deref(), Some("7"));
        assert!(p.finish().is_empty());
    }

    #[test]
    fn sse_final_event_without_blank_line() {
        let mut p = SseParser::new();
        assert!(p.push(b"data: [DONE]").is_empty());
        assert_eq!(p.finish()[0].data, "[DONE]");
    }

    #[test]
    fn ndjson_lines() {
        let mut p = NdjsonParser::new();
        let lines = p.push(b"{\"a\":1}\n\n{\"b\"");
        assert_eq!(lines, vec!["{\"a\":1}".to_string()]);
        assert!(p.push(b":2}").is_empty());
        assert_eq!(p.finish(), vec!["{\"b\":2}".to_string()]);
    }
}
