//! The web UI under `/ui` of `keel serve`: sessions from API keys (login, logout, revoked
//! keys), a tenant's scope (its runs only, client ids, 404 for another tenant's run on
//! every page and action) and approvals that continue the run on a worker. Plain HTTP
//! over a real socket; cookies are carried by hand so each step is visible.

use std::time::Instant;

use keel_server::keys;
use reqwest::redirect::Policy;
use serde_json::json;

use crate::common::{Backend, DEADLINE, Harness};

/// A client that shows redirects instead of following them.
fn browser() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(Policy::none())
        .build()
        .unwrap()
}

struct Answer {
    status: u16,
    location: String,
    cookies: Vec<String>,
    content_type: String,
    body: String,
}

async fn send(request: reqwest::RequestBuilder) -> Answer {
    let response = tokio::time::timeout(DEADLINE, request.send())
        .await
        .unwrap()
        .unwrap();
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .map(|v| v.to_str().unwrap().to_string())
            .unwrap_or_default()
    };
    let location = header("location");
    let content_type = header("content-type");
    let cookies = response
        .headers()
        .get_all("set-cookie")
        .iter()
        .map(|v| v.to_str().unwrap().to_string())
        .collect();
    let status = response.status().as_u16();
    let body = if content_type.starts_with("text/event-stream") {
        String::new()
    } else {
        response.text().await.unwrap()
    };
    Answer {
        status,
        location,
        cookies,
        content_type,
        body,
    }
}

async fn get(h: &Harness, path: &str, session: Option<&str>) -> Answer {
    let mut request = browser().get(h.url(path));
    if let Some(session) = session {
        request = request.header("cookie", session);
    }
    send(request).await
}

async fn post_form(h: &Harness, path: &str, session: Option<&str>, form: &str) -> Answer {
    let mut request = browser()
        .post(h.url(path))
        .header("content-type", "application/x-www-form-urlencoded")
        .header("origin", h.base.clone())
        .body(form.to_string());
    if let Some(session) = session {
        request = request.header("cookie", session);
    }
    send(request).await
}

/// The anti-forgery token the forms of `page` carry.
fn csrf_of(page: &str) -> String {
    let marker = "name=\"csrf\" value=\"";
    let at = page
        .find(marker)
        .unwrap_or_else(|| panic!("no csrf field: {page}"));
    let rest = &page[at + marker.len()..];
    rest[..rest.find('"').unwrap()].to_string()
}

/// Logs in with `key`; returns the `name=value` of the session cookie.
async fn login(h: &Harness, key: &str) -> String {
    let answer = post_form(
        h,
        "/ui/login",
        None,
        &format!("key={key}&next=%2Fui%2Fruns"),
    )
    .await;
    assert_eq!(answer.status, 303, "{}", answer.body);
    assert_eq!(answer.location, "/ui/runs");
    let cookie = answer
        .cookies
        .iter()
        .find(|c| c.starts_with("keel_session="))
        .unwrap_or_else(|| panic!("no session cookie: {:?}", answer.cookies));
    for attribute in ["HttpOnly", "SameSite=Strict", "Path=/ui"] {
        assert!(cookie.contains(attribute), "{cookie}");
    }
    assert!(!cookie.contains("Secure"), "plain HTTP: {cookie}");
    assert!(!cookie.contains(key), "the key is never in the cookie");
    assert!(!cookie.contains(&keys::digest(key)), "nor its digest");
    cookie.split(';').next().unwrap().to_string()
}

/// A chat of `tenant` that ends or pauses; returns (thread, run, the answer).
async fn chat(h: &Harness, key: &str, message: &str) -> (String, String, serde_json::Value) {
    let (status, _, answer) = h
        .send(
            "POST",
            "/v1/chat",
            key,
            Some(json!({"agent": "bot", "message": message})),
        )
        .await;
    assert_eq!(status, 200, "{answer}");
    (
        answer["thread_id"].as_str().unwrap().to_string(),
        answer["run_id"].as_str().unwrap().to_string(),
        answer,
    )
}

