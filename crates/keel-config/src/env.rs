//! Secrets and settings from the environment: loading `.env` (never overriding variables
//! already set) and expanding `${VAR}` / `${VAR:-default}` in string values of keel.toml.

use std::path::{Path, PathBuf};

/// Loads `dir/.env` into the process environment when it exists. Variables already set
/// are left alone. Returns the file loaded, if any.
pub fn load_dotenv(dir: &Path) -> Result<Option<PathBuf>, String> {
    let path = dir.join(".env");
    if !path.is_file() {
        return Ok(None);
    }
    dotenvy::from_path(&path)
        .map(|()| Some(path.clone()))
        .map_err(|e| format!("cannot load {}: {e}", path.display()))
}

/// A problem found while expanding one string.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExpandError {
    /// `${NAME}` without a default and `NAME` is not set.
    Missing(String),
    /// `${` without a closing `}`, or an empty name.
    Malformed(String),
}

/// Expands `${NAME}` and `${NAME:-default}` (default used when `NAME` is unset or empty);
/// `$$` is a literal `$`. Every missing variable is reported; missing ones expand to "".
pub fn expand(value: &str, env: &dyn Fn(&str) -> Option<String>) -> (String, Vec<ExpandError>) {
    let mut out = String::with_capacity(value.len());
    let mut errors = Vec::new();
    let mut rest = value;
    while let Some(pos) = rest.find('$') {
        out.push_str(rest.get(..pos).unwrap_or_default());
        let after = rest.get(pos + 1..).unwrap_or_default();
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
            continue;
        }
        let Some(body_start) = after.strip_prefix('{') else {
            out.push('$');
            rest = after;
            continue;
        };
        let Some(end) = body_start.find('}') else {
            errors.push(ExpandError::Malformed(format!(
                "unterminated `${{` in `{value}`; write `${{NAME}}`, or `$$` for a literal `$`"
            )));
            out.push_str(rest.get(pos..).unwrap_or_default());
            rest = "";
            break;
        };
        let body = body_start.get(..end).unwrap_or_default();
        let (name, default) = match body.split_once(":-") {
            Some((name, default)) => (name, Some(default)),
            None => (body, None),
        };
        let name = name.trim();
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            errors.push(ExpandError::Malformed(format!(
                "`${{{body}}}` is not a valid reference: use `${{NAME}}` or `${{NAME:-default}}` \
                 with NAME made of letters, digits and `_`"
            )));
        } else {
            match (env(name).filter(|v| !v.is_empty()), default) {
                (Some(v), _) => out.push_str(&v),
                (None, Some(d)) => out.push_str(d),
                (None, None) => {
                    // Set but empty counts as set for a reference without a default.
                    if env(name).is_none() {
                        errors.push(ExpandError::Missing(name.to_string()));
                    }
                }
            }
        }
        rest = body_start.get(end + 1..).unwrap_or_default();
    }
    out.push_str(rest);
    (out, errors)
}

/// The process environment as a lookup function.
pub fn process_env(name: &str) -> Option<String> {
    std::env::var(name).ok()
}
