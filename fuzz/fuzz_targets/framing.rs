//! SSE and NDJSON framing (`keel_providers::framing`). Input: a mode byte (framing, limit),
//! a split seed byte, then the body. Invariants:
//! - the frames do not depend on how the body is split into chunks: whole, in the seeded
//!   chunks and byte by byte give the same frames and the same limit error (a split run
//!   that fails has returned a prefix of the byte-by-byte frames);
//! - no frame holds a line break it should not, and none outgrows the limit;
//! - for UTF-8 bodies without a limit error, the frames equal those of a reference parser
//!   written straight from the rules (lines end at `\r\n`, `\r` or `\n`; comments and
//!   unknown fields dropped; `data:` lines joined with `\n`; a blank line dispatches).
#![no_main]

use keel_providers::framing::{Frame, FrameParser, FrameTooLarge, Framing};
use libfuzzer_sys::fuzz_target;

/// Frames of `chunks`, stopping at the first error.
fn run(framing: Framing, limit: usize, chunks: &[&[u8]]) -> (Vec<Frame>, Option<FrameTooLarge>) {
    let mut parser = FrameParser::with_limit(framing, limit);
    let mut frames = Vec::new();
    for chunk in chunks {
        match parser.push(chunk) {
            Ok(more) => frames.extend(more),
            Err(error) => return (frames, Some(error)),
        }
    }
    match parser.finish() {
        Ok(more) => {
            frames.extend(more);
            (frames, None)
        }
        Err(error) => (frames, Some(error)),
    }
}

/// The reference: `(event, data)` of each SSE event, or each NDJSON line.
fn reference(framing: Framing, body: &str) -> Vec<(Option<String>, String)> {
    let mut lines = Vec::new();
    let mut current = String::new();
    let mut chars = body.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\r' => {
                if chars.peek() == Some(&'\n') {
                    chars.next();
                }
                lines.push(std::mem::take(&mut current));
            }
            '\n' => lines.push(std::mem::take(&mut current)),
            other => current.push(other),
        }
    }
    let unfinished = (!current.is_empty()).then_some(current);
    match framing {
        Framing::Ndjson => lines
            .into_iter()
            .chain(unfinished)
            .filter(|l| !l.trim().is_empty())
            .map(|l| (None, l))
            .collect(),
        Framing::Sse => {
            let mut out = Vec::new();
            let mut event: Option<String> = None;
            let mut data: Option<String> = None;
            // The unfinished last line is still a line; the end dispatches like a blank one.
            for line in lines.into_iter().chain(unfinished).chain([String::new()]) {
                if line.is_empty() {
                    if let Some(data) = data.take() {
                        out.push((event.take(), data));
                    }
                    event = None;
                    continue;
                }
                if line.starts_with(':') {
                    continue;
                }
                let (field, value) = match line.find(':') {
                    Some(at) => {
                        let value = &line[at + 1..];
                        (&line[..at], value.strip_prefix(' ').unwrap_or(value))
                    }
                    None => (line.as_str(), ""),
                };
                match field {
                    "event" => event = Some(value.to_string()),
                    "data" => match &mut data {
                        Some(data) => {
                            data.push('\n');
                            data.push_str(value);
                        }
                        None => data = Some(value.to_string()),
                    },
                    _ => {}
                }
            }
            out
        }
    }
}

fn check_frame(frame: &Frame, limit: usize, utf8: bool) {
    // A lossy decoding turns one invalid byte into three; bound by that.
    let bound = if utf8 { limit } else { limit.saturating_mul(3) };
    match frame {
        Frame::Sse(event) => {
            assert!(!event.data.contains('\r'), "data holds a CR: {event:?}");
            for field in [&event.event, &event.id].into_iter().flatten() {
                assert!(
                    !field.contains(['\r', '\n']),
                    "field holds a line break: {event:?}"
                );
            }
            assert!(event.data.len() <= bound, "event data over the limit");
        }
        Frame::Line(line) => {
            assert!(
                !line.contains(['\r', '\n']),
                "line holds a line break: {line:?}"
            );
            assert!(!line.trim().is_empty(), "blank NDJSON line returned");
            assert!(line.len() <= bound, "line over the limit");
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let [mode, seed, body @ ..] = data else {
        return;
    };
    let framing = if mode & 1 == 0 {
        Framing::Sse
    } else {
        Framing::Ndjson
    };
    let limit = if mode & 2 == 0 {
        1 << 20
    } else {
        1 + usize::from(mode >> 2)
    };
    let sizes: Vec<usize> = (0..8u32)
        .map(|k| usize::from(seed.rotate_left(k) % 23) + 1)
        .collect();
    let mut chunks = Vec::new();
    let mut rest = body;
    let mut k = 0;
    while !rest.is_empty() {
        let (head, tail) = rest.split_at(sizes[k % sizes.len()].min(rest.len()));
        chunks.push(head);
        rest = tail;
        k += 1;
    }
    let bytes: Vec<&[u8]> = body.chunks(1).collect();

    let (whole, whole_error) = run(framing, limit, &[body]);
    let (split, split_error) = run(framing, limit, &chunks);
    let (bytewise, bytewise_error) = run(framing, limit, &bytes);

    assert_eq!(whole_error, split_error, "limit error depends on the split");
    assert_eq!(
        whole_error, bytewise_error,
        "limit error depends on the split"
    );
    if whole_error.is_none() {
        assert_eq!(whole, split, "frames depend on the split");
        assert_eq!(whole, bytewise, "frames depend on the split");
    } else {
        assert!(
            bytewise.starts_with(&split),
            "a failing split run returned frames the byte-by-byte run did not"
        );
    }
    let utf8 = std::str::from_utf8(body);
    for frame in whole.iter().chain(&split).chain(&bytewise) {
        check_frame(frame, limit, utf8.is_ok());
    }

    if let (Ok(text), None) = (utf8, whole_error) {
        let expected = reference(framing, text);
        let got: Vec<(Option<String>, String)> = whole
            .into_iter()
            .map(|frame| match frame {
                Frame::Sse(event) => (event.event, event.data),
                Frame::Line(line) => (None, line),
            })
            .collect();
        assert_eq!(got, expected, "frames differ from the reference parser");
    }
});
