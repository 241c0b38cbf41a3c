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
        ("/runs?sort=tokens&after=0.5~thr_x", "`after`"),
        ("/runs?skip=25", "`skip`"),
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
    // A search finds runs by what the page shows, never by a redacted secret.
    let (status, found) = get(&f.url("/runs?q=echo+this")).await;
    assert_eq!(status, 200);
    assert!(found.contains(&format!("data-thread=\"{id}\"")), "{found}");
    let (status, by_secret) = get(&f.url("/runs?q=abcdefghijklmnop")).await;
    assert_eq!(status, 200);
    assert!(
        !by_secret.contains(&format!("data-thread=\"{id}\"")),
        "{by_secret}"
    );
    assert!(by_secret.contains("id=\"hidden-notice\""), "{by_secret}");
    assert!(!by_secret.contains("abcdefghijklmnopq"), "{by_secret}");
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
    // Every form carries the UI's anti-forgery token (the paused run's page shows forms).
    let (_, paused_page) = get(&f.url(&format!("/runs/{}", f.threads.paused))).await;
    let token = crate::common::csrf_of(&paused_page);
    let post = |path: String, body: &'static str, origin: Option<String>| {
        let mut request = client
            .post(f.url(&path))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(format!("{body}&csrf={token}"));
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
    // Same origin but without the token (or with another one): refused as well.
    for body in [
        "at_seq=2".to_string(),
        format!("at_seq=2&csrf={}", "0".repeat(64)),
    ] {
        let forged = client
            .post(f.url(&format!("/runs/{done}/fork")))
            .header("content-type", "application/x-www-form-urlencoded")
            .header("origin", f.base.clone())
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(forged.status().as_u16(), 403);
        let text = forged.text().await.unwrap();
        assert!(text.contains("anti-forgery token"), "{text}");
    }
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

/// `keel ui` takes the thread's lease before it records a decision (issue 44): while
/// another driver (here a `keel resume` of another process, holding the same lease) drives
/// the paused thread, approving is a 409 naming that driver and writes nothing; once it is
/// gone the approval goes through and the run continues under the UI's own lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approving_a_thread_another_driver_holds_is_refused_with_the_holder_named() {
    let f = Fixture::new(false).await;
    let paused = f.threads.paused.clone();
    let held = f
        .queue
        .claim(
            &paused,
            "keel resume (pid 4242 started 1 on elsewhere, since 2026-12-03T00:00:00Z)",
            std::time::Duration::from_secs(60),
            None,
        )
        .await
        .unwrap();
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let (_, page) = get(&f.url(&format!("/runs/{paused}"))).await;
    let token = crate::common::csrf_of(&page);
    let approve = || {
        client
            .post(f.url(&format!("/runs/{paused}/approve")))
            .header("content-type", "application/x-www-form-urlencoded")
            .header("origin", f.base.clone())
            .body(format!("call_id={}&csrf={token}", f.threads.paused_call))
            .send()
    };
    let before = f.store.load(&paused).await.unwrap().len();
    let refused = approve().await.unwrap();
    assert_eq!(refused.status().as_u16(), 409);
    let text = refused.text().await.unwrap();
    assert!(
        text.contains("keel resume (pid 4242") && text.contains("since 2026-12-03"),
        "the refusal names the holder: {text}"
    );
    assert_eq!(
        f.store.load(&paused).await.unwrap().len(),
        before,
        "a refused approval wrote to the thread"
    );
    f.queue.complete(&held).await.unwrap();
    let approved = approve().await.unwrap();
    assert_eq!(approved.status().as_u16(), 303);
    let store = f.store.clone();
    crate::common::wait_until(std::time::Duration::from_secs(60), || {
        let store = store.clone();
        let id = paused.clone();
        async move {
            store
                .load(&id)
                .await
                .unwrap()
                .iter()
                .any(|e| matches!(e.kind, keel_core::EventKind::RunEnded { .. }))
        }
    })
    .await;
    // The UI's lease ends with the run it continued: the thread is free for the next driver.
    let queue = f.queue.clone();
    crate::common::wait_until(std::time::Duration::from_secs(60), || {
        let queue = queue.clone();
        let id = f.threads.paused.clone();
        async move {
            queue
                .claim(&id, "keel resume", std::time::Duration::from_secs(60), None)
                .await
                .is_ok()
        }
    })
    .await;
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
    for line in summary.lines().filter(|l| !l.is_empty()) {
        assert!(html.contains(line), "{line} not in the stats text: {html}");
    }
}

/// A seeded thread of [`sorting_filtering_and_paging_follow_the_whole_store`]: what it
/// holds, computed here independently of the store.
#[derive(Debug, Clone)]
struct Seeded {
    id: String,
    agent: &'static str,
    state: &'static str,
    started_ms: i64,
    duration_ms: i64,
    turns: u32,
    tool_calls: u32,
    tokens: u64,
    /// Hundredths of a dollar; `None`: no cost reported.
    cents: Option<u32>,
    text: String,
}

