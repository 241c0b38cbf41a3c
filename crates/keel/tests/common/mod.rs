//! Runs the repository's examples (`examples/*.rs`) as real processes, each in its own
//! directory and environment, against a loopback mock LLM — never the internet
//! (`KEEL_TEST_MODE=1` refuses any other host).
//!
//! How: a test binary compiles the examples it runs into itself ([`keel_examples!`]
//! `include!`s each source into a module) and gets one ignored test, `example_child`, that
//! runs the example named by `KEEL_EXAMPLE_CHILD`. [`run_example`] re-executes the test
//! binary (`current_exe`) with `--ignored --exact example_child`, that variable, the
//! working directory and environment the example needs, and returns what it printed.
//!
//! Why not `cargo run --example` or `target/debug/examples/NAME`: the first nests cargo
//! inside a test (it waits on the shared target directory's lock, and rebuilds under
//! another profile), the second is built only by some invocations (`cargo test --test
//! examples` does not build examples) and may be stale. Code compiled into the test
//! binary is always present and current, under `cargo test` and `cargo nextest` alike.
//! (This is also why the examples start with `//` comments: `include!` rejects a `//!`
//! crate doc.)
//!
//! Usage: `tests/integration.rs` (this crate's one test binary) lists every example once,
//! and its test modules run them:
//!
//! ```text
//! keel_examples! { hello => "hello.rs", typed_tool => "typed_tool.rs" }   // integration.rs
//! let run = common::run_example("hello", dir, &[("OPENAI_API_KEY", "sk-test")]).await;
//! ```
#![allow(
    dead_code,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use keel_testkit::mock_llm::{MockLlmServer, MockScript};

/// Names the example an `example_child` process runs.
pub const EXAMPLE_VAR: &str = "KEEL_EXAMPLE_CHILD";

/// How long one example may take, generously (a loaded 2-core machine).
pub const EXAMPLE_DEADLINE: Duration = Duration::from_secs(180);

/// Variables of the parent's environment an example must not see: keys and endpoints of
/// real providers, the store and configuration overrides.
const SCRUBBED: [&str; 13] = [
    "ANTHROPIC_API_KEY",
    "ANTHROPIC_BASE_URL",
    "OPENAI_API_KEY",
    "OPENAI_BASE_URL",
    "OPENROUTER_API_KEY",
    "OPENROUTER_BASE_URL",
    "OLLAMA_HOST",
    "KEEL_STORE",
    "KEEL_CONFIG",
    "KEEL_MODEL",
    "KEEL_DEFAULT_MODEL",
    "KEEL_LOG",
    "RUST_LOG",
];

/// Compiles the listed examples (file names under the repository's `examples/`) into this
/// test binary and defines the `example_child` entry point that runs them.
#[macro_export]
macro_rules! keel_examples {
    ($($name:ident => $file:literal),+ $(,)?) => {
        $(
            #[allow(dead_code, unused_imports, clippy::all)]
            mod $name {
                include!(concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/", $file));

                pub(crate) fn run_main() -> std::process::ExitCode {
                    std::process::Termination::report(main())
                }
            }
        )+

        /// The child process of `common::run_example`: runs the example named by
        /// `KEEL_EXAMPLE_CHILD`. Ignored in ordinary runs (and a no-op without the variable).
        #[test]
        #[ignore = "the entry point of example child processes (see tests/common/mod.rs)"]
        fn example_child() {
            let Ok(which) = std::env::var(common::EXAMPLE_VAR) else {
                return;
            };
            let code = match which.as_str() {
                $(stringify!($name) => $name::run_main(),)+
                other => panic!("this test binary has no example `{other}`"),
            };
            assert!(code == std::process::ExitCode::SUCCESS, "example `{which}` failed");
        }
    };
}

/// What an example process did.
#[derive(Debug)]
pub struct ExampleRun {
    /// Whether it exited successfully.
    pub success: bool,
    /// Its standard output (with the test harness's few lines around the example's).
    pub stdout: String,
    /// Its standard error (an example's `Err` from `main` is printed here).
    pub stderr: String,
}

/// Runs example `name` (declared with [`keel_examples!`] in this test binary) in `dir`,
/// with `env` on top of a scrubbed copy of this process's environment and
/// `KEEL_TEST_MODE=1`. Panics (failing the test) if it does not finish within
/// [`EXAMPLE_DEADLINE`]; the process is killed then.
pub async fn run_example(name: &str, dir: &Path, env: &[(&str, &str)]) -> ExampleRun {
    let exe = std::env::current_exe().expect("the test binary's path");
    let mut command = tokio::process::Command::new(exe);
    command
        .args([
            "example_child",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .current_dir(dir)
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .env(EXAMPLE_VAR, name)
        .env("KEEL_TEST_MODE", "1")
        .env("RUST_BACKTRACE", "0");
    for var in SCRUBBED {
        command.env_remove(var);
    }
    for (key, value) in env {
        command.env(key, value);
    }
    let output = tokio::time::timeout(EXAMPLE_DEADLINE, command.output())
        .await
        .unwrap_or_else(|_| panic!("example `{name}` did not finish in {EXAMPLE_DEADLINE:?}"))
        .expect("the example process starts");
    ExampleRun {
        success: output.status.success(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// A mock LLM answering with `script` (the JSON format of docs/mock-llm.md).
pub async fn mock(script: &str) -> MockLlmServer {
    MockLlmServer::start(MockScript::from_json(script).expect("a valid mock script"))
        .await
        .expect("the mock LLM starts")
}

/// Writes `dir/keel.toml`: the OpenAI provider pointed at `mock`, a SQLite store in
/// `dir`, and `[agents.detective]` on `openai:gpt-4.1-mini` — what the examples that use
/// `Agent::from_config("keel.toml", "detective")` read.
pub fn write_config(dir: &Path, mock: &MockLlmServer) -> String {
    let store = format!("sqlite://{}", dir.join("keel.db").display());
    let toml = format!(
        r#"[store]
url = "{store}"

[providers.openai]
base_url = "{base}/v1"

[agents.detective]
description = "Assesses software releases."
instructions = "You assess software releases and report their risk."
model = "openai:gpt-4.1-mini"
"#,
        base = mock.base_url()
    );
    std::fs::write(dir.join("keel.toml"), toml).expect("keel.toml written");
    store
}

/// The environment every example run against `mock` gets: a test key and, for examples
/// that build their model from `KEEL_MODEL`, the OpenAI endpoint of the mock.
pub fn provider_env(mock: &MockLlmServer) -> Vec<(&'static str, String)> {
    vec![
        ("OPENAI_API_KEY", "sk-test".to_string()),
        ("OPENAI_BASE_URL", format!("{}/v1", mock.base_url())),
        ("KEEL_MODEL", "openai:gpt-4.1-mini".to_string()),
    ]
}

/// `provider_env` as the borrowed pairs [`run_example`] takes.
pub fn as_pairs<'a>(env: &'a [(&'static str, String)]) -> Vec<(&'static str, &'a str)> {
    env.iter().map(|(k, v)| (*k, v.as_str())).collect()
}
