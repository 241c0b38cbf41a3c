//! Shared pieces of Keel's fuzz targets (`fuzz_targets/*.rs`): structure-aware generators
//! (JSON built from a target's vocabulary, chunk splits) and the stream-decoder harness
//! used by every provider's decoder target.
//!
//! Each target asserts invariants beyond "no panic"; a failed assertion is a finding,
//! saved by libFuzzer under `fuzz/artifacts/<target>/`.

use arbitrary::{Arbitrary, Result, Unstructured};
use keel_core::model::ResponseAssembler;
use keel_core::{Part, StreamEvent};
use keel_providers::fuzzing::{DecodeError, StreamDecoder, Wire};
use serde_json::{Map, Value};

/// A string: usually a word of `vocab` (so generated JSON hits the decoder's field names
/// and type tags), sometimes arbitrary text.
pub fn arb_string(u: &mut Unstructured, vocab: &[&str]) -> Result<String> {
    if !vocab.is_empty() && u.ratio(3u8, 4u8)? {
        let index = u.choose_index(vocab.len())?;
        return Ok(vocab.get(index).copied().unwrap_or_default().to_string());
    }
    String::arbitrary(u)
}

/// Any JSON value, nested at most `depth` levels, with keys and strings drawn mostly
/// from `vocab`.
pub fn arb_value(u: &mut Unstructured, vocab: &[&str], depth: u32) -> Result<Value> {
    let top = if depth == 0 { 4 } else { 6 };
    Ok(match u.int_in_range(0..=top)? {
        0 => Value::Null,
        1 => Value::Bool(bool::arbitrary(u)?),
        // Small integers most of the time: indexes and counts that collide.
        2 => Value::from(u.int_in_range(0u8..=3)?),
        3 => match u.int_in_range(0..=2)? {
            0 => Value::from(i64::arbitrary(u)?),
            1 => Value::from(u64::arbitrary(u)?),
            _ => {
                serde_json::Number::from_f64(f64::arbitrary(u)?).map_or(Value::Null, Value::Number)
            }
        },
        4 => Value::String(arb_string(u, vocab)?),
        5 => {
            let len = u.int_in_range(0..=3)?;
            let mut items = Vec::with_capacity(len);
            for _ in 0..len {
                items.push(arb_value(u, vocab, depth - 1)?);
            }
            Value::Array(items)
        }
        _ => Value::Object(arb_object(u, vocab, depth - 1)?),
    })
}

/// A JSON object of up to six fields (see [`arb_value`]).
pub fn arb_object(u: &mut Unstructured, vocab: &[&str], depth: u32) -> Result<Map<String, Value>> {
    let len = u.int_in_range(0..=6)?;
    let mut map = Map::new();
    for _ in 0..len {
        let key = arb_string(u, vocab)?;
        let value = arb_value(u, vocab, depth)?;
        map.insert(key, value);
    }
    Ok(map)
}

/// `body` cut into chunks whose sizes come from `sizes` (cycled; a size of 0 means one
/// byte), the way a network delivers a response in arbitrary pieces.
pub fn split<'a>(body: &'a [u8], sizes: &[u8]) -> Vec<&'a [u8]> {
    let mut out = Vec::new();
    let mut rest = body;
    let mut index = 0usize;
    while !rest.is_empty() {
        let size = if sizes.is_empty() {
            rest.len()
        } else {
            usize::from(sizes[index % sizes.len()]).max(1)
        };
        let (head, tail) = rest.split_at(size.min(rest.len()));
        out.push(head);
        rest = tail;
        index += 1;
    }
    out
}

/// One generated frame of a streamed answer.
#[derive(Debug)]
struct GenFrame {
    event: Option<String>,
    data: String,
    comment: bool,
    line_end: &'static str,
}

