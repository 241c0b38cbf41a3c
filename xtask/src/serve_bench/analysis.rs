//! From timelines to figures: the mock's own schedule (the baseline), the latency `keel
//! serve` adds to each event over it, and the checks every stream must pass.
//!
//! **Added latency per event.** The baseline run asks the mock for the same answer
//! directly, at the same concurrency, from the same client; the median arrival of its
//! text chunk *m* (and of its end) since the request was sent is the mock's reference
//! time for that point of the answer. Each event of a chat stream then has a reference:
//! - events before the model answers (`run_started`, `user_message`, `model_requested`):
//!   0 — the mock was not even asked yet, all of that time is the server's;
//! - a `text_delta`: the mock's chunk holding the last byte the stream has received with
//!   it (deltas and chunks line up one to one unless the provider reads several chunks at
//!   once; matching by text keeps the comparison right either way);
//! - events after the answer (`model_responded`, `run_ended`, `outcome`): the mock's end.
//!
//! The added latency of the event is its arrival (since the chat's request was sent)
//! minus its reference. It includes everything the server does for the chat: auth,
//! limits, queueing the run, a worker leasing it, journaling, the provider's HTTP call,
//! the fan-out to the stream and the SSE encoding.

use std::time::Duration;

use super::client::{ChatTimeline, Kind, MockTimeline};

/// Where in a chat an event falls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Before the model call answers.
    Before,
    /// A text delta.
    Delta,
    /// After the answer.
    After,
}

/// The mock's reference times (medians over the baseline streams).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Reference {
    /// Text chunk *m*: the answer's length in bytes up to and including it, and when it
    /// arrived.
    pub chunks: Vec<(usize, Duration)>,
    /// The end of the answer (`[DONE]`).
    pub end: Duration,
}

impl Reference {
    /// The medians of the successful baseline streams.
    pub fn from_baseline(streams: &[MockTimeline]) -> Self {
        let ok: Vec<&MockTimeline> = streams.iter().filter(|s| s.error.is_none()).collect();
        let longest = ok.iter().map(|s| s.chunks.len()).max().unwrap_or(0);
        let chunks = (0..longest)
            .map(|m| {
                let len = ok
                    .iter()
                    .filter_map(|s| s.chunks.get(m).map(|(len, _)| *len))
                    .max()
                    .unwrap_or(0);
                let at = median(
                    ok.iter()
                        .filter_map(|s| s.chunks.get(m).map(|(_, at)| *at))
                        .collect(),
                );
                (len, at)
            })
            .collect();
        let end = median(ok.iter().filter_map(|s| s.done).collect());
        Self { chunks, end }
    }

    /// The answer's length in bytes.
    pub fn answer_len(&self) -> usize {
        self.chunks.last().map_or(0, |(len, _)| *len)
    }

    /// When the mock's stream held the first `len` bytes of the answer.
    fn for_text(&self, len: usize) -> Duration {
        self.chunks
            .iter()
            .find(|(upto, _)| *upto >= len)
            .map_or(self.end, |(_, at)| *at)
    }
}

fn median(mut values: Vec<Duration>) -> Duration {
    values.sort_unstable();
    values.get(values.len() / 2).copied().unwrap_or_default()
}

/// The added latency (ms, may be slightly negative: the reference is a median) of every
/// event of `stream`, with its phase.
pub fn added_latencies(reference: &Reference, stream: &ChatTimeline) -> Vec<(Phase, f64)> {
    let mut out = Vec::with_capacity(stream.arrivals.len());
    let mut answered = false;
    let mut received = 0usize;
    for arrival in &stream.arrivals {
        let (phase, at) = match &arrival.kind {
            Kind::Delta { text } => {
                answered = true;
                received += text.len();
                (Phase::Delta, reference.for_text(received))
            }
            Kind::Stored { name, .. } if !answered && name != "model_responded" => {
                (Phase::Before, Duration::ZERO)
            }
            Kind::Stored { .. } | Kind::Outcome { .. } => {
                answered = true;
                (Phase::After, reference.end)
            }
        };
        out.push((phase, ms(arrival.at) - ms(at)));
    }
    out
}

/// Milliseconds as a float.
pub fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1000.0
}

/// The `p`-th percentile (0–100, nearest rank) of `values`; 0 when empty.
pub fn percentile(values: &[f64], p: f64) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    let mut sorted = values.to_vec();
    sorted.sort_unstable_by(f64::total_cmp);
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted
        .get(rank.clamp(1, sorted.len()) - 1)
        .copied()
        .unwrap_or_default()
}

/// p50, p99 and max of `values` (ms).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Spread {
    /// How many values.
    pub count: usize,
    /// Median.
    pub p50: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Largest.
    pub max: f64,
}

