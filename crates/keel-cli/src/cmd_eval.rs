//! `keel eval`: run an evaluation suite (`run`), compare a report with a baseline
//! (`compare`), list saved baselines (`baselines`) and runs (`runs`), replay golden
//! conversations (`replay`, in `cmd_replay`). A thin layer over
//! keel-eval: parsing, running, scoring, judging, comparing and saving live there; this
//! file reads flags, shows progress, writes `report.json` / `report.html` and prints the
//! tables. See docs/evaluation.md.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use keel_eval::{
    Comparison, EvalError, EvalReport, ModelJudge, Progress, RunOptions, ScenarioStatus, Suite,
};

use crate::CliError;
use crate::config::{app, app_error};
use crate::eval_setup::{self, ReleaseServiceHook};

/// `keel eval` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum EvalCommand {
    /// Run a suite file: every scenario × trial against its agent; writes report.json and
    /// exits 0 when every scenario passed, 1 otherwise (2: the suite or flags are invalid).
    Run(EvalRunArgs),
    /// Compare a report with a baseline: prints every change and exits 1 on a
    /// significant regression. Each side is a report.json file, a saved run id or a
    /// baseline name.
    Compare(EvalCompareArgs),
    /// List the baselines saved in the store (`keel eval run --save-baseline NAME`).
    Baselines(EvalListArgs),
    /// List the eval runs saved in the store, newest first.
    Runs(EvalRunsArgs),
    /// Replay golden conversations (cassettes recorded with `keel run --record`) offline
    /// against the agent as it is now; exits 1 when a replay deviates from its recording.
    Replay(crate::cmd_replay::EvalReplayArgs),
}

/// Flags of `keel eval baselines`.
#[derive(Debug, clap::Args)]
pub struct EvalListArgs {
    /// The store (default: KEEL_STORE, else keel.toml [store] url, else
    /// sqlite://.keel/keel.db).
    #[arg(long, value_name = "URL")]
    pub store: Option<String>,
}

/// Flags of `keel eval runs`.
#[derive(Debug, clap::Args)]
pub struct EvalRunsArgs {
    /// Only runs of this suite.
    #[arg(long, value_name = "NAME")]
    pub suite: Option<String>,
    /// At most this many runs.
    #[arg(long, value_name = "N", default_value_t = 20)]
    pub limit: usize,
    /// The store (default: KEEL_STORE, else keel.toml [store] url, else
    /// sqlite://.keel/keel.db).
    #[arg(long, value_name = "URL")]
    pub store: Option<String>,
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
    /// Where to write report.json and report.html (default
    /// .keel/eval/<suite>-<timestamp>).
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Link each trial in report.html to this URL, `{trace_id}` and `{thread_id}` replaced
    /// (e.g. a trace viewer's address).
    #[arg(long, value_name = "URL")]
    pub trace_url: Option<String>,
    /// Per-trial timeout in seconds (default 600).
    #[arg(long, value_name = "SECONDS")]
    pub timeout: Option<u64>,
    /// The event store the trials' threads go to, where the run is saved (default:
    /// KEEL_STORE, else keel.toml [store] url, else sqlite://.keel/keel.db).
    #[arg(long, value_name = "URL")]
    pub store: Option<String>,
    /// Save this run as baseline NAME in the store (moving NAME if it exists).
    #[arg(long, value_name = "NAME")]
    pub save_baseline: Option<String>,
    /// Compare this run with baseline NAME from the store: the report carries the
    /// comparison and the exit code is 1 on a significant regression.
    #[arg(long, value_name = "NAME")]
    pub baseline: Option<String>,
    /// With --baseline: a drop larger than this (absolute, 0..1) is a regression.
    #[arg(
        long,
        value_name = "DELTA",
        default_value_t = 0.05,
        requires = "baseline"
    )]
    pub threshold: f64,
}

/// Flags of `keel eval compare`.
#[derive(Debug, clap::Args)]
pub struct EvalCompareArgs {
    /// The new report: a report.json file, a saved run id (`keel eval runs`) or a
    /// baseline name (`keel eval baselines`).
    #[arg(value_name = "CURRENT")]
    pub current: String,
    /// The baseline: a report.json file, a saved run id or a baseline name.
    #[arg(value_name = "BASELINE")]
    pub baseline: String,
    /// A drop larger than this (absolute, 0..1) is a regression.
    #[arg(long, value_name = "DELTA", default_value_t = 0.05)]
    pub threshold: f64,
    /// Also write the current report with the comparison attached, as HTML, to this file.
    #[arg(long, value_name = "FILE")]
    pub html: Option<PathBuf>,
    /// The store holding saved runs and baselines (default: KEEL_STORE, else keel.toml
    /// [store] url, else sqlite://.keel/keel.db).
    #[arg(long, value_name = "URL")]
    pub store: Option<String>,
}

