//! The composition examples run as real processes against a loopback mock LLM (see
//! tests/common/mod.rs): `agent_as_tool` (the sub-agent gets only its task, the lead gets
//! its answer) and `handoff` (billing continues triage's thread and answers).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

use crate::common;

fn bodies(mock: &keel_testkit::mock_llm::MockLlmServer) -> Vec<String> {
    mock.requests().iter().map(|r| r.body.to_string()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_as_tool_delegates_the_task_and_answers_with_the_result() {
    let dir = tempfile::tempdir().unwrap();
    let mock = common::mock(
        r#"{"turns": [
            {"tool_calls": [{"name": "research", "arguments": {"task": "Name the capital city of France."}}]},
            {"text": "Paris"},
            {"text": "The capital of France is Paris."}
        ]}"#,
    )
    .await;
    let env = common::provider_env(&mock);
    let run = common::run_example("agent_as_tool", dir.path(), &common::as_pairs(&env)).await;
    assert!(run.success, "{run:?}");
    assert!(
        run.stdout.contains("The capital of France is Paris."),
        "{run:?}"
    );
    let bodies = bodies(&mock);
    assert_eq!(bodies.len(), 3, "{bodies:?}");
    // The sub-agent sees its task, not the lead's conversation.
    assert!(bodies[1].contains("Name the capital city of France."));
    assert!(!bodies[1].contains("What is the capital of France?"));
    assert!(bodies[1].contains("Answer with the fact only."));
    // The lead gets the sub-agent's answer as the tool's result.
    assert!(bodies[2].contains("Paris"), "{}", bodies[2]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handoff_passes_the_thread_to_billing_which_answers() {
    let dir = tempfile::tempdir().unwrap();
    let mock = common::mock(
        r#"{"turns": [
            {"tool_calls": [{"name": "transfer_to_billing", "arguments": {"reason": "an invoice question"}}]},
            {"text": "Invoice INV-7 was paid on 3 March."}
        ]}"#,
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

[agents.triage]
description = "Routes customer requests."
instructions = "Route each request to the right desk."
handoffs = ["billing"]

[agents.billing]
description = "Answers invoice and refund questions."
instructions = "You answer billing questions."
"#,
        base = mock.base_url()
    );
    std::fs::write(dir.path().join("keel.toml"), toml).unwrap();
    let env = [("OPENAI_API_KEY", "sk-test")];
    let run = common::run_example("handoff", dir.path(), &env).await;
    assert!(run.success, "{run:?}");
    assert!(
        run.stdout
            .contains("handoff triage -> billing: an invoice question"),
        "{run:?}"
    );
    assert!(
        run.stdout.contains("Invoice INV-7 was paid on 3 March."),
        "{run:?}"
    );
    let bodies = bodies(&mock);
    assert_eq!(bodies.len(), 2, "{bodies:?}");
    assert!(bodies[0].contains("transfer_to_billing"), "{}", bodies[0]);
    // Billing continues the same conversation: the question and the transfer.
    assert!(bodies[1].contains("You answer billing questions."));
    assert!(bodies[1].contains("Is invoice INV-7 paid?"));
    assert!(
        bodies[1].contains("Transferred to `billing`"),
        "{}",
        bodies[1]
    );
}
