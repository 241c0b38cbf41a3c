//! Tenant isolation, table-driven over `/openapi.json` (a new endpoint is covered or the
//! test fails), revoked keys, and the requests-per-minute limit.

use serde_json::{Value, json};

use crate::common::{Backend, Harness};

async fn tenant_b_gets_404_for_everything_of_tenant_a(backend: Backend) {
    let script = json!({"turns": [
        {"tool_calls": [{"name": "calculator", "arguments": {"expression": "1+1"}}]},
        {"text": "2"}
    ]});
    let h = Harness::start(backend, script, "").await;
    let a = h.key("alpha").await;
    let b = h.key("beta").await;
    let (_, headers, paused) = h
        .send(
            "POST",
            "/v1/chat",
            &a,
            Some(json!({"agent": "bot", "message": "1+1?"})),
        )
        .await;
    assert_eq!(paused["status"], "awaiting_approval", "{paused}");
    let job = headers["x-keel-job-id"].to_str().unwrap().to_string();
    let thread = paused["thread_id"].as_str().unwrap().to_string();
    let run = paused["run_id"].as_str().unwrap().to_string();
    let call = paused["awaiting"]["call_id"].as_str().unwrap().to_string();

    let paths = h.openapi["paths"].as_object().unwrap().clone();
    assert!(paths.len() >= 10, "{:?}", paths.keys());
    let mut checked = 0;
    for (template, item) in &paths {
        for method in item.as_object().unwrap().keys() {
            let method = method.to_uppercase();
            let path = template
                .replace("{thread_id}", &thread)
                .replace("{run_id}", &run)
                .replace("{call_id}", &call)
                .replace("{job_id}", &job);
            let body = match (method.as_str(), template.as_str()) {
                ("POST", "/v1/chat") => {
                    Some(json!({"agent": "bot", "thread_id": thread, "message": "hi"}))
                }
                ("POST", t) if t.ends_with("/approvals/{call_id}") => {
                    Some(json!({"decision": "approve"}))
                }
                ("POST", t) if t.ends_with("/reply") => Some(json!({"answer": "x"})),
                ("POST", t) if t.ends_with("/fork") => Some(json!({})),
                _ => None,
            };
            if template.contains('{') || template == "/v1/chat" {
                let (status, _, answer) = h.send(&method, &path, &b, body).await;
                assert_eq!(
                    status, 404,
                    "{method} {template} with tenant B's key: {answer}"
                );
                assert_eq!(answer["error"]["code"], "not_found");
                if method == "GET" && !template.ends_with("/events") {
                    let (status, _, answer) = h.send(&method, &path, &a, None).await;
                    assert_eq!(
                        status, 200,
                        "{method} {template} with tenant A's key: {answer}"
                    );
                }
            } else {
                match template.as_str() {
                    "/v1/threads" => {
                        let (_, _, list) = h.send("GET", &path, &b, None).await;
                        assert_eq!(list["threads"], json!([]), "B lists none of A's threads");
                        let (_, _, list) = h.send("GET", &path, &a, None).await;
                        assert_eq!(list["threads"][0]["thread_id"], thread.as_str());
                    }
                    "/metrics" => {
                        // Every tenant's figures: no tenant's key reads them.
                        let (status, _, answer) = h.send(&method, &path, &b, None).await;
                        assert_eq!(status, 403, "{answer}");
                        assert_eq!(answer["error"]["code"], "operator_only");
                    }
                    "/healthz" | "/readyz" => {
                        let response = h.request(&method, &path, &b).send().await.unwrap();
                        assert_eq!(response.status().as_u16(), 200, "{template}");
                        let text = response.text().await.unwrap();
                        assert!(!text.contains(&thread) && !text.contains("alpha"), "{text}");
                    }
                    other => panic!(
                        "{method} {other} has no tenancy case: add one to this test (what must \
                         tenant B not see or change of tenant A through it?)"
                    ),
                }
            }
            checked += 1;
        }
    }
    assert!(checked >= 13, "{checked} operations checked");
    // B's attempts changed nothing of A's: the run still waits for A's decision.
    let (_, _, still) = h
        .send("GET", &format!("/v1/threads/{thread}/runs/{run}"), &a, None)
        .await;
    assert_eq!(still["status"], "awaiting_approval", "{still}");
    let events = h.events(&a, &thread).await;
    assert!(
        events
            .iter()
            .all(|e| e["type"] != "approval_granted" && e["type"] != "run_ended")
    );
    h.stop().await;
}

async fn keys_are_required_and_revocation_is_immediate(backend: Backend) {
    let h = Harness::start(backend, json!({"turns": [{"text": "hi"}]}), "").await;
    let created = keel_server::keys::create(h.store.serving.as_ref(), "alpha", Some("ci".into()))
        .await
        .unwrap();
    let (status, _, _) = h.send("GET", "/v1/threads", &created.key, None).await;
    assert_eq!(status, 200);
    let response = h.client.get(h.url("/v1/threads")).send().await.unwrap();
    assert_eq!(response.status().as_u16(), 401);
    let body: Value = serde_json::from_str(&response.text().await.unwrap()).unwrap();
    assert_eq!(body["error"]["code"], "unauthorized");
    let (status, _, _) = h.send("GET", "/v1/threads", "keel_0000_nope", None).await;
    assert_eq!(status, 401);
    assert!(
        keel_server::keys::revoke(h.store.serving.as_ref(), &created.info.key_id)
            .await
            .unwrap()
    );
    let (status, _, body) = h.send("GET", "/v1/threads", &created.key, None).await;
    assert_eq!(status, 401, "{body}");
    let (status, _, _) = h
        .send(
            "POST",
            "/v1/chat",
            &created.key,
            Some(json!({"agent": "bot", "message": "x"})),
        )
        .await;
    assert_eq!(status, 401);
    for public in ["/healthz", "/readyz", "/openapi.json", "/docs"] {
        let response = h.client.get(h.url(public)).send().await.unwrap();
        assert_eq!(response.status().as_u16(), 200, "{public}");
    }
    h.stop().await;
}

crate::on_both_stores!(
    tenant_b_gets_404_for_everything_of_tenant_a,
    keys_are_required_and_revocation_is_immediate,
);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_per_minute_give_429_with_retry_after() {
    let h = Harness::start(
        Backend::Sqlite,
        json!({"turns": [{"text": "hi"}]}),
        "[server.tenants.limited]\nrequests_per_minute = 3\n",
    )
    .await;
    let key = h.key("limited").await;
    let other = h.key("other").await;
    for _ in 0..3 {
        let (status, _, body) = h.send("GET", "/v1/threads", &key, None).await;
        assert_eq!(status, 200, "{body}");
    }
    // The bucket refills one request every 20 s: within 20 quick requests one is refused.
    let mut refused = None;
    for _ in 0..20 {
        let (status, headers, body) = h.send("GET", "/v1/threads", &key, None).await;
        if status == 429 {
            refused = Some((headers, body));
            break;
        }
    }
    let (headers, body) = refused.expect("no 429 within the limit");
    assert_eq!(body["error"]["code"], "rate_limited");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("requests_per_minute")
    );
    assert!(
        headers["retry-after"]
            .to_str()
            .unwrap()
            .parse::<u64>()
            .unwrap()
            >= 1
    );
    let (status, _, _) = h.send("GET", "/v1/threads", &other, None).await;
    assert_eq!(status, 200, "another tenant is not limited");
    h.stop().await;
}