fn seeded_thread(i: u32) -> (Seeded, Vec<keel_core::Event>) {
    use keel_core::{EndState, EventKind, Message};
    use keel_store::conformance::fixtures::{event, run_ended};
    let id = format!("thr_seed_{i:02}");
    let agent = ["alpha", "beta", "gamma"][(i % 3) as usize];
    let model = ["openai:gpt-4o", "mock:small"][(i % 2) as usize];
    let started_ms = i64::from(i) * 1_000;
    let step = i64::from((i * 7) % 13 + 1) * 10;
    let text = format!(
        "question number {i}{}",
        if i % 4 == 1 {
            " about flaky TIMEOUTS"
        } else {
            ""
        }
    );
    let calls = (i * 5) % 4 + 1;
    let tools = (i * 3) % 5;
    let cents = (!i.is_multiple_of(4)).then_some((i * 13) % 17);
    let mut kinds = vec![
        EventKind::RunStarted {
            agent: agent.into(),
            model: model.into(),
            goal: text.clone(),
            constraints: Vec::new(),
            budget: keel_core::Budget::unlimited(),
            definition: None,
            parent_span_id: None,
        },
        EventKind::UserMessage {
            message: Message::user(text.clone()),
        },
    ];
    let mut tokens = 0u64;
    for turn in 1..=calls {
        let (input, output) = (u64::from((i * 37 + turn * 11) % 101), u64::from(turn));
        tokens += input + output;
        // The whole cost on the first answer (sums of floats stay exact).
        let cost = if turn == 1 {
            cents.map(|c| f64::from(c) / 100.0)
        } else {
            None
        };
        kinds.push(
            serde_json::from_value(serde_json::json!({
                "type": "model_requested", "turn": turn, "model": model, "message_count": turn,
                "tool_count": 1, "estimated_input_tokens": input
            }))
            .unwrap(),
        );
        kinds.push(
            serde_json::from_value(serde_json::json!({
                "type": "model_responded", "turn": turn,
                "message": Message::assistant(format!("answer {turn}")),
                "usage": {"input_tokens": input, "output_tokens": output},
                "latency_ms": 5, "stop_reason": "end_turn", "cost_usd": cost
            }))
            .unwrap(),
        );
    }
    for call in 0..tools {
        let ok = !(i + call).is_multiple_of(4);
        let result = if ok {
            serde_json::json!({"status": "ok", "data": "fine", "schema_validated": false, "truncated": false})
        } else {
            serde_json::json!({"status": "error", "code": "timeout", "message": "slow"})
        };
        let mut outcome = serde_json::json!({
            "tool": "probe", "call_id": format!("c{call}"), "thread_id": id,
            "run_id": format!("run-{id}"), "attempts": 1, "latency_ms": 3
        });
        outcome
            .as_object_mut()
            .unwrap()
            .extend(result.as_object().unwrap().clone());
        kinds.push(
            serde_json::from_value(serde_json::json!({
                "type": "tool_call_finished",
                "result": {"call_id": format!("c{call}"), "name": "probe", "outcome": outcome, "content": "probe said fine"}
            }))
            .unwrap(),
        );
    }
    let state = if i.is_multiple_of(7) {
        "running"
    } else if i.is_multiple_of(5) {
        kinds.push(run_ended(EndState::Failed));
        "failed"
    } else {
        kinds.push(run_ended(EndState::Done));
        "done"
    };
    let count = kinds.len() as i64;
    let events = kinds
        .into_iter()
        .enumerate()
        .map(|(n, kind)| {
            let mut e = event(&id, n as u64, 0, kind);
            e.ts = keel_store::conformance::fixtures::base_time()
                + chrono::Duration::milliseconds(started_ms + n as i64 * step);
            e
        })
        .collect();
    let seeded = Seeded {
        id,
        agent,
        state,
        started_ms,
        duration_ms: (count - 1) * step,
        turns: calls,
        tool_calls: tools,
        tokens,
        cents,
        text,
    };
    (seeded, events)
}

/// Row ids of a runs page, in order.
fn row_ids(html: &str) -> Vec<String> {
    html.split("<tr data-thread=\"")
        .skip(1)
        .filter_map(|rest| rest.split('"').next())
        .map(str::to_string)
        .collect()
}

/// Every row of `url`'s listing, through its "Next page" links.
async fn walk_pages(base: &str, url: &str) -> Vec<String> {
    let mut seen = Vec::new();
    let mut url = format!("{base}{url}");
    for _ in 0..100 {
        let (status, html) = get(&url).await;
        assert_eq!(status, 200, "{url}: {html}");
        seen.extend(row_ids(&html));
        match html.split("id=\"next-page\" href=\"").nth(1) {
            Some(rest) => {
                let href = rest.split('"').next().unwrap().replace("&amp;", "&");
                url = format!("{base}{href}");
            }
            None => return seen,
        }
    }
    panic!("more than 100 pages from {url}");
}

