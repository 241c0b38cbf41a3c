//! The release service over real HTTP on an ephemeral loopback port.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

use std::time::{Duration, Instant};

use keel_detective::{RunningService, ServiceConfig, fixtures, serve};
use serde_json::{Value, json};

async fn start(dir: &std::path::Path) -> RunningService {
    serve(ServiceConfig {
        port: 0,
        reports_dir: dir.to_path_buf(),
        fixtures_dir: None,
    })
    .await
    .unwrap()
}

async fn get(url: String) -> (u16, Value) {
    let response = reqwest::get(url).await.unwrap();
    let status = response.status().as_u16();
    (
        status,
        serde_json::from_slice(&response.bytes().await.unwrap()).unwrap(),
    )
}

async fn post(base: &str, body: Value, key: Option<&str>) -> (u16, Value) {
    let mut request = reqwest::Client::new()
        .post(format!("{base}/risk-reports"))
        .header("content-type", "application/json")
        .body(body.to_string());
    if let Some(key) = key {
        request = request.header("idempotency-key", key);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    (
        status,
        serde_json::from_slice(&response.bytes().await.unwrap()).unwrap(),
    )
}

/// The report files in `dir` (not the idempotency index or temporary files).
fn report_files(dir: &std::path::Path) -> usize {
    std::fs::read_dir(dir)
        .unwrap()
        .filter(|entry| {
            let name = entry.as_ref().unwrap().file_name();
            let name = name.to_string_lossy();
            name.starts_with("rr-") && name.ends_with(".json")
        })
        .count()
}

#[test]
fn fixtures_cover_every_severity_edge_cases_and_failures() {
    let releases = fixtures::embedded().unwrap();
    assert!(releases.len() >= 12, "{} releases", releases.len());
    for severity in ["high", "medium", "low"] {
        let count = releases
            .values()
            .filter(|r| r.expected_severity.as_deref() == Some(severity))
            .count();
        assert!(count >= 2, "{severity}: {count}");
    }
    assert!(
        releases
            .values()
            .any(|r| r.summary["deployment_metrics"].is_null()),
        "missing metrics"
    );
    assert!(
        releases.values().any(|r| r.summary["tests"]
            == json!({"passed": 0, "failed": 0, "skipped": 0})
            && r.behavior.fail_status.is_none()),
        "zero tests"
    );
    assert!(
        releases
            .values()
            .any(|r| r.behavior.fail_status == Some(500))
    );
    assert!(releases.values().any(|r| r.behavior.delay_ms.is_some()));
    // The embedded copies are the files on disk.
    let on_disk = fixtures::load_dir(
        &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/releases"),
    )
    .unwrap();
    assert_eq!(on_disk, releases);
}

#[tokio::test]
async fn summary_and_test_details_of_a_release() {
    let dir = tempfile::tempdir().unwrap();
    let service = start(dir.path()).await;
    let base = service.base_url();
    let (status, summary) = get(format!("{base}/releases/v2.1.0/summary")).await;
    assert_eq!(status, 200);
    assert_eq!(summary["version"], "v2.1.0");
    assert_eq!(
        summary["tests"],
        json!({"passed": 142, "failed": 2, "skipped": 5})
    );
    assert_eq!(summary["deployment_metrics"]["error_rate"], 0.02);
    let (status, details) = get(format!("{base}/releases/v2.1.0/test-details")).await;
    assert_eq!(status, 200);
    assert_eq!(details["failing_tests"].as_array().unwrap().len(), 2);
    assert!(
        details["failing_tests"][0]["name"]
            .as_str()
            .unwrap()
            .contains("payments")
    );
    let (status, list) = get(format!("{base}/releases")).await;
    assert_eq!(status, 200);
    assert!(list["releases"].as_array().unwrap().len() >= 12);
    service.shutdown().await;
}

#[tokio::test]
async fn unknown_broken_and_slow_releases() {
    let dir = tempfile::tempdir().unwrap();
    let service = start(dir.path()).await;
    let base = service.base_url();
    let (status, body) = get(format!("{base}/releases/v0.0.0/summary")).await;
    assert_eq!(status, 404);
    assert_eq!(body["error"]["field"], "release_id");
    assert!(
        body["error"]["fix"].as_str().unwrap().contains("v2.1.0"),
        "{body}"
    );
    let (status, body) = get(format!("{base}/releases/v2.7.0-broken/test-details")).await;
    assert_eq!(status, 500, "{body}");
    let started = Instant::now();
    let (status, body) = get(format!("{base}/releases/v2.8.0-slow/summary")).await;
    assert_eq!(status, 200);
    assert_eq!(body["version"], "v2.8.0-slow");
    assert!(
        started.elapsed() >= Duration::from_millis(2_400),
        "{:?}",
        started.elapsed()
    );
    service.shutdown().await;
}

#[tokio::test]
async fn filed_reports_are_kept_on_disk_and_listed() {
    let dir = tempfile::tempdir().unwrap();
    let service = start(dir.path()).await;
    let base = service.base_url();
    let body = json!({"release_id": "v2.1.0", "severity": "HIGH", "findings": ["2 payment tests fail"], "summary": "risky"});
    let (status, report) = post(&base, body, None).await;
    assert_eq!(status, 201, "{report}");
    let id = report["report_id"].as_str().unwrap().to_string();
    assert!(id.starts_with("rr-"));
    assert_eq!(report["severity"], "high");
    let file = dir.path().join(format!("{id}.json"));
    let on_disk: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    assert_eq!(on_disk["findings"], json!(["2 payment tests fail"]));

    let (status, fetched) = get(format!("{base}/risk-reports/{id}")).await;
    assert_eq!(status, 200);
    assert_eq!(fetched, report);
    let (_, other) = post(
        &base,
        json!({"release_id": "v1.9.8", "severity": "low", "findings": ["all green"]}),
        None,
    )
    .await;
    let (_, list) = get(format!("{base}/risk-reports?release_id=v2.1.0")).await;
    assert_eq!(list["reports"].as_array().unwrap().len(), 1);
    let (_, all) = get(format!("{base}/risk-reports")).await;
    assert_eq!(all["reports"].as_array().unwrap().len(), 2);
    let (status, _) = get(format!("{base}/risk-reports/rr-nope")).await;
    assert_eq!(status, 404);
    let (status, _) = get(format!("{base}/risk-reports/..%2F..%2Fetc")).await;
    assert_eq!(status, 404);
    service.shutdown().await;

    // A new service on the same directory still has them.
    let again = start(dir.path()).await;
    let (status, fetched) = get(format!(
        "{}/risk-reports/{}",
        again.base_url(),
        other["report_id"].as_str().unwrap()
    ))
    .await;
    assert_eq!(status, 200);
    assert_eq!(fetched["severity"], "low");
    again.shutdown().await;
}

#[tokio::test]
async fn the_same_idempotency_key_files_one_report() {
    let dir = tempfile::tempdir().unwrap();
    let service = start(dir.path()).await;
    let body = json!({"release_id": "v2.0.4", "severity": "medium", "findings": ["flaky UI test"]});
    let (first_status, first) =
        post(&service.base_url(), body.clone(), Some("thread:call-1")).await;
    let (second_status, second) = post(&service.base_url(), body, Some("thread:call-1")).await;
    assert_eq!((first_status, second_status), (201, 200));
    assert_eq!(first["report_id"], second["report_id"]);
    assert_eq!(report_files(dir.path()), 1);
    service.shutdown().await;
}

#[tokio::test]
async fn a_retry_after_a_restart_returns_the_same_report() {
    let dir = tempfile::tempdir().unwrap();
    let body =
        json!({"release_id": "v2.1.0", "severity": "high", "findings": ["2 payment tests fail"]});
    let service = start(dir.path()).await;
    let (status, first) = post(&service.base_url(), body.clone(), Some("thread:call-7")).await;
    assert_eq!(status, 201, "{first}");
    service.shutdown().await;

    let again = start(dir.path()).await;
    let (status, second) = post(&again.base_url(), body.clone(), Some("thread:call-7")).await;
    assert_eq!(status, 200, "{second}");
    assert_eq!(second, first);
    assert_eq!(report_files(dir.path()), 1, "no duplicate report");
    again.shutdown().await;

    // The reports stay the source of truth: without the index file, the key is still known.
    std::fs::remove_file(dir.path().join(keel_detective::reports::IDEMPOTENCY_FILE)).unwrap();
    let third = start(dir.path()).await;
    let (status, answer) = post(&third.base_url(), body, Some("thread:call-7")).await;
    assert_eq!((status, &answer["report_id"]), (200, &first["report_id"]));
    assert_eq!(report_files(dir.path()), 1);
    third.shutdown().await;
}

#[tokio::test]
async fn a_reused_key_with_a_different_body_is_a_conflict() {
    let dir = tempfile::tempdir().unwrap();
    let service = start(dir.path()).await;
    let base = service.base_url();
    let body = json!({"release_id": "v2.0.4", "severity": "medium", "findings": ["flaky UI test"]});
    let (status, first) = post(&base, body, Some("thread:call-2")).await;
    assert_eq!(status, 201);
    let other = json!({"release_id": "v2.0.4", "severity": "low", "findings": ["flaky UI test"]});
    let (status, answer) = post(&base, other, Some("thread:call-2")).await;
    assert_eq!(status, 409, "{answer}");
    assert_eq!(answer["error"]["code"], "idempotency_conflict");
    assert_eq!(answer["error"]["field"], "Idempotency-Key");
    let message = answer["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("thread:call-2")
            && message.contains(first["report_id"].as_str().unwrap())
            && message.contains("different body"),
        "{message}"
    );
    assert_eq!(report_files(dir.path()), 1, "nothing new filed");
    service.shutdown().await;
}

#[tokio::test]
async fn reports_must_be_sent_as_json() {
    let dir = tempfile::tempdir().unwrap();
    let service = start(dir.path()).await;
    let base = service.base_url();
    let body = json!({"release_id": "v2.1.0", "severity": "high", "findings": ["x"]}).to_string();
    for content_type in [
        None,
        Some("text/plain"),
        Some("application/x-www-form-urlencoded"),
    ] {
        let mut request = reqwest::Client::new()
            .post(format!("{base}/risk-reports"))
            .body(body.clone());
        if let Some(content_type) = content_type {
            request = request.header("content-type", content_type);
        }
        let response = request.send().await.unwrap();
        assert_eq!(response.status().as_u16(), 415, "{content_type:?}");
        let answer: Value = serde_json::from_slice(&response.bytes().await.unwrap()).unwrap();
        assert_eq!(answer["error"]["field"], "Content-Type", "{answer}");
        assert!(
            answer["error"]["fix"]
                .as_str()
                .unwrap()
                .contains("application/json")
        );
    }
    assert_eq!(report_files(dir.path()), 0);
    let response = reqwest::Client::new()
        .post(format!("{base}/risk-reports"))
        .header("content-type", "Application/JSON; charset=utf-8")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 201);
    service.shutdown().await;
}

