//! Finding an agent's definition: a keel.toml `[agents.<name>]` table (with the agent file
//! its `file` names under it), or a standalone agent file. The result remembers which file
//! set each key, so a problem found while building the agent (an unknown tool or model)
//! names that file, the key and its line.

use std::path::{Path, PathBuf};

use keel_config::{AgentDefinition, AgentFile, DiagnosticCode, LoadedConfig, Source};

use crate::error::AppError;

/// How an agent is referred to.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum AgentRef {
    /// An `[agents.<name>]` table of keel.toml.
    Named(String),
    /// An agent file.
    File(PathBuf),
    /// A definition already parsed (e.g. from text held in memory); problems are located
    /// in its source.
    Parsed(Box<AgentFile>),
}

/// `reference` as an agent: an `[agents.<name>]` name when keel.toml has one (a name wins
/// over a file of the same name), else an existing file — relative paths against `dir`.
pub fn find(loaded: &LoadedConfig, reference: &str, dir: &Path) -> Result<AgentRef, AppError> {
    if loaded.config.agents.contains_key(reference) {
        return Ok(AgentRef::Named(reference.to_string()));
    }
    let path = dir.join(reference);
    if path.is_file() {
        return Ok(AgentRef::File(std::path::absolute(&path).unwrap_or(path)));
    }
    let names: Vec<&str> = loaded.config.agents.keys().map(String::as_str).collect();
    let hint = match keel_config::diagnostic::nearest(reference, names.iter().copied()) {
        _ if loaded.config.workflows.contains_key(reference) => {
            format!(" (`{reference}` is a workflow: run it with `--workflow {reference}`)")
        }
        Some(best) => format!("; did you mean `{best}`?"),
        None if names.is_empty() => " (keel.toml declares no agents)".to_string(),
        None => format!(" (keel.toml declares: {})", names.join(", ")),
    };
    Err(AppError::UnknownAgent {
        reference: reference.to_string(),
        hint,
    })
}

/// A definition with the files it came from.
#[derive(Debug, Clone)]
pub struct Resolved {
    /// The merged definition (the table's keys over its file's).
    pub definition: AgentDefinition,
    /// The `[agents.<name>]` name, when the agent came from keel.toml.
    pub name: Option<String>,
    /// The agent file, when there is one (absolute).
    pub file: Option<PathBuf>,
    table: Option<Origin>,
    file_origin: Option<Origin>,
}

#[derive(Debug, Clone)]
struct Origin {
    source: Source,
    /// Key prefix of the definition in the source (`agents.NAME.` or empty).
    prefix: String,
    /// Directory relative paths are resolved against.
    dir: PathBuf,
    /// Top-level keys set there.
    keys: Vec<&'static str>,
}

impl Resolved {
    /// Resolves `reference` against the loaded keel.toml.
    pub fn load(loaded: &LoadedConfig, reference: &AgentRef) -> Result<Self, AppError> {
        match reference {
            AgentRef::Parsed(file) => Ok(Self {
                definition: file.definition.clone(),
                name: None,
                file: None,
                table: None,
                file_origin: Some(Origin {
                    dir: file
                        .source
                        .path
                        .as_deref()
                        .and_then(Path::parent)
                        .map_or_else(|| loaded.base_dir.clone(), Path::to_path_buf),
                    prefix: String::new(),
                    keys: file.definition.set_keys(),
                    source: file.source.clone(),
                }),
            }),
            AgentRef::File(path) => {
                let (definition, file) = load_file(path, &path.display().to_string())?;
                Ok(Self {
                    definition,
                    name: None,
                    file: Some(path.clone()),
                    table: None,
                    file_origin: Some(file),
                })
            }
            AgentRef::Named(name) => {
                let Some(table) = loaded.config.agents.get(name) else {
                    return Err(AppError::UnknownAgent {
                        reference: name.clone(),
                        hint: " (no such [agents.<name>] entry)".into(),
                    });
                };
                let table_origin = Origin {
                    source: loaded.source.clone(),
                    prefix: format!("agents.{name}."),
                    dir: loaded.base_dir.clone(),
                    keys: table.set_keys(),
                };
                let Some(relative) = &table.file else {
                    return Ok(Self {
                        definition: table.clone(),
                        name: Some(name.clone()),
                        file: None,
                        table: Some(table_origin),
                        file_origin: None,
                    });
                };
                let path = loaded.base_dir.join(relative);
                let path = std::path::absolute(&path).unwrap_or(path);
                if !path.is_file() {
                    return Err(table_origin.error(
                        DiagnosticCode::MissingFile,
                        "file",
                        format!(
                            "`agents.{name}.file`: file `{}` does not exist (paths are relative \
                             to the directory of keel.toml)",
                            relative.display()
                        ),
                    ));
                }
                let (mut base, file) = load_file(&path, &relative.display().to_string())?;
                // The table's instructions replace the file's, whichever key either uses.
                if table.instructions.is_some() || table.instructions_file.is_some() {
                    base.instructions = None;
                    base.instructions_file = None;
                }
                Ok(Self {
                    definition: base.overlay(table),
                    name: Some(name.clone()),
                    file: Some(path),
                    table: Some(table_origin),
                    file_origin: Some(file),
                })
            }
        }
    }

    fn origin_of(&self, top_key: &str) -> Option<&Origin> {
        match (&self.table, &self.file_origin) {
            (Some(table), _) if table.keys.contains(&top_key) => Some(table),
            (_, Some(file)) => Some(file),
            (table, None) => table.as_ref(),
        }
    }

    /// An error located at `key` (`tools[2]`, `critic.require_calls[0].tool`) in the file
    /// that set it.
    pub fn error(&self, code: DiagnosticCode, key: &str, message: String) -> AppError {
        let top = key.split(['.', '[']).next().unwrap_or(key).to_string();
        match self.origin_of(&top) {
            Some(origin) => origin.error(code, key, message),
            None => AppError::Invalid(message),
        }
    }

    /// The full key path of `key` in the file that set it (`agents.NAME.model`, `model`).
    pub fn key_path(&self, key: &str) -> String {
        let top = key.split(['.', '[']).next().unwrap_or(key);
        match self.origin_of(top) {
            Some(origin) => format!("{}{key}", origin.prefix),
            None => key.to_string(),
        }
    }

    /// The directory relative paths of `key` resolve against (its file's directory).
    pub fn dir_of(&self, key: &str) -> PathBuf {
        self.origin_of(key)
            .map_or_else(|| PathBuf::from("."), |o| o.dir.clone())
    }
}

impl Origin {
    fn error(&self, code: DiagnosticCode, key: &str, message: String) -> AppError {
        AppError::Located(vec![self.source.error(
            code,
            &format!("{}{key}", self.prefix),
            message,
        )])
    }
}

fn load_file(path: &Path, shown: &str) -> Result<(AgentDefinition, Origin), AppError> {
    let file = AgentDefinition::load(path, shown)?;
    let origin = Origin {
        dir: path
            .parent()
            .map_or_else(|| PathBuf::from("."), Path::to_path_buf),
        prefix: String::new(),
        keys: file.definition.set_keys(),
        source: file.source,
    };
    Ok((file.definition, origin))
}
