//! Headless Chromium for browser tests: the operating system's `chromium`, driven by its
//! `chromedriver` over W3C WebDriver on loopback (Debian's packages `chromium` and
//! `chromium-driver`, which `scripts/install-test-deps` installs; nothing is downloaded).
//!
//! A test opens a page, runs a script in it and reads the browser's console log (errors
//! included) back. The client is a handful of JSON requests over reqwest, which the
//! workspace already builds: the WebDriver client crates (fantoccini, thirtyfour) would add
//! their HTTP stack and ICU tables to every cold build for these five endpoints.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::process::{Child, Command};

/// How long one WebDriver request (and the driver's start) may take. Generous: a loaded
/// 2-core machine starts Chromium in seconds, not minutes.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);

/// A browser test's failure.
#[derive(Debug, thiserror::Error)]
pub enum BrowserError {
    /// Chromium or ChromeDriver is not installed.
    #[error(
        "{0} not found: run ./scripts/install-test-deps (Debian packages chromium and chromium-driver), or set {1}"
    )]
    Missing(String, &'static str),
    /// The driver did not start or answer.
    #[error("chromedriver: {0}")]
    Driver(String),
    /// A WebDriver command failed.
    #[error("WebDriver {command}: {message}")]
    Command {
        /// The endpoint.
        command: String,
        /// What the driver said.
        message: String,
    },
}

/// One console message.
#[derive(Debug, Clone, PartialEq)]
pub struct ConsoleEntry {
    /// `SEVERE` (errors, uncaught exceptions, failed loads), `WARNING`, `INFO`, ...
    pub level: String,
    /// The message.
    pub message: String,
}

/// A headless Chromium session. Dropping it kills the driver (and with it the browser).
pub struct Browser {
    driver: Child,
    client: reqwest::Client,
    base: String,
    session: String,
    profile: PathBuf,
}

fn locate(env: &'static str, candidates: &[&str]) -> Result<PathBuf, BrowserError> {
    if let Some(path) = std::env::var_os(env) {
        return Ok(PathBuf::from(path));
    }
    candidates
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
        .ok_or_else(|| BrowserError::Missing(candidates.join(" or "), env))
}

fn free_port() -> Result<u16, BrowserError> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")
        .map_err(|e| BrowserError::Driver(format!("no free loopback port: {e}")))?;
    listener
        .local_addr()
        .map(|a| a.port())
        .map_err(|e| BrowserError::Driver(e.to_string()))
}

impl Browser {
    /// Starts ChromeDriver on a free loopback port and opens a headless Chromium session
    /// with its console log recorded. `KEEL_CHROMIUM` / `KEEL_CHROMEDRIVER` override where
    /// the binaries are.
    pub async fn launch() -> Result<Self, BrowserError> {
        Self::launch_with_args(&[]).await
    }

