//! The short chaos run of `./scripts/test`: 200 conversations, 16 at a time, 30% seeded
//! provider and tool faults, on the memory and the SQLite store — the same code as
//! `cargo xtask chaos`. The verdict depends on the seed and on counts only.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use xtask::chaos::{ChaosOptions, run};
use xtask::store::StoreKind;

fn short(store: StoreKind) -> ChaosOptions {
    ChaosOptions {
        conversations: 200,
        concurrency: 16,
        store,
        ..ChaosOptions::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_200_conversations_memory_store() {
    let report = run(short(StoreKind::Memory)).await.unwrap();
    println!("{report}");
    assert!(report.failures().is_empty(), "{report}");
    // The faults really happened, of every kind, and were survived.
    assert_eq!(report.provider_faults.len(), 6, "{report}");
    assert!(report.model_retries.values().sum::<u64>() > 0);
    assert!(report.tool_retries.contains_key("timeout"), "{report}");
    assert!(report.tool_retries.contains_key("rate_limited"), "{report}");
    assert!(report.effects.book_deduplicated > 0, "{report}");
    assert!(report.effects.notify_failures > 0, "{report}");
    assert_eq!(
        report.effects.notify_attempts,
        report.effects.notify_calls as u64
    );
    assert!(report.wire.tool_results > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_200_conversations_sqlite_store() {
    let report = run(short(StoreKind::Sqlite)).await.unwrap();
    println!("{report}");
    assert!(report.failures().is_empty(), "{report}");
}

/// With a budget of one attempt per call the same faults end runs `failed`: the harness
/// notices (its assertion can fail), and every such run says it is resumable and finishes
/// `done` when resumed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_retries_the_done_assertion_fails_and_resume_recovers() {
    let report = run(ChaosOptions {
        conversations: 40,
        concurrency: 8,
        max_attempts: 1,
        ..ChaosOptions::default()
    })
    .await
    .unwrap();
    println!("{report}");
    let failures = report.failures();
    assert!(
        failures
            .iter()
            .any(|f| f.contains("ended done at their first try")),
        "{report}"
    );
    // Nothing else broke: only runs gave up (and their resumes may meet faults again).
    for failure in &failures {
        assert!(
            failure.contains("ended done at their first try")
                || failure.contains("did not finish done when resumed"),
            "{failure}\n{report}"
        );
    }
    assert!(report.resumable > 0, "{report}");
    assert!(report.resumed_done > 0, "{report}");
}
