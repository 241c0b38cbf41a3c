//! `keel eval`: run an evaluation suite (`run`) and compare a report with a baseline
//! (`compare`). A thin layer over keel-eval: parsing, running, scoring, judging and
//! comparing live there; this file reads flags, shows progress, writes `report.json` and
//! prints the tables. See docs/evaluation.md.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use keel_eval::{
    Comparison, EvalError, EvalReport, ModelJudge, Progress, RunOptions, ScenarioStatus, Suite,
};

use crate::CliError;
use crate::config::{app, app_error};

/// `keel eval` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum EvalCommand {
    /// Run a suite file: every scenario × trial against its agent; writes report.json and
    /// exits 0 when every scenario passed, 1 otherwise (2: the suite or flags are invalid).
    Run(EvalRunArgs),
    /// Compare a report with a baseline report: prints every change and exits 1 on a
    /// significant regression.
    Compare(EvalCompareArgs),
}

/// Flags of `keel eval run`.
#[derive(Debug, clap::Args)]
pub struct EvalRunArgs {
    /// The suite file (TOML; see docs/evaluation.md).
    #[arg(value_name = "SUITE")]
    pub suite: PathBuf,
    /// Trials per scenario (default: the suite's `trials`).
    #[arg(long, value_name = "N")]
    pub trials: Option<u32>,
    /// Run the agent with this model (PROVIDER:MODEL or a keel.toml [models] alias).
    #[arg(long, value_name = "PROVIDER:MODEL")]
    pub model: Option<String>,
    /// Override the agent model's provider base URL.
    #[arg(long, value_name = "URL")]
    pub base_url: Option<String>,
    /// Score rubrics with this model (without it, rubrics are not scored).
    #[arg(long, value_name = "PROVIDER:MODEL")]
    pub judge_model: Option<String>,
    /// Override the judge model's provider base URL.
    #[arg(long, value_name = "URL", requires = "judge_model")]
    pub judge_base_url: Option<String>,
    /// Cache judge verdicts here (default .keel/eval/judge-cache).
    #[arg(long, value_name = "DIR")]
    pub judge_cache: Option<PathBuf>,
    /// Where to write report.json (default .keel/eval/<suite>-<timestamp>).
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Per-trial timeout in seconds (default 600).
    #[arg(long, value_name = "SECONDS")]
    pub timeout: Option<u64>,
    /// The event store the trials' threads go to (default: KEEL_STORE, else keel.toml
    /// [store] url, else sqlite://.keel/keel.db).
    #[arg(long, value_name = "URL")]
    pub store: Option<String>,
}

/// Flags of `keel eval compare`.
#[derive(Debug, clap::Args)]
pub struct EvalCompareArgs {
    /// The new report (report.json).
    #[arg(value_name = "CURRENT")]
    pub current: PathBuf,
    /// The baseline report.
    #[arg(value_name = "BASELINE")]
    pub baseline: PathBuf,
    /// A drop larger than this (absolute, 0..1) is a regression.
    #[arg(long, value_name = "DELTA", default_value_t = 0.05)]
    pub threshold: f64,
}

/// Runs `keel eval ...`.
pub async fn run(command: EvalCommand) -> Result<u8, CliError> {
    match command {
        EvalCommand::Run(args) => eval_run(args).await,
        EvalCommand::Compare(args) => eval_compare(&args),
    }
}

async fn eval_run(args: EvalRunArgs) -> Result<u8, CliError> {
    let text = std::fs::read_to_string(&args.suite)
        .map_err(|e| CliError::usage(format!("cannot read {}: {e}", args.suite.display())))?;
    let suite = match Suite::parse(&text, &args.suite.display().to_string()) {
        Ok(suite) => suite,
        Err(diagnostics) => {
            eprint!("{}", keel_config::render_text(&diagnostics));
            return Ok(crate::EXIT_USAGE);
        }
    };
    if args.trials == Some(0) {
        return Err(CliError::usage("--trials must be at least 1"));
    }
    let judge = match &args.judge_model {
        Some(spec) => {
            let model = keel_app::model::build_model(
                app().config(),
                spec,
                args.judge_base_url.as_deref(),
                app().env(),
            )
            .map_err(app_error)?;
            let cache = args
                .judge_cache
                .clone()
                .unwrap_or_else(|| PathBuf::from(keel_eval::DEFAULT_JUDGE_CACHE));
            let judge = ModelJudge::new(model, spec.clone())
                .map_err(|e| CliError::failure(e.to_string()))?
                .with_cache_dir(Some(cache));
            Some(Arc::new(judge) as Arc<dyn keel_eval::Judge>)
        }
        None => None,
    };
    let trials = args.trials.unwrap_or(suite.suite.trials).max(1);
    let total = (suite.scenarios.len() as u64).saturating_mul(u64::from(trials));
    let bar = indicatif::ProgressBar::new(total);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} trials  {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let progress_bar = bar.clone();
    let options = RunOptions {
        model: args.model.clone(),
        base_url: args.base_url.clone(),
        store: args.store.clone(),
        trials: args.trials,
        timeout: args
            .timeout
            .map_or(keel_eval::DEFAULT_TRIAL_TIMEOUT, Duration::from_secs),
        judge,
        setup: None,
        progress: Some(Arc::new(move |p: &Progress| match p.status {
            None => progress_bar.set_message(format!("{} #{}", p.scenario, p.trial)),
            Some(_) => progress_bar.inc(1),
        })),
    };
    let result = keel_eval::run_suite(app(), &suite, &options).await;
    bar.finish_and_clear();
    let report = result.map_err(eval_error)?;
    let out = args.out.clone().unwrap_or_else(|| {
        PathBuf::from(".keel/eval").join(format!(
            "{}-{}",
            suite.suite.name,
            chrono::Utc::now().format("%Y%m%d-%H%M%S")
        ))
    });
    let path = write_report(&out, &report)?;
    print_summary(&report);
    println!("report: {}", path.display());
    let all_passed = report
        .scenarios
        .iter()
        .all(|s| s.status == ScenarioStatus::Passed);
    Ok(if all_passed { 0 } else { 1 })
}