impl Spread {
    /// Of `values`.
    pub fn of(values: &[f64]) -> Self {
        Self {
            count: values.len(),
            p50: percentile(values, 50.0),
            p99: percentile(values, 99.0),
            max: percentile(values, 100.0),
        }
    }
}

/// What went wrong with the chat streams (every count must be 0).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Problems {
    /// Streams that did not answer 200.
    pub bad_status: usize,
    /// Streams cut, timed out or unparsable.
    pub transport: usize,
    /// Streams that ended without an `outcome`.
    pub no_outcome: usize,
    /// Streams whose outcome is not `ended` / `done`.
    pub not_done: usize,
    /// Streams whose ids skip or repeat a sequence number.
    pub seq_gaps: usize,
    /// Streams whose `text_delta`s do not add up to the answer.
    pub delta_mismatch: usize,
    /// Bytes of the answer missing from those streams' deltas, in all.
    pub bytes_missing: usize,
    /// A few examples, for the report.
    pub examples: Vec<String>,
}

impl Problems {
    /// Errors: streams that failed (the delta counts are reported on their own).
    pub fn errors(&self) -> usize {
        self.bad_status + self.transport + self.no_outcome + self.not_done + self.seq_gaps
    }
}

/// Checks every stream; `answer` is what the mock streams (its deltas must add up to it).
pub fn problems(streams: &[ChatTimeline], answer: &str) -> Problems {
    let mut out = Problems::default();
    let note = |out: &mut Problems, index: usize, what: String| {
        if out.examples.len() < 5 {
            out.examples.push(format!("chat {index}: {what}"));
        }
    };
    for (index, stream) in streams.iter().enumerate() {
        if stream.status.is_some_and(|s| s != 200) {
            out.bad_status += 1;
            note(&mut out, index, stream.error.clone().unwrap_or_default());
            continue;
        }
        if let Some(error) = &stream.error {
            out.transport += 1;
            note(&mut out, index, error.clone());
            continue;
        }
        match stream.arrivals.last().map(|a| &a.kind) {
            Some(Kind::Outcome { done: true }) => {}
            Some(Kind::Outcome { done: false }) => {
                out.not_done += 1;
                note(&mut out, index, "the run did not end done".into());
            }
            _ => {
                out.no_outcome += 1;
                note(
                    &mut out,
                    index,
                    "the stream ended without an outcome".into(),
                );
            }
        }
        let seqs: Vec<u64> = stream
            .arrivals
            .iter()
            .filter_map(|a| match a.kind {
                Kind::Stored { seq, .. } => Some(seq),
                _ => None,
            })
            .collect();
        if seqs
            .windows(2)
            .any(|w| w.first().map(|a| a + 1) != w.get(1).copied())
        {
            out.seq_gaps += 1;
            note(&mut out, index, format!("ids {seqs:?}"));
        }
        let texts: Vec<&str> = stream
            .arrivals
            .iter()
            .filter_map(|a| match &a.kind {
                Kind::Delta { text } => Some(text.as_str()),
                _ => None,
            })
            .collect();
        let streamed = texts.concat();
        if streamed != answer {
            out.delta_mismatch += 1;
            out.bytes_missing += answer.len().saturating_sub(streamed.len());
            note(
                &mut out,
                index,
                format!(
                    "{} deltas carried {} of the answer's {} bytes: {streamed:?}",
                    texts.len(),
                    streamed.len(),
                    answer.len()
                ),
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use super::super::client::Arrival;
    use super::*;

    fn at(ms: u64) -> Duration {
        Duration::from_millis(ms)
    }

    fn stored(ms: u64, name: &str, seq: u64) -> Arrival {
        Arrival {
            at: at(ms),
            kind: Kind::Stored {
                name: name.into(),
                seq,
            },
        }
    }

    fn delta(ms: u64, text: &str) -> Arrival {
        Arrival {
            at: at(ms),
            kind: Kind::Delta { text: text.into() },
        }
    }

    fn chat(arrivals: Vec<Arrival>) -> ChatTimeline {
        ChatTimeline {
            status: Some(200),
            headers: Some(at(1)),
            error: None,
            arrivals,
            end: at(0),
        }
    }

    #[test]
    fn the_reference_is_the_median_of_the_baseline() {
        let mock = |chunks: &[u64], done: u64| MockTimeline {
            error: None,
            chunks: chunks
                .iter()
                .enumerate()
                .map(|(i, &m)| (3 * (i + 1), at(m)))
                .collect(),
            done: Some(at(done)),
        };
        let failed = MockTimeline {
            error: Some("cut".into()),
            chunks: vec![(3, at(1))],
            done: None,
        };
        let reference = Reference::from_baseline(&[
            mock(&[50, 60], 70),
            mock(&[52, 61], 75),
            mock(&[58, 69], 90),
            failed,
        ]);
        assert_eq!(reference.chunks, vec![(3, at(52)), (6, at(61))]);
        assert_eq!(reference.end, at(75));
        assert_eq!(reference.answer_len(), 6);
    }

    #[test]
    fn each_event_is_measured_against_its_point_of_the_answer() {
        let reference = Reference {
            chunks: vec![(3, at(50)), (6, at(60)), (9, at(65))],
            end: at(70),
        };
        let stream = chat(vec![
            stored(5, "run_started", 3),
            stored(6, "user_message", 4),
            stored(8, "model_requested", 5),
            delta(58, "ab "),
            delta(66, "cd ef "), // two chunks read at once: measured against the second
            delta(90, "!"),      // past the answer: measured against the end
            stored(80, "model_responded", 6),
            stored(81, "run_ended", 7),
            Arrival {
                at: at(82),
                kind: Kind::Outcome { done: true },
            },
        ]);
        let added = added_latencies(&reference, &stream);
        let phases: Vec<Phase> = added.iter().map(|(p, _)| *p).collect();
        assert_eq!(
            phases,
            [
                Phase::Before,
                Phase::Before,
                Phase::Before,
                Phase::Delta,
                Phase::Delta,
                Phase::Delta,
                Phase::After,
                Phase::After,
                Phase::After
            ]
        );
        let values: Vec<i64> = added.iter().map(|(_, v)| v.round() as i64).collect();
        assert_eq!(values, [5, 6, 8, 8, 1, 20, 10, 11, 12]);
    }

    #[test]
    fn a_stream_without_deltas_still_splits_at_the_answer() {
        let reference = Reference {
            chunks: vec![(3, at(50))],
            end: at(70),
        };
        let stream = chat(vec![
            stored(5, "run_started", 0),
            stored(75, "model_responded", 1),
            stored(76, "run_ended", 2),
        ]);
        let phases: Vec<Phase> = added_latencies(&reference, &stream)
            .iter()
            .map(|(p, _)| *p)
            .collect();
        assert_eq!(phases, [Phase::Before, Phase::After, Phase::After]);
    }

    #[test]
    fn problems_are_counted_per_stream() {
        let outcome = |done| Arrival {
            at: at(9),
            kind: Kind::Outcome { done },
        };
        let good = chat(vec![
            stored(1, "run_started", 0),
            delta(2, "hello "),
            delta(2, "world"),
            stored(3, "run_ended", 1),
            outcome(true),
        ]);
        let merged = chat(vec![
            stored(1, "run_started", 0),
            delta(2, "hello world"),
            stored(3, "run_ended", 1),
            outcome(true),
        ]);
        let gap = chat(vec![
            stored(1, "run_started", 0),
            delta(2, "hello world"),
            stored(3, "run_ended", 2),
            outcome(true),
        ]);
        let lost = chat(vec![
            stored(1, "run_started", 0),
            delta(2, "world"),
            stored(3, "run_ended", 1),
            outcome(true),
        ]);
        let failed_run = chat(vec![
            stored(1, "run_started", 0),
            delta(2, "hello world"),
            outcome(false),
        ]);
        let cut = ChatTimeline {
            error: Some("stream: reset".into()),
            ..good.clone()
        };
        let refused = ChatTimeline {
            status: Some(429),
            error: Some("HTTP 429".into()),
            ..ChatTimeline::default()
        };
        let unfinished = chat(vec![stored(1, "run_started", 0), delta(2, "hello world")]);
        let found = problems(
            &[
                good, merged, gap, lost, failed_run, cut, refused, unfinished,
            ],
            "hello world",
        );
        assert_eq!(found.bad_status, 1);
        assert_eq!(found.transport, 1);
        assert_eq!(found.no_outcome, 1);
        assert_eq!(found.not_done, 1);
        assert_eq!(found.seq_gaps, 1);
        assert_eq!(found.delta_mismatch, 1);
        assert_eq!(found.bytes_missing, 6);
        assert_eq!(found.errors(), 5);
        assert_eq!(found.examples.len(), 5);
    }

    #[test]
    fn percentiles_by_nearest_rank() {
        let values: Vec<f64> = (1..=100).map(f64::from).collect();
        let spread = Spread::of(&values);
        assert_eq!((spread.p50, spread.p99, spread.max), (50.0, 99.0, 100.0));
        assert_eq!(percentile(&[], 50.0), 0.0);
        assert_eq!(percentile(&[-2.0, 3.0], 50.0), -2.0);
    }
}
