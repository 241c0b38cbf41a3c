//! Exactly once, proven by an adversary (issue 44): a real `keel run` process drives an
//! agent file's HTTP tools against a real shop service while a hosted-like mock provider
//! (`keel mock-llm`, ids never repeated: a re-asked model gives every call a new id) answers
//! by conversation turn. The run is crashed at **every** durable point and after **every**
//! request the service receives — not at sampled moments:
//!
//! - after the Nth append to the store, N = 1, 2, … until a run ends without crashing
//!   (`KEEL_CRASH_AFTER_APPENDS`, a test seam that aborts the process once the append is
//!   durable and before anything acts on it);
//! - after the service has recorded its Kth request (the service SIGKILLs the process
//!   before it answers), K = 1, 2, … likewise;
//! - and each crash of the first process is followed by a resume that is itself crashed at
//!   every one of its own append points before a last resume finishes it.
//!
//! Then `keel resume THREAD` (no flags) finishes the run. The checker counts effects at
//! the service, per logical call: the idempotent order (`Idempotency-Key` honoured) exactly
//! once, the mutating charge (no key) at most once — and when its outcome is unknown the
//! model is told `may_have_run` — every run `done`, no event lost (each log read before a
//! resume is a prefix of the final log), no panic. The tools: a read-only stock check, the
//! idempotent order, a mutating charge, and a read-only quote that fails so the policy
//! falls back to a mutating hold (a fallback that must not run twice).
//!
//! On SQLite and on Postgres (DATABASE_URL; a throw-away schema). The report (crashes per
//! kill point kind, effects) is printed on stderr; docs/reliability.md has the figures.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

use std::collections::BTreeMap;
use std::io::Read;
use std::net::TcpListener;
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::common::MockLlm;

/// The conversation, one answer per turn: read stock and place the order (parallel),
/// then charge the card and ask for a quote (whose failure falls back to a hold), then
/// the final answer. Ids are left to the mock: fresh for every request.
const MOCK_SCRIPT: &str = r#"{"turn_by": "conversation", "when_exhausted": "error", "turns": [
  {"tool_calls": [
     {"name": "check_stock", "arguments": {"item": "book"}},
     {"name": "place_order", "arguments": {"item": "book", "quantity": 1}}]},
  {"tool_calls": [
     {"name": "charge_card", "arguments": {"amount_cents": 1250}},
     {"name": "get_quote", "arguments": {"item": "book"}}]},
  {"text": "Ordered, charged and held."}
]}"#;

/// The agent file: four HTTP tools against `SHOP_URL`, and the fallback of `get_quote`.
const AGENT_FILE: &str = r#"
name = "shop"
env = ["SHOP_URL"]
description = "Orders books."
instructions = "Check stock, place the order, charge the card, get a quote, then answer."

[[tools]]
name = "check_stock"
description = "Stock of an item."
usage = "check_stock — pass the item."
method = "GET"
url = "${SHOP_URL}/stock/{item}"
input_schema = { type = "object", properties = { item = { type = "string" } }, required = ["item"] }
effect = "read_only"
retry = { max_attempts = 1 }

[[tools]]
name = "place_order"
description = "Places an order."
usage = "place_order — pass the item and quantity."
method = "POST"
url = "${SHOP_URL}/orders"
input_schema = { type = "object", properties = { item = { type = "string" }, quantity = { type = "integer" } }, required = ["item", "quantity"] }
effect = "idempotent"
honours_idempotency_key = true
retry = { max_attempts = 1 }

[[tools]]
name = "charge_card"
description = "Charges the card."
usage = "charge_card — pass the amount in cents."
method = "POST"
url = "${SHOP_URL}/charges"
input_schema = { type = "object", properties = { amount_cents = { type = "integer" } }, required = ["amount_cents"] }
effect = "mutating"
retry = { max_attempts = 1 }

[[tools]]
name = "get_quote"
description = "Quotes an item (the quote service is down)."
usage = "get_quote — pass the item."
method = "GET"
url = "${SHOP_URL}/quotes/{item}"
input_schema = { type = "object", properties = { item = { type = "string" } }, required = ["item"] }
effect = "read_only"
retry = { max_attempts = 1 }

[[tools]]
name = "hold_item"
description = "Holds an item for the customer."
usage = "hold_item — pass the item."
method = "POST"
url = "${SHOP_URL}/holds"
input_schema = { type = "object", properties = { item = { type = "string" } }, required = ["item"] }
effect = "mutating"
retry = { max_attempts = 1 }
"#;

