//! The agent of a stored run, rebuilt from the log: every run records the resolved
//! [`AgentSpec`] it was built from in its `RunStarted` event, so `keel resume`, `approve`,
//! `deny`, `reply` and workers need no flags to continue it. Flags given explicitly still
//! win, each with a printed notice; a run recorded before definitions existed is
//! continued with the flags, as before. The rules live in [`keel_app::recipe`].

use std::sync::Arc;

use keel_core::Event;
use keel_runtime::Thread;

use crate::CliError;
use crate::agents::{AgentArgs, AgentSpec};
use crate::config::app_error;

/// The agent spec a run recorded when it started, if it recorded one.
pub fn recorded_spec(run_events: &[Arc<Event>]) -> Result<Option<AgentSpec>, CliError> {
    AgentSpec::recorded(run_events).map_err(app_error)
}

/// The spec to continue the thread's latest run with (see [`spec_from`]).
pub fn spec_for_thread(thread: &Thread, flags: &AgentArgs) -> Result<AgentSpec, CliError> {
    spec_from(recorded_spec(thread.run_events())?, flags)
}

/// The `recorded` spec with explicit `flags` applied over it (a notice on stderr for each
/// flag that changes something), or the flags alone for runs recorded without one.
pub fn spec_from(recorded: Option<AgentSpec>, flags: &AgentArgs) -> Result<AgentSpec, CliError> {
    let Some(recorded) = recorded else {
        return flags.spec();
    };
    let (spec, notices) = recorded.with_overrides(&flags.spec()?).map_err(app_error)?;
    for notice in notices {
        eprintln!("keel: {}", crate::redaction::for_stderr(&notice));
    }
    Ok(spec)
}
