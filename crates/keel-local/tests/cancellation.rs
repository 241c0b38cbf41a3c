//! Cancellation: dropping a local model's stream stops its worker thread between two
//! tokens. Alone in its own test binary so no other generation shares the model's
//! active-generation counter.
//!
//! Needs the model file: run `./scripts/fetch-model` first (the test fails otherwise).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

use crate::common;

use std::time::{Duration, Instant};

use futures::StreamExt;
use keel_core::{Message, Model, ModelRequest, StreamEvent};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_stream_stops_generation() {
    let mut options = common::options().with_max_tokens(4000);
    options.ignore_eos = true;
    let model = common::model(options);
    let messages = vec![Message::user("Tell me a very long story.")];
    let mut stream = model.stream(ModelRequest::new(&messages));
    let first = stream.next().await.expect("an event").expect("no error");
    assert!(matches!(first, StreamEvent::TextDelta(_)), "{first:?}");
    assert_eq!(model.active_generations(), 1);
    drop(stream);
    // 4000 tokens would take minutes; a cancelled worker exits after its current token.
    let deadline = Instant::now() + Duration::from_secs(10);
    while model.active_generations() > 0 {
        assert!(
            Instant::now() < deadline,
            "generation kept running after the stream was dropped"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