const KEEL_TOML: &str = r#"
[policies.fallbacks]
get_quote = "hold_item"
"#;

/// A hang detector for one child process, generous for a loaded machine.
const PROCESS_DEADLINE: Duration = Duration::from_secs(120);

/// What the shop recorded, per conversation (thread).
#[derive(Default)]
struct Shop {
    /// Every request, in order: (route, thread, idempotency key).
    requests: Vec<(String, String, Option<String>)>,
    /// Orders kept, by idempotency key (a repeated key is answered, not kept again).
    orders: BTreeMap<String, String>,
    /// Charges made: (thread, key as sent).
    charges: Vec<(String, Option<String>)>,
    /// Holds made: (thread, key as sent).
    holds: Vec<(String, Option<String>)>,
    /// Kill the process after this many requests of the current run (counted from arming).
    kill_after: Option<usize>,
    /// Kill the process after its first request to this route (the effect is recorded).
    kill_on_route: Option<&'static str>,
    counted: usize,
    /// The process to kill, and whether it was killed.
    pid: Option<u32>,
    killed: bool,
}

/// The shop service on a loopback port, on a thread of its own.
struct ShopServer {
    url: String,
    state: Arc<Mutex<Shop>>,
}

impl ShopServer {
    fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let state = Arc::new(Mutex::new(Shop::default()));
        let shared = state.clone();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                let app = axum::Router::new()
                    .route("/stock/{item}", axum::routing::get(stock))
                    .route("/quotes/{item}", axum::routing::get(quote))
                    .route("/orders", axum::routing::post(order))
                    .route("/charges", axum::routing::post(charge))
                    .route("/holds", axum::routing::post(hold))
                    .with_state(shared);
                axum::serve(listener, app).await.unwrap();
            });
        });
        Self { url, state }
    }

    /// Arms the kill after `requests` requests (None: disarmed) for the process `pid`.
    fn arm(&self, requests: Option<usize>, pid: Option<u32>) {
        let mut shop = self.state.lock().unwrap();
        shop.kill_after = requests;
        shop.kill_on_route = None;
        shop.counted = 0;
        shop.pid = pid;
        shop.killed = false;
    }

    /// Arms the kill for the next process's first request to `route`.
    fn arm_route(&self, route: &'static str) {
        self.state.lock().unwrap().kill_on_route = Some(route);
    }

    fn set_pid(&self, pid: u32) {
        self.state.lock().unwrap().pid = Some(pid);
    }

    fn killed(&self) -> bool {
        self.state.lock().unwrap().killed
    }
}

type Shared = Arc<Mutex<Shop>>;

fn header(headers: &axum::http::HeaderMap, name: &str) -> Option<String> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

/// The thread a request came from: the key is `thread:call`, and every tool sends its
/// call's key (read-only ones excepted: they send the thread in `X-Thread` via the body
/// or not at all — the shop counts them without one).
fn thread_of(key: &Option<String>) -> String {
    key.as_deref()
        .and_then(|k| k.split(':').next())
        .unwrap_or("")
        .to_string()
}

/// Records a request; kills the process when the armed count is reached (before the
/// response leaves: the effect happened, the process never learns its result).
fn record(state: &Shared, route: &str, key: Option<String>, effect: impl FnOnce(&mut Shop)) {
    let mut shop = state.lock().unwrap();
    shop.requests
        .push((route.to_string(), thread_of(&key), key));
    effect(&mut shop);
    shop.counted += 1;
    let on_route = shop.kill_on_route.is_some_and(|r| r == route);
    if (shop.kill_after == Some(shop.counted) || on_route) && !shop.killed {
        let pid = shop.pid.expect("armed without a process");
        let status = Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status()
            .unwrap();
        assert!(status.success(), "kill -KILL {pid} failed");
        shop.killed = true;
    }
}

async fn stock(
    axum::extract::State(state): axum::extract::State<Shared>,
    axum::extract::Path(item): axum::extract::Path<String>,
) -> axum::Json<Value> {
    record(&state, "stock", None, |_| {});
    axum::Json(json!({"item": item, "in_stock": 3}))
}

async fn quote(
    axum::extract::State(state): axum::extract::State<Shared>,
    axum::extract::Path(_item): axum::extract::Path<String>,
) -> (axum::http::StatusCode, axum::Json<Value>) {
    record(&state, "quote", None, |_| {});
    (
        axum::http::StatusCode::SERVICE_UNAVAILABLE,
        axum::Json(json!({"error": "the quote service is down"})),
    )
}

