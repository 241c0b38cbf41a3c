//! One workflow step's run on its child thread: started when the thread has no run of
//! the step yet, resumed when that run is in progress (the agent's own resume settles
//! interrupted tool calls, so a mutating call never runs twice), and read back from the
//! log when it already ended — a step's run is never started twice.

use keel_core::{EventKind, Message};

use crate::agent::Agent;
use crate::context::RunContext;
use crate::outcome::{RunError, RunOutcome, RunStatus};
use crate::thread::Thread;

/// The child thread of step `step` of the workflow on `workflow_thread`.
pub fn child_thread_id(workflow_thread: &str, step: &str) -> String {
    format!("{workflow_thread}.{step}")
}

/// Runs, continues or reads back the step's run: the first run of `child` at or after
/// `from_seq` (the child thread's length when the step started).
pub(crate) async fn drive_step(
    agent: &dyn Agent,
    child: &mut Thread,
    input: &str,
    from_seq: u64,
    context: &RunContext,
) -> Result<RunOutcome, RunError> {
    let ours = child
        .run_events()
        .first()
        .filter(|e| e.seq >= from_seq && matches!(e.kind, EventKind::RunStarted { .. }))
        .map(|e| e.run_id.clone());
    let Some(run_id) = ours else {
        return agent.run(vec![Message::user(input)], child, context).await;
    };
    match child.state().run().and_then(|run| run.ended) {
        None => agent.resume(child, context).await,
        Some(end_state) => {
            let outcome = RunOutcome::from_run_events(
                child.id(),
                &run_id,
                child.run_events(),
                RunStatus::Ended { end_state },
            );
            if outcome.resumable {
                // It ended on a retryable model failure: the agent continues it.
                agent.resume(child, context).await
            } else {
                Ok(outcome)
            }
        }
    }
}
