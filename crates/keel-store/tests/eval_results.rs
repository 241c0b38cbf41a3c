#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]
//! One suite for every `EvalResultStore`: memory, SQLite (temp files) and Postgres
//! (`DATABASE_URL`, a fresh schema per test). Each case takes a fresh, empty store; the
//! `cases!` macro runs it against every backend. Reopening is checked per backend at the
//! end.

use std::sync::Arc;

use chrono::Utc;
use keel_store::{
    EvalResultStore, EvalRunId, EvalStoreError, EvalThreadLink, MemoryEvalResultStore, NewEvalRun,
    PostgresOptions, PostgresStore, SqliteStore, open,
};
use serde_json::json;

fn database_url() -> String {
    std::env::var("DATABASE_URL").unwrap_or_else(|_| {
        panic!(
            "DATABASE_URL is not set: the Postgres store tests need a server. Run them through \
             ./scripts/test (which sets DATABASE_URL=postgres://postgres@127.0.0.1:5432/test), or \
             export DATABASE_URL yourself."
        )
    })
}

fn postgres_options() -> PostgresOptions {
    let schema = format!("keel_test_{}", uuid::Uuid::new_v4().simple());
    PostgresOptions::new(database_url()).schema(schema)
}

async fn postgres() -> PostgresStore {
    PostgresStore::connect_with(postgres_options())
        .await
        .expect("connect to Postgres at DATABASE_URL")
}

async fn sqlite() -> (tempfile::TempDir, SqliteStore) {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("keel.db")).await.unwrap();
    (dir, store)
}

fn link(scenario: &str, trial: u32, thread_id: &str) -> EvalThreadLink {
    EvalThreadLink {
        scenario: scenario.into(),
        trial,
        thread_id: thread_id.into(),
        trace_id: format!("trace-{thread_id}"),
    }
}

fn new_run(suite: &str, threads: &[&str]) -> NewEvalRun {
    NewEvalRun {
        suite: suite.into(),
        model: Some("mock:echo".into()),
        pass_rate: 0.5,
        total_scenarios: 2,
        report: json!({"suite": suite, "summary": {"pass_rate": 0.5}}),
        threads: threads
            .iter()
            .enumerate()
            .map(|(i, t)| link("s", u32::try_from(i).unwrap(), t))
            .collect(),
    }
}

fn ids(runs: &[keel_store::EvalRunInfo]) -> Vec<EvalRunId> {
    runs.iter().map(|r| r.id).collect()
}

fn assert_invalid(result: Result<impl std::fmt::Debug, EvalStoreError>, expected_field: &str) {
    match result {
        Err(EvalStoreError::InvalidArgument { field, message }) => {
            assert_eq!(field, expected_field, "{message}");
            let shown = EvalStoreError::InvalidArgument {
                field: field.clone(),
                message,
            }
            .to_string();
            assert!(shown.contains(expected_field), "{shown}");
        }
        other => panic!("expected an invalid {expected_field}, got {other:?}"),
    }
}

