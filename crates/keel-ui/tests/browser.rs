//! The UI in a real browser: headless Chromium over WebDriver (keel-testkit's `browser`).
//! Every wait is a condition polled against a generous deadline; screenshots of each page
//! land in `target/ui-screenshots/` (referenced from docs/ui.md).

use std::path::PathBuf;
use std::time::Duration;

use base64::Engine as _;
use keel_testkit::browser::Browser;
use serde_json::{Value, json};

use crate::common::{Fixture, get};

/// How long any one condition may take to hold (a loaded 2-core machine; normally
/// well under a second).
const DEADLINE: Duration = Duration::from_secs(30);

/// Polls `script` (a function body returning a value; falsy = not yet) until it returns
/// something truthy; script errors (e.g. while a page is navigating) count as "not yet".
async fn wait_for(browser: &Browser, what: &str, script: &str) -> Value {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let last = match browser.execute(script, vec![]).await {
            Ok(value) if truthy(&value) => return value,
            Ok(value) => value,
            Err(error) => json!(error.to_string()),
        };
        if tokio::time::Instant::now() > deadline {
            let page = browser
                .execute(
                    "return location.href + '\\n' + document.body.innerText.slice(0, 3000);",
                    vec![],
                )
                .await;
            panic!("timed out after {DEADLINE:?} waiting for {what}; last: {last}; page: {page:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn truthy(value: &Value) -> bool {
    !matches!(value, Value::Null | Value::Bool(false)) && value != &json!(0) && value != &json!("")
}

fn screenshot_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target"));
    target.join("ui-screenshots")
}

async fn screenshot(browser: &Browser, name: &str) {
    let png = browser.screenshot_base64().await.unwrap();
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(png.as_bytes())
        .unwrap();
    let dir = screenshot_dir();
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(format!("{name}.png")), bytes).unwrap();
}

/// No console errors and nothing caught by the page's `window.onerror` collector.
async fn assert_no_errors(browser: &Browser, page: &str) {
    let console = browser.console_errors().await.unwrap();
    assert!(console.is_empty(), "{page}: console errors: {console:?}");
    let caught = browser
        .execute("return window.__keelErrors || null;", vec![])
        .await
        .unwrap();
    assert_eq!(caught, json!([]), "{page}: errors caught by the page");
}

