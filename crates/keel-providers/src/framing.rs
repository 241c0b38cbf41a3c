//! Incremental wire framing: Server-Sent Events and newline-delimited JSON.
//!
//! Both parsers accept bytes in arbitrary chunks (a chunk may end in the middle of a line
//! or of a multi-byte UTF-8 character) and return the complete frames found so far. They
//! never panic and never buffer more than one unfinished line plus one unfinished event,
//! each bounded by a byte limit ([`DEFAULT_MAX_EVENT_BYTES`] unless set with
//! `with_limit`): a server that sends an endless line or an endless event makes `push`
//! fail with [`FrameTooLarge`] instead of exhausting memory.

/// The default limit on one line and on one event's data, in bytes (16 MiB).
pub const DEFAULT_MAX_EVENT_BYTES: usize = 16 * 1024 * 1024;

/// A line, or an event's joined `data:` lines, grew past the parser's byte limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a {what} in the response stream exceeds the limit of {limit} bytes")]
pub struct FrameTooLarge {
    /// What outgrew the limit: `line` or `event`.
    pub what: &'static str,
    /// The limit, in bytes.
    pub limit: usize,
}

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

/// Splits bytes into lines (`\n`, `\r\n` or `\r`), keeping the unfinished tail (at most
/// `limit` bytes).
#[derive(Debug)]
struct LineBuffer {
    pending: Vec<u8>,
    /// The previous chunk ended in `\r`; a leading `\n` in the next one belongs to it.
    skip_lf: bool,
    limit: usize,
}

impl LineBuffer {
    fn new(limit: usize) -> Self {
        Self {
            pending: Vec::new(),
            skip_lf: false,
            limit,
        }
    }

    fn push(&mut self, chunk: &[u8], out: &mut Vec<String>) -> Result<(), FrameTooLarge> {
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
                other => {
                    if self.pending.len() >= self.limit {
                        return Err(FrameTooLarge {
                            what: "line",
                            limit: self.limit,
                        });
                    }
                    self.pending.push(other);
                }
            }
        }
        Ok(())
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
#[derive(Debug)]
pub struct SseParser {
    lines: LineBuffer,
    current: SseEvent,
    has_data: bool,
    scratch: Vec<String>,
    limit: usize,
}

impl Default for SseParser {
    fn default() -> Self {
        Self::new()
    }
}

impl SseParser {
    /// A new parser with the default limit ([`DEFAULT_MAX_EVENT_BYTES`]).
    pub fn new() -> Self {
        Self::with_limit(DEFAULT_MAX_EVENT_BYTES)
    }

    /// A new parser that refuses a line, or an event's data, longer than `limit` bytes.
    pub fn with_limit(limit: usize) -> Self {
        Self {
            lines: LineBuffer::new(limit),
            current: SseEvent::default(),
            has_data: false,
            scratch: Vec::new(),
            limit,
        }
    }

    /// Feeds a chunk of bytes; returns the events completed by it.
    pub fn push(&mut self, chunk: &[u8]) -> Result<Vec<SseEvent>, FrameTooLarge> {
        let mut lines = std::mem::take(&mut self.scratch);
        let pushed = self.lines.push(chunk, &mut lines);
        let mut events = Vec::new();
        let mut result = Ok(());
        for line in lines.drain(..) {
            if result.is_ok() {
                result = self.line(&line, &mut events);
            }
        }
        self.scratch = lines;
        // The lines handled come before the one that outgrew the limit: an event error
        // among them happened first, whatever the chunking.
        result?;
        pushed?;
        Ok(events)
    }

    /// Ends the input: a final event not followed by a blank line is still dispatched.
    pub fn finish(&mut self) -> Result<Vec<SseEvent>, FrameTooLarge> {
        let mut events = Vec::new();
        if let Some(line) = self.lines.finish() {
            self.line(&line, &mut events)?;
        }
        self.dispatch(&mut events);
        Ok(events)
    }

    fn line(&mut self, line: &str, events: &mut Vec<SseEvent>) -> Result<(), FrameTooLarge> {
        if line.is_empty() {
            self.dispatch(events);
            return Ok(());
        }
        if line.starts_with(':') {
            return Ok(()); // comment, e.g. `: OPENROUTER PROCESSING`
        }
        let (field, value) = match line.split_once(':') {
            Some((field, value)) => (field, value.strip_prefix(' ').unwrap_or(value)),
            None => (line, ""),
        };
        match field {
            "event" => self.current.event = Some(value.to_owned()),
            "data" => {
                let joined = self
                    .current
                    .data
                    .len()
                    .saturating_add(usize::from(self.has_data))
                    .saturating_add(value.len());
                if joined > self.limit {
                    return Err(FrameTooLarge {
                        what: "event",
                        limit: self.limit,
                    });
                }
                if self.has_data {
                    self.current.data.push('\n');
                }
                self.current.data.push_str(value);
                self.has_data = true;
            }
            "id" => self.current.id = Some(value.to_owned()),
            _ => {} // `retry:` and unknown fields are ignored
        }
        Ok(())
    }

    fn dispatch(&mut self, events: &mut Vec<SseEvent>) {
        let event = std::mem::take(&mut self.current);
        if std::mem::take(&mut self.has_data) {
            events.push(event);
        }
    }
}

/// Incremental newline-delimited JSON splitter: returns each non-blank line.
#[derive(Debug)]
pub struct NdjsonParser {
    lines: LineBuffer,
}

impl Default for NdjsonParser {
    fn default() -> Self {
        Self::new()
    }
}

impl NdjsonParser {
    /// A new parser with the default limit ([`DEFAULT_MAX_EVENT_BYTES`]).
    pub fn new() -> Self {
        Self::with_limit(DEFAULT_MAX_EVENT_BYTES)
    }