/// Generates a response body of `framing_sse` (SSE) or NDJSON frames from `vocab`.
fn arb_body(u: &mut Unstructured, vocab: &[&str], sse: bool) -> Result<Vec<u8>> {
    let count = u.int_in_range(0..=12)?;
    let mut frames = Vec::with_capacity(count);
    for _ in 0..count {
        let data = match u.int_in_range(0..=9)? {
            0 => "[DONE]".to_string(),
            1 => String::arbitrary(u)?,
            _ => Value::Object(arb_object(u, vocab, 3)?).to_string(),
        };
        frames.push(GenFrame {
            event: if u.ratio(1u8, 3u8)? {
                Some(arb_string(u, vocab)?)
            } else {
                None
            },
            data,
            comment: u.ratio(1u8, 10u8)?,
            line_end: *u.choose(&["\n", "\r\n", "\r"])?,
        });
    }
    let mut body = String::new();
    for frame in frames {
        let end = frame.line_end;
        if sse {
            if frame.comment {
                body.push_str(": keep-alive");
                body.push_str(end);
            }
            if let Some(event) = frame.event {
                body.push_str(&format!("event: {event}{end}"));
            }
            body.push_str(&format!("data: {}{end}{end}", frame.data));
        } else {
            if frame.comment {
                body.push_str(end);
            }
            body.push_str(&frame.data);
            body.push_str(end);
        }
    }
    Ok(body.into_bytes())
}

/// What a consumer of the driver sees from one decoded attempt: the events up to and
/// including the first `Stop` (the driver returns there), and how it ended.
#[derive(Debug, Clone, PartialEq)]
pub struct Observed {
    /// Events yielded.
    pub events: Vec<StreamEvent>,
    /// `Ok` when a `Stop` was yielded; otherwise the failure.
    pub result: std::result::Result<(), DecodeError>,
}

/// Runs `wire`'s decoder over `chunks` the way the driver does; also returns every event
/// the decoder produced (before cutting at the first `Stop`) and whether `finish` passed.
fn decode(wire: Wire, limit: usize, chunks: &[&[u8]]) -> (Observed, Vec<StreamEvent>, bool) {
    let mut decoder = StreamDecoder::new(wire, limit);
    let mut raw = Vec::new();
    let mut failure = None;
    for chunk in chunks {
        if let Err(error) = decoder.push(chunk, &mut raw) {
            failure = Some(error);
            break;
        }
    }
    let mut finished_ok = false;
    if failure.is_none() {
        match decoder.finish(&mut raw) {
            Ok(()) => finished_ok = true,
            Err(error) => failure = Some(error),
        }
    }
    let stop = raw
        .iter()
        .position(|e| matches!(e, StreamEvent::Stop { .. }));
    let observed = match stop {
        Some(at) => Observed {
            events: raw.get(..=at).map(<[_]>::to_vec).unwrap_or_default(),
            result: Ok(()),
        },
        None => Observed {
            events: raw.clone(),
            result: Err(failure.unwrap_or_else(|| {
                // `finish` passed without a Stop: caught by the invariant below.
                DecodeError::Frame(keel_providers::framing::FrameTooLarge {
                    what: "none",
                    limit: 0,
                })
            })),
        },
    };
    (observed, raw, finished_ok)
}

/// Replaces tool-call ids the decoder generated (Ollama sends none) so two decodings of
/// the same body compare equal.
fn normalize_generated_ids(events: &mut [StreamEvent], body: &[u8]) {
    let body = String::from_utf8_lossy(body);
    let fix = |id: &mut String| {
        if id.starts_with("call") && !body.contains(id.as_str()) {
            *id = "<generated>".into();
        }
    };
    for event in events {
        match event {
            StreamEvent::ToolCall(call) => fix(&mut call.id),
            StreamEvent::ToolCallDelta { id: Some(id), .. } => fix(id),
            _ => {}
        }
    }
}

