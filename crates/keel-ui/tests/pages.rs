//! The pages over HTTP: statuses, escaping, redaction, filters, pagination, forks and the
//! dashboard's figures (the browser tests are in `browser.rs`).

use crate::common::{Fixture, SCRIPT_PAYLOAD, SECRET, get};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_runs_are_404_pages_and_malformed_filters_400_pages_naming_the_field() {
    let f = Fixture::new(false).await;
    let (status, body) = get(&f.url("/runs/thr_nope")).await;
    assert_eq!(status, 404, "{body}");
    assert!(body.contains("there is no run thr_nope"), "{body}");
    assert!(body.contains("<!DOCTYPE html>"), "{body}");
    let (status, _) = get(&f.url(&format!("/runs/{}/spans/nope", f.threads.done))).await;
    assert_eq!(status, 404);
    let (status, _) = get(&f.url("/nowhere")).await;
    assert_eq!(status, 404);
    let (status, _) = get(&f.url("/runs/thr_nope/live")).await;
    assert_eq!(status, 404);

    for (path, field) in [
        ("/runs?state=bogus", "`state`"),
        ("/runs?from=yesterday", "`from`"),
        ("/runs?to=soon", "`to`"),
        ("/runs?limit=0", "`limit`"),
        ("/runs?sort=colour", "`sort`"),
        ("/runs?colour=red", "`colour`"),
        ("/dashboard?from=later", "`from`"),
        ("/dashboard?agent=a&x=1", "`x`"),
    ] {
        let (status, body) = get(&f.url(path)).await;
        assert_eq!(status, 400, "{path}: {body}");
        assert!(body.contains(&format!("invalid {field}")), "{path}: {body}");
    }
    let (status, body) = get(&f.url(&format!("/runs/{}/live?after=x", f.threads.done))).await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("invalid `after`"), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn model_and_tool_text_is_escaped_and_secrets_are_redacted() {
    let f = Fixture::new(false).await;
    let id = &f.threads.xss;
    let (status, runs) = get(&f.url("/runs")).await;
    assert_eq!(status, 200);
    let (status, page) = get(&f.url(&format!("/runs/{id}"))).await;
    assert_eq!(status, 200);
    // The tool span's details: find its id in the waterfall, then fetch them.
    let span = page
        .split("data-span-id=\"")
        .skip(1)
        .filter_map(|rest| rest.split('"').next())
        .find(|span| {
            page.contains(&format!(
                "id=\"span-{span}\" data-span-id=\"{span}\" data-kind=\"tool\""
            ))
        })
        .unwrap_or_else(|| panic!("no tool span in {page}"))
        .to_string();
    let (status, detail) = get(&f.url(&format!("/runs/{id}/spans/{span}"))).await;
    assert_eq!(status, 200, "{detail}");
    for html in [&runs, &page, &detail] {
        assert!(!html.contains("<script>window"), "unescaped: {html}");
        assert!(!html.contains("<img src=x"), "unescaped: {html}");
        assert!(!html.contains("abcdefghijklmnop"), "secret shown: {html}");
    }
    assert!(
        detail.contains("&lt;script&gt;window.__xss = 1&lt;/script&gt;"),
        "{detail}"
    );
    assert!(runs.contains("&lt;script&gt;"), "{runs}");
    // What the store holds is unchanged: the payload and the key are really there.
    let raw = serde_json::to_string(&f.store.load(id).await.unwrap()).unwrap();
    assert!(raw.contains(SECRET));
    assert!(raw.contains(&serde_json::to_string(SCRIPT_PAYLOAD).unwrap()[1..20]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filters_and_pages_walk_every_run_once() {
    let f = Fixture::new(false).await;
    let ids = |html: &str| -> Vec<String> {
        html.split("<tr data-thread=\"")
            .skip(1)
            .filter_map(|rest| rest.split('"').next())
            .map(str::to_string)
            .collect()
    };
    let (_, all) = get(&f.url("/runs")).await;
    let all = ids(&all);
    assert_eq!(all.len(), 4, "{all:?}");

    // Two per page, through the "next page" links.
    let mut seen = Vec::new();
    let mut url = f.url("/runs?limit=2");
    for _ in 0..10 {
        let (status, html) = get(&url).await;
        assert_eq!(status, 200, "{html}");
        let page = ids(&html);
        assert!(page.len() <= 2, "{page:?}");
        seen.extend(page);
        match html.split("id=\"next-page\" href=\"").nth(1) {
            Some(rest) => {
                let href = rest.split('"').next().unwrap().replace("&amp;", "&");
                url = f.url(&href);
            }
            None => break,
        }
    }
    assert_eq!(
        seen, all,
        "pages must follow the listing without gaps or repeats"
    );

    let (_, failed) = get(&f.url("/runs?state=failed")).await;
    assert_eq!(ids(&failed), vec![f.threads.failed.clone()]);
    let (_, waiting) = get(&f.url("/runs?state=awaiting_approval")).await;
    assert_eq!(ids(&waiting), vec![f.threads.paused.clone()]);
    let (_, text) = get(&f.url("/runs?q=echo+THIS")).await;
    assert_eq!(ids(&text), vec![f.threads.xss.clone()]);
    let model = f
        .store
        .load(&f.threads.done)
        .await
        .unwrap()
        .iter()
        .find_map(|e| match &e.kind {
            keel_core::EventKind::RunStarted { model, .. } => Some(model.clone()),
            _ => None,
        })
        .unwrap();
    let upper: String = form_urlencoded::byte_serialize(model.to_uppercase().as_bytes()).collect();
    let (_, same_model) = get(&f.url(&format!("/runs?model={upper}"))).await;
    assert_eq!(ids(&same_model), all);
    let (_, none) = get(&f.url("/runs?model=no-such-model")).await;
    assert_eq!(ids(&none), Vec::<String>::new());
    let (_, future) = get(&f.url("/runs?to=2000-01-01T00:00:00Z")).await;
    assert!(ids(&future).is_empty());
    // Sorting by tokens, fewest first: the failed run (no answer) leads.
    let (_, sorted) = get(&f.url("/runs?sort=tokens&dir=asc")).await;
    assert_eq!(ids(&sorted).first(), Some(&f.threads.failed));
    // The live refresh's fragment is the table body alone.
    let (status, rows) = get(&f.url("/runs?fragment=rows&state=failed")).await;
    assert_eq!(status, 200);
    assert!(rows.starts_with("<tr "), "{rows}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forks_copy_the_log_and_cross_site_posts_are_refused() {
    let f = Fixture::new(false).await;
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let post = |path: String, body: &'static str, origin: Option<String>| {
        let mut request = client
            .post(f.url(&path))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(body);
        if let Some(origin) = origin {
            request = request.header("origin", origin);
        }
        request.send()
    };
    let done = f.threads.done.clone();
    let refused = post(
        format!("/runs/{done}/fork"),
        "at_seq=2",
        Some("http://evil.example".into()),
    )
    .await
    .unwrap();
    assert_eq!(refused.status().as_u16(), 403);
    let bad = post(format!("/runs/{done}/fork"), "at_seq=x", None)
        .await
        .unwrap();
    assert_eq!(bad.status().as_u16(), 400);
    let forked = post(
        format!("/runs/{done}/fork"),
        "at_seq=2",
        Some(f.base.clone()),
    )
    .await
    .unwrap();
    assert_eq!(forked.status().as_u16(), 303);
    let location = forked.headers()["location"].to_str().unwrap().to_string();
    let target = location.strip_prefix("/runs/").unwrap();
    assert_eq!(f.store.load(target).await.unwrap().len(), 3);
    let (status, page) = get(&f.url(&location)).await;
    assert_eq!(status, 200);
    assert!(
        page.contains(&format!("forked from {done} at event 2")),
        "{page}"
    );

    // Approving the paused call records the decision and the run continues to its end.
    let paused = f.threads.paused.clone();
    let body: &'static str = format!("call_id={}", f.threads.paused_call).leak();
    let approved = post(
        format!("/runs/{paused}/approve"),
        body,
        Some(f.base.clone()),
    )
    .await
    .unwrap();
    assert_eq!(approved.status().as_u16(), 303);
    let store = f.store.clone();
    let id = paused.clone();
    let ended = crate::common::wait_until(std::time::Duration::from_secs(30), || {
        let store = store.clone();
        let id = id.clone();
        async move {
            store
                .load(&id)
                .await
                .unwrap()
                .iter()
                .any(|e| matches!(e.kind, keel_core::EventKind::RunEnded { .. }))
        }
    });
    if tokio::time::timeout(std::time::Duration::from_secs(31), ended)
        .await
        .is_err()
    {
        let (_, page) = get(&f.url(&format!("/runs/{paused}"))).await;
        panic!("the approved run did not end: {page}");
    }
    let (_, page) = get(&f.url(&format!("/runs/{paused}"))).await;
    assert!(page.contains("approved call"), "{page}");

    // Approving a call that is not waiting is a conflict page, not a 500.
    let conflict = post(format!("/runs/{done}/approve"), "call_id=nope", None)
        .await
        .unwrap();
    assert_eq!(conflict.status().as_u16(), 409);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_shows_the_figures_of_keel_stats() {
    let f = Fixture::new(false).await;
    let events = f.all_events().await;
    let report =
        keel_telemetry::compute_metrics(&events, &keel_telemetry::MetricsOptions::default());
    let (status, html) = get(&f.url("/dashboard")).await;
    assert_eq!(status, 200, "{html}");
    for point in &report.survival {
        let expected = format!(
            "data-tool-calls=\"{}\" data-rate=\"{:.6}\" data-alive=\"{}\" data-reached=\"{}\"",
            point.tool_calls, point.rate, point.alive, point.reached
        );
        assert!(html.contains(&expected), "{expected} not in {html}");
    }
    assert!(html.contains(&format!("<div class=\"value\">{}</div>", report.runs)));
    let summary = keel_telemetry::render_summary(&report);
    let first = summary.lines().next().unwrap();
    assert!(html.contains(first), "{first} not in the stats text");
}