/// Runs `keel eval ...`.
pub async fn run(command: EvalCommand) -> Result<u8, CliError> {
    match command {
        EvalCommand::Run(args) => eval_run(args).await,
        EvalCommand::Compare(args) => eval_compare(&args).await,
        EvalCommand::Baselines(args) => eval_baselines(&args).await,
        EvalCommand::Runs(args) => eval_runs(&args).await,
        EvalCommand::Replay(args) => crate::cmd_replay::run(&args).await,
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
    let hook_problems = eval_setup::check(&suite);
    if !hook_problems.is_empty() {
        eprint!("{}", keel_config::render_text(&hook_problems));
        return Ok(crate::EXIT_USAGE);
    }
    if args.trials == Some(0) {
        return Err(CliError::usage("--trials must be at least 1"));
    }
    check_threshold(args.threshold)?;
    if let Some(name) = &args.save_baseline {
        keel_store::eval_results::check_baseline_name(name)
            .map_err(|e| CliError::usage(format!("--save-baseline: {e}")))?;
    }
    // The baseline is read before the run, so a typo costs nothing.
    let baseline = match &args.baseline {
        Some(name) => {
            let results = open_results(args.store.as_deref()).await?;
            match keel_eval::load_baseline(results.as_ref(), name).await {
                Ok(Some((run, report))) => Some((name.clone(), run, report)),
                Ok(None) => {
                    return Err(CliError::usage(format!(
                        "--baseline: no baseline named `{name}` in the store (keel eval baselines lists them; save one with --save-baseline {name})"
                    )));
                }
                Err(e) => return Err(CliError::failure(e.to_string())),
            }
        }
        None => None,
    };
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
    let out = args.out.clone().unwrap_or_else(|| {
        PathBuf::from(".keel/eval").join(format!(
            "{}-{}",
            suite.suite.name,
            chrono::Utc::now().format("%Y%m%d-%H%M%S")
        ))
    });
    // The setup hook's service runs for the whole evaluation; the agent reaches it
    // through RELEASE_SERVICE_URL in an application built for this run.
    let hook = match suite.suite.setup_hook.as_deref() {
        Some(eval_setup::RELEASE_SERVICE) => {
            let reports = out.join("risk-reports");
            let hook = ReleaseServiceHook::start(reports.clone()).await?;
            println!(
                "release service: {} (reports filed into {})",
                hook.base_url(),
                reports.display()
            );
            Some(Arc::new(hook))
        }
        _ => None,
    };
    let hooked_app = hook.as_ref().map(|hook| {
        let url = hook.base_url();
        crate::config::app_with_env(Arc::new(move |name: &str| {
            if name == "RELEASE_SERVICE_URL" {
                Some(url.clone())
            } else {
                app().env()(name)
            }
        }))
    });
    if judge.is_none() {
        let judged: Vec<&str> = suite
            .scenarios
            .iter()
            .filter(|s| {
                s.expect
                    .decision_quality
                    .as_ref()
                    .is_some_and(|dq| dq.rubric.is_some())
            })
            .map(|s| s.id.as_str())
            .collect();
        if !judged.is_empty() {
            eprintln!(
                "warning: {} scenario(s) have a rubric ({}), and no --judge-model was given: \
                 their rubrics are not scored (pass --judge-model PROVIDER:MODEL to score them)",
                judged.len(),
                judged.join(", ")
            );
        }
    }
    // The models to run: --model, else each of the suite's `models` (a matrix: one
    // report per model under <out>/<model>/ and a table comparing them), else the agent's.
    let models: Vec<Option<String>> = match (&args.model, suite.suite.models.as_slice()) {
        (Some(model), _) => vec![Some(model.clone())],
        (None, []) => vec![None],
        (None, listed) => listed.iter().cloned().map(Some).collect(),
    };
    if models.len() > 1 && (args.save_baseline.is_some() || args.baseline.is_some()) {
        return Err(CliError::usage(format!(
            "--save-baseline and --baseline compare one model's runs, and the suite lists {} \
             models: pick one with --model",
            models.len()
        )));
    }
    let runs = EvalRuns {
        args: &args,
        suite: &suite,
        app: hooked_app.as_ref().unwrap_or(app()),
        judge,
        hook: hook.clone(),
        baseline: baseline.as_ref(),
    };
    let mut outcomes = Vec::new();
    for model in &models {
        let dir = match (models.len(), model) {
            (1, _) | (_, None) => out.clone(),
            (_, Some(model)) => out.join(model_dir_name(model)),
        };
        if models.len() > 1 {
            println!(
                "\n== model {} ==",
                model.as_deref().unwrap_or("(the agent's)")
            );
        }
        outcomes.push((model.clone(), runs.run(model.clone(), &dir).await));
    }
    if let Some(hook) = hook.and_then(Arc::into_inner) {
        hook.shutdown().await;
    }
    if models.len() > 1 {
        print_matrix(&outcomes);
    }
    let mut code = 0;
    for (_, outcome) in outcomes {
        code = code.max(outcome?.0);
    }
    Ok(code)
}

/// What every model's run of a suite shares.
struct EvalRuns<'a> {
    args: &'a EvalRunArgs,
    suite: &'a Suite,
    app: &'a keel_app::App,
    judge: Option<Arc<dyn keel_eval::Judge>>,
    hook: Option<Arc<ReleaseServiceHook>>,
    baseline: Option<&'a (String, keel_store::EvalRunId, EvalReport)>,
}

