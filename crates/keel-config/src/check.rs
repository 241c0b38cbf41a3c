//! `keel config check`: everything [`crate::analyze`] finds (syntax, unknown keys with the
//! nearest valid key, invalid values, `${VAR}` references to unset variables) plus checks
//! serde cannot make: model specs and aliases, store URLs, telemetry values, the API-key
//! variable of the default model's provider, and files the configuration points at.

use std::path::{Path, PathBuf};

use keel_telemetry::TelemetryError;

use crate::analyze::{Analysis, Reporter, Seg, analyze};
use crate::diagnostic::{Diagnostic, DiagnosticCode, Severity, nearest};
use crate::env::{load_dotenv, process_env};
use crate::load::{ConfigError, DEFAULT_FILE, resolve_path};
use crate::schema::{BUILTIN_PROVIDERS, KeelConfig, RetrySettings, split_spec};

/// Checks the configuration `keel` would use from the current directory: `path`
/// (`--config FILE`) or `./keel.toml`. `.env` is loaded first. Reports every problem.
pub fn check(path: Option<&Path>) -> Vec<Diagnostic> {
    let dir = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("."));
    check_in(&dir, path)
}

/// [`check`] relative to `dir` instead of the current directory.
pub fn check_in(dir: &Path, path: Option<&Path>) -> Vec<Diagnostic> {
    let mut diagnostics = Vec::new();
    if let Err(message) = load_dotenv(dir) {
        diagnostics.push(plain(".env", DiagnosticCode::Io, message));
    }
    let (file, explicit) = resolve_path(dir, path);
    let shown = path.map_or_else(|| DEFAULT_FILE.to_string(), |p| p.display().to_string());
    let text = match std::fs::read_to_string(&file) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !explicit => {
            // No keel.toml: the defaults, checked like an empty file.
            String::new()
        }
        Err(e) => {
            diagnostics.push(plain(
                &shown,
                DiagnosticCode::Io,
                format!("cannot read {}: {e}", file.display()),
            ));
            return diagnostics;
        }
    };
    let base = file
        .parent()
        .map_or_else(|| dir.to_path_buf(), Path::to_path_buf);
    diagnostics.extend(check_str(&text, &shown, &base, &process_env));
    diagnostics
}

/// Checks configuration text. `file` is the name shown in diagnostics, `base_dir` the
/// directory relative paths are resolved against, `env` the environment lookup.
pub fn check_str(
    text: &str,
    file: &str,
    base_dir: &Path,
    env: &dyn Fn(&str) -> Option<String>,
) -> Vec<Diagnostic> {
    let Analysis {
        config,
        mut diagnostics,
        spans,
    } = analyze(text, file, env);
    if let Some(config) = config {
        let reporter = Reporter::new(text, file, &spans);
        semantic(&config, &reporter, base_dir, env, &mut diagnostics);
    }
    diagnostics.sort_by_key(|d| (d.line.unwrap_or(usize::MAX), d.column.unwrap_or(0)));
    diagnostics
}

fn plain(file: &str, code: DiagnosticCode, message: String) -> Diagnostic {
    Diagnostic {
        severity: Severity::Error,
        code,
        file: file.to_string(),
        key: None,
        line: None,
        column: None,
        message,
    }
}

fn keys(parts: &[&str]) -> Vec<Seg> {
    parts.iter().map(|p| Seg::Key((*p).to_string())).collect()
}