#[tokio::test]
async fn invalid_reports_get_422_naming_the_field_and_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    let service = start(dir.path()).await;
    let base = service.base_url();
    let cases = [
        (json!({"severity": "high", "findings": ["x"]}), "release_id"),
        (
            json!({"release_id": "v9.9.9", "severity": "high", "findings": ["x"]}),
            "release_id",
        ),
        (
            json!({"release_id": "v2.1.0", "severity": "critical", "findings": ["x"]}),
            "severity",
        ),
        (
            json!({"release_id": "v2.1.0", "findings": ["x"]}),
            "severity",
        ),
        (
            json!({"release_id": "v2.1.0", "severity": "low", "findings": []}),
            "findings",
        ),
        (
            json!({"release_id": "v2.1.0", "severity": "low"}),
            "findings",
        ),
        (
            json!({"release_id": "v2.1.0", "severity": "low", "findings": "one"}),
            "findings",
        ),
        (
            json!({"release_id": "v2.1.0", "severity": "low", "findings": [1, 2]}),
            "findings",
        ),
        (
            json!({"release_id": "v2.1.0", "severity": "low", "findings": ["x"], "sevrity": "low"}),
            "sevrity",
        ),
    ];
    for (body, field) in cases {
        let (status, answer) = post(&base, body.clone(), None).await;
        assert_eq!(status, 422, "{body} -> {answer}");
        assert_eq!(answer["error"]["field"], field, "{body} -> {answer}");
        assert!(!answer["error"]["fix"].as_str().unwrap().is_empty());
        assert!(
            answer["error"]["message"].as_str().unwrap().contains(field),
            "{answer}"
        );
    }
    let response = reqwest::Client::new()
        .post(format!("{base}/risk-reports"))
        .header("content-type", "application/json")
        .body("not json")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 400);
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "nothing filed"
    );
    service.shutdown().await;
}