impl EvalRuns<'_> {
    /// Runs the suite on `model` (None: the agent's), writes the reports into `out`, prints
    /// the table, saves the run; the exit code (0 all passed, 1 otherwise or regressed).
    async fn run(&self, model: Option<String>, out: &Path) -> Result<(u8, EvalReport), CliError> {
        let (args, suite) = (self.args, self.suite);
        let trials = args.trials.unwrap_or(suite.suite.trials).max(1);
        let total = (suite.scenarios.len() as u64).saturating_mul(u64::from(trials));
        let bar = indicatif::ProgressBar::new(total);
        bar.set_style(
            indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} trials  {msg}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        let progress_bar = bar.clone();
        let options = RunOptions {
            model: model.clone(),
            base_url: args.base_url.clone(),
            store: args.store.clone(),
            trials: args.trials,
            timeout: args
                .timeout
                .map_or(keel_eval::DEFAULT_TRIAL_TIMEOUT, Duration::from_secs),
            judge: self.judge.clone(),
            setup: self
                .hook
                .clone()
                .map(|hook| hook as Arc<dyn keel_eval::TrialSetup>),
            progress: Some(Arc::new(move |p: &Progress| match p.status {
                None => progress_bar.set_message(format!("{} #{}", p.scenario, p.trial)),
                Some(_) => progress_bar.inc(1),
            })),
        };
        let result = keel_eval::run_suite(self.app, suite, &options).await;
        bar.finish_and_clear();
        let mut report = result.map_err(eval_error)?;
        let comparison = self.baseline.map(|(_, _, baseline)| {
            let comparison = keel_eval::compare(&report, baseline, args.threshold);
            report.attach(&comparison);
            comparison
        });
        // The saved run remembers what it was compared with (the web UI's comparison).
        if let (Some((name, run, _)), Some(meta)) = (self.baseline, report.run.as_mut()) {
            meta.baseline = Some(keel_eval::BaselineRef {
                name: name.clone(),
                run_id: run.0,
                threshold: args.threshold,
            });
        }
        let html_options = keel_eval::HtmlOptions {
            trace_url: args.trace_url.clone(),
            subtitle: Some(run_subtitle(model.as_deref(), trials)),
        };
        let (json_path, html_path) = write_report(out, &report, &html_options)?;
        print_summary(&report);
        println!("report: {}", json_path.display());
        println!("html:   {}", html_path.display());
        save_run(args, model.as_deref(), &report).await?;
        let all_passed = report
            .scenarios
            .iter()
            .all(|s| s.status == ScenarioStatus::Passed);
        let regressed = match (&comparison, self.baseline) {
            (Some(comparison), Some((name, run, _))) => {
                println!("compared with baseline {name} (eval run {run}):");
                print_comparison(comparison);
                comparison.is_regression()
            }
            _ => false,
        };
        Ok((if all_passed && !regressed { 0 } else { 1 }, report))
    }
}