/// Sorting is global: every order walked page by page (and filtered) equals a full sort
/// of the seeded threads, computed here from what was seeded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sorting_filtering_and_paging_follow_the_whole_store() {
    use std::sync::Arc;
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn keel_core::EventStore> = Arc::new(
        keel_store::SqliteStore::open(dir.path().join("keel.db"))
            .await
            .unwrap(),
    );
    let mut seeded = Vec::new();
    for i in 0..45 {
        let (thread, events) = seeded_thread(i);
        store.append(&thread.id, 0, &events).await.unwrap();
        seeded.push(thread);
    }
    let ui = keel_ui::Ui::new(keel_ui::RunSource::new(
        store.clone(),
        keel_telemetry::Redactor::default(),
    ));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(keel_ui::serve(
        listener,
        keel_ui::router(ui),
        std::future::pending(),
    ));

    // (sort key, its value in a seeded thread as a comparable integer)
    type Key = fn(&Seeded) -> i64;
    let keys: [(&str, Key); 7] = [
        ("", |s| s.started_ms + s.duration_ms),
        ("started", |s| s.started_ms),
        ("duration", |s| s.duration_ms),
        ("turns", |s| i64::from(s.turns)),
        ("tool_calls", |s| i64::from(s.tool_calls)),
        ("tokens", |s| s.tokens as i64),
        ("cost", |s| i64::from(s.cents.unwrap_or(0))),
    ];
    let expected = |rows: &[&Seeded], key: Key, ascending: bool| -> Vec<String> {
        let mut rows = rows.to_vec();
        rows.sort_by(|a, b| {
            let order = key(a).cmp(&key(b));
            let order = if ascending { order } else { order.reverse() };
            order.then_with(|| a.id.cmp(&b.id))
        });
        rows.iter().map(|s| s.id.clone()).collect()
    };
    let all: Vec<&Seeded> = seeded.iter().collect();
    for (sort, key) in keys {
        for ascending in [false, true] {
            let mut url = format!("/runs?limit=7&sort={sort}");
            if ascending {
                url.push_str("&dir=asc");
            }
            let walked = walk_pages(&base, &url).await;
            assert_eq!(walked, expected(&all, key, ascending), "{url}");
        }
    }

    // Filtered, sorted and paged together.
    let failed: Vec<&Seeded> = seeded.iter().filter(|s| s.state == "failed").collect();
    assert!(failed.len() > 3);
    let walked = walk_pages(&base, "/runs?state=failed&sort=tokens&limit=2").await;
    assert_eq!(walked, expected(&failed, |s| s.tokens as i64, false));
    let beta_timeouts: Vec<&Seeded> = seeded
        .iter()
        .filter(|s| s.agent == "beta" && s.text.contains("TIMEOUTS"))
        .collect();
    assert!(!beta_timeouts.is_empty());
    let walked = walk_pages(
        &base,
        "/runs?agent=beta&q=flaky+timeouts&sort=cost&dir=asc&limit=1",
    )
    .await;
    assert_eq!(
        walked,
        expected(&beta_timeouts, |s| i64::from(s.cents.unwrap_or(0)), true)
    );
    let running: Vec<&Seeded> = seeded.iter().filter(|s| s.state == "running").collect();
    let walked = walk_pages(&base, "/runs?state=running&sort=duration&dir=asc&limit=2").await;
    assert_eq!(walked, expected(&running, |s| s.duration_ms, true));

    // The column headings sort the whole filtered list from its first page: their links
    // keep the filters and drop the position.
    let (_, page) = get(&format!(
        "{base}/runs?state=failed&agent=beta&sort=tokens&limit=2"
    ))
    .await;
    let next = page
        .split("id=\"next-page\" href=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap()
        .replace("&amp;", "&");
    let (_, second) = get(&format!("{base}{next}")).await;
    let heading = second
        .split("data-sort=\"turns\"")
        .next()
        .and_then(|before| before.rsplit("href=\"").next())
        .and_then(|rest| rest.split('"').next())
        .unwrap()
        .replace("&amp;", "&");
    assert_eq!(heading, "/runs?state=failed&agent=beta&sort=turns&limit=2");
    let tokens_heading = second
        .split("data-sort=\"tokens\"")
        .next()
        .and_then(|before| before.rsplit("href=\"").next())
        .and_then(|rest| rest.split('"').next())
        .unwrap()
        .replace("&amp;", "&");
    assert_eq!(
        tokens_heading, "/runs?state=failed&agent=beta&sort=tokens&dir=asc&limit=2",
        "clicking the current order's heading reverses it"
    );
    assert!(second.contains("id=\"first-page\""), "{second}");

    // A position that belongs to another order, or is not one: a 400 page naming it.
    for bad in [
        "/runs?sort=tokens&after=1.5~thr_seed_01",
        "/runs?after=yesterday",
        "/runs?sort=cost&after=NaN~x",
        "/runs?q=two%0Alines",
    ] {
        let (status, body) = get(&format!("{base}{bad}")).await;
        assert_eq!(status, 400, "{bad}: {body}");
        assert!(body.contains("invalid `"), "{bad}: {body}");
    }
}