async fn order(
    axum::extract::State(state): axum::extract::State<Shared>,
    headers: axum::http::HeaderMap,
) -> axum::Json<Value> {
    let key = header(&headers, "idempotency-key");
    let mut id = String::new();
    record(&state, "order", key.clone(), |shop| {
        let key = key.clone().unwrap_or_default();
        let next = format!("ord_{}", shop.orders.len() + 1);
        id = shop.orders.entry(key).or_insert(next).clone();
    });
    axum::Json(json!({"order_id": id}))
}

async fn charge(
    axum::extract::State(state): axum::extract::State<Shared>,
    headers: axum::http::HeaderMap,
) -> axum::Json<Value> {
    let key = header(&headers, "idempotency-key");
    record(&state, "charge", key.clone(), |shop| {
        shop.charges.push((thread_of(&key), key.clone()));
    });
    axum::Json(json!({"charged": true}))
}

async fn hold(
    axum::extract::State(state): axum::extract::State<Shared>,
    headers: axum::http::HeaderMap,
) -> axum::Json<Value> {
    let key = header(&headers, "idempotency-key");
    record(&state, "hold", key.clone(), |shop| {
        shop.holds.push((thread_of(&key), key.clone()));
    });
    axum::Json(json!({"held": true}))
}

/// One store under test and the files every process shares.
struct Harness<'a> {
    label: &'static str,
    root: &'a Path,
    store_url: String,
    mock: MockLlm,
    shop: ShopServer,
    report: Report,
}

#[derive(Default, Debug)]
struct Report {
    conversations: usize,
    crashes_after_append: usize,
    crashes_after_request: usize,
    crashes_in_resume: usize,
    resumes: usize,
    order_executions: usize,
    charges_unknown: usize,
}

/// How a process ended.
enum Ended {
    Finished(Value),
    Crashed,
}