async fn open(browser: &Browser, url: &str, ready: &str) {
    browser.open(url).await.unwrap();
    wait_for(browser, &format!("{url} to load"), ready).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ui_in_headless_chromium() {
    let f = Fixture::new(true).await;
    let live = f.threads.live.clone().unwrap();
    let browser = Browser::launch().await.unwrap();
    browser.set_window_size(1360, 900).await.unwrap();

    // The runs page: every run, then filtered by end state through the form.
    open(
        &browser,
        &f.url("/runs"),
        "return document.querySelectorAll('#runs-body tr').length === 5;",
    )
    .await;
    let states = browser
        .execute(
            "return Array.from(document.querySelectorAll('#runs-body tr')).map(function (r) { return r.dataset.status; }).sort();",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(
        states,
        json!(["awaiting_approval", "done", "done", "failed", "running"])
    );
    screenshot(&browser, "runs").await;
    assert_no_errors(&browser, "runs").await;
    browser
        .execute(
            "document.getElementById('filter-state').value = 'failed'; document.getElementById('apply-filters').click(); return true;",
            vec![],
        )
        .await
        .unwrap();
    let failed = wait_for(
        &browser,
        "the state filter",
        "if (location.search.indexOf('state=failed') < 0) return null;
         var rows = Array.from(document.querySelectorAll('#runs-body tr'));
         return rows.length === 1 ? rows[0].dataset.thread : null;",
    )
    .await;
    assert_eq!(failed, json!(f.threads.failed));
    assert_no_errors(&browser, "runs filtered").await;

    // Sorting by a column heading: the whole list by tokens, most first, filters kept.
    open(
        &browser,
        &f.url("/runs"),
        "return document.querySelectorAll('#runs-body tr').length === 5;",
    )
    .await;
    browser
        .execute(
            "document.querySelector('a[data-sort=\"tokens\"]').click(); return true;",
            vec![],
        )
        .await
        .unwrap();
    let tokens = wait_for(
        &browser,
        "the tokens heading",
        "if (location.search.indexOf('sort=tokens') < 0) return null;
         var rows = Array.from(document.querySelectorAll('#runs-body tr'));
         return rows.length === 5 ? rows.map(function (r) { return Number(r.children[8].textContent); }) : null;",
    )
    .await;
    let tokens: Vec<u64> = serde_json::from_value(tokens).unwrap();
    let mut sorted = tokens.clone();
    sorted.sort_by(|a, b| b.cmp(a));
    assert_eq!(tokens, sorted, "rows by tokens, most first");
    assert_no_errors(&browser, "runs sorted").await;

    // A finished run: expand its tool call and see the arguments.
    open(
        &browser,
        &f.url(&format!("/runs/{}", f.threads.done)),
        "return document.getElementById('waterfall') !== null;",
    )
    .await;
    let kinds = browser
        .execute(
            "return Array.from(document.querySelectorAll('details.span')).map(function (s) { return s.dataset.kind; });",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(kinds, json!(["agent", "chat", "tool", "chat"]), "{kinds}");
    browser
        .execute(
            "document.querySelector('details.span[data-kind=tool] > summary').click(); return true;",
            vec![],
        )
        .await
        .unwrap();
    let arguments = wait_for(
        &browser,
        "the tool call's arguments",
        "var a = document.querySelector('details.span[data-kind=tool][open] .tool-arguments');
         return a ? a.textContent : null;",
    )
    .await;
    assert!(
        arguments
            .as_str()
            .unwrap()
            .contains("\"expression\": \"6*7\""),
        "{arguments}"
    );
    let result = browser
        .execute("return document.querySelector('details.span[data-kind=tool] .tool-result-data').textContent;", vec![])
        .await
        .unwrap();
    assert!(result.as_str().unwrap().contains("42"), "{result}");
    screenshot(&browser, "run").await;
    assert_no_errors(&browser, "run").await;

    // `<script>` in a tool result and a user message: shown as text, never run.
    open(
        &browser,
        &f.url(&format!("/runs/{}", f.threads.xss)),
        "return document.getElementById('waterfall') !== null;",
    )
    .await;
    browser
        .execute("document.querySelector('details.span[data-kind=tool] > summary').click(); return true;", vec![])
        .await
        .unwrap();
    let shown = wait_for(
        &browser,
        "the ping_pong result",
        "var d = document.querySelector('details.span[data-kind=tool] .tool-result-data');
         return d ? d.textContent : null;",
    )
    .await;
    assert!(
        shown
            .as_str()
            .unwrap()
            .contains("<script>window.__xss = 1</script>"),
        "{shown}"
    );
    let injected = browser
        .execute(
            "return {xss: window.__xss === undefined ? null : window.__xss,
                     scripts: document.querySelectorAll('main script, main img').length};",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(injected, json!({"xss": null, "scripts": 0}));
    assert_no_errors(&browser, "xss run").await;

    // A live run: its next spans appear without a reload once the gate opens.
    open(
        &browser,
        &f.url(&format!("/runs/{live}")),
        "return document.querySelector('#live[data-following=yes]') !== null;",
    )
    .await;
    let before = browser
        .execute(
            "window.__sameDocument = true;
             return {chats: document.querySelectorAll('details.span[data-kind=chat]').length,
                     openTool: document.querySelectorAll('details.span[data-kind=tool][data-open-span=true]').length,
                     state: document.getElementById('run-state').textContent};",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(
        before,
        json!({"chats": 1, "openTool": 1, "state": "running"})
    );
    screenshot(&browser, "run-live").await;
    f.gate.add_permits(1);
    let after = wait_for(
        &browser,
        "the live run's new spans",
        "var chats = document.querySelectorAll('details.span[data-kind=chat]').length;
         var state = document.getElementById('run-state').textContent;
         return chats === 2 && state === 'done' ? {chats: chats, state: state, same: window.__sameDocument === true} : null;",
    )
    .await;
    assert_eq!(after, json!({"chats": 2, "state": "done", "same": true}));
    assert_no_errors(&browser, "live run").await;

    // A paused run: approve it and watch it finish.
    open(
        &browser,
        &f.url(&format!("/runs/{}", f.threads.paused)),
        "return document.querySelector('.approval button.approve') !== null;",
    )
    .await;
    let call = browser
        .execute(
            "return document.querySelector('.approval').dataset.callId;",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(call, json!(f.threads.paused_call));
    screenshot(&browser, "run-paused").await;
    browser
        .execute(
            "document.querySelector('.approval button.approve').click(); return true;",
            vec![],
        )
        .await
        .unwrap();
    wait_for(
        &browser,
        "the approved run to finish",
        "var s = document.getElementById('run-state');
         return s && s.textContent === 'done' && document.querySelector('.approval') === null;",
    )
    .await;
    let approval = browser
        .execute(
            "return document.querySelectorAll('details.span[data-kind=approval]').length;",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(approval, json!(1));
    assert_no_errors(&browser, "approved run").await;

    // The dashboard: the survival curve's points are `keel stats`' figures.
    open(
        &browser,
        &f.url("/dashboard"),
        "return document.getElementById('survival-chart') !== null;",
    )
    .await;
    let points = browser
        .execute(
            "return Array.from(document.querySelectorAll('#survival-chart circle.point')).map(function (c) {
               return [Number(c.dataset.toolCalls), c.dataset.rate, Number(c.dataset.alive)]; });",
            vec![],
        )
        .await
        .unwrap();
    let events = f.all_events().await;
    let report =
        keel_telemetry::compute_metrics(&events, &keel_telemetry::MetricsOptions::default());
    let expected: Vec<Value> = report
        .survival
        .iter()
        .map(|p| json!([p.tool_calls, format!("{:.6}", p.rate), p.alive]))
        .collect();
    assert_eq!(points, json!(expected));
    let labels = browser
        .execute(
            "return Array.from(document.querySelectorAll('#survival-chart text.point-label')).map(function (t) { return t.textContent; });",
            vec![],
        )
        .await
        .unwrap();
    let summary = keel_telemetry::render_summary(&report);
    for label in labels.as_array().unwrap() {
        assert!(
            summary.contains(label.as_str().unwrap()),
            "{label} not in {summary}"
        );
    }
    screenshot(&browser, "dashboard").await;
    assert_no_errors(&browser, "dashboard").await;

    // Bad input, last (Chromium logs a failed page load as a console error).
    browser.open(&f.url("/runs/thr_unknown")).await.unwrap();
    let message = wait_for(&browser, "the 404 page", "var m = document.getElementById('error-message'); return m ? [document.title, m.textContent] : null;").await;
    assert_eq!(
        message,
        json!(["Not found — keel", "there is no run thr_unknown"])
    );
    screenshot(&browser, "not-found").await;
    browser.open(&f.url("/runs?from=yesterday")).await.unwrap();
    let message = wait_for(
        &browser,
        "the 400 page",
        "var m = document.getElementById('error-message'); return m ? m.textContent : null;",
    )
    .await;
    assert!(
        message.as_str().unwrap().starts_with("invalid `from`"),
        "{message}"
    );
    let (status, _) = get(&f.url("/runs?from=yesterday")).await;
    assert_eq!(status, 400);
    browser.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eval_pages_and_the_reply_form_in_headless_chromium() {
    let f = crate::evals::EvalFixture::new().await;
    let browser = Browser::launch().await.unwrap();
    browser.set_window_size(1360, 900).await.unwrap();

    // The list: both saved runs, newest first, with the trend chart.
    open(
        &browser,
        &f.url("/evals"),
        "return document.querySelectorAll('#evals-body tr').length === 2;",
    )
    .await;
    let listed = browser
        .execute(
            "return {runs: Array.from(document.querySelectorAll('#evals-body tr')).map(function (r) { return r.dataset.run; }),
                     points: document.querySelectorAll('#evals-trend circle.point').length,
                     nav: document.querySelector('#nav-evals.current') !== null};",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(
        listed,
        json!({"runs": [f.current.to_string(), f.baseline.to_string()], "points": 2, "nav": true})
    );
    screenshot(&browser, "evals").await;
    assert_no_errors(&browser, "evals").await;

    // One run's grid: open it from the list; a failed cell says why and links to the
    // trial's run page.
    browser
        .execute(
            &format!(
                "document.querySelector('#evals-body tr[data-run=\"{}\"] a').click(); return true;",
                f.current
            ),
            vec![],
        )
        .await
        .unwrap();
    wait_for(
        &browser,
        "the eval run's grid",
        "return document.querySelectorAll('#eval-grid tr.scenario').length === 2;",
    )
    .await;
    let cell = browser
        .execute(
            "var c = document.querySelector('#eval-grid tr[data-scenario=mul] td.trial[data-trial=\"1\"]');
             return {status: c.dataset.status, title: c.title, href: c.querySelector('a').getAttribute('href')};",
            vec![],
        )
        .await
        .unwrap();
    let thread = &f.current_report.scenarios[0].trials[0].thread_id;
    assert_eq!(cell["status"], json!("failed"));
    assert_eq!(cell["href"], json!(format!("/runs/{thread}")));
    assert!(
        cell["title"].as_str().unwrap().contains("\"forty-two\""),
        "{cell}"
    );
    browser
        .execute(
            "document.getElementById('compare-box').scrollIntoView(); return true;",
            vec![],
        )
        .await
        .unwrap();
    screenshot(&browser, "eval-run").await;
    assert_no_errors(&browser, "eval run").await;

    // The comparison with the baseline the run was compared with.
    browser
        .execute(
            "document.getElementById('recorded-comparison').click(); return true;",
            vec![],
        )
        .await
        .unwrap();
    let compared = wait_for(
        &browser,
        "the comparison",
        "var v = document.getElementById('verdict');
         if (!v) return null;
         return {regression: v.dataset.regression,
                 mul: document.querySelector('#compare-grid tr[data-scenario=mul]').dataset.change,
                 half: document.querySelector('#compare-grid tr[data-scenario=half]').dataset.change,
                 bars: document.querySelectorAll('#compare-chart g.change').length};",
    )
    .await;
    let expected = keel_eval::compare(&f.current_report, &f.baseline_report, 0.05);
    assert_eq!(
        compared,
        json!({"regression": "true", "mul": "regressed", "half": "improved",
               "bars": expected.regressions.len() + expected.improvements.len()})
    );
    screenshot(&browser, "eval-compare").await;
    assert_no_errors(&browser, "eval comparison").await;

    // A trial's run page: its model calls are marked at their first token.
    open(
        &browser,
        &f.url(&format!("/runs/{thread}")),
        "return document.getElementById('waterfall') !== null;",
    )
    .await;
    let marks = browser
        .execute(
            "return document.querySelectorAll('details.span[data-kind=chat] .track .ttft').length;",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(marks, json!(2));
    assert_no_errors(&browser, "eval trial run").await;

    // A question answered with the form: the thread's next run starts and finishes live.
    open(
        &browser,
        &f.url(&format!("/runs/{}", f.asked)),
        "return document.getElementById('reply-form') !== null;",
    )
    .await;
    let question = browser
        .execute(
            "return document.getElementById('question-text').textContent;",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(question, json!(crate::evals::QUESTION));
    screenshot(&browser, "run-question").await;
    browser
        .execute(
            "document.getElementById('reply-answer').value = 'Paris';
             document.getElementById('reply-send').click(); return true;",
            vec![],
        )
        .await
        .unwrap();
    wait_for(
        &browser,
        "the answered run to finish",
        "var s = document.getElementById('run-state');
         return s && s.textContent === 'done' && document.getElementById('question') === null;",
    )
    .await;
    screenshot(&browser, "run-answered").await;
    assert_no_errors(&browser, "answered run").await;
    browser.close().await;
}

/// The page a hostile site serves: it tries to read the runs list from the `keel ui` on
/// `target` (a cross-origin fetch) and to approve the paused call there (a form posted
/// into a hidden frame), and writes what happened into `window.__probe`.
fn attacker_page(target: &str, paused: &str, call_id: &str) -> String {
    format!(
        r#"<!doctype html><html><body>
<iframe name="sink" id="sink"></iframe>
<form id="forged" method="post" target="sink" action="{target}/runs/{paused}/approve">
  <input type="hidden" name="call_id" value="{call_id}">
</form>
<script>
window.__probe = {{}};
fetch("{target}/runs").then(r => r.text())
  .then(t => {{ window.__probe.read = t; }})
  .catch(e => {{ window.__probe.read_error = String(e); }});
document.getElementById("sink").addEventListener("load", () => {{ window.__probe.posted = true; }});
document.getElementById("forged").submit();
</script></body></html>"#
    )
}

/// DNS rebinding and cross-site forms against `keel ui` in headless Chromium. Chromium
/// resolves `attacker.test` to 127.0.0.1 (`--host-resolver-rules`): a page loaded from
/// `http://attacker.test:<ui port>/` is exactly what a rebound page is — same origin as
/// far as the browser knows — and the UI answers it `421` with none of its data. A page
/// on another origin cannot read the runs list (no CORS) and its form post to approve
/// the paused call is refused (cross-site, and without the anti-forgery token): the call
/// is still waiting afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebound_or_cross_site_page_cannot_read_or_approve_in_headless_chromium() {
    let f = Fixture::new(false).await;
    let port = f.base.rsplit(':').next().unwrap().to_string();
    let paused = f.threads.paused.clone();
    let call_id = f.threads.paused_call.clone();

    // The hostile site, on its own loopback port.
    let page = attacker_page(&f.base, &paused, &call_id);
    let site = axum::Router::new().route(
        "/",
        axum::routing::get(move || {
            let page = page.clone();
            async move { axum::response::Html(page) }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let site_port = listener.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(listener, site).await });

    let browser = Browser::launch_with_args(&[
        "--host-resolver-rules=MAP attacker.test 127.0.0.1".to_string()
    ])
    .await
    .unwrap();

    // Rebinding: the attacker's name now points at the UI.
    browser
        .open(&format!("http://attacker.test:{port}/runs"))
        .await
        .unwrap();
    let text = wait_for(
        &browser,
        "the rebound page to load",
        "return document.body && document.body.innerText;",
    )
    .await;
    let text = text.as_str().unwrap().to_string();
    assert!(text.contains("misdirected_host"), "{text}");
    assert!(!text.contains(&paused), "{text}");
    let status = browser
        .execute(
            "return fetch('/runs').then(r => r.status + ' ' + r.headers.get('content-type'));",
            vec![],
        )
        .await
        .unwrap();
    assert!(status.as_str().unwrap().starts_with("421"), "{status}");

    // Another origin: cannot read, cannot approve.
    browser
        .open(&format!("http://attacker.test:{site_port}/"))
        .await
        .unwrap();
    let probe = wait_for(
        &browser,
        "the forged post to be answered and the read to settle",
        "const p = window.__probe; return p && p.posted && (p.read !== undefined || p.read_error) ? p : null;",
    )
    .await;
    assert!(
        probe.get("read").is_none(),
        "the page read the runs list: {probe}"
    );
    browser.close().await;

    // The form post was answered before the frame loaded: had it been accepted, the
    // decision would be in the log by now.
    let events = f.store.load(&paused).await.unwrap();
    assert!(
        !events.iter().any(|e| matches!(
            e.kind,
            keel_core::EventKind::ApprovalGranted { .. }
                | keel_core::EventKind::ApprovalDenied { .. }
        )),
        "a cross-site page approved the call: {events:#?}"
    );
    let (_, page) = get(&f.url(&format!("/runs/{paused}"))).await;
    assert!(page.contains("waits for approval"), "{page}");
}