/// A saved run loads back equal: columns, links in order and the report JSON (awkward
/// floats, unicode, NUL and deep nesting included); an unknown id is `None`.
async fn round_trip(store: Arc<dyn EvalResultStore>) {
    let report = json!({
        "suite": "smoke",
        "summary": {"pass_rate": 2.0 / 3.0, "mean": 0.1 + 0.2, "tiny": 1e-300, "big": 1.7976931348623157e308},
        "scenarios": [{"id": "a", "text": "héllo \u{0} 🚀 \"quoted\"\n", "trials": [1, 2, 3]}],
        "nested": {"a": {"b": {"c": [null, true, false, -0.0, 12345678901234_i64]}}},
    });
    let threads = vec![
        link("b-scenario", 1, "thread-2"),
        link("a-scenario", 0, "thread-1"),
        EvalThreadLink {
            scenario: "c".into(),
            trial: u32::MAX,
            thread_id: "thread-3".into(),
            trace_id: String::new(),
        },
    ];
    let before = Utc::now();
    let id = store
        .save_run(NewEvalRun {
            suite: "smoke".into(),
            model: Some("anthropic:claude".into()),
            pass_rate: 2.0 / 3.0,
            total_scenarios: 3,
            report: report.clone(),
            threads: threads.clone(),
        })
        .await
        .unwrap();
    let after = Utc::now();
    assert!(id.0 > 0, "{id}");
    let stored = store.run(&id).await.unwrap().expect("the saved run");
    assert_eq!(stored.report, report);
    assert_eq!(stored.info.id, id);
    assert_eq!(stored.info.suite, "smoke");
    assert_eq!(stored.info.model.as_deref(), Some("anthropic:claude"));
    assert_eq!(stored.info.pass_rate, 2.0 / 3.0);
    assert_eq!(stored.info.total_scenarios, 3);
    assert_eq!(stored.info.threads, threads);
    assert!(
        before <= stored.info.created_at && stored.info.created_at <= after,
        "{before} <= {} <= {after}",
        stored.info.created_at
    );
    // A run without model or threads.
    let bare = store
        .save_run(NewEvalRun {
            model: None,
            threads: Vec::new(),
            ..new_run("smoke", &[])
        })
        .await
        .unwrap();
    assert!(bare > id, "ids increase: {bare} after {id}");
    let bare = store.run(&bare).await.unwrap().unwrap();
    assert_eq!(bare.info.model, None);
    assert!(bare.info.threads.is_empty());
    assert_eq!(
        store.list_runs(None, 10).await.unwrap()[1],
        stored.info,
        "a listed run equals the loaded one without its report"
    );
    assert!(store.run(&EvalRunId(id.0 + 1000)).await.unwrap().is_none());
}

/// Lists are newest first, filtered by suite, cut at the limit.
async fn list_newest_first_and_by_suite(store: Arc<dyn EvalResultStore>) {
    assert!(store.list_runs(None, 10).await.unwrap().is_empty());
    let a1 = store.save_run(new_run("a", &["t1"])).await.unwrap();
    let b1 = store.save_run(new_run("b", &["t2", "t3"])).await.unwrap();
    let a2 = store.save_run(new_run("a", &[])).await.unwrap();
    let all = store.list_runs(None, 10).await.unwrap();
    assert_eq!(ids(&all), vec![a2, b1, a1]);
    assert_eq!(all[1].threads, new_run("b", &["t2", "t3"]).threads);
    assert!(all[0].threads.is_empty());
    assert_eq!(
        ids(&store.list_runs(Some("a"), 10).await.unwrap()),
        vec![a2, a1]
    );
    assert_eq!(
        ids(&store.list_runs(Some("b"), 10).await.unwrap()),
        vec![b1]
    );
    assert_eq!(ids(&store.list_runs(None, 2).await.unwrap()), vec![a2, b1]);
    assert_eq!(ids(&store.list_runs(Some("a"), 1).await.unwrap()), vec![a2]);
    assert!(store.list_runs(None, 0).await.unwrap().is_empty());
    assert!(store.list_runs(Some("zzz"), 10).await.unwrap().is_empty());
    assert_eq!(store.list_runs(None, usize::MAX).await.unwrap().len(), 3);
}