/// The decoder target: a body (raw bytes, or generated frames from `vocab`) decoded whole
/// and in arbitrary chunks. Invariants:
/// - the driver-visible result does not depend on how the body was split (a chunk holding
///   a line over the byte limit fails whole, having yielded a prefix of the events);
/// - at most one `Stop`, and it is the last event; `finish` passes only after a `Stop`;
/// - the assembled response holds exactly the streamed tool calls, in order, and the
///   streamed text.
pub fn fuzz_decoder(wire: Wire, vocab: &[&str], data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let sse = wire != Wire::Ollama;
    let (body, sizes) = if mode & 1 == 0 {
        // Raw: the rest of the input is the body; chunk sizes derive from the mode byte.
        let sizes: Vec<u8> = (1..=8u8)
            .map(|k| mode.rotate_left(u32::from(k)) % 17)
            .collect();
        (rest.to_vec(), sizes)
    } else {
        let mut u = Unstructured::new(rest);
        let Ok(body) = arb_body(&mut u, vocab, sse) else {
            return;
        };
        let sizes = Vec::<u8>::arbitrary(&mut u).unwrap_or_default();
        (body, sizes)
    };
    let limit = if mode & 2 == 0 {
        1 << 20
    } else {
        16 + usize::from(mode >> 2) * 8
    };

    let (mut whole, whole_raw, whole_finished) = decode(wire, limit, &[&body]);
    let (mut split_obs, split_raw, split_finished) = decode(wire, limit, &split(&body, &sizes));
    let bytes: Vec<&[u8]> = body.chunks(1).collect();
    let (mut bytewise, bytewise_raw, bytewise_finished) = decode(wire, limit, &bytes);

    for (raw, finished) in [
        (&whole_raw, whole_finished),
        (&split_raw, split_finished),
        (&bytewise_raw, bytewise_finished),
    ] {
        let stops = raw
            .iter()
            .filter(|e| matches!(e, StreamEvent::Stop { .. }))
            .count();
        assert!(stops <= 1, "{stops} Stop events: {raw:?}");
        if stops == 1 {
            assert!(
                matches!(raw.last(), Some(StreamEvent::Stop { .. })),
                "events after Stop: {raw:?}"
            );
        }
        assert!(
            !finished || stops == 1,
            "finish() passed but no Stop was produced: {raw:?}"
        );
    }

    // Byte by byte, every frame is decoded as soon as it is complete. Any other split
    // gives the same result, except that a chunk holding an oversized line fails as a
    // whole (its complete frames are not decoded): then it saw a prefix of the events.
    normalize_generated_ids(&mut whole.events, &body);
    normalize_generated_ids(&mut split_obs.events, &body);
    normalize_generated_ids(&mut bytewise.events, &body);
    for run in [&whole, &split_obs] {
        if matches!(run.result, Err(DecodeError::Frame(_))) {
            assert!(
                bytewise.events.starts_with(&run.events),
                "a run that outgrew the limit yielded events the byte-by-byte run did not"
            );
        } else {
            assert_eq!(run, &bytewise, "decoding depends on how the body is split");
        }
    }

    check_assembly(&whole.events);
    check_assembly(&bytewise.events);
}

/// The assembled response holds exactly the streamed tool calls and text.
fn check_assembly(events: &[StreamEvent]) {
    let mut assembler = ResponseAssembler::new();
    for event in events {
        assembler.push(event);
    }
    let stopped = events.iter().any(|e| matches!(e, StreamEvent::Stop { .. }));
    assert_eq!(assembler.is_complete(), stopped);
    let response = assembler.finish();
    let calls: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            StreamEvent::ToolCall(call) => Some(call.clone()),
            _ => None,
        })
        .collect();
    let assembled: Vec<_> = response
        .message
        .parts
        .iter()
        .filter_map(|p| match p {
            Part::ToolCall(call) => Some(call.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(calls, assembled);
    let text: String = events
        .iter()
        .filter_map(|e| match e {
            StreamEvent::TextDelta(t) => Some(t.as_str()),
            _ => None,
        })
        .collect();
    let assembled_text: String = response
        .message
        .parts
        .iter()
        .filter_map(|p| match p {
            Part::Text { text } => Some(text.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(assembled_text, text);
}
