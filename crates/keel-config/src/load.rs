//! Loading keel.toml: `.env` first (never overriding set variables), then `./keel.toml`
//! or the `--config FILE` given. A missing default file means the defaults; a missing
//! explicit file is an error. Problems come back as [`ConfigError`] carrying every
//! diagnostic, not just the first.

use std::path::{Path, PathBuf};

use crate::analyze::analyze;
use crate::check::{load_blocking, semantic};
use crate::diagnostic::{Diagnostic, render_text};
use crate::env::{load_dotenv, process_env};
use crate::schema::KeelConfig;
use crate::source::Source;

/// The file read when no `--config` is given.
pub const DEFAULT_FILE: &str = "keel.toml";

/// A loaded configuration and where it came from.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadedConfig {
    /// The configuration.
    pub config: KeelConfig,
    /// The file read; `None` when there was no `./keel.toml` (defaults).
    pub path: Option<PathBuf>,
    /// The directory relative paths in the configuration are resolved against.
    pub base_dir: PathBuf,
    /// The `.env` file loaded, if any.
    pub dotenv: Option<PathBuf>,
    /// The file's name (as shown in diagnostics), path and text, for locating problems
    /// found later (an agent's unknown tool or model). Empty text when there was no file.
    pub source: Source,
    /// Warnings and non-fatal problems (e.g. an unset API-key variable, a missing agent
    /// file) — the same findings `keel config check` reports.
    pub warnings: Vec<Diagnostic>,
}

impl LoadedConfig {
    /// The defaults, as if `dir` had no keel.toml.
    pub fn defaults(dir: &Path) -> Self {
        Self {
            config: KeelConfig::default(),
            path: None,
            base_dir: dir.to_path_buf(),
            dotenv: None,
            source: Source::new(DEFAULT_FILE, None, ""),
            warnings: Vec::new(),
        }
    }
}

/// Why the configuration could not be loaded.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConfigError {
    /// `--config FILE` names a file that does not exist.
    #[error("configuration file {} does not exist (given with --config)", path.display())]
    NotFound {
        /// The path given.
        path: PathBuf,
    },
    /// The file or `.env` could not be read.
    #[error("cannot read {}: {message}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        message: String,
    },
    /// The file has problems; every one is listed.
    #[error("invalid configuration in {}:\n{}", path.display(), render_text(diagnostics).trim_end())]
    Invalid {
        /// The file.
        path: PathBuf,
        /// Every problem found.
        diagnostics: Vec<Diagnostic>,
    },
}

impl ConfigError {
    /// A stable code: `not_found`, `io` or `invalid`.
    pub fn code(&self) -> &'static str {
        match self {
            Self::NotFound { .. } => "not_found",
            Self::Io { .. } => "io",
            Self::Invalid { .. } => "invalid",
        }
    }
}

/// `(file, explicit)`: the file to read for `path` relative to `dir`.
pub(crate) fn resolve_path(dir: &Path, path: Option<&Path>) -> (PathBuf, bool) {
    match path {
        Some(p) if p.is_absolute() => (p.to_path_buf(), true),
        Some(p) => (dir.join(p), true),
        None => (dir.join(DEFAULT_FILE), false),
    }
}

impl KeelConfig {
    /// Loads `path` (`--config FILE`) or `./keel.toml` from the current directory, after
    /// loading `./.env`.
    pub fn load(path: Option<&Path>) -> Result<LoadedConfig, ConfigError> {
        let dir = std::env::current_dir().map_err(|e| ConfigError::Io {
            path: PathBuf::from("."),
            message: e.to_string(),
        })?;
        Self::load_in(&dir, path)
    }

