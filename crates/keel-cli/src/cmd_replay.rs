//! `keel eval replay CASSETTE|DIR…`: replays golden conversations recorded with `keel run
//! --record` against the agent as it is now, offline, and prints each one's differences
//! from its recording. A thin layer over [`keel_eval::golden`]; see docs/evaluation.md.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use keel_core::Model;
use keel_eval::golden::{Allowances, ReplayError, ReplayOptions, replay};

use crate::CliError;
use crate::config::{app, app_error};
use crate::output::OutputFormat;

/// Flags of `keel eval replay`.
#[derive(Debug, clap::Args)]
pub struct EvalReplayArgs {
    /// Cassette files, or directories whose `*.json` files are cassettes.
    #[arg(value_name = "CASSETTE", required = true)]
    pub cassettes: Vec<PathBuf>,
    /// Replay against this agent (keel.toml name or agent file) instead of the recorded
    /// one.
    #[arg(long, value_name = "NAME|FILE")]
    pub agent: Option<String>,
    /// Ask this live model instead of replaying the recorded responses (tools still
    /// answer from the recording).
    #[arg(long, value_name = "PROVIDER:MODEL", conflicts_with = "script")]
    pub model: Option<String>,
    /// The live model's provider base URL.
    #[arg(long, value_name = "URL", requires = "model")]
    pub base_url: Option<String>,
    /// A scripted model (JSON steps) as the live model.
    #[arg(long, value_name = "FILE")]
    pub script: Option<PathBuf>,
    /// The final text may differ from the recording.
    #[arg(long)]
    pub allow_final_text: bool,
    /// An argument field that may differ, as TOOL:/json/pointer (`*:/pointer` for every
    /// tool); repeatable.
    #[arg(long, value_name = "TOOL:/POINTER")]
    pub allow_argument: Vec<String>,
    /// Longest one replay may take, in seconds (default 300).
    #[arg(long, value_name = "SECONDS")]
    pub timeout: Option<u64>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
    pub output: OutputFormat,
}

/// Runs `keel eval replay`: exit 0 when every cassette replays without a difference, 1
/// when one differs, 2 when one cannot be read or its agent cannot be built.
pub async fn run(args: &EvalReplayArgs) -> Result<u8, CliError> {
    let cassettes = expand(&args.cassettes)?;
    let allow = Allowances {
        final_text: args.allow_final_text,
        arguments: args.allow_argument.clone(),
    };
    allow.validate().map_err(CliError::usage)?;
    let model: Option<Arc<dyn Model>> = match (&args.model, &args.script) {
        (Some(spec), _) => Some(
            keel_app::model::build_model(
                app().config(),
                spec,
                args.base_url.as_deref(),
                app().env(),
            )
            .map_err(app_error)?,
        ),
        (None, Some(script)) => Some(crate::scripted::scripted_from(script, 0)?.0),
        (None, None) => None,
    };
    let options = ReplayOptions {
        agent: args.agent.clone(),
        model,
        allow,
        timeout: args.timeout.map_or(
            keel_eval::golden::DEFAULT_REPLAY_TIMEOUT,
            Duration::from_secs,
        ),
    };
    let mut reports = Vec::new();
    let mut unusable = false;
    for cassette in &cassettes {
        match replay(app(), cassette, &options).await {
            Ok(report) => {
                if args.output == OutputFormat::Text {
                    print!("{}", report.render());
                }
                reports.push(report);
            }
            Err(error) => {
                unusable = true;
                eprintln!("ERROR   {}", describe(&error));
            }
        }
    }
    let failed = reports.iter().filter(|r| !r.passed).count();
    match args.output {
        OutputFormat::Json => {
            let json = serde_json::to_string_pretty(&reports)
                .map_err(|e| CliError::failure(format!("cannot serialize the reports: {e}")))?;
            println!("{json}");
        }
        OutputFormat::Text => println!(
            "replay: {} cassette{}, {} passed, {} failed{}",
            cassettes.len(),
            if cassettes.len() == 1 { "" } else { "s" },
            reports.len() - failed,
            failed,
            if unusable {
                ", some could not be replayed (above)"
            } else {
                ""
            }
        ),
    }
    Ok(if unusable {
        crate::EXIT_USAGE
    } else if failed > 0 {
        1
    } else {
        0
    })
}

fn describe(error: &ReplayError) -> String {
    crate::redaction::for_stderr(&error.to_string())
}

/// The cassette files: each file given, and each directory's `*.json` files in name order.
fn expand(paths: &[PathBuf]) -> Result<Vec<PathBuf>, CliError> {
    let mut files = Vec::new();
    for path in paths {
        if path.is_dir() {
            let mut found: Vec<PathBuf> = std::fs::read_dir(path)
                .map_err(|e| CliError::usage(format!("cannot read {}: {e}", path.display())))?
                .filter_map(|entry| entry.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "json") && p.is_file())
                .collect();
            if found.is_empty() {
                return Err(CliError::usage(format!(
                    "{} holds no cassette (*.json); record one with `keel run --record FILE`",
                    path.display()
                )));
            }
            found.sort();
            files.extend(found);
        } else if path.is_file() {
            files.push(path.clone());
        } else {
            return Err(CliError::usage(format!(
                "{}: no such cassette file or directory",
                path.display()
            )));
        }
    }
    Ok(files)
}

/// Where `keel run --record FILE` writes: the run's events of `thread_id` as a cassette.
pub async fn record(
    store: &dyn keel_core::EventStore,
    thread_id: &str,
    run_id: &str,
    path: &Path,
) -> Result<(), CliError> {
    let events = store
        .load(thread_id)
        .await
        .map_err(|e| CliError::failure(format!("--record: cannot read the run's events: {e}")))?;
    let cassette = keel_eval::Cassette::from_run(
        &events,
        run_id,
        path,
        chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
    )
    .map_err(|e| CliError::failure(format!("--record: {e}")))?;
    cassette
        .save(path)
        .map_err(|e| CliError::failure(format!("--record: {e}")))?;
    eprintln!(
        "recorded: {} ({} model response{}, {} tool output{}, end state {}); replay it with \
         `keel eval replay {}`",
        path.display(),
        cassette.model_responses.len(),
        if cassette.model_responses.len() == 1 {
            ""
        } else {
            "s"
        },
        cassette.tool_outputs.len(),
        if cassette.tool_outputs.len() == 1 {
            ""
        } else {
            "s"
        },
        cassette.expected.end_state,
        path.display()
    );
    Ok(())
}