/// Baselines: save, get, list, move (updated_at moves, run_created_at does not),
/// overwrite with the same run, delete.
async fn baselines(store: Arc<dyn EvalResultStore>) {
    assert!(store.baselines().await.unwrap().is_empty());
    assert!(store.baseline("main").await.unwrap().is_none());
    let r1 = store.save_run(new_run("smoke", &["t1"])).await.unwrap();
    let mut second = new_run("smoke", &["t2"]);
    second.pass_rate = 1.0;
    second.report = json!({"second": true});
    let r2 = store.save_run(second).await.unwrap();

    store.save_baseline("main", &r1).await.unwrap();
    let main = store.baseline("main").await.unwrap().unwrap();
    assert_eq!(main, store.run(&r1).await.unwrap().unwrap());
    let listed = store.baselines().await.unwrap();
    assert_eq!(listed.len(), 1);
    let first = listed[0].clone();
    assert_eq!(first.name, "main");
    assert_eq!(first.run_id, r1);
    assert_eq!(first.suite, "smoke");
    assert_eq!(first.model.as_deref(), Some("mock:echo"));
    assert_eq!(first.pass_rate, 0.5);
    assert_eq!(first.total_scenarios, 2);
    assert_eq!(first.run_created_at, main.info.created_at);
    assert!(first.updated_at >= first.run_created_at);

    // Moving the name.
    store.save_baseline("main", &r2).await.unwrap();
    let moved = store.baseline("main").await.unwrap().unwrap();
    assert_eq!(moved.info.id, r2);
    assert_eq!(moved.report, json!({"second": true}));
    let listed = store.baselines().await.unwrap();
    assert_eq!(listed.len(), 1, "moving a name does not add a baseline");
    assert_eq!(listed[0].run_id, r2);
    assert_eq!(listed[0].pass_rate, 1.0);
    assert!(listed[0].updated_at >= first.updated_at);
    // Saving it again on the same run is fine.
    store.save_baseline("main", &r2).await.unwrap();
    assert_eq!(store.baseline("main").await.unwrap().unwrap().info.id, r2);

    // More names list in byte order; two names may share a run.
    store.save_baseline("release-1.2", &r2).await.unwrap();
    store.save_baseline("Main", &r1).await.unwrap();
    store.save_baseline("é unicode", &r1).await.unwrap();
    let names: Vec<String> = store
        .baselines()
        .await
        .unwrap()
        .into_iter()
        .map(|b| b.name)
        .collect();
    assert_eq!(names, ["Main", "main", "release-1.2", "é unicode"]);

    assert!(store.delete_baseline("main").await.unwrap());
    assert!(!store.delete_baseline("main").await.unwrap());
    assert!(store.baseline("main").await.unwrap().is_none());
    assert_eq!(store.baselines().await.unwrap().len(), 3);
    // Deleting a baseline keeps its run.
    assert!(store.run(&r2).await.unwrap().is_some());
}

/// A baseline on an unknown run is `NotFound` and creates nothing; an existing baseline
/// stays where it was.
async fn unknown_run_is_not_found(store: Arc<dyn EvalResultStore>) {
    let missing = EvalRunId(999_999);
    let err = store.save_baseline("main", &missing).await.unwrap_err();
    assert_eq!(err, EvalStoreError::NotFound(missing));
    assert_eq!(err.code(), "not_found");
    assert!(err.to_string().contains("999999"), "{err}");
    assert!(store.baselines().await.unwrap().is_empty());
    let r1 = store.save_run(new_run("smoke", &[])).await.unwrap();
    store.save_baseline("main", &r1).await.unwrap();
    let err = store.save_baseline("main", &missing).await.unwrap_err();
    assert_eq!(err, EvalStoreError::NotFound(missing));
    assert_eq!(store.baseline("main").await.unwrap().unwrap().info.id, r1);
}

/// Bad baseline names fail with an error naming the field, on save, get and delete; the
/// longest allowed name works.
async fn bad_names_are_rejected(store: Arc<dyn EvalResultStore>) {
    let run = store.save_run(new_run("smoke", &[])).await.unwrap();
    for bad in [
        String::new(),
        "x".repeat(129),
        "two\nlines".into(),
        "tab\there".into(),
        "nul\u{0}".into(),
        " padded ".into(),
    ] {
        assert_invalid(store.save_baseline(&bad, &run).await, "name");
        assert_invalid(store.baseline(&bad).await, "name");
        assert_invalid(store.delete_baseline(&bad).await, "name");
    }
    assert!(store.baselines().await.unwrap().is_empty());
    let longest = "é".repeat(128);
    store.save_baseline(&longest, &run).await.unwrap();
    assert_eq!(
        store.baseline(&longest).await.unwrap().unwrap().info.id,
        run
    );
}