fn assert_login_redirect(answer: &Answer, why: Option<&str>) {
    assert_eq!(answer.status, 303, "{}", answer.body);
    assert!(
        answer.location.starts_with("/ui/login?next="),
        "{}",
        answer.location
    );
    if let Some(why) = why {
        assert!(
            answer.location.ends_with(&format!("why={why}")),
            "{}",
            answer.location
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn login_shows_the_tenants_runs_only() {
    let h = Harness::start(Backend::Sqlite, json!({"turns": [{"text": "hello"}]}), "").await;
    let a = h.key("alpha").await;
    let b = h.key("beta").await;
    let (ta, _, answer) = chat(&h, &a, "alpha's question").await;
    assert_eq!(answer["end_state"], "done", "{answer}");
    let (tb, _, _) = chat(&h, &b, "beta's question").await;

    // Without a session every page and action sends the browser to the login page.
    for path in [
        "/ui",
        "/ui/runs",
        &format!("/ui/runs/{ta}"),
        "/ui/dashboard",
    ] {
        let answer = get(&h, path, None).await;
        assert_login_redirect(&answer, None);
    }
    let answer = get(&h, "/ui/runs?state=done", None).await;
    assert_eq!(
        answer.location,
        "/ui/login?next=%2Fui%2Fruns%3Fstate%3Ddone"
    );
    let answer = post_form(&h, &format!("/ui/runs/{ta}/fork"), None, "at_seq=1").await;
    assert_login_redirect(&answer, None);
    let answer = get(&h, "/ui/runs", Some("keel_session=made-up")).await;
    assert_login_redirect(&answer, Some("expired"));

    let page = get(&h, "/ui/login?next=%2Fui%2Fdashboard", None).await;
    assert_eq!(page.status, 200);
    assert!(page.body.contains("name=\"key\""), "{}", page.body);
    assert!(
        page.body.contains("value=\"/ui/dashboard\""),
        "{}",
        page.body
    );

    let wrong = post_form(&h, "/ui/login", None, "key=keel_000000000000_00").await;
    assert_eq!(wrong.status, 401);
    assert!(wrong.cookies.is_empty());
    assert!(wrong.body.contains("not valid"), "{}", wrong.body);

    // A form from another site cannot log a browser in.
    let forged = send(
        browser()
            .post(h.url("/ui/login"))
            .header("content-type", "application/x-www-form-urlencoded")
            .header("sec-fetch-site", "cross-site")
            .body(format!("key={a}")),
    )
    .await;
    assert_eq!(forged.status, 403);
    assert!(forged.cookies.is_empty());

    let session = login(&h, &a).await;
    let runs = get(&h, "/ui/runs", Some(&session)).await;
    assert_eq!(runs.status, 200, "{}", runs.body);
    assert!(runs.content_type.starts_with("text/html"));
    assert!(
        runs.body.contains(&format!("href=\"/ui/runs/{ta}\"")),
        "{}",
        runs.body
    );
    assert!(!runs.body.contains(&tb), "beta's thread on alpha's page");
    assert!(!runs.body.contains("alpha."), "store ids are not shown");
    let run = get(&h, &format!("/ui/runs/{ta}"), Some(&session)).await;
    assert_eq!(run.status, 200, "{}", run.body);
    assert!(
        run.body.contains(&format!("id=\"thread-id\">{ta}<")),
        "the client id: {}",
        run.body
    );
    assert!(!run.body.contains(&format!("alpha.{ta}")), "{}", run.body);
    let dashboard = get(&h, "/ui/dashboard", Some(&session)).await;
    assert_eq!(dashboard.status, 200, "{}", dashboard.body);
    let css = get(&h, "/ui/assets/ui.css", Some(&session)).await;
    assert_eq!(css.status, 200);

    // Over TLS (a proxy saying so) the cookie is also `Secure`.
    let tls = send(
        browser()
            .post(h.url("/ui/login"))
            .header("content-type", "application/x-www-form-urlencoded")
            .header("x-forwarded-proto", "https")
            .body(format!("key={b}")),
    )
    .await;
    assert_eq!(tls.status, 303);
    assert!(tls.cookies[0].contains("; Secure"), "{:?}", tls.cookies);

    let out = post_form(&h, "/ui/logout", Some(&session), "").await;
    assert_eq!(out.status, 303);
    assert!(out.cookies[0].contains("Max-Age=0"), "{:?}", out.cookies);
    let answer = get(&h, "/ui/runs", Some(&session)).await;
    assert_login_redirect(&answer, Some("expired"));
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_keys_session_is_refused() {
    let h = Harness::start(Backend::Sqlite, json!({"turns": [{"text": "hello"}]}), "").await;
    let created = keys::create(h.store.serving.as_ref(), "alpha", None)
        .await
        .unwrap();
    let session = login(&h, &created.key).await;
    assert_eq!(get(&h, "/ui/runs", Some(&session)).await.status, 200);
    assert!(
        keys::revoke(h.store.serving.as_ref(), &created.info.key_id)
            .await
            .unwrap()
    );
    let answer = get(&h, "/ui/runs", Some(&session)).await;
    assert_login_redirect(&answer, Some("revoked"));
    assert!(
        answer.cookies[0].contains("Max-Age=0"),
        "{:?}",
        answer.cookies
    );
    // The session is gone, and the key cannot open another.
    assert_login_redirect(&get(&h, "/ui/runs", Some(&session)).await, Some("expired"));
    let again = post_form(&h, "/ui/login", None, &format!("key={}", created.key)).await;
    assert_eq!(again.status, 401);
    h.stop().await;
}

/// One tenant logging in again and again ends its own oldest sessions, never another
/// tenant's (before, every session shared one pool of 10,000: a tenant's logins could end
/// everyone else's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_tenants_logins_end_only_its_own_oldest_sessions() {
    let h = Harness::start(Backend::Sqlite, json!({"turns": [{"text": "hello"}]}), "").await;
    let alpha = h.key("alpha").await;
    let beta = h.key("beta").await;
    let beta_session = login(&h, &beta).await;
    let first = login(&h, &alpha).await;
    let cap = keel_server::ui::MAX_SESSIONS_PER_TENANT;
    let mut latest = String::new();
    for _ in 0..cap {
        latest = login(&h, &alpha).await;
    }
    assert_login_redirect(&get(&h, "/ui/runs", Some(&first)).await, Some("expired"));
    assert_eq!(get(&h, "/ui/runs", Some(&latest)).await.status, 200);
    assert_eq!(get(&h, "/ui/runs", Some(&beta_session)).await.status, 200);
    h.stop().await;
}

/// A paused run of tenant alpha: (harness, alpha's key, thread, run, call).
async fn paused_run() -> (Harness, String, String, String, String) {
    let script = json!({"turns": [
        {"tool_calls": [{"name": "calculator", "arguments": {"expression": "6*7"}}]},
        {"text": "42"}
    ]});
    let h = Harness::start(Backend::Sqlite, script, "").await;
    let a = h.key("alpha").await;
    let (thread, run, answer) = chat(&h, &a, "6*7?").await;
    assert_eq!(answer["status"], "awaiting_approval", "{answer}");
    let call = answer["awaiting"]["call_id"].as_str().unwrap().to_string();
    (h, a, thread, run, call)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_tenants_run_is_not_found_on_every_page_and_action() {
    let (h, a, ta, run, call) = paused_run().await;
    let b = h.key("beta").await;
    let alpha = login(&h, &a).await;
    let beta = login(&h, &b).await;

    let page = get(&h, &format!("/ui/runs/{ta}"), Some(&alpha)).await;
    assert_eq!(page.status, 200, "{}", page.body);
    let marker = format!("/ui/runs/{ta}/spans/");
    let start = page.body.find(&marker).expect("a span link") + marker.len();
    let span: String = page.body[start..]
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric())
        .collect();
    let span_path = format!("/ui/runs/{ta}/spans/{span}");
    assert_eq!(get(&h, &span_path, Some(&alpha)).await.status, 200);
    let live = get(&h, &format!("/ui/runs/{ta}/live"), Some(&alpha)).await;
    assert_eq!(live.status, 200);
    assert!(live.content_type.starts_with("text/event-stream"));

    for id in [ta.clone(), format!("alpha.{ta}")] {
        for path in [
            format!("/ui/runs/{id}"),
            format!("/ui/runs/{id}/spans/{span}"),
            format!("/ui/runs/{id}/live"),
            format!("/ui/runs/{id}/live?after=0"),
        ] {
            let answer = get(&h, &path, Some(&beta)).await;
            assert_eq!(answer.status, 404, "GET {path}: {}", answer.body);
            assert!(answer.body.contains("Not found"), "{}", answer.body);
        }
        for (action, form) in [
            ("approve", format!("call_id={call}")),
            ("deny", format!("call_id={call}&reason=no")),
            ("fork", "at_seq=1".to_string()),
        ] {
            let path = format!("/ui/runs/{id}/{action}");
            let answer = post_form(&h, &path, Some(&beta), &form).await;
            assert_eq!(answer.status, 404, "POST {path}: {}", answer.body);
        }
    }
    let runs = get(&h, "/ui/runs", Some(&beta)).await;
    assert!(!runs.body.contains(&ta), "{}", runs.body);

    // Nothing of beta's touched alpha's run: it still waits, and alpha has one thread.
    let (_, _, status) = h
        .send("GET", &format!("/v1/threads/{ta}/runs/{run}"), &a, None)
        .await;
    assert_eq!(status["status"], "awaiting_approval", "{status}");
    let (_, _, threads) = h.send("GET", "/v1/threads", &a, None).await;
    assert_eq!(threads["threads"].as_array().unwrap().len(), 1, "{threads}");
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approving_from_the_ui_finishes_the_run_on_a_worker() {
    let (h, a, ta, run, call) = paused_run().await;
    let session = login(&h, &a).await;
    let page = get(&h, &format!("/ui/runs/{ta}"), Some(&session)).await;
    assert!(
        page.body
            .contains(&format!("action=\"/ui/runs/{ta}/approve\"")),
        "{}",
        page.body
    );

    // keel-ui's refusal of cross-site posts holds under /ui.
    let forged = send(
        browser()
            .post(h.url(&format!("/ui/runs/{ta}/approve")))
            .header("cookie", session.clone())
            .header("content-type", "application/x-www-form-urlencoded")
            .header("sec-fetch-site", "cross-site")
            .body(format!("call_id={call}")),
    )
    .await;
    assert_eq!(forged.status, 403, "{}", forged.body);

    // Each session's forms carry its own anti-forgery token: a post without it, or with
    // another session's, is refused (same origin and a valid cookie notwithstanding).
    let token = csrf_of(&page.body);
    let other_session = login(&h, &a).await;
    let other_page = get(&h, &format!("/ui/runs/{ta}"), Some(&other_session)).await;
    let other_token = csrf_of(&other_page.body);
    assert_ne!(token, other_token);
    for form in [
        format!("call_id={call}"),
        format!("call_id={call}&csrf={other_token}"),
    ] {
        let refused = post_form(&h, &format!("/ui/runs/{ta}/approve"), Some(&session), &form).await;
        assert_eq!(refused.status, 403, "{}", refused.body);
        assert!(
            refused.body.contains("anti-forgery token"),
            "{}",
            refused.body
        );
    }

    let approved = post_form(
        &h,
        &format!("/ui/runs/{ta}/approve"),
        Some(&session),
        &format!("call_id={call}&csrf={token}"),
    )
    .await;
    assert_eq!(approved.status, 303, "{}", approved.body);
    assert_eq!(approved.location, format!("/ui/runs/{ta}"));

    let ended = h.wait_run(&a, &ta, &run).await;
    assert_eq!(ended["end_state"], "done", "{ended}");
    assert_eq!(ended["final_text"], "42", "{ended}");
    // Recorded as the session's key, from the UI.
    let events = h.events(&a, &ta).await;
    let granted = events
        .iter()
        .find(|e| e["type"] == "approval_granted")
        .unwrap();
    assert!(
        granted["by"].as_str().unwrap().starts_with("ui:"),
        "{granted}"
    );
    // The chat's job and the continuation's: the run went on on a worker.
    h.wait_jobs_done(2).await;

    let start = Instant::now();
    loop {
        let page = get(&h, &format!("/ui/runs/{ta}"), Some(&session)).await;
        if page.body.contains("on a worker") {
            assert!(page.body.contains("done"), "{}", page.body);
            break;
        }
        assert!(start.elapsed() < DEADLINE, "{}", page.body);
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answering_a_question_from_the_ui_starts_the_next_run_on_a_worker() {
    let script = json!({"turns": [
        {"tool_calls": [{"name": "ask_user", "arguments": {"question": "Which city?"}}]},
        {"text": "Booked in Paris."}
    ]});
    let h = Harness::start(Backend::Sqlite, script, "").await;
    let a = h.key("alpha").await;
    let (thread, run, _) = chat(&h, &a, "book a table").await;
    // The chat may answer as soon as the question is asked; the run then ends
    // clarify_needed (a worker has no one to ask).
    let ended = h.wait_run(&a, &thread, &run).await;
    assert_eq!(ended["end_state"], "clarify_needed", "{ended}");
    let session = login(&h, &a).await;
    let page = get(&h, &format!("/ui/runs/{thread}"), Some(&session)).await;
    assert!(page.body.contains("Which city?"), "{}", page.body);
    assert!(
        page.body
            .contains(&format!("action=\"/ui/runs/{thread}/reply\"")),
        "{}",
        page.body
    );
    // Eval results belong to no tenant: no eval pages under /ui.
    assert!(!page.body.contains("nav-evals"), "{}", page.body);
    assert_eq!(get(&h, "/ui/evals", Some(&session)).await.status, 404);

    let sent = post_form(
        &h,
        &format!("/ui/runs/{thread}/reply"),
        Some(&session),
        &format!("answer=Paris&csrf={}", csrf_of(&page.body)),
    )
    .await;
    assert_eq!(sent.status, 303, "{}", sent.body);
    assert_eq!(sent.location, format!("/ui/runs/{thread}"));
    // The chat's job and the next run's: the answer started a run on a worker.
    h.wait_jobs_done(2).await;
    let events = h.events(&a, &thread).await;
    let ends: Vec<String> = events
        .iter()
        .filter(|e| e.to_string().contains("\"run_ended\""))
        .map(|e| e.to_string())
        .collect();
    assert_eq!(ends.len(), 2, "{events:#?}");
    assert!(
        ends[1].contains("\"done\"") && ends[1].contains("Booked in Paris."),
        "{}",
        ends[1]
    );
    assert!(
        events
            .iter()
            .any(|e| e.to_string().contains("\"user_message\"") && e.to_string().contains("Paris")),
        "{events:#?}"
    );
    h.stop().await;
}

/// Sign-ins and every `/ui` page count against the tenant's requests-per-minute allowance,
/// as `/v1` requests do (before, neither was limited: a browser tab, or a script posting
/// the login form, got around `[server.limits]`). Another tenant is not affected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sign_ins_and_pages_count_against_the_tenants_rate_limit() {
    let h = Harness::start(
        Backend::Sqlite,
        json!({"turns": [{"text": "hello"}]}),
        // Two a minute: one comes back every 30 s, far longer than this test's requests.
        "[server.limits]\nrequests_per_minute = 2\n",
    )
    .await;
    let alpha = h.key("alpha").await;
    let beta = h.key("beta").await;
    // One sign-in and one page use alpha's two requests.
    let session = login(&h, &alpha).await;
    assert_eq!(get(&h, "/ui/runs", Some(&session)).await.status, 200);
    for limited in [
        get(&h, "/ui/runs", Some(&session)).await,
        post_form(&h, "/ui/login", None, &format!("key={alpha}")).await,
    ] {
        assert_eq!(limited.status, 429, "{}", limited.body);
        assert!(
            limited.body.contains("requests per minute"),
            "{}",
            limited.body
        );
    }
    let retry_after = browser()
        .get(h.url("/ui/runs"))
        .header("cookie", &session)
        .send()
        .await
        .unwrap();
    assert_eq!(retry_after.status(), 429);
    let seconds: u64 = retry_after.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=61).contains(&seconds), "{seconds}");
    // The `/v1` allowance is the same one.
    let (status, _, _) = h.send("GET", "/v1/threads", &alpha, None).await;
    assert_eq!(status, 429);
    // Beta's allowance is its own.
    let beta_session = login(&h, &beta).await;
    assert_eq!(get(&h, "/ui/runs", Some(&beta_session)).await.status, 200);
    h.stop().await;
}

/// A run page's live stream ends when its session's key is revoked (before, it went on
/// reading the log every 400 ms for as long as the run waited), and it takes one of the
/// key's open-stream slots while open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_page_ends_when_its_key_is_revoked_and_counts_as_a_stream() {
    let script = json!({"turns": [
        {"tool_calls": [{"name": "calculator", "arguments": {"expression": "6*7"}}]},
        {"text": "42"}
    ]});
    let h = Harness::start(
        Backend::Sqlite,
        script,
        "[server.limits]\nopen_streams_per_key = 1\n",
    )
    .await;
    let created = keys::create(h.store.serving.as_ref(), "alpha", None)
        .await
        .unwrap();
    let (thread, _, answer) = chat(&h, &created.key, "6*7?").await;
    assert_eq!(answer["status"], "awaiting_approval", "{answer}");
    let session = login(&h, &created.key).await;
    let live_path = format!("/ui/runs/{thread}/live");
    let mut live = tokio::time::timeout(
        DEADLINE,
        browser()
            .get(h.url(&live_path))
            .header("cookie", &session)
            .send(),
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(live.status(), 200);
    // The key's one stream slot is taken: a second live page is refused.
    let second = get(&h, &live_path, Some(&session)).await;
    assert_eq!(second.status, 429, "{}", second.body);
    assert!(
        second.body.contains("open_streams_per_key"),
        "{}",
        second.body
    );
    assert!(
        keys::revoke(h.store.serving.as_ref(), &created.info.key_id)
            .await
            .unwrap()
    );
    let mut seen = String::new();
    let ended = tokio::time::timeout(DEADLINE, async {
        while let Some(chunk) = live.chunk().await.unwrap() {
            seen.push_str(&String::from_utf8_lossy(&chunk));
            if seen.contains("event: done") {
                return true;
            }
        }
        false
    })
    .await
    .expect("the revoked key's live page went on");
    assert!(ended, "{seen}");
    assert!(seen.contains("signed out"), "{seen}");
    h.stop().await;
}
