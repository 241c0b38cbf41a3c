//! `keel run --agent NAME` for an agent of `kind = "openai-responses"` (keel-app's
//! [`keel_app::ResponsesAgent`]): the conversation lives on OpenAI's Responses API, so
//! the run sends only the new message with the previous response's id. `--thread ID`
//! continues one of its conversations; a thread a local agent answered in is refused
//! with the reason, and so is `keel run`/`chat`/`resume` with a tool-calling agent on
//! one of its threads.

use std::sync::Arc;

use keel_app::{AgentRef, AgentRequest};
use keel_config::AgentKind;
use keel_core::{CancellationToken, Message};
use keel_runtime::Agent;

use crate::CliError;
use crate::agents::{self, AgentSpec, StoreArgs};
use crate::config::{app, app_error};
use crate::output::{OutputFormat, TextPrinter};

/// Runs `message` with the agent `spec` names when it is a Responses agent; `None`
/// (nothing done) for any other agent.
pub async fn run_if_responses(
    spec: &AgentSpec,
    store: &StoreArgs,
    thread: Option<&str>,
    message: String,
    output: OutputFormat,
) -> Result<Option<u8>, CliError> {
    let reference = match (&spec.agent_name, &spec.agent) {
        (Some(name), _) => AgentRef::Named(name.clone()),
        (None, Some(path)) => AgentRef::File(path.clone()),
        (None, None) => return Ok(None),
    };
    if app().agent_kind(&reference).map_err(app_error)? != AgentKind::OpenAiResponses {
        return Ok(None);
    }
    if spec.script.is_some() {
        return Err(CliError::usage(
            "--script cannot drive a kind = \"openai-responses\" agent (it speaks the Responses \
             API); point --base-url at `keel mock-llm` instead",
        ));
    }
    let request = AgentRequest {
        agent: Some(reference),
        model: spec.model.clone(),
        base_url: spec.base_url.clone(),
        tools: spec.tools.clone(),
        instructions: spec.instructions.clone(),
        max_output_tokens: spec.max_output_tokens,
        ..AgentRequest::default()
    };
    let (agent, resolution) = app().responses_agent(&request).await.map_err(app_error)?;
    // The same lease a worker takes: no other driver drives this thread meanwhile.
    let (claim, mut thread) = store.claim_thread(thread, "keel run").await?;
    let cancel = CancellationToken::new();
    crate::cmd_run::spawn_ctrl_c_handler(cancel.clone());
    let mut context = app()
        .run_context(claim.store(), None, resolution.approve)
        .with_cancel(cancel);
    if output == OutputFormat::Text {
        context = context.with_observer(Arc::new(TextPrinter));
    }
    if let Some(telemetry) = crate::config::telemetry_observer() {
        context = context.with_observer(telemetry);
    }
    let outcome = agent
        .run(vec![Message::user(message)], &mut thread, &context)
        .await
        .map_err(agents::run_error);
    claim.release().await;
    let outcome = outcome?;
    crate::cmd_run::report(&outcome, output, None, None).map(Some)
}