    /// A new parser that refuses a line longer than `limit` bytes.
    pub fn with_limit(limit: usize) -> Self {
        Self {
            lines: LineBuffer::new(limit),
        }
    }

    /// Feeds a chunk of bytes; returns the complete non-blank lines in it.
    pub fn push(&mut self, chunk: &[u8]) -> Result<Vec<String>, FrameTooLarge> {
        let mut lines = Vec::new();
        self.lines.push(chunk, &mut lines)?;
        lines.retain(|line| !line.trim().is_empty());
        Ok(lines)
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
    /// A parser for a framing, with the default limit ([`DEFAULT_MAX_EVENT_BYTES`]).
    pub fn new(framing: Framing) -> Self {
        Self::with_limit(framing, DEFAULT_MAX_EVENT_BYTES)
    }

    /// A parser for a framing that refuses a line or event longer than `limit` bytes.
    pub fn with_limit(framing: Framing, limit: usize) -> Self {
        match framing {
            Framing::Sse => Self::Sse(SseParser::with_limit(limit)),
            Framing::Ndjson => Self::Ndjson(NdjsonParser::with_limit(limit)),
        }
    }

    /// Feeds bytes.
    pub fn push(&mut self, chunk: &[u8]) -> Result<Vec<Frame>, FrameTooLarge> {
        Ok(match self {
            Self::Sse(p) => p.push(chunk)?.into_iter().map(Frame::Sse).collect(),
            Self::Ndjson(p) => p.push(chunk)?.into_iter().map(Frame::Line).collect(),
        })
    }

    /// Ends the input.
    pub fn finish(&mut self) -> Result<Vec<Frame>, FrameTooLarge> {
        Ok(match self {
            Self::Sse(p) => p.finish()?.into_iter().map(Frame::Sse).collect(),
            Self::Ndjson(p) => p.finish().into_iter().map(Frame::Line).collect(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sse_basics() {
        let mut p = SseParser::new();
        let input = b": OPENROUTER PROCESSING\n\nevent: ping\ndata: {}\n\ndata: a\ndata: b\r\n\r\nretry: 5\nid: 7\ndata:x\n\n";
        let events = p.push(input).unwrap();
        assert_eq!(events.len(), 3);
        assert_eq!(events[0].event.as_deref(), Some("ping"));
        assert_eq!(events[1].data, "a\nb");
        assert_eq!(events[2].data, "x");
        assert_eq!(events[2].id.as_deref(), Some("7"));
        assert!(p.finish().unwrap().is_empty());
    }

    #[test]
    fn sse_final_event_without_blank_line() {
        let mut p = SseParser::new();
        assert!(p.push(b"data: [DONE]").unwrap().is_empty());
        assert_eq!(p.finish().unwrap()[0].data, "[DONE]");
    }

    #[test]
    fn ndjson_lines() {
        let mut p = NdjsonParser::new();
        let lines = p.push(b"{\"a\":1}\n\n{\"b\"").unwrap();
        assert_eq!(lines, vec!["{\"a\":1}".to_string()]);
        assert!(p.push(b":2}").unwrap().is_empty());
        assert_eq!(p.finish(), vec!["{\"b\":2}".to_string()]);
    }

    #[test]
    fn an_endless_line_fails_at_the_limit() {
        let mut p = FrameParser::with_limit(Framing::Ndjson, 1024);
        assert!(p.push(&[b'x'; 1000]).unwrap().is_empty());
        assert_eq!(
            p.push(&[b'x'; 100]),
            Err(FrameTooLarge {
                what: "line",
                limit: 1024
            })
        );
        let mut p = FrameParser::with_limit(Framing::Sse, 1024);
        let mut line = b"data: ".to_vec();
        line.extend([b'y'; 2000]);
        assert_eq!(p.push(&line).unwrap_err().what, "line");
        // Exactly at the limit is still fine.
        let mut p = NdjsonParser::with_limit(4);
        assert_eq!(p.push(b"abcd\n").unwrap(), vec!["abcd".to_string()]);
    }

    #[test]
    fn the_first_limit_error_is_reported_however_the_body_is_split() {
        // Found by the `framing` fuzz target: an event outgrows the limit, then a line does;
        // fed whole, the line's error used to win over the event's.
        let body =
            b"data: 0123456789\ndata: 0123456789\ndata: 0123456789\nxxxxxxxxxxxxxxxxxxxxxxxxxx";
        let whole = SseParser::with_limit(24).push(body).unwrap_err();
        let mut split = SseParser::with_limit(24);
        let mut first = None;
        for byte in body.chunks(1) {
            if let Err(error) = split.push(byte) {
                first = Some(error);
                break;
            }
        }
        assert_eq!(whole.what, "event");
        assert_eq!(Some(whole), first);
    }

    #[test]
    fn an_event_of_many_short_data_lines_fails_at_the_limit() {
        let mut p = SseParser::with_limit(1024);
        let mut failed = None;
        for _ in 0..100 {
            match p.push(b"data: 0123456789abcdef0123456789abcdef\n") {
                Ok(events) => assert!(events.is_empty()),
                Err(error) => {
                    failed = Some(error);
                    break;
                }
            }
        }
        assert_eq!(
            failed,
            Some(FrameTooLarge {
                what: "event",
                limit: 1024
            })
        );
        // The same lines split into events under the limit pass.
        let mut p = SseParser::with_limit(1024);
        for _ in 0..100 {
            assert_eq!(p.push(b"data: 0123456789abcdef\n\n").unwrap().len(), 1);
        }
    }
}
