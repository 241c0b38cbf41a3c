//! The short soak of `./scripts/test`: 50 conversations × 20 turns with compaction — the
//! same code as `cargo xtask soak`. Every run must end `done`, compaction must happen,
//! and tokio tasks, file descriptors and resident memory must not grow after warm-up.
//! (Its own test binary: nothing else runs in the process while it measures.)
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use xtask::soak::{SoakOptions, run};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soak_50_conversations_of_20_turns() {
    let report = run(SoakOptions {
        conversations: 50,
        turns: 20,
        concurrency: 8,
        ..SoakOptions::default()
    })
    .await
    .unwrap();
    println!("{report}");
    assert!(report.failures().is_empty(), "{report}");
    assert_eq!(report.runs, 50 * 20);
    assert!(
        report.compactions >= 50,
        "every conversation compacts: {report}"
    );
}
