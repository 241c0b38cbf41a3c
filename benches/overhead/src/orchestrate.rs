//! The orchestrator (`run`): starts the mock in its own process, spawns one measured
//! worker process per configuration and workload, and prints the table, the ratios and
//! the targets. All configurations run in the same invocation, so every ratio is against
//! a baseline measured on the same machine minutes apart.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::time::Instant;

use anyhow::{Context, bail};

use crate::keel::{self, StoreKind};
use crate::measure::median;
use crate::worker::{ClientKind, Report};

/// The orchestrator's arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    /// Fewer repetitions and W1 conversations (a smoke run; ratios are noisier).
    #[arg(long)]
    pub quick: bool,
    /// Exit 1 when a target fails.
    #[arg(long)]
    pub check: bool,
    /// Model name sent to the mock (it decides which tokenizer Keel loads for estimates).
    #[arg(long, default_value = "gpt-4o-mini")]
    pub model: String,
    /// Configurations to run (default: all).
    #[arg(long, value_delimiter = ',', value_enum)]
    pub configs: Vec<Config>,
    /// W1: sequential conversations per repetition.
    #[arg(long)]
    pub w1_conversations: Option<u32>,
    /// W1: repetitions (the median is reported).
    #[arg(long)]
    pub reps: Option<u32>,
    /// W2: concurrent conversations.
    #[arg(long, default_value_t = 500)]
    pub w2_conversations: u32,
    /// W2: tool turns per conversation (model requests = tools + 1).
    #[arg(long, default_value_t = 5)]
    pub w2_tools: u32,
    /// W2: mock latency per model request.
    #[arg(long, default_value_t = 50)]
    pub w2_latency_ms: u64,
    /// Cold start: spawns measured (after one discarded).
    #[arg(long)]
    pub cold_reps: Option<u32>,
    /// W2: repetitions, each in a fresh process (medians are reported).
    #[arg(long)]
    pub w2_reps: Option<u32>,
}

/// A client configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Config {
    /// reqwest + tokio, no framework, sending the request a hand-written client would: a
    /// one-line system prompt and the calculator's definition alone.
    BareMinimal,
    /// reqwest + tokio, no framework, sending Keel's own request (its system prompt and
    /// tool list), so the difference to Keel is the framework's work alone.
    Bare,
    /// Keel with `MemoryStore`.
    KeelMemory,
    /// Keel with `SqliteStore` on a temp file.
    KeelSqlite,
    /// Keel with `PostgresStore` in a fresh schema.
    KeelPostgres,
}

impl Config {
    const ALL: [Config; 5] = [
        Config::BareMinimal,
        Config::Bare,
        Config::KeelMemory,
        Config::KeelSqlite,
        Config::KeelPostgres,
    ];

    fn name(self) -> &'static str {
        match self {
            Config::BareMinimal => "bare-minimal",
            Config::Bare => "bare",
            Config::KeelMemory => "keel-memory",
            Config::KeelSqlite => "keel-sqlite",
            Config::KeelPostgres => "keel-postgres",
        }
    }

    fn worker_args(self) -> Vec<String> {
        let (client, store) = match self {
            Config::BareMinimal | Config::Bare => (ClientKind::Bare, StoreKind::Memory),
            Config::KeelMemory => (ClientKind::Keel, StoreKind::Memory),
            Config::KeelSqlite => (ClientKind::Keel, StoreKind::Sqlite),
            Config::KeelPostgres => (ClientKind::Keel, StoreKind::Postgres),
        };
        let client = match client {
            ClientKind::Bare => "bare",
            ClientKind::Keel => "keel",
        };
        let store = match store {
            StoreKind::Memory => "memory",
            StoreKind::Sqlite => "sqlite",
            StoreKind::Postgres => "postgres",
        };
        vec![
            "--client".into(),
            client.into(),
            "--store".into(),
            store.into(),
        ]
    }
}

/// One configuration's figures (`None`: not measured or skipped).
#[derive(Debug, Default, Clone)]
struct Row {
    skipped: Option<String>,
    w1_cpu_ms: Option<f64>,
    w2_wall_s: Option<f64>,
    w2_cpu_s: Option<f64>,
    w2_peak_rss_mb: Option<f64>,
    w2_rss_before_mb: Option<f64>,
    cold_ms: Option<f64>,
}

/// The mock process; stopped (stdin closed, then waited for) on drop.
struct Mock {
    child: Child,
    base_url: String,
}