impl Harness<'_> {
    fn keel(&self, args: &[&str]) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_keel"));
        command
            .args(args)
            .current_dir(self.root)
            .env("KEEL_TEST_MODE", "1")
            .env("OPENAI_API_KEY", "test-key")
            .env("SHOP_URL", &self.shop.url)
            .env("KEEL_STORE", &self.store_url)
            .env_remove("KEEL_CONFIG")
            .env_remove(keel_app::crash_point::CRASH_AFTER_APPENDS_ENV)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        command
    }

    /// Runs a child to its end; `kill_after_requests` arms the shop for it.
    fn drive(
        &self,
        command: Command,
        crash_after_appends: Option<usize>,
        kill_after_requests: Option<usize>,
    ) -> Ended {
        self.drive_killed_on(command, crash_after_appends, kill_after_requests, None)
    }

    /// [`Harness::drive`], also killing the process after its first request to `route`.
    fn drive_killed_on(
        &self,
        mut command: Command,
        crash_after_appends: Option<usize>,
        kill_after_requests: Option<usize>,
        route: Option<&'static str>,
    ) -> Ended {
        if let Some(n) = crash_after_appends {
            command.env(
                keel_app::crash_point::CRASH_AFTER_APPENDS_ENV,
                n.to_string(),
            );
        }
        self.shop.arm(kill_after_requests, None);
        if let Some(route) = route {
            self.shop.arm_route(route);
        }
        let mut child = command.spawn().unwrap();
        self.shop.set_pid(child.id());
        let mut stdout = child.stdout.take().unwrap();
        let mut stderr = child.stderr.take().unwrap();
        let out = std::thread::spawn(move || {
            let mut buf = String::new();
            let _ = stdout.read_to_string(&mut buf);
            buf
        });
        let err = std::thread::spawn(move || {
            let mut buf = String::new();
            let _ = stderr.read_to_string(&mut buf);
            buf
        });
        let started = Instant::now();
        let status: ExitStatus = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            assert!(
                started.elapsed() < PROCESS_DEADLINE,
                "[{}] {command:?} hung",
                self.label
            );
            std::thread::sleep(Duration::from_millis(5));
        };
        self.shop.arm(None, None);
        let (stdout, stderr) = (out.join().unwrap(), err.join().unwrap());
        assert!(
            !stderr.contains("panicked"),
            "[{}] a panic: {stderr}",
            self.label
        );
        if status.success() {
            let value: Value = serde_json::from_str(stdout.trim())
                .unwrap_or_else(|e| panic!("[{}] not JSON ({e}): {stdout}", self.label));
            return Ended::Finished(value);
        }
        use std::os::unix::process::ExitStatusExt;
        assert!(
            status.signal().is_some(),
            "[{}] {command:?} failed without crashing: {status:?}\n{stdout}\n{stderr}",
            self.label
        );
        Ended::Crashed
    }

    fn run(&self, thread: &str) -> Command {
        self.keel(&[
            "run",
            "--model",
            "openai:gpt-4.1",
            "--base-url",
            &self.mock.base_url,
            "--agent",
            "agent.toml",
            "--thread",
            thread,
            "--output",
            "json",
            "order a book",
        ])
    }

    fn resume(&self, thread: &str) -> Command {
        self.keel(&["resume", thread, "--output", "json"])
    }

    fn events(&self, thread: &str) -> Vec<Value> {
        let out = self
            .keel(&["threads", "show", thread, "--output", "json"])
            .output()
            .unwrap();
        if !out.status.success() {
            return Vec::new();
        }
        let shown: Value = serde_json::from_slice(&out.stdout).unwrap();
        shown["events"].as_array().cloned().unwrap_or_default()
    }

    /// Resumes until the run is finished, crashing the first resume after its
    /// `crash_resume_at`th append when given. Each log read before a resume must be a
    /// prefix of the log after it.
    fn finish(&mut self, thread: &str, crash_resume_at: Option<usize>) -> Value {
        let mut crash = crash_resume_at;
        for _ in 0..4 {
            let before = self.events(thread);
            let ended = if before.is_empty() {
                // Nothing was durable: the conversation starts again, as a user would.
                self.drive(self.run(thread), crash.take(), None)
            } else {
                self.report.resumes += 1;
                self.drive(self.resume(thread), crash.take(), None)
            };
            let after = self.events(thread);
            assert_prefix(self.label, thread, &before, &after);
            match ended {
                Ended::Finished(outcome) => return outcome,
                Ended::Crashed => self.report.crashes_in_resume += 1,
            }
        }
        panic!("[{}] {thread}: not finished after four resumes", self.label);
    }

    /// One conversation crashed at one kill point, then finished and checked. Returns
    /// whether the kill point was reached (false: the run ended first).
    fn conversation(&mut self, kill: KillPoint, crash_resume_at: Option<usize>) -> bool {
        self.report.conversations += 1;
        let thread = format!("thr_{}_{}", self.label, self.report.conversations);
        let (appends, requests) = match kill {
            KillPoint::AfterAppend(n) => (Some(n), None),
            KillPoint::AfterRequest(k) => (None, Some(k)),
        };
        let ended = self.drive(self.run(&thread), appends, requests);
        let crashed = matches!(ended, Ended::Crashed);
        let outcome = match ended {
            Ended::Finished(outcome) => {
                assert!(!self.shop.killed(), "[{}] killed, yet finished", self.label);
                outcome
            }
            Ended::Crashed => {
                match kill {
                    KillPoint::AfterAppend(_) => self.report.crashes_after_append += 1,
                    KillPoint::AfterRequest(_) => self.report.crashes_after_request += 1,
                }
                self.finish(&thread, crash_resume_at)
            }
        };
        assert_eq!(
            outcome["end_state"], "done",
            "[{}] {thread} ({kill:?}): {outcome}",
            self.label
        );
        self.check_effects(&thread, &kill);
        crashed
    }

    /// The operator changes the agent between the crash and the resume: the charge, killed
    /// right after the shop recorded it, is declared `idempotent` (with a key) in the agent
    /// file before `keel resume`. The effect its durable start recorded governs: the charge
    /// is not run again, the model is told it may have run, and a notice names the flag
    /// that would force it. The agent file is put back afterwards.
    fn relaxed_between_crash_and_resume(&mut self) {
        self.report.conversations += 1;
        let thread = format!("thr_{}_relaxed_{}", self.label, self.report.conversations);
        let ended = self.drive_killed_on(self.run(&thread), None, None, Some("charge"));
        assert!(
            matches!(ended, Ended::Crashed),
            "[{}] {thread}: not killed at the charge",
            self.label
        );
        self.report.crashes_after_request += 1;
        let relaxed = AGENT_FILE.replace(
            "url = \"${SHOP_URL}/charges\"\ninput_schema = { type = \"object\", properties = { amount_cents = { type = \"integer\" } }, required = [\"amount_cents\"] }\neffect = \"mutating\"",
            "url = \"${SHOP_URL}/charges\"\ninput_schema = { type = \"object\", properties = { amount_cents = { type = \"integer\" } }, required = [\"amount_cents\"] }\neffect = \"idempotent\"\nhonours_idempotency_key = true",
        );
        assert_ne!(
            relaxed, AGENT_FILE,
            "the charge's effect was not found to relax"
        );
        std::fs::write(self.root.join("agent.toml"), relaxed).unwrap();
        let outcome = self.finish(&thread, None);
        std::fs::write(self.root.join("agent.toml"), AGENT_FILE).unwrap();
        assert_eq!(
            outcome["end_state"], "done",
            "[{}] {thread}: {outcome}",
            self.label
        );
        let kill = KillPoint::AfterRequest(0);
        self.check_effects(&thread, &kill);
        let shop = self.shop.state.lock().unwrap();
        let charges = shop.charges.iter().filter(|(t, _)| t == &thread).count();
        drop(shop);
        assert_eq!(
            charges, 1,
            "[{}] {thread}: charged {charges} times",
            self.label
        );
        let events = self.events(&thread);
        let told = &results_by_tool(&events)["charge_card"][0];
        assert_eq!(
            (
                &told["details"]["may_have_run"],
                &told["details"]["relaxed_since_start"]
            ),
            (&json!(true), &json!(true)),
            "[{}] {thread}: {told}",
            self.label
        );
        assert!(
            events.iter().any(|e| e["type"] == "notice"
                && e["code"] == "relaxed_call_not_rerun"
                && e["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("--rerun-relaxed-calls"))),
            "[{}] {thread}: no notice names the flag",
            self.label
        );
    }

    /// Counts the conversation's effects at the shop and checks what the model was told.
    fn check_effects(&mut self, thread: &str, kill: &KillPoint) {
        let shop = self.shop.state.lock().unwrap();
        let orders: Vec<&String> = shop
            .orders
            .keys()
            .filter(|key| key.starts_with(&format!("{thread}:")))
            .collect();
        assert_eq!(
            orders.len(),
            1,
            "[{}] {thread} ({kill:?}): the order must take effect exactly once, keys {orders:?}",
            self.label
        );
        self.report.order_executions += shop
            .requests
            .iter()
            .filter(|(route, t, _)| route == "order" && t == thread)
            .count();
        let charges = shop.charges.iter().filter(|(t, _)| t == thread).count();
        let holds = shop.holds.iter().filter(|(t, _)| t == thread).count();
        drop(shop);
        assert!(
            charges <= 1,
            "[{}] {thread} ({kill:?}): charged {charges} times",
            self.label
        );
        assert!(
            holds <= 1,
            "[{}] {thread} ({kill:?}): the fallback held {holds} times",
            self.label
        );
        let events = self.events(thread);
        let results = results_by_tool(&events);
        let charge = results
            .get("charge_card")
            .unwrap_or_else(|| panic!("[{}] {thread}: charge_card never answered", self.label));
        assert_eq!(charge.len(), 1, "[{}] {thread}: {charge:?}", self.label);
        let told_unknown = charge[0]["details"]["may_have_run"] == json!(true);
        if charges == 0 || told_unknown {
            // Never charged, or charged without the process learning it: the model is told
            // the call may have run (a charge that never ran but whose start was durable
            // is "may have run" too — at most once, never blindly repeated).
            if told_unknown {
                self.report.charges_unknown += 1;
            } else {
                panic!(
                    "[{}] {thread} ({kill:?}): no charge at the shop, yet the model was told {}\nlog: {}",
                    self.label,
                    charge[0],
                    serde_json::to_string_pretty(&events).unwrap()
                );
            }
        }
        let quote = &results["get_quote"];
        assert_eq!(quote.len(), 1, "[{}] {thread}: {quote:?}", self.label);
    }
}

#[derive(Debug, Clone, Copy)]
enum KillPoint {
    AfterAppend(usize),
    AfterRequest(usize),
}

/// Each tool's results in the log, by tool name: their outcomes.
fn results_by_tool(events: &[Value]) -> BTreeMap<String, Vec<Value>> {
    let mut by_tool: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    for event in events {
        if event["type"] == "tool_call_finished" {
            let result = &event["result"];
            by_tool
                .entry(result["name"].as_str().unwrap_or("").to_string())
                .or_default()
                .push(result["outcome"].clone());
        }
    }
    by_tool
}

fn assert_prefix(label: &str, thread: &str, before: &[Value], after: &[Value]) {
    assert!(
        after.len() >= before.len(),
        "[{label}] {thread}: the log shrank from {} to {} events",
        before.len(),
        after.len()
    );
    for (old, new) in before.iter().zip(after) {
        assert_eq!(
            (&old["seq"], &old["type"]),
            (&new["seq"], &new["type"]),
            "[{label}] {thread}: an event was lost or rewritten"
        );
    }
    for (i, event) in after.iter().enumerate() {
        assert_eq!(
            event["seq"],
            json!(i),
            "[{label}] {thread}: seq not contiguous"
        );
    }
}

/// How many times every kill point is crashed (`KEEL_EXACTLY_ONCE_ROUNDS`, default 1:
/// about 58 crashes; `./scripts/crash` runs 9 rounds, over 500 per store).
fn rounds() -> usize {
    match std::env::var("KEEL_EXACTLY_ONCE_ROUNDS") {
        Ok(value) => value
            .trim()
            .parse::<usize>()
            .ok()
            .filter(|n| *n > 0)
            .unwrap_or_else(|| {
                panic!("KEEL_EXACTLY_ONCE_ROUNDS={value:?}: expected a positive whole number")
            }),
        Err(_) => 1,
    }
}

/// Every kill point of one conversation: after each append (and, for the first few, each
/// of the resume's appends too), after each request the shop receives.
fn harness(label: &'static str, root: &Path, store_url: String) {
    std::fs::write(root.join("mock.json"), MOCK_SCRIPT).unwrap();
    std::fs::write(root.join("agent.toml"), AGENT_FILE).unwrap();
    std::fs::write(root.join("keel.toml"), KEEL_TOML).unwrap();
    let mock = MockLlm::start(root, "mock.json");
    let mut h = Harness {
        label,
        root,
        store_url,
        mock,
        shop: ShopServer::start(),
        report: Report::default(),
    };
    let started = Instant::now();
    let (mut appends, mut requests) = (0, 0);
    for _ in 0..rounds() {
        // After every append of the first process; for each, also every append of its
        // resume.
        let mut n = 1;
        while h.conversation(KillPoint::AfterAppend(n), None) {
            for m in 1..=3 {
                h.conversation(KillPoint::AfterAppend(n), Some(m));
            }
            n += 1;
            assert!(n < 50, "[{label}] the run never finished");
        }
        appends = n - 1;
        let mut k = 1;
        while h.conversation(KillPoint::AfterRequest(k), None) {
            for m in 1..=3 {
                h.conversation(KillPoint::AfterRequest(k), Some(m));
            }
            k += 1;
            assert!(k < 50, "[{label}] the run never finished");
        }
        requests = k - 1;
        h.relaxed_between_crash_and_resume();
    }
    let report = &h.report;
    eprintln!(
        "exactly-once [{label}]: {} conversations in {:.1} s; kill points: {appends} appends, \
         {requests} shop requests; crashes: {} after an append, {} after a shop request, {} \
         in a resume; {} resumes; order requests {} (one order each), charges told \
         may_have_run {}",
        report.conversations,
        started.elapsed().as_secs_f64(),
        report.crashes_after_append,
        report.crashes_after_request,
        report.crashes_in_resume,
        report.resumes,
        report.order_executions,
        report.charges_unknown,
    );
    let crashes =
        report.crashes_after_append + report.crashes_after_request + report.crashes_in_resume;
    assert!(
        crashes >= 50,
        "[{label}] only {crashes} crashes: the harness must crash at least 50 times"
    );
    assert!(appends >= 2 && requests >= 4, "[{label}] {report:?}");
}

#[test]
fn sqlite_every_kill_point_keeps_each_effect_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("shop.db").display());
    harness("sqlite", dir.path(), url);
}

#[test]
fn postgres_every_kill_point_keeps_each_effect_exactly_once() {
    let base = std::env::var("DATABASE_URL").unwrap_or_else(|_| {
        panic!("DATABASE_URL is not set: this test needs PostgreSQL (scripts/test sets it)")
    });
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let schema = format!("keel_once_{}_{}", std::process::id(), nanos % 1_000_000_000);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let store = runtime
        .block_on(keel_store::PostgresStore::connect_with(
            keel_store::PostgresOptions::new(&base).schema(&schema),
        ))
        .unwrap_or_else(|e| panic!("cannot open Postgres at DATABASE_URL: {e}"));
    let separator = if base.contains('?') { '&' } else { '?' };
    let url = format!("{base}{separator}options[search_path]={schema}");
    let dir = tempfile::tempdir().unwrap();
    harness("postgres", dir.path(), url);
    runtime.block_on(store.drop_schema()).unwrap();
}