#[tokio::test]
async fn a_busy_port_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let first = start(dir.path()).await;
    let error = serve(ServiceConfig {
        port: first.addr().port(),
        reports_dir: dir.path().to_path_buf(),
        fixtures_dir: None,
    })
    .await
    .unwrap_err()
    .to_string();
    assert!(
        error.contains(&first.addr().port().to_string()) && error.contains("--port 0"),
        "{error}"
    );
    first.shutdown().await;
}

#[tokio::test]
async fn injected_faults_fail_stall_or_cut_the_requests_they_match() {
    let dir = tempfile::tempdir().unwrap();
    let service = start(dir.path()).await;
    let base = service.base_url();
    let setup = keel_detective::FaultSetup::from_value(&json!({"faults": [
        {"endpoint": "summary", "release": "v2.1.0", "status": 503, "times": 2},
        {"endpoint": "test-details", "malformed": true},
        {"endpoint": "risk-reports", "status": 403},
    ]}))
    .unwrap();
    service.set_faults(setup.faults).await.unwrap();

    // The first two summaries of v2.1.0 fail, the third and other releases' do not.
    for _ in 0..2 {
        let (status, body) = get(format!("{base}/releases/v2.1.0/summary")).await;
        assert_eq!(status, 503, "{body}");
        assert_eq!(body["error"]["code"], "unavailable");
    }
    assert_eq!(get(format!("{base}/releases/v2.1.0/summary")).await.0, 200);
    assert_eq!(get(format!("{base}/releases/v1.9.8/summary")).await.0, 200);

    // Test details answer 200 with JSON cut off halfway, every time.
    let response = reqwest::get(format!("{base}/releases/v1.9.8/test-details"))
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    let text = response.text().await.unwrap();
    assert!(!text.is_empty());
    assert!(serde_json::from_str::<Value>(&text).is_err(), "{text}");

    // Filing is rejected and nothing is written.
    let report = json!({"release_id": "v1.9.8", "severity": "low", "findings": ["all green"]});
    let (status, body) = post(&base, report.clone(), None).await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["error"]["code"], "rejected");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("do not retry")
    );
    assert_eq!(report_files(dir.path()), 0);

    // Clearing the faults restores normal answers; an invalid rule changes nothing.
    service.set_faults(Vec::new()).await.unwrap();
    assert_eq!(post(&base, report.clone(), None).await.0, 201);
    let bad: keel_detective::FaultRule =
        serde_json::from_value(json!({"endpoint": "summary", "status": 200})).unwrap();
    let error = service.set_faults(vec![bad]).await.unwrap_err();
    assert!(error.starts_with("faults[0]: `status` 200"), "{error}");
    assert_eq!(get(format!("{base}/releases/v2.1.0/summary")).await.0, 200);
    service.shutdown().await;
}