/// Checks that need the typed configuration.
pub(crate) fn semantic(
    config: &KeelConfig,
    reporter: &Reporter<'_>,
    base_dir: &Path,
    env: &dyn Fn(&str) -> Option<String>,
    out: &mut Vec<Diagnostic>,
) {
    let error = |code, path: Vec<Seg>, message: String| {
        reporter.at(Severity::Error, code, &path, false, message)
    };
    // Model specs.
    let mut specs: Vec<(Vec<Seg>, &str)> = Vec::new();
    if let Some(model) = &config.defaults.model {
        specs.push((keys(&["defaults", "model"]), model));
    }
    for (name, agent) in &config.agents {
        if let Some(model) = &agent.model {
            specs.push((keys(&["agents", name, "model"]), model));
        }
    }
    for (path, spec) in specs {
        if let Some(d) = check_spec(config, spec, true, &path, reporter) {
            out.push(d);
        }
    }
    for (alias, model) in &config.models {
        let path = keys(&["models", alias, "model"]);
        if model.model.trim().is_empty() {
            out.push(error(
                DiagnosticCode::MissingKey,
                keys(&["models", alias]),
                format!("`models.{alias}` needs `model = \"provider:model\"`"),
            ));
        } else if let Some(d) = check_spec(config, &model.model, false, &path, reporter) {
            out.push(d);
        }
    }
    for (alias, model) in &config.models {
        if let Some(retry) = &model.retry {
            out.extend(
                retry_problems(retry, &["models", alias, "retry"])
                    .into_iter()
                    .map(|(path, message)| error(DiagnosticCode::InvalidValue, path, message)),
            );
        }
        if model.call_timeout_ms == Some(0) {
            out.push(error(
                DiagnosticCode::InvalidValue,
                keys(&["models", alias, "call_timeout_ms"]),
                format!("`models.{alias}.call_timeout_ms` must be at least 1 (milliseconds)"),
            ));
        }
    }
    for (name, provider) in &config.providers {
        if let Some(retry) = &provider.retry {
            out.extend(
                retry_problems(retry, &["providers", name, "retry"])
                    .into_iter()
                    .map(|(path, message)| error(DiagnosticCode::InvalidValue, path, message)),
            );
        }
        let builtin = BUILTIN_PROVIDERS.contains(&name.as_str());
        match provider.kind.as_deref() {
            Some(kind) if !BUILTIN_PROVIDERS.contains(&kind) => out.push(error(
                DiagnosticCode::InvalidValue,
                keys(&["providers", name, "kind"]),
                format!("invalid value `{kind}` for `providers.{name}.kind`; valid values: {}{}", BUILTIN_PROVIDERS.join(", "), did_you_mean(kind, &BUILTIN_PROVIDERS)),
            )),
            None if !builtin => out.push(error(
                DiagnosticCode::MissingKey,
                keys(&["providers", name]),
                format!("`{name}` is not a built-in provider ({}): set `kind` to the protocol it speaks{}", BUILTIN_PROVIDERS.join(", "), did_you_mean(name, &BUILTIN_PROVIDERS)),
            )),
            _ => {}
        }
        if let Some(url) = &provider.base_url
            && !(url.starts_with("http://") || url.starts_with("https://"))
        {
            out.push(error(
                DiagnosticCode::InvalidValue,
                keys(&["providers", name, "base_url"]),
                // The value itself is not echoed: a URL may carry a password or token.
                format!(
                    "`providers.{name}.base_url` (beginning `{}`) must start with http:// or https://",
                    url.chars().take_while(|c| *c != ':' && *c != '@').take(16).collect::<String>()
                ),
            ));
        }
    }
    // Server.
    for (path, message) in config.server.problems() {
        // `server.cors_origins.N` is an array index; every other part a key.
        let in_array = path.get(1).is_some_and(|p| p == "cors_origins");
        let path = path
            .into_iter()
            .enumerate()
            .map(|(i, part)| match part.parse::<usize>() {
                Ok(index) if in_array && i == 2 => Seg::Index(index),
                _ => Seg::Key(part),
            })
            .collect();
        out.push(error(DiagnosticCode::InvalidValue, path, message));
    }
    // Tenants' credentials naming the server's own secrets.
    for (path, message) in crate::server::credential_problems(config) {
        let path = path.into_iter().map(Seg::Key).collect();
        out.push(error(DiagnosticCode::InvalidValue, path, message));
    }
    // A2A agents (`a2a.agents.N....`: the index is an array position).
    for (path, message) in config.a2a.problems() {
        let in_origins = path.get(3).is_some_and(|p| p == "interface_origins");
        let path = path
            .into_iter()
            .enumerate()
            .map(|(i, part)| match part.parse::<usize>() {
                Ok(index) if i == 2 || (i == 4 && in_origins) => Seg::Index(index),
                _ => Seg::Key(part),
            })
            .collect();
        out.push(error(DiagnosticCode::InvalidValue, path, message));
    }
    // `[outbound] allow_private` (`outbound.allow_private.N`: an array position).
    for (path, message) in config.outbound.problems() {
        let path = path
            .into_iter()
            .enumerate()
            .map(|(i, part)| match part.parse::<usize>() {
                Ok(index) if i == 2 => Seg::Index(index),
                _ => Seg::Key(part),
            })
            .collect();
        out.push(error(DiagnosticCode::InvalidValue, path, message));
    }
    // Agents answered by a remote A2A agent (`a2a = "<[[a2a.agents]] name>"`).
    for (name, agent) in &config.agents {
        let path = |key: &str| format!("agents.{name}.{key}");
        for (key, message) in agent.a2a_problems(&config.a2a, &path) {
            out.push(error(
                DiagnosticCode::InvalidValue,
                keys(&["agents", name, key]),
                message,
            ));
        }
    }
    // Store.
    if let Some(message) = store_url_problem(&config.store.url) {
        out.push(error(
            DiagnosticCode::InvalidValue,
            keys(&["store", "url"]),
            message,
        ));
    }
    // Telemetry (its own validation names the field).
    if let Err(TelemetryError::Config { field, message }) = config.telemetry.validate() {
        let path: Vec<Seg> = field.split('.').map(|s| Seg::Key(s.to_string())).collect();
        out.push(error(
            DiagnosticCode::InvalidValue,
            path,
            format!("invalid value for `{field}`: {message}"),
        ));
    } else if let Err(e) = config.telemetry.validate() {
        out.push(error(
            DiagnosticCode::InvalidValue,
            keys(&["telemetry"]),
            format!("invalid [telemetry]: {e}"),
        ));
    }
    // The default model's API key.
    if let Some(spec) = &config.defaults.model
        && let Some(resolved) = config.resolve_model(spec)
        && let Some(var) = config.api_key_env(&resolved.provider)
        && env(&var).is_none_or(|v| v.trim().is_empty())
    {
        let (path, what) = match config
            .providers
            .get(&resolved.provider)
            .and_then(|p| p.api_key_env.as_ref())
        {
            Some(_) => (
                keys(&["providers", &resolved.provider, "api_key_env"]),
                "configured",
            ),
            None => (keys(&["defaults", "model"]), "usual"),
        };
        out.push(error(
            DiagnosticCode::MissingApiKey,
            path,
            format!(
                "environment variable `{var}` (the {what} API key of provider `{}`, used by the default model `{spec}`) is not set; export it or add it to .env",
                resolved.provider
            ),
        ));
    }
    // Files.
    for (name, agent) in &config.agents {
        for (key, file) in [
            ("file", &agent.file),
            ("instructions_file", &agent.instructions_file),
        ] {
            if let Some(file) = file
                && !base_dir.join(file).is_file()
            {
                out.push(error(
                    DiagnosticCode::MissingFile,
                    keys(&["agents", name, key]),
                    format!("`agents.{name}.{key}`: file `{}` does not exist (paths are relative to the directory of keel.toml)", file.display()),
                ));
            }
        }
    }
    // Agent files: the same diagnostics as keel.toml, positions in the agent file.
    for agent in config.agents.values() {
        if let Some(file) = &agent.file
            && base_dir.join(file).is_file()
        {
            let shown = file.display().to_string();
            if let Err(ConfigError::Invalid { diagnostics, .. }) =
                crate::agent::AgentDefinition::load(&base_dir.join(file), &shown)
            {
                out.extend(diagnostics);
            }
        }
    }
    if let Some(agent) = &config.defaults.agent
        && !config.agents.contains_key(agent)
        && !base_dir.join(agent).is_file()
    {
        let names: Vec<&str> = config.agents.keys().map(String::as_str).collect();
        out.push(error(
            DiagnosticCode::MissingFile,
            keys(&["defaults", "agent"]),
            format!(
                "`defaults.agent` = `{agent}` is neither an [agents.<name>] entry nor an existing file{}",
                did_you_mean(agent, &names)
            ),
        ));
    }
    // Workflows: kinds, keys and the agents they name.
    for (name, workflow) in &config.workflows {
        for problem in crate::workflow::problems(config, name, workflow, base_dir) {
            let path = crate::source::parse_key(&problem.key);
            out.push(error(problem.code, path, problem.message));
        }
    }
}