/// A directory name for a model spec (`openai:gpt-4.1` → `openai-gpt-4.1`).
fn model_dir_name(model: &str) -> String {
    model
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_') {
                c
            } else {
                '-'
            }
        })
        .collect()
}

/// One model's run of a suite: its exit code and report, or why it could not run.
type ModelOutcome = (Option<String>, Result<(u8, EvalReport), CliError>);

/// The model matrix: one line per model with its pass rate and average scores.
fn print_matrix(outcomes: &[ModelOutcome]) {
    println!("\nmodel matrix:");
    let width = outcomes
        .iter()
        .map(|(m, _)| m.as_deref().map_or(8, |m| m.chars().count()))
        .max()
        .unwrap_or(8)
        .max(5);
    println!(
        "{:<width$}  {:>9}  {:>6}  average scores",
        "model", "pass rate", "passed"
    );
    for (model, outcome) in outcomes {
        let model = model.as_deref().unwrap_or("(agent's)");
        match outcome {
            Ok((_, report)) => {
                let s = &report.summary;
                let averages: Vec<String> = s
                    .avg_scores
                    .iter()
                    .map(|(d, v)| format!("{}={v:.2}", d.as_str()))
                    .collect();
                println!(
                    "{model:<width$}  {:>9.2}  {:>6}  {}",
                    s.pass_rate,
                    format!("{}/{}", s.passed, s.total_scenarios),
                    averages.join(" ")
                );
            }
            Err(error) => println!("{model:<width$}  could not run: {}", error.message),
        }
    }
}

/// Saves the run in the store (and as baseline `--save-baseline`), saying where.
async fn save_run(
    args: &EvalRunArgs,
    model: Option<&str>,
    report: &EvalReport,
) -> Result<(), CliError> {
    let results = open_results(args.store.as_deref()).await?;
    let run = keel_eval::save_report(results.as_ref(), report, model)
        .await
        .map_err(|e| CliError::failure(format!("cannot save the run in the store: {e}")))?;
    println!(
        "saved:  eval run {run} ({})",
        store_label(args.store.as_deref())
    );
    if let Some(name) = &args.save_baseline {
        results
            .save_baseline(name, &run)
            .await
            .map_err(|e| CliError::failure(format!("cannot save baseline {name}: {e}")))?;
        println!("baseline {name} -> eval run {run}");
    }
    Ok(())
}

/// The eval results of the store `flag` (or the configured one) chooses.
async fn open_results(
    flag: Option<&str>,
) -> Result<Arc<dyn keel_store::EvalResultStore>, CliError> {
    Ok(app()
        .open_store(flag)
        .await
        .map_err(app_error)?
        .eval_results)
}

/// The store's URL for messages (password hidden).
fn store_label(flag: Option<&str>) -> String {
    keel_app::store::display_url(&app().store_url(flag).0)
}

fn check_threshold(threshold: f64) -> Result<(), CliError> {
    if (0.0..=1.0).contains(&threshold) {
        Ok(())
    } else {
        Err(CliError::usage("--threshold must be between 0 and 1"))
    }
}

fn eval_error(error: EvalError) -> CliError {
    match error {
        EvalError::Store(_) => CliError::failure(error.to_string()),
        other => CliError::usage(other.to_string()),
    }
}

/// The HTML report's line under the title: when, how many trials, which model.
fn run_subtitle(model: Option<&str>, trials: u32) -> String {
    let model = model.map_or(String::from("the agent's model"), |m| format!("model {m}"));
    format!(
        "{} · {trials} trial(s) per scenario · {model}",
        chrono::Utc::now().format("%Y-%m-%d %H:%M UTC")
    )
}

/// Writes report.json and report.html into `dir`; returns both paths.
fn write_report(
    dir: &Path,
    report: &EvalReport,
    html: &keel_eval::HtmlOptions,
) -> Result<(PathBuf, PathBuf), CliError> {
    std::fs::create_dir_all(dir)
        .map_err(|e| CliError::failure(format!("cannot create {}: {e}", dir.display())))?;
    let json_path = dir.join("report.json");
    let json = serde_json::to_string_pretty(report)
        .map_err(|e| CliError::failure(format!("cannot serialize the report: {e}")))?;
    write_file(&json_path, &json)?;
    let html_path = dir.join("report.html");
    write_file(&html_path, &keel_eval::render_html(report, html))?;
    Ok((json_path, html_path))
}

