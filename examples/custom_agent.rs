// A custom agent: any type implementing the runtime's agent trait (`AgentTrait` in the
// prelude), writing its run with `RunRecorder` so it is durable and observable like any
// other. This one asks a model for a French translation; a failed model call ends the run
// `failed` (errors are data). The model is KEEL_MODEL (default openai:gpt-4.1-mini).
use std::sync::Arc;

use keel::core::model::{Model, ModelRequest, complete};
use keel::prelude::*;

const SYSTEM: &str = "Translate the user's message into French. Reply with the translation only.";

struct Translator(Arc<dyn Model>);

#[keel::async_trait]
impl AgentTrait for Translator {
    fn name(&self) -> &str {
        "translator"
    }

    async fn run(
        &self,
        input: Vec<Message>,
        thread: &mut Thread,
        context: &RunContext,
    ) -> Result<RunOutcome, RunError> {
        let model = self.0.id();
        let mut run = RunRecorder::start("translator", &model, input, thread, context).await?;
        let messages = run.state().messages().to_vec();
        let mut request = ModelRequest::new(&messages);
        request.system = Some(SYSTEM);
        let answer = tokio::select! {
            answer = complete(self.0.as_ref(), request) => Some(answer),
            () = context.cancel.cancelled() => None,
        };
        match answer {
            Some(Ok(response)) => {
                let text = response.message.text();
                run.reply("translator", response.message).await?;
                run.finish(EndState::Done, None, Some(text)).await
            }
            Some(Err(error)) => {
                run.finish(EndState::Failed, Some(error.to_string()), None)
                    .await
            }
            None => run.finish(EndState::Cancelled, None, None).await,
        }
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let spec = std::env::var("KEEL_MODEL").unwrap_or_else(|_| "openai:gpt-4.1-mini".into());
    let model = keel::providers::model_from_spec(&spec, &Default::default())?;
    let agent = keel::Agent::new(Translator(model));
    println!("{}", agent.prompt("Good morning, how are you?").await?);
    Ok(())
}
