//! `keel stats`: metrics over every run in the store (turn survival, step success, repair
//! success, retries, tool latency percentiles, error taxonomy, tokens and cost per model,
//! end states, context-window utilization), as a summary or Prometheus text.

use keel_core::store::ThreadFilter;

use crate::CliError;

/// Flags of `keel stats`.
#[derive(Debug, clap::Args)]
pub struct StatsArgs {
    #[command(flatten)]
    pub store: crate::agents::StoreArgs,
    /// Print Prometheus text exposition format instead of a summary.
    #[arg(long)]
    pub prometheus: bool,
    /// Only threads of this agent.
    #[arg(long, value_name = "NAME")]
    pub agent: Option<String>,
}

/// Runs `keel stats`.
pub async fn run(args: StatsArgs) -> Result<u8, CliError> {
    let store = args.store.events().await?;
    let filter = ThreadFilter {
        agent: args.agent.clone(),
        ..ThreadFilter::default()
    };
    let threads = store
        .list_threads(&filter)
        .await
        .map_err(|e| CliError::failure(e.to_string()))?;
    let mut events = Vec::new();
    for thread in &threads {
        events.extend(
            store
                .load(&thread.thread_id)
                .await
                .map_err(|e| CliError::failure(e.to_string()))?,
        );
    }
    let report =
        keel_telemetry::compute_metrics(&events, &keel_telemetry::MetricsOptions::default());
    if args.prometheus {
        print!("{}", keel_telemetry::render_prometheus(&report));
    } else {
        print!("{}", keel_telemetry::render_summary(&report));
    }
    Ok(0)
}
