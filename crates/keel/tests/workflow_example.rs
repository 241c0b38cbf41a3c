//! The workflow example runs as a real process against a loopback mock LLM (see
//! tests/common/mod.rs): `[workflows.review]` fans the question out to two agents, then
//! the summarizer gets both answers, in branch order, and writes the workflow's answer.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

use crate::common;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workflow_fans_out_then_summarizes() {
    let dir = tempfile::tempdir().unwrap();
    // Each conversation gets its own first answer, whichever branch asks first.
    let mock = common::mock(
        r#"{"turn_by": "conversation", "turns": [{"text": "Yes: memory safety without a GC."}]}"#,
    )
    .await;
    let store = format!("sqlite://{}", dir.path().join("keel.db").display());
    let toml = format!(
        r#"[store]
url = "{store}"

[providers.openai]
base_url = "{base}/v1"

[defaults]
model = "openai:gpt-4.1-mini"

[agents.researcher]
description = "Finds the arguments for."
instructions = "List the strongest arguments for the proposal."

[agents.critic]
description = "Finds the arguments against."
instructions = "List the strongest arguments against the proposal."

[agents.summarizer]
instructions = "Weigh the findings below and give a one-line recommendation."

[workflows.review]
kind = "parallel"
agents = ["researcher", "critic"]
then = "summarizer"
"#,
        base = mock.base_url()
    );
    std::fs::write(dir.path().join("keel.toml"), toml).unwrap();
    let env = [("OPENAI_API_KEY", "sk-test")];
    let run = common::run_example("workflow", dir.path(), &env).await;
    assert!(run.success, "{run:?}");
    for line in [
        "researcher: Yes: memory safety without a GC.",
        "critic: Yes: memory safety without a GC.",
        "summarizer: Yes: memory safety without a GC.",
        "answer: Yes: memory safety without a GC.",
    ] {
        assert!(run.stdout.contains(line), "{line}: {run:?}");
    }
    let bodies: Vec<String> = mock.requests().iter().map(|r| r.body.to_string()).collect();
    assert_eq!(bodies.len(), 3, "{bodies:?}");
    // The summarizer asks last, with both answers under their step names, in order.
    let summary = &bodies[2];
    assert!(summary.contains("Weigh the findings"), "{summary}");
    let researcher = summary.find("## researcher (researcher)").unwrap();
    let critic = summary.find("## critic (critic)").unwrap();
    assert!(researcher < critic, "{summary}");
}