fn write_file(path: &Path, text: &str) -> Result<(), CliError> {
    std::fs::write(path, text)
        .map_err(|e| CliError::failure(format!("cannot write {}: {e}", path.display())))
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

/// A report named on the command line: an existing file, else a saved run id, else a
/// baseline name.
async fn resolve_report(
    which: &str,
    given: &str,
    store: Option<&str>,
) -> Result<EvalReport, CliError> {
    let path = Path::new(given);
    if path.is_file() {
        return read_report(path);
    }
    let results = open_results(store).await?;
    if let Ok(id) = given.parse::<keel_store::EvalRunId>() {
        return match keel_eval::load_run(results.as_ref(), id).await {
            Ok(Some(report)) => Ok(report),
            Ok(None) => Err(CliError::usage(format!(
                "{which} `{given}`: no such file, and no eval run {id} in {} (keel eval runs lists them)",
                store_label(store)
            ))),
            Err(e) => Err(CliError::failure(e.to_string())),
        };
    }
    match keel_eval::load_baseline(results.as_ref(), given).await {
        Ok(Some((_, report))) => Ok(report),
        Ok(None) => Err(CliError::usage(format!(
            "{which} `{given}` is not a file, a saved run id or a baseline name in {} (keel eval baselines lists them)",
            store_label(store)
        ))),
        Err(e) => Err(CliError::failure(e.to_string())),
    }
}

async fn eval_baselines(args: &EvalListArgs) -> Result<u8, CliError> {
    let results = open_results(args.store.as_deref()).await?;
    let baselines = results
        .baselines()
        .await
        .map_err(|e| CliError::failure(e.to_string()))?;
    if baselines.is_empty() {
        println!(
            "no baselines in {} (save one: keel eval run SUITE --save-baseline NAME)",
            store_label(args.store.as_deref())
        );
        return Ok(0);
    }
    println!(
        "{:<20}  {:>6}  {:<16}  {:<24}  {:>9}  {:>9}  saved",
        "baseline", "run", "suite", "model", "pass rate", "scenarios"
    );
    for b in &baselines {
        println!(
            "{:<20}  {:>6}  {:<16}  {:<24}  {:>9.2}  {:>9}  {}",
            b.name,
            b.run_id,
            b.suite,
            b.model.as_deref().unwrap_or("-"),
            b.pass_rate,
            b.total_scenarios,
            b.updated_at.format("%Y-%m-%d %H:%M:%S UTC")
        );
    }
    Ok(0)
}

async fn eval_runs(args: &EvalRunsArgs) -> Result<u8, CliError> {
    let results = open_results(args.store.as_deref()).await?;
    let runs = results
        .list_runs(args.suite.as_deref(), args.limit)
        .await
        .map_err(|e| CliError::failure(e.to_string()))?;
    if runs.is_empty() {
        println!("no eval runs in {}", store_label(args.store.as_deref()));
        return Ok(0);
    }
    println!(
        "{:>6}  {:<16}  {:<24}  {:>9}  {:>9}  {:>6}  saved",
        "run", "suite", "model", "pass rate", "scenarios", "trials"
    );
    for r in &runs {
        println!(
            "{:>6}  {:<16}  {:<24}  {:>9.2}  {:>9}  {:>6}  {}",
            r.id,
            r.suite,
            r.model.as_deref().unwrap_or("-"),
            r.pass_rate,
            r.total_scenarios,
            r.threads.len(),
            r.created_at.format("%Y-%m-%d %H:%M:%S UTC")
        );
    }
    Ok(0)
}

async fn eval_compare(args: &EvalCompareArgs) -> Result<u8, CliError> {
    check_threshold(args.threshold)?;
    let store = args.store.as_deref();
    let mut current = resolve_report("CURRENT", &args.current, store).await?;
    let baseline = resolve_report("BASELINE", &args.baseline, store).await?;
    let comparison = keel_eval::compare(&current, &baseline, args.threshold);
    print_comparison(&comparison);
    if let Some(path) = &args.html {
        current.attach(&comparison);
        let options = keel_eval::HtmlOptions {
            trace_url: None,
            subtitle: Some(format!(
                "{} compared with baseline {}",
                args.current, args.baseline
            )),
        };
        write_file(path, &keel_eval::render_html(&current, &options))?;
        println!("html: {}", path.display());
    }
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
