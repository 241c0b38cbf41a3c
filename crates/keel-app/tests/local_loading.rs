//! Loading an embedded `local:` model never blocks the async runtime: keel-app resolves,
//! verifies and loads it on the blocking pool (`keel_app::model::build_model_async`).
//! Needs SmolLM2 (`./scripts/fetch-model`; `./scripts/test` fetches it).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

#[test]
fn loading_a_local_model_does_not_block_the_runtime() {
    if let Err(error) = keel_local::resolve_model("smollm2") {
        panic!("this test needs SmolLM2-135M: {error}. Run ./scripts/fetch-model");
    }
    // A single-threaded runtime: had the load run on it (the blocking `load_spec` inside
    // the async agent builder, before), the ticker could not tick until it was done.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let ticks = Arc::new(AtomicU64::new(0));
        let ticker = tokio::spawn({
            let ticks = Arc::clone(&ticks);
            async move {
                loop {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    ticks.fetch_add(1, Ordering::SeqCst);
                }
            }
        });
        let config = keel_config::KeelConfig::default();
        let load =
            keel_app::model::build_model_async(&config, "local:smollm2", None, &|_| None, None);
        // Started, not awaited yet: the ticker runs while the load is on the blocking pool.
        let model = load.await.unwrap();
        ticker.abort();
        assert_eq!(model.id(), "local:smollm2");
        assert!(
            ticks.load(Ordering::SeqCst) > 0,
            "the runtime could not tick while the model loaded"
        );
    });
}
