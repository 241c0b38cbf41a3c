//! [`AppError`]: why configuration could not be turned into a store, a model, tools or an
//! agent. Problems in a file carry its diagnostics (file, key, line, column, message);
//! every message names what to fix.

use keel_config::{ConfigError, Diagnostic, render_text};

/// Why the application layer could not do what was asked.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum AppError {
    /// keel.toml (or an agent file) could not be loaded.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// Problems located in a configuration or agent file (an unknown tool or model named
    /// by an agent, an invalid value found when building it).
    #[error("{}", render_text(.0).trim_end())]
    Located(Vec<Diagnostic>),
    /// `--agent` / `defaults.agent` names neither an `[agents.<name>]` table nor a file.
    #[error(
        "agent `{reference}` is neither an [agents.<name>] entry of keel.toml nor an agent file{hint}"
    )]
    UnknownAgent {
        /// The name or path given.
        reference: String,
        /// `; did you mean ...` or the known names.
        hint: String,
    },
    /// A tool requested outside any file (e.g. `--tool`) is not in the catalog.
    #[error("unknown tool{} {}; available: {available}", if .unknown.len() == 1 { "" } else { "s" }, .unknown.join(", "))]
    UnknownTool {
        /// The unknown names.
        unknown: Vec<String>,
        /// The catalog's names.
        available: String,
    },
    /// A model could not be built from its spec.
    #[error("model `{spec}`: {message}")]
    Model {
        /// The spec (`provider:model`, an alias, `local:NAME`).
        spec: String,
        /// Why.
        message: String,
    },
    /// A tool could not be built or registered.
    #[error("tool {name}: {message}")]
    Tool {
        /// The tool (or where it is declared, e.g. `keel.toml tools.http[0]`).
        name: String,
        /// Why.
        message: String,
    },
    /// The store could not be opened.
    #[error("cannot open store {url}: {message}")]
    Store {
        /// The URL, without password or query.
        url: String,
        /// Why.
        message: String,
    },
    /// A value given by the caller (not from a file) is invalid.
    #[error("{0}")]
    Invalid(String),
    /// A stored thread cannot be continued: it does not exist, its recorded recipe cannot
    /// be read or rebuilt, or its resumed run failed (see [`crate::resume`]).
    #[error("{0}")]
    Resume(String),
}

impl AppError {
    /// One error for every problem found: located diagnostics together, else the first
    /// other problem; `None` when there is none.
    pub(crate) fn merge(problems: Vec<AppError>) -> Option<AppError> {
        let mut located = Vec::new();
        let mut other = None;
        for problem in problems {
            match problem {
                AppError::Located(diagnostics) => located.extend(diagnostics),
                problem => {
                    other.get_or_insert(problem);
                }
            }
        }
        if located.is_empty() {
            other
        } else {
            Some(AppError::Located(located))
        }
    }

    /// A stable code: `config`, `located`, `unknown_agent`, `unknown_tool`, `model`,
    /// `tool`, `store`, `invalid` or `resume`.
    pub fn code(&self) -> &'static str {
        match self {
            Self::Config(_) => "config",
            Self::Located(_) => "located",
            Self::UnknownAgent { .. } => "unknown_agent",
            Self::UnknownTool { .. } => "unknown_tool",
            Self::Model { .. } => "model",
            Self::Tool { .. } => "tool",
            Self::Store { .. } => "store",
            Self::Invalid(_) => "invalid",
            Self::Resume(_) => "resume",
        }
    }

    /// Whether the same call may succeed later: the store failed, or a tool could not be
    /// reached or built (an MCP server down, an HTTP tool's endpoint) — not a problem of
    /// the configuration, the recipe or the caller's values.
    pub fn is_transient(&self) -> bool {
        matches!(self, Self::Store { .. } | Self::Tool { .. })
    }

    /// The diagnostics, when the problem is located in a file.
    pub fn diagnostics(&self) -> &[Diagnostic] {
        match self {
            Self::Located(diagnostics) => diagnostics,
            Self::Config(ConfigError::Invalid { diagnostics, .. }) => diagnostics,
            _ => &[],
        }
    }
}
