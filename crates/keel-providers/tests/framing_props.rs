//! Property tests: the SSE and NDJSON parsers give the same frames whatever the chunk
//! boundaries (including inside multi-byte characters and between `\r` and `\n`).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

use keel_providers::framing::{NdjsonParser, SseEvent, SseParser};
use proptest::prelude::*;

fn split_points(len: usize, cuts: &[usize]) -> Vec<usize> {
    let mut points: Vec<usize> = cuts.iter().map(|c| c % (len + 1)).collect();
    points.push(0);
    points.push(len);
    points.sort_unstable();
    points.dedup();
    points
}

fn sse_in_chunks(input: &[u8], cuts: &[usize]) -> Vec<SseEvent> {
    let mut parser = SseParser::new();
    let mut events = Vec::new();
    let points = split_points(input.len(), cuts);
    for pair in points.windows(2) {
        events.extend(parser.push(&input[pair[0]..pair[1]]).unwrap());
    }
    events.extend(parser.finish().unwrap());
    events
}

fn arb_event() -> impl Strategy<Value = (Option<String>, Vec<String>, bool)> {
    (
        proptest::option::of("[a-z_.]{1,12}"),
        proptest::collection::vec("[^\r\n]{0,20}", 1..3),
        any::<bool>(),
    )
}

proptest! {
    #[test]
    fn sse_is_chunking_invariant(
        events in proptest::collection::vec(arb_event(), 0..6),
        crlf in any::<bool>(),
        cuts in proptest::collection::vec(any::<usize>(), 0..12),
    ) {
        let nl = if crlf { "\r\n" } else { "\n" };
        let mut text = String::new();
        let mut expected = Vec::new();
        for (name, data, comment) in &events {
            if *comment {
                text.push_str(&format!(": OPENROUTER PROCESSING{nl}{nl}"));
            }
            if let Some(name) = name {
                text.push_str(&format!("event: {name}{nl}"));
            }
            for line in data {
                text.push_str(&format!("data: {line}{nl}"));
            }
            text.push_str(nl);
            expected.push(SseEvent { event: name.clone(), data: data.join("\n"), id: None });
        }
        let whole = sse_in_chunks(text.as_bytes(), &[]);
        let chunked = sse_in_chunks(text.as_bytes(), &cuts);
        // `data: x` strips exactly one leading space, so compare against the parser's own
        // whole-input result as well as the construction.
        prop_assert_eq!(&chunked, &whole);
        let stripped: Vec<SseEvent> = expected
            .into_iter()
            .map(|mut e| {
                e.data = e.data.split('\n').map(|l| l.to_string()).collect::<Vec<_>>().join("\n");
                e
            })
            .collect();
        prop_assert_eq!(chunked.len(), stripped.len());
        for (got, want) in chunked.iter().zip(stripped.iter()) {
            prop_assert_eq!(&got.event, &want.event);
            prop_assert_eq!(&got.data, &want.data);
        }
    }

    #[test]
    fn ndjson_is_chunking_invariant(
        values in proptest::collection::vec(any::<(u32, String, bool)>(), 0..8),
        cuts in proptest::collection::vec(any::<usize>(), 0..12),
        trailing_newline in any::<bool>(),
    ) {
        let lines: Vec<String> = values
            .iter()
            .map(|(n, s, b)| serde_json::json!({"n": n, "s": s, "done": b}).to_string())
            .collect();
        let mut text = lines.join("\n");
        if trailing_newline && !text.is_empty() {
            text.push('\n');
        }
        let bytes = text.as_bytes();
        let mut parser = NdjsonParser::new();
        let mut got = Vec::new();
        let points = split_points(bytes.len(), &cuts);
        for pair in points.windows(2) {
            got.extend(parser.push(&bytes[pair[0]..pair[1]]).unwrap());
        }
        got.extend(parser.finish());
        prop_assert_eq!(got, lines);
    }
}
