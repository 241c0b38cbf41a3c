//! Diagnostics reported by `keel config check` (and carried by load errors): severity, a
//! stable code, the TOML key path, the position in the file and a message naming the fix.
//! Rendered as `FILE:LINE:COL: error: ...` lines or as JSON.

use serde::{Deserialize, Serialize};

/// How bad a diagnostic is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    /// The configuration cannot be used as is.
    Error,
    /// Probably a mistake, but Keel can run.
    Warning,
}

impl Severity {
    /// `error` or `warning`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Error => "error",
            Self::Warning => "warning",
        }
    }
}

/// What kind of problem a diagnostic is (stable, for scripts).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DiagnosticCode {
    /// The file could not be read.
    Io,
    /// The file is not valid TOML.
    Syntax,
    /// A key the schema does not have.
    UnknownKey,
    /// A value of the wrong type or not one of the allowed values.
    InvalidValue,
    /// A required key is missing.
    MissingKey,
    /// A `${VAR}` reference (without default) to an unset variable.
    MissingEnv,
    /// The API-key variable of the default model's provider is unset.
    MissingApiKey,
    /// A file referenced by the configuration does not exist.
    MissingFile,
    /// A reference to an agent, model or provider that is not declared.
    UnknownReference,
}

/// One problem in a configuration file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Diagnostic {
    /// Error or warning.
    pub severity: Severity,
    /// The kind of problem.
    pub code: DiagnosticCode,
    /// The file (as given, e.g. `keel.toml`).
    pub file: String,
    /// TOML key path, e.g. `telemetry.log.levle` or `mcp.servers[0].comand`.
    pub key: Option<String>,
    /// 1-based line, when known.
    pub line: Option<usize>,
    /// 1-based column (in characters), when known.
    pub column: Option<usize>,
    /// What is wrong and how to fix it.
    pub message: String,
}

impl Diagnostic {
    /// `FILE:LINE:COL: error: message` (position parts omitted when unknown).
    pub fn render(&self) -> String {
        let mut out = self.file.clone();
        if let Some(line) = self.line {
            out.push_str(&format!(":{line}"));
            if let Some(column) = self.column {
                out.push_str(&format!(":{column}"));
            }
        }
        out.push_str(&format!(": {}: {}", self.severity.as_str(), self.message));
        out
    }

    /// Whether this is an error (not a warning).
    pub fn is_error(&self) -> bool {
        self.severity == Severity::Error
    }
}

impl std::fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.render())
    }
}

/// One line per diagnostic, in file order.
pub fn render_text(diagnostics: &[Diagnostic]) -> String {
    diagnostics.iter().map(|d| d.render() + "\n").collect()
}

/// `{"ok": bool, "errors": N, "warnings": N, "diagnostics": [...]}`.
pub fn render_json(diagnostics: &[Diagnostic]) -> serde_json::Value {
    let errors = diagnostics.iter().filter(|d| d.is_error()).count();
    serde_json::json!({
        "ok": errors == 0,
        "errors": errors,
        "warnings": diagnostics.len() - errors,
        "diagnostics": diagnostics,
    })
}

/// 1-based line and column (in characters) of byte `offset` in `text`. For more than one
/// position in the same text, build a [`LineIndex`] once.
pub fn line_col(text: &str, offset: usize) -> (usize, usize) {
    LineIndex::new(text).line_col(offset)
}

/// Where each line of a text starts, so that positions are found by binary search: a file
/// with thousands of errors costs a scan, not a scan per error.
#[derive(Debug)]
pub struct LineIndex<'a> {
    text: &'a str,
    /// Byte offset of the start of every line; the first is 0.
    starts: Vec<usize>,
}

impl<'a> LineIndex<'a> {
    /// Indexes `text`'s lines.
    pub fn new(text: &'a str) -> Self {
        let starts = std::iter::once(0)
            .chain(text.match_indices('\n').map(|(i, _)| i + 1))
            .collect();
        Self { text, starts }
    }

    /// 1-based line and column (in characters) of byte `offset`: offsets past the end, or
    /// inside a character, count as the end of the text.
    pub fn line_col(&self, offset: usize) -> (usize, usize) {
        let offset = if self.text.is_char_boundary(offset) {
            offset
        } else {
            self.text.len()
        };
        // Lines starting at or before `offset`; at least one, since the first starts at 0.
        let line = self.starts.partition_point(|&start| start <= offset).max(1);
        let line_start = self.starts.get(line - 1).copied().unwrap_or(0);
        let column = self
            .text
            .get(line_start..offset)
            .map_or(0, |s| s.chars().count())
            + 1;
        (line, column)
    }
}

/// The valid name nearest to `given`, when close enough to be a likely typo.
pub fn nearest<'a>(given: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let given_lower = given.to_lowercase();
    candidates
        .into_iter()
        .map(|c| {
            (
                c,
                strsim::normalized_damerau_levenshtein(&given_lower, &c.to_lowercase()),
            )
        })
        .filter(|(c, score)| *score >= 0.5 || c.to_lowercase() == given_lower)
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .map(|(c, _)| c)
}

#[cfg(test)]
mod tests {
    use super::LineIndex;

    /// The definition `LineIndex` must agree with: count the newlines before the offset.
    fn scan(text: &str, offset: usize) -> (usize, usize) {
        let before = text.get(..offset.min(text.len())).unwrap_or(text);
        let line = before.matches('\n').count() + 1;
        let line_start = before.rfind('\n').map_or(0, |i| i + 1);
        let column = before.get(line_start..).map_or(0, |s| s.chars().count()) + 1;
        (line, column)
    }

    #[test]
    fn line_index_agrees_with_a_scan_at_every_offset() {
        for text in [
            "",
            "\n",
            "a",
            "model = 1\n[agents.x]\nbad = \n",
            "\n\nx\n",
            "é\nçà\n\n日本語 = 1",
            "no newline at the end",
        ] {
            let index = LineIndex::new(text);
            for offset in 0..text.len() + 3 {
                assert_eq!(
                    index.line_col(offset),
                    scan(text, offset),
                    "{text:?} at {offset}"
                );
            }
        }
    }
}