/// Values of a retry section no retry loop can use, with their key paths.
fn retry_problems(retry: &RetrySettings, at: &[&str]) -> Vec<(Vec<Seg>, String)> {
    let mut problems = Vec::new();
    let key = |field: &str| {
        let mut path: Vec<&str> = at.to_vec();
        path.push(field);
        (keys(&path), path.join("."))
    };
    if retry.max_attempts == Some(0) {
        let (path, shown) = key("max_attempts");
        problems.push((
            path,
            format!("`{shown}` must be at least 1 (1 = no retries)"),
        ));
    }
    if let Some(factor) = retry.factor
        && !(factor.is_finite() && factor >= 1.0)
    {
        let (path, shown) = key("factor");
        problems.push((
            path,
            format!("`{shown}` = {factor} must be a number of at least 1.0"),
        ));
    }
    if let (Some(initial), Some(max)) = (retry.initial_delay_ms, retry.max_delay_ms)
        && initial > max
    {
        let (path, shown) = key("initial_delay_ms");
        problems.push((
            path,
            format!("`{shown}` = {initial} is larger than `max_delay_ms` = {max}"),
        ));
    }
    problems
}

fn did_you_mean(given: &str, candidates: &[&str]) -> String {
    nearest(given, candidates.iter().copied())
        .map_or_else(String::new, |best| format!("; did you mean `{best}`?"))
}