    /// [`Browser::launch`] with more Chromium switches, e.g.
    /// `--host-resolver-rules=MAP attacker.test 127.0.0.1` to point a made-up name at a
    /// loopback server (a DNS rebinding, without any DNS).
    pub async fn launch_with_args(extra: &[String]) -> Result<Self, BrowserError> {
        let chromium = locate("KEEL_CHROMIUM", &["/usr/bin/chromium"])?;
        let chromedriver = locate("KEEL_CHROMEDRIVER", &["/usr/bin/chromedriver"])?;
        static PROFILES: AtomicU32 = AtomicU32::new(0);
        let profile = std::env::temp_dir().join(format!(
            "keel-chromium-{}-{}",
            std::process::id(),
            PROFILES.fetch_add(1, Ordering::Relaxed)
        ));
        let port = free_port()?;
        let driver = Command::new(&chromedriver)
            .arg(format!("--port={port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| BrowserError::Driver(format!("{}: {e}", chromedriver.display())))?;
        let client = reqwest::Client::builder()
            .timeout(REQUEST_TIMEOUT)
            .build()
            .map_err(|e| BrowserError::Driver(e.to_string()))?;
        let base = format!("http://127.0.0.1:{port}");
        let mut browser = Browser {
            driver,
            client,
            base,
            session: String::new(),
            profile,
        };
        browser.wait_ready().await?;
        let created = browser
            .send(
                reqwest::Method::POST,
                "/session",
                Some(json!({"capabilities": {"alwaysMatch": {
                    "browserName": "chrome",
                    "goog:chromeOptions": {
                        "binary": chromium,
                        "args": chromium_args(&browser.profile, extra),
                    },
                    "goog:loggingPrefs": {"browser": "ALL"},
                }}})),
            )
            .await?;
        browser.session = created
            .get("sessionId")
            .and_then(Value::as_str)
            .ok_or_else(|| BrowserError::Driver(format!("no session id in {created}")))?
            .to_string();
        Ok(browser)
    }

    /// Polls the driver's /status until it is ready (it answers within a second or two
    /// of starting; the deadline is for a machine under load).
    async fn wait_ready(&mut self) -> Result<(), BrowserError> {
        let deadline = tokio::time::Instant::now() + REQUEST_TIMEOUT;
        loop {
            if let Ok(Some(status)) = self.driver.try_wait() {
                return Err(BrowserError::Driver(format!("exited at start: {status}")));
            }
            let ready = self
                .client
                .get(format!("{}/status", self.base))
                .send()
                .await
                .ok()
                .filter(|r| r.status().is_success());
            if let Some(response) = ready {
                let body: Value =
                    serde_json::from_slice(&response.bytes().await.unwrap_or_default())
                        .unwrap_or(Value::Null);
                if body.pointer("/value/ready") == Some(&json!(true)) {
                    return Ok(());
                }
            }
            if tokio::time::Instant::now() > deadline {
                return Err(BrowserError::Driver(format!(
                    "not ready on {} after {}s",
                    self.base,
                    REQUEST_TIMEOUT.as_secs()
                )));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// One WebDriver command; returns its `value`.
    async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value, BrowserError> {
        let fail = |message: String| BrowserError::Command {
            command: path.to_string(),
            message,
        };
        let mut request = self.client.request(method, format!("{}{path}", self.base));
        if let Some(body) = body {
            request = request
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(body.to_string());
        }
        let response = request.send().await.map_err(|e| fail(e.to_string()))?;
        let status = response.status();
        let bytes = response.bytes().await.map_err(|e| fail(e.to_string()))?;
        let body: Value = serde_json::from_slice(&bytes)
            .map_err(|e| fail(format!("{status}: not JSON ({e})")))?;
        let value = body.get("value").cloned().unwrap_or(Value::Null);
        if !status.is_success() {
            let field = |name: &str| value.get(name).and_then(Value::as_str).unwrap_or("");
            return Err(fail(format!(
                "{status}: {} {}",
                field("error"),
                field("message")
            )));
        }
        Ok(value)
    }

    fn session_path(&self, tail: &str) -> String {
        format!("/session/{}{tail}", self.session)
    }

    /// Navigates to `url` (e.g. a `file://` URL of a report) and waits for it to load.
    pub async fn open(&self, url: &str) -> Result<(), BrowserError> {
        self.send(
            reqwest::Method::POST,
            &self.session_path("/url"),
            Some(json!({ "url": url })),
        )
        .await
        .map(|_| ())
    }

    /// Opens a local file.
    pub async fn open_file(&self, path: &Path) -> Result<(), BrowserError> {
        let absolute = std::path::absolute(path)
            .map_err(|e| BrowserError::Driver(format!("{}: {e}", path.display())))?;
        self.open(&format!("file://{}", absolute.display())).await
    }

    /// Runs `script` (a function body; `arguments[i]` are `args`) and returns its result.
    pub async fn execute(&self, script: &str, args: Vec<Value>) -> Result<Value, BrowserError> {
        self.send(
            reqwest::Method::POST,
            &self.session_path("/execute/sync"),
            Some(json!({ "script": script, "args": args })),
        )
        .await
    }

    /// Resizes the window (e.g. before a screenshot).
    pub async fn set_window_size(&self, width: u32, height: u32) -> Result<(), BrowserError> {
        self.send(
            reqwest::Method::POST,
            &self.session_path("/window/rect"),
            Some(json!({ "width": width, "height": height })),
        )
        .await
        .map(|_| ())
    }

    /// A PNG screenshot of the viewport, base64-encoded as WebDriver returns it.
    pub async fn screenshot_base64(&self) -> Result<String, BrowserError> {
        let value = self
            .send(
                reqwest::Method::GET,
                &self.session_path("/screenshot"),
                None,
            )
            .await?;
        value
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| BrowserError::Command {
                command: "screenshot".into(),
                message: format!("not a base64 string: {value}"),
            })
    }

    /// The console messages since the last call (ChromeDriver's browser log).
    pub async fn console(&self) -> Result<Vec<ConsoleEntry>, BrowserError> {
        let entries = self
            .send(
                reqwest::Method::POST,
                &self.session_path("/se/log"),
                Some(json!({ "type": "browser" })),
            )
            .await?;
        Ok(entries
            .as_array()
            .map(|list| {
                list.iter()
                    .map(|e| {
                        let field = |name: &str| {
                            e.get(name)
                                .and_then(Value::as_str)
                                .unwrap_or("")
                                .to_string()
                        };
                        ConsoleEntry {
                            level: field("level"),
                            message: field("message"),
                        }
                    })
                    .collect()
            })
            .unwrap_or_default())
    }

    /// Console errors (`SEVERE`) since the last call.
    pub async fn console_errors(&self) -> Result<Vec<String>, BrowserError> {
        Ok(self
            .console()
            .await?
            .into_iter()
            .filter(|e| e.level == "SEVERE")
            .map(|e| e.message)
            .collect())
    }

    /// Ends the session (closing Chromium) and stops the driver.
    pub async fn close(mut self) {
        let path = self.session_path("");
        let _ = self.send(reqwest::Method::DELETE, &path, None).await;
        let _ = self.driver.kill().await;
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.driver.start_kill();
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}

/// The switches every session runs with, then `extra`.
fn chromium_args(profile: &Path, extra: &[String]) -> Vec<String> {
    let mut args: Vec<String> = [
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
    ]
    .iter()
    .map(|s| (*s).to_string())
    .collect();
    args.push(format!("--user-data-dir={}", profile.display()));
    args.extend(extra.iter().cloned());
    args
}
