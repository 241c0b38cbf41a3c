// Handoff: keel.toml's `[agents.triage]` lists `handoffs = ["billing"]`, so its model may
// call `transfer_to_billing`; the billing agent then continues the same thread (it sees
// the whole conversation) and its answer is the final one. The log records the handoff.
use keel::core::{EventKind, Message};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let agent = keel::Agent::from_config("keel.toml", "triage")?;
    let mut thread = agent.thread();
    let question = Message::user("Is invoice INV-7 paid?");
    let outcome = agent.run(vec![question], &mut thread).await?;
    let store = agent.context().await?.store;
    for event in store.load(thread.id()).await? {
        if let EventKind::Handoff {
            from, to, reason, ..
        } = event.kind
        {
            println!("handoff {from} -> {to}: {}", reason.unwrap_or_default());
        }
    }
    println!("{}", outcome.final_text.unwrap_or_default());
    Ok(())
}