fn check_spec(
    config: &KeelConfig,
    spec: &str,
    aliases_allowed: bool,
    path: &[Seg],
    reporter: &Reporter<'_>,
) -> Option<Diagnostic> {
    if aliases_allowed && config.models.contains_key(spec) {
        return None;
    }
    let key = crate::analyze::path_string(path);
    let Some((provider, _)) = split_spec(spec) else {
        let aliases: Vec<&str> = config.models.keys().map(String::as_str).collect();
        let hint = if aliases_allowed {
            did_you_mean(spec, &aliases)
        } else {
            String::new()
        };
        return Some(reporter.at(
            Severity::Error,
            DiagnosticCode::InvalidValue,
            path,
            false,
            format!("`{key}` = `{spec}` is not `provider:model` (e.g. `anthropic:claude-sonnet-4-5`){}{hint}", if aliases_allowed { " nor a [models] alias" } else { "" }),
        ));
    };
    let known = BUILTIN_PROVIDERS.contains(&provider) || config.providers.contains_key(provider);
    (!known).then(|| {
        let mut names: Vec<&str> = BUILTIN_PROVIDERS.to_vec();
        names.extend(config.providers.keys().map(String::as_str));
        reporter.at(
            Severity::Error,
            DiagnosticCode::UnknownReference,
            path,
            false,
            format!(
                "`{key}`: unknown provider `{provider}` (known: {}){}",
                names.join(", "),
                did_you_mean(provider, &names)
            ),
        )
    })
}

/// Why a store URL cannot work, if it cannot (mirrors keel-store's `open`).
pub fn store_url_problem(url: &str) -> Option<String> {
    let url = url.trim();
    if url.is_empty() {
        return Some(
            "`store.url` is empty: use sqlite://PATH, a path, postgres://... or memory:".into(),
        );
    }
    if url == "memory"
        || url == "memory:"
        || url.starts_with("postgres://")
        || url.starts_with("postgresql://")
    {
        return None;
    }
    if let Some(rest) = url
        .strip_prefix("sqlite://")
        .or_else(|| url.strip_prefix("sqlite:"))
    {
        let path = rest.split('?').next().unwrap_or_default();
        return (path.is_empty() || path == ":memory:").then(|| {
            format!("`store.url` = `{url}` names no SQLite file; give a path, or use memory:")
        });
    }
    if let Some((scheme, _)) = url.split_once("://") {
        return Some(format!(
            "`store.url`: unsupported scheme `{scheme}`; use sqlite://PATH, a path, postgres://... or memory:"
        ));
    }
    None
}

/// Whether these diagnostics stop a configuration from loading (the rule `load` applies:
/// the others are warnings then, because a flag may make them irrelevant).
pub fn load_blocking(diagnostics: &[Diagnostic]) -> bool {
    diagnostics.iter().any(|d| {
        d.is_error()
            && matches!(
                d.code,
                DiagnosticCode::Syntax
                    | DiagnosticCode::UnknownKey
                    | DiagnosticCode::InvalidValue
                    | DiagnosticCode::MissingKey
                    | DiagnosticCode::MissingEnv
                    | DiagnosticCode::Io
            )
    })
}
