// Workflow: keel.toml's `[workflows.review]` sends the question to two agents at once and
// has a third summarize their answers. Each step runs on its own thread and the workflow's
// log records every step, so after a crash `keel resume THREAD` continues where it stopped.
use keel::app::App;
use keel::app::workflow::WorkflowRequest;
use keel::core::{EventKind, Message};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let app = App::load(Some("keel.toml".as_ref()))?;
    let workflow = app.workflow(&WorkflowRequest::new("review")).await?;
    let store = app.open_store(None).await?.events;
    let review =
        keel::Agent::new(workflow).with_context(app.run_context(store.clone(), None, None));
    let mut thread = review.thread();
    let question = Message::user("Should our agent runtime be written in Rust?");
    let outcome = review.run(vec![question], &mut thread).await?;
    for event in store.load(thread.id()).await? {
        if let EventKind::WorkflowStepFinished { step, output, .. } = event.kind {
            println!("{step}: {}", output.unwrap_or_default());
        }
    }
    println!("answer: {}", outcome.final_text.unwrap_or_default());
    Ok(())
}