/// Bad runs fail with an error naming the field, and save nothing.
async fn bad_runs_are_rejected(store: Arc<dyn EvalResultStore>) {
    let cases: Vec<(NewEvalRun, &str)> = vec![
        (new_run("", &[]), "suite"),
        (new_run("a\u{0}b", &[]), "suite"),
        (
            NewEvalRun {
                model: Some("m\n".into()),
                ..new_run("s", &[])
            },
            "model",
        ),
        (
            NewEvalRun {
                pass_rate: f64::NAN,
                ..new_run("s", &[])
            },
            "pass_rate",
        ),
        (
            NewEvalRun {
                pass_rate: 1.5,
                ..new_run("s", &[])
            },
            "pass_rate",
        ),
        (new_run("s", &["ok", ""]), "threads[1].thread_id"),
        (
            NewEvalRun {
                threads: vec![link("", 0, "t")],
                ..new_run("s", &[])
            },
            "threads[0].scenario",
        ),
    ];
    for (run, field) in cases {
        assert_invalid(store.save_run(run).await, field);
    }
    assert!(store.list_runs(None, 100).await.unwrap().is_empty());
    assert_invalid("x".parse::<EvalRunId>(), "run id");
}

/// The runs of a thread, newest first, each with all its links.
async fn runs_for_thread(store: Arc<dyn EvalResultStore>) {
    let r1 = store.save_run(new_run("a", &["t1", "t2"])).await.unwrap();
    let r2 = store.save_run(new_run("b", &["t2", "t3"])).await.unwrap();
    let t2 = store.runs_for_thread("t2").await.unwrap();
    assert_eq!(ids(&t2), vec![r2, r1]);
    assert_eq!(t2[0].threads, new_run("b", &["t2", "t3"]).threads);
    assert_eq!(t2[1].threads, new_run("a", &["t1", "t2"]).threads);
    assert_eq!(ids(&store.runs_for_thread("t1").await.unwrap()), vec![r1]);
    assert_eq!(ids(&store.runs_for_thread("t3").await.unwrap()), vec![r2]);
    assert!(store.runs_for_thread("nope").await.unwrap().is_empty());
    // The same thread twice in one run gives the run once.
    let r3 = store.save_run(new_run("c", &["t4", "t4"])).await.unwrap();
    let t4 = store.runs_for_thread("t4").await.unwrap();
    assert_eq!(ids(&t4), vec![r3]);
    assert_eq!(t4[0].threads.len(), 2);
}

/// Concurrent saves all succeed with distinct ids.
async fn concurrent_saves(store: Arc<dyn EvalResultStore>) {
    let saves = (0..40).map(|i| {
        let store = store.clone();
        tokio::spawn(async move {
            store
                .save_run(new_run(
                    &format!("suite-{}", i % 3),
                    &[format!("t{i}").as_str()],
                ))
                .await
        })
    });
    let mut saved: Vec<EvalRunId> = futures::future::join_all(saves)
        .await
        .into_iter()
        .map(|r| r.unwrap().unwrap())
        .collect();
    saved.sort();
    saved.dedup();
    assert_eq!(saved.len(), 40);
    assert_eq!(store.list_runs(None, 100).await.unwrap().len(), 40);
    assert_eq!(store.runs_for_thread("t7").await.unwrap().len(), 1);
}