fn eval_error(error: EvalError) -> CliError {
    match error {
        EvalError::Store(_) => CliError::failure(error.to_string()),
        other => CliError::usage(other.to_string()),
    }
}

fn write_report(dir: &Path, report: &EvalReport) -> Result<PathBuf, CliError> {
    std::fs::create_dir_all(dir)
        .map_err(|e| CliError::failure(format!("cannot create {}: {e}", dir.display())))?;
    let path = dir.join("report.json");
    let json = serde_json::to_string_pretty(report)
        .map_err(|e| CliError::failure(format!("cannot serialize the report: {e}")))?;
    std::fs::write(&path, json)
        .map_err(|e| CliError::failure(format!("cannot write {}: {e}", path.display())))?;
    Ok(path)
}

fn status_str(status: ScenarioStatus) -> &'static str {
    match status {
        ScenarioStatus::Passed => "passed",
        ScenarioStatus::Failed => "failed",
        ScenarioStatus::Flaky => "flaky",
        ScenarioStatus::JudgeError => "judge_error",
    }
}

/// The table: one line per scenario, then the totals.
fn print_summary(report: &EvalReport) {
    let width = report
        .scenarios
        .iter()
        .map(|s| s.id.chars().count())
        .max()
        .unwrap_or(8)
        .max(8);
    println!(
        "{:<width$}  {:<11}  {:<24}  scores",
        "scenario", "status", "pass rate (95% CI)"
    );
    for s in &report.scenarios {
        let rate = format!(
            "{}/{} [{:.2}, {:.2}]",
            s.trials_passed, s.trials_run, s.ci95.lo, s.ci95.hi
        );
        let scores: Vec<String> = s
            .scores
            .iter()
            .map(|(d, v)| format!("{}={v:.2}", d.as_str()))
            .collect();
        println!(
            "{:<width$}  {:<11}  {rate:<24}  {}",
            s.id,
            status_str(s.status),
            scores.join(" ")
        );
        for trial in &s.trials {
            if let Some(error) = trial.error.as_ref().or(trial.judge_error.as_ref()) {
                println!("{:<width$}    {}: {error}", "", trial.thread_id);
            }
        }
    }
    let summary = &report.summary;
    let averages: Vec<String> = summary
        .avg_scores
        .iter()
        .map(|(d, v)| format!("{}={v:.2}", d.as_str()))
        .collect();
    println!(
        "{} scenarios: {} passed, {} failed, {} flaky, {} judge errors; pass rate {:.2}; {}",
        summary.total_scenarios,
        summary.passed,
        summary.failed,
        summary.flaky,
        summary.judge_errors,
        summary.pass_rate,
        averages.join(" ")
    );
}

fn read_report(path: &Path) -> Result<EvalReport, CliError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| CliError::usage(format!("cannot read {}: {e}", path.display())))?;
    serde_json::from_str(&text).map_err(|e| {
        CliError::usage(format!(
            "{} is not a keel eval report (report.json): {e}",
            path.display()
        ))
    })
}

fn eval_compare(args: &EvalCompareArgs) -> Result<u8, CliError> {
    if !(0.0..=1.0).contains(&args.threshold) {
        return Err(CliError::usage("--threshold must be between 0 and 1"));
    }
    let current = read_report(&args.current)?;
    let baseline = read_report(&args.baseline)?;
    let comparison = keel_eval::compare(&current, &baseline, args.threshold);
    print_comparison(&comparison);
    Ok(if comparison.is_regression() { 1 } else { 0 })
}

fn print_comparison(c: &Comparison) {
    for m in &c.summary {
        println!(
            "summary {}: {:.3} -> {:.3} ({:+.3})",
            m.metric, m.before, m.after, m.delta
        );
    }
    for r in &c.regressions {
        let label = if r.significant {
            "REGRESSION"
        } else {
            "regression (not significant)"
        };
        println!(
            "{label} {} {}: {:.3} -> {:.3} ({:+.3})",
            r.scenario, r.metric, r.before, r.after, r.delta
        );
    }
    for i in &c.improvements {
        let note = if i.significant {
            ""
        } else {
            " (not significant)"
        };
        println!(
            "improvement{note} {} {}: {:.3} -> {:.3} ({:+.3})",
            i.scenario, i.metric, i.before, i.after, i.delta
        );
    }
    for id in &c.added {
        println!("added scenario {id}");
    }
    for id in &c.removed {
        println!("removed scenario {id}");
    }
    let significant = c.regressions.iter().filter(|r| r.significant).count();
    if significant > 0 {
        println!(
            "{significant} significant regression(s) beyond {:.2}",
            c.threshold
        );
    } else {
        println!("no significant regression (threshold {:.2})", c.threshold);
    }
}