    /// [`load`](Self::load) relative to `dir` instead of the current directory.
    pub fn load_in(dir: &Path, path: Option<&Path>) -> Result<LoadedConfig, ConfigError> {
        let dotenv = load_dotenv(dir).map_err(|message| ConfigError::Io {
            path: dir.join(".env"),
            message,
        })?;
        let (file, explicit) = resolve_path(dir, path);
        let text = match std::fs::read_to_string(&file) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                if explicit {
                    return Err(ConfigError::NotFound { path: file });
                }
                return Ok(LoadedConfig {
                    config: KeelConfig::default(),
                    path: None,
                    base_dir: dir.to_path_buf(),
                    dotenv,
                    source: Source::new(DEFAULT_FILE, None, ""),
                    warnings: Vec::new(),
                });
            }
            Err(e) => {
                return Err(ConfigError::Io {
                    path: file,
                    message: e.to_string(),
                });
            }
        };
        let base_dir = file
            .parent()
            .map_or_else(|| dir.to_path_buf(), Path::to_path_buf);
        let shown = path.map_or_else(|| DEFAULT_FILE.to_string(), |p| p.display().to_string());
        let (config, diagnostics) = Self::parse_with_env(&text, &shown, &base_dir, &process_env);
        match config {
            Some(config) if !load_blocking(&diagnostics) => Ok(LoadedConfig {
                config,
                source: Source::new(shown, Some(file.clone()), text),
                path: Some(file),
                base_dir,
                dotenv,
                warnings: diagnostics,
            }),
            _ => Err(ConfigError::Invalid {
                path: file,
                diagnostics,
            }),
        }
    }

    /// Parses configuration text with an explicit environment: the configuration (when
    /// the text is valid TOML) and every diagnostic. Relative files are resolved against
    /// `base_dir`; `file` is the name shown in diagnostics.
    ///
    /// ```
    /// use std::path::Path;
    /// use keel_config::KeelConfig;
    ///
    /// let text = "[store]\nurl = \"${DB:-memory:}\"\n\n[agents.helper]\ninstructions = \"Help.\"\n";
    /// let (config, diagnostics) = KeelConfig::parse_with_env(text, "keel.toml", Path::new("."), &|_| None);
    /// let config = config.expect("valid TOML");
    /// assert!(diagnostics.is_empty(), "{diagnostics:?}");
    /// assert_eq!(config.store.url, "memory:"); // `${DB:-memory:}` with DB unset
    /// assert!(config.agents.contains_key("helper"));
    /// ```
    pub fn parse_with_env(
        text: &str,
        file: &str,
        base_dir: &Path,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> (Option<KeelConfig>, Vec<Diagnostic>) {
        let analysis = analyze(text, file, env);
        let mut diagnostics = analysis.diagnostics;
        if let Some(config) = &analysis.config {
            let reporter = crate::analyze::Reporter::new(text, file, &analysis.spans);
            semantic(config, &reporter, base_dir, env, &mut diagnostics);
        }
        (analysis.config, diagnostics)
    }

    /// Parses configuration text, failing on the first blocking problems (all listed).
    /// `${VAR}` references are expanded from the process environment.
    pub fn from_toml_str(text: &str) -> Result<KeelConfig, ConfigError> {
        Self::loaded_from_str(text, Path::new("."), &process_env).map(|loaded| loaded.config)
    }

    /// Parses configuration text as if it were `base_dir/keel.toml` (relative paths resolve
    /// against `base_dir`), with an explicit environment; `.env` is not read.
    pub fn loaded_from_str(
        text: &str,
        base_dir: &Path,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<LoadedConfig, ConfigError> {
        let (config, diagnostics) = Self::parse_with_env(text, DEFAULT_FILE, base_dir, env);
        match config {
            Some(config) if !load_blocking(&diagnostics) => Ok(LoadedConfig {
                config,
                path: None,
                base_dir: base_dir.to_path_buf(),
                dotenv: None,
                source: Source::new(DEFAULT_FILE, None, text),
                warnings: diagnostics,
            }),
            _ => Err(ConfigError::Invalid {
                path: PathBuf::from(DEFAULT_FILE),
                diagnostics,
            }),
        }
    }
}