/// Writes the data that `check_reopened` expects.
async fn fill_for_reopen(store: &dyn EvalResultStore) -> (EvalRunId, EvalRunId) {
    let r1 = store.save_run(new_run("smoke", &["t1"])).await.unwrap();
    let r2 = store.save_run(new_run("smoke", &["t2"])).await.unwrap();
    store.save_baseline("main", &r1).await.unwrap();
    store.save_baseline("main", &r2).await.unwrap();
    store.save_baseline("old", &r1).await.unwrap();
    (r1, r2)
}

/// Everything `fill_for_reopen` wrote is there; new ids keep increasing.
async fn check_reopened(store: &dyn EvalResultStore, (r1, r2): (EvalRunId, EvalRunId)) {
    assert_eq!(ids(&store.list_runs(None, 10).await.unwrap()), vec![r2, r1]);
    assert_eq!(
        store.run(&r1).await.unwrap().unwrap().report,
        new_run("smoke", &["t1"]).report
    );
    assert_eq!(store.baseline("main").await.unwrap().unwrap().info.id, r2);
    assert_eq!(store.baseline("old").await.unwrap().unwrap().info.id, r1);
    assert_eq!(ids(&store.runs_for_thread("t2").await.unwrap()), vec![r2]);
    let r3 = store.save_run(new_run("smoke", &[])).await.unwrap();
    assert!(r3 > r2, "{r3} after {r2}");
}

macro_rules! cases {
    ($($case:ident),* $(,)?) => {
        mod memory_eval {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    super::$case(Arc::new(MemoryEvalResultStore::new())).await;
                }
            )*
        }
        mod sqlite_eval {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let (_dir, store) = sqlite().await;
                    super::$case(Arc::new(store.clone())).await;
                    store.close().await;
                }
            )*
        }
        mod postgres_eval {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let store = postgres().await;
                    // Drop the schema whether the case passes or panics.
                    let result = tokio::spawn(super::$case(Arc::new(store.clone()))).await;
                    store.drop_schema().await.unwrap();
                    if let Err(e) = result {
                        std::panic::resume_unwind(e.into_panic());
                    }
                }
            )*
        }
    };
}

cases!(
    round_trip,
    list_newest_first_and_by_suite,
    baselines,
    unknown_run_is_not_found,
    bad_names_are_rejected,
    bad_runs_are_rejected,
    runs_for_thread,
    concurrent_saves,
);

/// A SQLite file closed and reopened (directly and through `open`) keeps every run,
/// link and baseline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_reopen_keeps_everything() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keel.db");
    let first = SqliteStore::open(&path).await.unwrap();
    let saved = fill_for_reopen(&first).await;
    first.close().await;
    let again = SqliteStore::open(&path).await.unwrap();
    check_reopened(&again, saved).await;
    again.close().await;
    let opened = open(&format!("sqlite://{}", path.display())).await.unwrap();
    assert_eq!(opened.backend, "sqlite");
    assert_eq!(
        opened.eval_results.list_runs(None, 10).await.unwrap().len(),
        3
    );
}

/// A second connection to the same Postgres schema (another process) sees everything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_reconnect_keeps_everything() {
    let options = postgres_options();
    let first = PostgresStore::connect_with(options.clone()).await.unwrap();
    let saved = fill_for_reopen(&first).await;
    first.close().await;
    let again = PostgresStore::connect_with(options).await.unwrap();
    let result = tokio::spawn({
        let again = again.clone();
        async move { check_reopened(&again, saved).await }
    })
    .await;
    again.drop_schema().await.unwrap();
    if let Err(e) = result {
        std::panic::resume_unwind(e.into_panic());
    }
}

/// `open("memory:")` comes with a working in-memory eval store.
#[tokio::test]
async fn memory_url_has_an_eval_store() {
    let opened = open("memory:").await.unwrap();
    let id = opened
        .eval_results
        .save_run(new_run("smoke", &["t"]))
        .await
        .unwrap();
    assert_eq!(id, EvalRunId(1));
    assert!(opened.eval_results.run(&id).await.unwrap().is_some());
}