impl Mock {
    fn start(exe: &std::path::Path) -> anyhow::Result<Self> {
        let mut child = Command::new(exe)
            .args(["mock", "--port", "0"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .context("spawning the mock process")?;
        let stdout = child.stdout.take().context("mock stdout")?;
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line)?;
        let Some(port) = line.trim().strip_prefix("mock listening on ") else {
            let _ = child.kill();
            bail!("the mock did not start (it printed {line:?})");
        };
        let base_url = format!("http://127.0.0.1:{port}");
        Ok(Self { child, base_url })
    }
}

impl Drop for Mock {
    fn drop(&mut self) {
        // Closing stdin stops the mock; kill it if it is still there after that.
        drop(self.child.stdin.take());
        let deadline = Instant::now() + std::time::Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct Plan {
    exe: std::path::PathBuf,
    base_url: String,
    model: String,
    template: std::path::PathBuf,
    /// The hand-written client's request (`bare-minimal`).
    minimal_template: std::path::PathBuf,
}

impl Plan {
    /// Spawns a worker; returns its report and the time from spawn to its report line.
    fn worker(&self, config: Config, extra: &[String]) -> anyhow::Result<(Report, f64)> {
        let started = Instant::now();
        let template = match config {
            Config::BareMinimal => &self.minimal_template,
            _ => &self.template,
        };
        let mut child = Command::new(&self.exe)
            .arg("worker")
            .args(config.worker_args())
            .args(["--base-url", &self.base_url, "--model", &self.model])
            .arg("--template")
            .arg(template)
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .context("spawning a worker")?;
        let stdout = child.stdout.take().context("worker stdout")?;
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line)?;
        let elapsed_ms = started.elapsed().as_secs_f64() * 1000.0;
        let status = child.wait()?;
        if !status.success() || line.trim().is_empty() {
            bail!("the {} worker failed ({status})", config.name());
        }
        let report: Report = serde_json::from_str(line.trim())
            .with_context(|| format!("parsing the worker's report {line:?}"))?;
        Ok((report, elapsed_ms))
    }
}

fn say(text: &str) {
    let mut err = std::io::stderr().lock();
    let _ = writeln!(err, "bench: {text}");
}

/// Runs every configuration and prints the results; `Ok(false)` when `--check` found a FAIL.
pub fn run(args: RunArgs) -> anyhow::Result<bool> {
    let exe = std::env::current_exe().context("locating the benchmark binary")?;
    let configs = if args.configs.is_empty() {
        Config::ALL.to_vec()
    } else {
        args.configs.clone()
    };
    let w1_conversations = args
        .w1_conversations
        .unwrap_or(if args.quick { 100 } else { 300 });
    let reps = args.reps.unwrap_or(if args.quick { 3 } else { 5 });
    let cold_reps = args.cold_reps.unwrap_or(if args.quick { 3 } else { 7 });
    let w2_reps = args.w2_reps.unwrap_or(if args.quick { 1 } else { 3 });
    let load_before = load_average();

    let mock = Mock::start(&exe)?;
    say(&format!("mock LLM (own process) at {}", mock.base_url));
    let scratch = tempfile::tempdir()?;
    let template = scratch.path().join("template.json");
    std::fs::write(
        &template,
        serde_json::to_vec(&keel::request_template(&args.model, &mock.base_url)?)?,
    )?;
    let minimal_template = scratch.path().join("minimal-template.json");
    std::fs::write(
        &minimal_template,
        serde_json::to_vec(&crate::bare::minimal_template(&args.model))?,
    )?;
    let plan = Plan {
        exe,
        base_url: mock.base_url.clone(),
        model: args.model.clone(),
        template,
        minimal_template,
    };

    let counts = Counts {
        w1_conversations,
        reps,
        cold_reps,
        w2_reps,
    };
    let rows = measure_all(&plan, &configs, &args, &counts)?;
    drop(mock);

    let table = render(&rows, &args, &counts);
    println!("{table}");
    println!(
        "load average (1 min) before: {load_before}, after: {} — other work on the machine inflates wall times and cold starts",
        load_average()
    );
    let failed = table.lines().any(|l| l.starts_with("FAIL"));
    Ok(!(args.check && failed))
}

/// How many times each thing is measured.
#[derive(Clone, Copy)]
struct Counts {
    w1_conversations: u32,
    reps: u32,
    cold_reps: u32,
    w2_reps: u32,
}

/// The 1-minute load average from `/proc/loadavg`, as text.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|text| text.split_whitespace().next().map(str::to_owned))
        .unwrap_or_else(|| "unknown".to_owned())
}

/// Measures every configuration. Repetitions are interleaved — round 1 of every
/// configuration, then round 2, … — so a change of load on the machine during the run
/// spreads over all configurations instead of biasing the ratios.
fn measure_all(
    plan: &Plan,
    configs: &[Config],
    args: &RunArgs,
    counts: &Counts,
) -> anyhow::Result<Vec<(Config, Row)>> {
    let Counts {
        w1_conversations,
        reps,
        cold_reps,
        w2_reps,
    } = *counts;
    let cold = ["--workload".to_owned(), "cold".to_owned()];
    let w1 = [
        "--workload".to_owned(),
        "w1".to_owned(),
        "--conversations".to_owned(),
        w1_conversations.to_string(),
        "--reps".to_owned(),
        "1".to_owned(),
        "--tools".to_owned(),
        "1".to_owned(),
        "--warmup".to_owned(),
        "30".to_owned(),
    ];
    let w2 = [
        "--workload".to_owned(),
        "w2".to_owned(),
        "--conversations".to_owned(),
        args.w2_conversations.to_string(),
        "--tools".to_owned(),
        args.w2_tools.to_string(),
        "--latency-ms".to_owned(),
        args.w2_latency_ms.to_string(),
        "--warmup".to_owned(),
        "10".to_owned(),
    ];

    // One discarded cold start per configuration: warms the page cache, finds skips.
    let mut live = Vec::new();
    let mut rows = Vec::new();
    for &config in configs {
        let (first, _) = plan.worker(config, &cold)?;
        match first.skipped {
            Some(reason) => {
                say(&format!("{}: SKIPPED — {reason}", config.name()));
                rows.push((
                    config,
                    Row {
                        skipped: Some(reason),
                        ..Row::default()
                    },
                ));
            }
            None => live.push(config),
        }
    }

    let mut colds: Vec<Vec<f64>> = vec![Vec::new(); live.len()];
    let mut w1s: Vec<Vec<f64>> = vec![Vec::new(); live.len()];
    let mut w2s: Vec<Vec<Report>> = vec![Vec::new(); live.len()];
    say(&format!("cold start: {cold_reps} rounds"));
    for _ in 0..cold_reps {
        for (config, samples) in live.iter().zip(colds.iter_mut()) {
            samples.push(plan.worker(*config, &cold)?.1);
        }
    }
    say(&format!(
        "W1: {reps} rounds of {w1_conversations} sequential one-tool conversations"
    ));
    for _ in 0..reps {
        for (config, samples) in live.iter().zip(w1s.iter_mut()) {
            samples.extend(plan.worker(*config, &w1)?.0.cpu_ms_per_conv);
        }
    }
    say(&format!(
        "W2: {w2_reps} rounds of {} concurrent conversations × {} requests at {} ms",
        args.w2_conversations,
        args.w2_tools + 1,
        args.w2_latency_ms
    ));
    for _ in 0..w2_reps.max(1) {
        for (config, samples) in live.iter().zip(w2s.iter_mut()) {
            samples.push(plan.worker(*config, &w2)?.0);
        }
    }

    for (index, config) in live.iter().enumerate() {
        let reports = w2s.get(index).map(Vec::as_slice).unwrap_or_default();
        let med = |f: fn(&Report) -> f64| median(&reports.iter().map(f).collect::<Vec<_>>());
        rows.push((
            *config,
            Row {
                skipped: None,
                w1_cpu_ms: w1s.get(index).and_then(|v| median(v)),
                w2_wall_s: med(|r| r.wall_s),
                w2_cpu_s: med(|r| r.cpu_s),
                w2_peak_rss_mb: med(|r| r.peak_rss_mb),
                w2_rss_before_mb: med(|r| r.rss_before_mb),
                cold_ms: colds.get(index).and_then(|v| median(v)),
            },
        ));
    }
    rows.sort_by_key(|(config, _)| configs.iter().position(|c| c == config));
    Ok(rows)
}

fn cell(value: Option<f64>, decimals: usize) -> String {
    value.map_or_else(|| "–".to_owned(), |v| format!("{v:.decimals$}"))
}

fn ratio(value: Option<f64>, base: Option<f64>) -> Option<f64> {
    match (value, base) {
        (Some(v), Some(b)) if b > 0.0 => Some(v / b),
        _ => None,
    }
}

fn target(label: &str, value: Option<f64>, limit: f64, unit: &str) -> String {
    match value {
        None => format!("SKIP  {label} (not measured)"),
        Some(v) if v <= limit => format!("PASS  {label}: {v:.2}{unit} ≤ {limit}{unit}"),
        Some(v) => format!("FAIL  {label}: {v:.2}{unit} > {limit}{unit}"),
    }
}

fn render(rows: &[(Config, Row)], args: &RunArgs, counts: &Counts) -> String {
    let Counts {
        w1_conversations,
        reps,
        cold_reps,
        w2_reps,
    } = *counts;
    let get = |c: Config| rows.iter().find(|(k, _)| *k == c).map(|(_, r)| r.clone());
    let minimal = get(Config::BareMinimal).unwrap_or_default();
    let bare = get(Config::Bare).unwrap_or_default();
    let memory = get(Config::KeelMemory).unwrap_or_default();
    let sqlite = get(Config::KeelSqlite).unwrap_or_default();
    let postgres = get(Config::KeelPostgres).unwrap_or_default();
    let mut out = String::new();
    out.push_str(&format!(
        "\nW1: {reps} × {w1_conversations} sequential one-tool conversations (median). \
         W2: {} concurrent conversations × {} model requests at {} ms mock latency (ideal wall {:.2} s), \
         median of {w2_reps} processes. Cold start: median of {cold_reps} spawns. Model name: {}.\n\n",
        args.w2_conversations,
        args.w2_tools + 1,
        args.w2_latency_ms,
        f64::from(args.w2_tools + 1) * args.w2_latency_ms as f64 / 1000.0,
        args.model,
    ));
    out.push_str("| config | W1 CPU ms/conv | ×bare-minimal | ×bare | W2 wall s | ×memory | W2 CPU s | W2 peak RSS MB | cold start ms |\n");
    out.push_str("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    for (config, row) in rows {
        if let Some(reason) = &row.skipped {
            out.push_str(&format!(
                "| {} | skipped: {reason} | | | | | | | |\n",
                config.name()
            ));
            continue;
        }
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            config.name(),
            cell(row.w1_cpu_ms, 3),
            cell(ratio(row.w1_cpu_ms, minimal.w1_cpu_ms), 2),
            cell(ratio(row.w1_cpu_ms, bare.w1_cpu_ms), 2),
            cell(row.w2_wall_s, 3),
            cell(ratio(row.w2_wall_s, memory.w2_wall_s), 2),
            cell(row.w2_cpu_s, 3),
            cell(row.w2_peak_rss_mb, 1),
            cell(row.cold_ms, 1),
        ));
    }
    out.push('\n');
    for (config, row) in rows {
        if let (Some(before), Some(peak)) = (row.w2_rss_before_mb, row.w2_peak_rss_mb) {
            let per_conv_kib = (peak - before) * 1024.0 / f64::from(args.w2_conversations.max(1));
            out.push_str(&format!(
                "{}: RSS {before:.1} MB before W2, peak {peak:.1} MB: ~{per_conv_kib:.0} KiB per concurrent conversation\n",
                config.name()
            ));
        }
    }
    out.push('\n');
    let targets = [
        target(
            "Memory-store W1 CPU ≤ 2.5× the minimal bare loop",
            ratio(memory.w1_cpu_ms, minimal.w1_cpu_ms),
            2.5,
            "×",
        ),
        target(
            "SQLite W1 CPU ≤ 3× the minimal bare loop",
            ratio(sqlite.w1_cpu_ms, minimal.w1_cpu_ms),
            3.0,
            "×",
        ),
        target(
            "SQLite W1 CPU ≤ 1.25× memory",
            ratio(sqlite.w1_cpu_ms, memory.w1_cpu_ms),
            1.25,
            "×",
        ),
        target(
            "SQLite W2 wall ≤ 1.2× memory",
            ratio(sqlite.w2_wall_s, memory.w2_wall_s),
            1.2,
            "×",
        ),
        target(
            "Postgres W2 wall ≤ 1.5× memory",
            ratio(postgres.w2_wall_s, memory.w2_wall_s),
            1.5,
            "×",
        ),
        target(
            "W2 peak RSS with the memory store ≤ 50 MB",
            memory.w2_peak_rss_mb,
            50.0,
            " MB",
        ),
    ];
    for line in targets {
        out.push_str(&line);
        out.push('\n');
    }
    out
}
