//! Turning keel.toml text into a [`KeelConfig`] while collecting EVERY problem, not just
//! the first: the text is parsed with spans, `${VAR}` references are expanded, and the
//! typed deserialization is repeated, each time removing the offending key and recording
//! a diagnostic, until what remains deserializes. Unknown-key errors come from serde's own
//! `deny_unknown_fields` messages, so the list of valid keys (for "did you mean") always
//! matches the schema, including the sections owned by other crates.

use std::collections::HashMap;
use std::ops::Range;

use toml::de::{DeTable, DeValue};

use crate::agent::INNER_PREFIX;
use crate::diagnostic::{Diagnostic, DiagnosticCode, LineIndex, Severity, line_col, nearest};
use crate::env::{ExpandError, expand};
use crate::schema::KeelConfig;

/// At most this many removal rounds (each finds one problem).
const MAX_ROUNDS: usize = 200;

/// One step of a key path.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum Seg {
    /// A table key.
    Key(String),
    /// An array index.
    Index(usize),
}

/// `a.b[0].c`.
pub(crate) fn path_string(path: &[Seg]) -> String {
    let mut out = String::new();
    for seg in path {
        match seg {
            Seg::Key(k) => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(k);
            }
            Seg::Index(i) => out.push_str(&format!("[{i}]")),
        }
    }
    out
}

/// Spans of keys and values by key path.
#[derive(Debug, Default)]
pub(crate) struct SpanIndex {
    keys: HashMap<String, Range<usize>>,
    values: HashMap<String, Range<usize>>,
}

impl SpanIndex {
    pub(crate) fn build(table: &DeTable<'_>) -> Self {
        let mut index = Self::default();
        index.walk_table(table, &mut Vec::new());
        index
    }

    fn walk_table(&mut self, table: &DeTable<'_>, path: &mut Vec<Seg>) {
        for (key, value) in table.iter() {
            path.push(Seg::Key(key.get_ref().to_string()));
            self.keys.insert(path_string(path), key.span());
            self.walk_value(value.get_ref(), value.span(), path);
            path.pop();
        }
    }

    fn walk_value(&mut self, value: &DeValue<'_>, span: Range<usize>, path: &mut Vec<Seg>) {
        self.values.insert(path_string(path), span);
        match value {
            DeValue::Table(t) => self.walk_table(t, path),
            DeValue::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    path.push(Seg::Index(i));
                    self.walk_value(item.get_ref(), item.span(), path);
                    path.pop();
                }
            }
            _ => {}
        }
    }

    /// The span of `path`'s key (else value), or of its nearest ancestor.
    pub(crate) fn locate(&self, path: &[Seg], prefer_key: bool) -> Option<Range<usize>> {
        let mut path = path.to_vec();
        loop {
            let s = path_string(&path);
            let (first, second) = if prefer_key {
                (&self.keys, &self.values)
            } else {
                (&self.values, &self.keys)
            };
            if let Some(span) = first.get(&s).or_else(|| second.get(&s)) {
                // Header tables (`[a.b]`) have an empty or whole-document value span.
                if span.end > span.start {
                    return Some(span.clone());
                }
            }
            path.pop()?;
        }
    }
}

/// The result of analysing one file.
#[derive(Debug)]
pub(crate) struct Analysis<T = KeelConfig> {
    /// What deserialized (after removing every offending key), `None` on a syntax error.
    pub config: Option<T>,
    /// Problems, in the order found.
    pub diagnostics: Vec<Diagnostic>,
    /// Spans, for later checks.
    pub spans: SpanIndex,
}

/// Builds diagnostics with positions.
pub(crate) struct Reporter<'a> {
    pub lines: LineIndex<'a>,
    pub file: &'a str,
    pub spans: &'a SpanIndex,
}

impl<'a> Reporter<'a> {
    /// A reporter for diagnostics in `text` (the file `file`, whose keys are in `spans`).
    pub(crate) fn new(text: &'a str, file: &'a str, spans: &'a SpanIndex) -> Self {
        Self {
            lines: LineIndex::new(text),
            file,
            spans,
        }
    }

    pub(crate) fn at(
        &self,
        severity: Severity,
        code: DiagnosticCode,
        path: &[Seg],
        prefer_key: bool,
        message: String,
    ) -> Diagnostic {
        let pos = self
            .spans
            .locate(path, prefer_key)
            .map(|span| self.lines.line_col(span.start));
        Diagnostic {
            severity,
            code,
            file: self.file.to_string(),
            key: (!path.is_empty()).then(|| path_string(path)),
            line: pos.map(|p| p.0),
            column: pos.map(|p| p.1),
            message,
        }
    }
}

/// Parses, expands and deserializes keel.toml `text`, collecting every problem.
pub(crate) fn analyze(text: &str, file: &str, env: &dyn Fn(&str) -> Option<String>) -> Analysis {
    analyze_as::<KeelConfig>(text, file, Some(env))
}

/// An environment lookup.
pub(crate) type EnvLookup<'a> = &'a dyn Fn(&str) -> Option<String>;

/// Parses `text` as a `T`, collecting every problem; `${VAR}` references are expanded
/// from `env` when it is given (keel.toml) and kept as written otherwise (agent files).
pub(crate) fn analyze_as<T: serde::de::DeserializeOwned>(
    text: &str,
    file: &str,
    env: Option<EnvLookup<'_>>,
) -> Analysis<T> {
    let (spanned, errors) = DeTable::parse_recoverable(text);
    let spans = SpanIndex::build(spanned.get_ref());
    if !errors.is_empty() {
        let lines = LineIndex::new(text);
        let diagnostics = errors
            .iter()
            .map(|e| {
                let pos = e.span().map(|s| lines.line_col(s.start));
                Diagnostic {
                    severity: Severity::Error,
                    code: DiagnosticCode::Syntax,
                    file: file.to_string(),
                    key: None,
                    line: pos.map(|p| p.0),
                    column: pos.map(|p| p.1),
                    message: format!("invalid TOML: {}", e.message().trim()),
                }
            })
            .collect();
        return Analysis {
            config: None,
            diagnostics,
            spans,
        };
    }
    let mut root = match toml::from_str::<toml::Table>(text) {
        Ok(root) => root,
        Err(e) => {
            let pos = e.span().map(|s| line_col(text, s.start));
            let diagnostic = Diagnostic {
                severity: Severity::Error,
                code: DiagnosticCode::Syntax,
                file: file.to_string(),
                key: None,
                line: pos.map(|p| p.0),
                column: pos.map(|p| p.1),
                message: format!("invalid TOML: {}", e.message().trim()),
            };
            return Analysis {
                config: None,
                diagnostics: vec![diagnostic],
                spans,
            };
        }
    };
    let reporter = Reporter::new(text, file, &spans);
    let mut diagnostics = Vec::new();
    if let Some(env) = env {
        expand_table(&mut root, &mut Vec::new(), env, &reporter, &mut diagnostics);
    }
    let config = deserialize_all::<T>(root, &reporter, &mut diagnostics);
    Analysis {
        config,
        diagnostics,
        spans,
    }
}

fn expand_table(
    table: &mut toml::Table,
    path: &mut Vec<Seg>,
    env: &dyn Fn(&str) -> Option<String>,
    reporter: &Reporter<'_>,
    out: &mut Vec<Diagnostic>,
) {
    for (key, value) in table.iter_mut() {
        path.push(Seg::Key(key.clone()));
        expand_value(value, path, env, reporter, out);
        path.pop();
    }
}

fn expand_value(
    value: &mut toml::Value,
    path: &mut Vec<Seg>,
    env: &dyn Fn(&str) -> Option<String>,
    reporter: &Reporter<'_>,
    out: &mut Vec<Diagnostic>,
) {
    match value {
        toml::Value::String(s) if s.contains('$') => {
            let (expanded, errors) = expand(s, env);
            for error in errors {
                let (code, message) = match error {
                    ExpandError::Missing(name) => (
                        DiagnosticCode::MissingEnv,
                        format!(
                            "environment variable `{name}` is not set (referenced as `${{{name}}}` \
                             in `{}`); export it, add it to .env, or write `${{{name}:-default}}`",
                            path_string(path)
                        ),
                    ),
                    ExpandError::Malformed(m) => (
                        DiagnosticCode::InvalidValue,
                        format!("`{}`: {m}", path_string(path)),
                    ),
                };
                out.push(reporter.at(Severity::Error, code, path, false, message));
            }
            *s = expanded;
        }
        toml::Value::Table(t) => expand_table(t, path, env, reporter, out),
        toml::Value::Array(items) => {
            for (i, item) in items.iter_mut().enumerate() {
                path.push(Seg::Index(i));
                expand_value(item, path, env, reporter, out);
                path.pop();
            }
        }
        _ => {}
    }
}

/// Deserializes, removing each offending node and retrying, so every problem is reported.
fn deserialize_all<T: serde::de::DeserializeOwned>(
    mut root: toml::Table,
    reporter: &Reporter<'_>,
    out: &mut Vec<Diagnostic>,
) -> Option<T> {
    // Original indices still present in each array (arrays shrink as elements are removed).
    let mut array_maps: HashMap<String, Vec<usize>> = HashMap::new();
    let mut removed: Vec<String> = Vec::new();
    for _ in 0..MAX_ROUNDS {
        let value = toml::Value::Table(root.clone());
        let error = match serde_path_to_error::deserialize::<_, T>(value) {
            Ok(config) => return Some(config),
            Err(error) => error,
        };
        let mut current = to_segs(error.path());
        let mut message = error.inner().message().trim().to_string();
        // An error inside an agent's HTTP tool table names its key path in the message.
        if let Some(rest) = message.strip_prefix(INNER_PREFIX)
            && let Some((inner, text)) = rest.split_once("`: ")
        {
            current.extend(crate::source::parse_key(inner));
            message = text.to_string();
        }
        let original = to_original(&current, &array_maps);
        let diagnostic = describe(&original, &message, reporter);
        let original_str = path_string(&original);
        // An error about a node we already removed a key from is a consequence of that
        // removal (e.g. a misspelled required key), not a separate problem.
        let secondary = removed.iter().any(|r| {
            r.len() > original_str.len()
                && r.starts_with(&original_str)
                && (original_str.is_empty()
                    || matches!(r.as_bytes().get(original_str.len()), Some(b'.' | b'[')))
        });
        if !secondary
            && !out
                .iter()
                .any(|d| d.key.as_deref() == Some(original_str.as_str()))
        {
            out.push(diagnostic);
        }
        if current.is_empty() || !remove(&mut root, &current, &original, &mut array_maps) {
            return None;
        }
        removed.push(original_str);
    }
    None
}

fn to_segs(path: &serde_path_to_error::Path) -> Vec<Seg> {
    path.iter()
        .filter_map(|seg| match seg {
            serde_path_to_error::Segment::Seq { index } => Some(Seg::Index(*index)),
            serde_path_to_error::Segment::Map { key } => Some(Seg::Key(key.clone())),
            _ => None,
        })
        .collect()
}

/// Maps indices of the shrunken document back to the file's.
fn to_original(current: &[Seg], maps: &HashMap<String, Vec<usize>>) -> Vec<Seg> {
    let mut original = Vec::with_capacity(current.len());
    for seg in current {
        let mapped = match seg {
            Seg::Index(i) => {
                let key = path_string(&original);
                Seg::Index(
                    maps.get(&key)
                        .and_then(|m| m.get(*i).copied())
                        .unwrap_or(*i),
                )
            }
            Seg::Key(k) => Seg::Key(k.clone()),
        };
        original.push(mapped);
    }
    original
}

/// Removes the node at `current`; false when there is nothing to remove.
fn remove(
    root: &mut toml::Table,
    current: &[Seg],
    original: &[Seg],
    maps: &mut HashMap<String, Vec<usize>>,
) -> bool {
    let Some((last, parents)) = current.split_last() else {
        return false;
    };
    let mut node: &mut toml::Value = match parents.first() {
        None => {
            return match last {
                Seg::Key(k) => root.remove(k).is_some(),
                Seg::Index(_) => false,
            };
        }
        Some(Seg::Key(k)) => match root.get_mut(k) {
            Some(v) => v,
            None => return false,
        },
        Some(Seg::Index(_)) => return false,
    };
    for seg in parents.iter().skip(1) {
        node = match (seg, node) {
            (Seg::Key(k), toml::Value::Table(t)) => match t.get_mut(k) {
                Some(v) => v,
                None => return false,
            },
            (Seg::Index(i), toml::Value::Array(a)) => match a.get_mut(*i) {
                Some(v) => v,
                None => return false,
            },
            _ => return false,
        };
    }
    match (last, node) {
        (Seg::Key(k), toml::Value::Table(t)) => t.remove(k).is_some(),
        (Seg::Index(i), toml::Value::Array(a)) if *i < a.len() => {
            let array_key = path_string(original.split_last().map_or(&[][..], |(_, p)| p));
            let len = a.len();
            let map = maps.entry(array_key).or_insert_with(|| (0..len).collect());
            if *i < map.len() {
                map.remove(*i);
            }
            a.remove(*i);
            true
        }
        _ => false,
    }
}

/// Backticked names in a serde message (`unknown field `x`, expected one of `a`, `b``).
fn backticked(message: &str) -> Vec<&str> {
    message.split('`').skip(1).step_by(2).collect()
}

fn describe(path: &[Seg], message: &str, reporter: &Reporter<'_>) -> Diagnostic {
    let key = path_string(path);
    let parent = path_string(path.split_last().map_or(&[][..], |(_, p)| p));
    let section = if parent.is_empty() {
        "the top level".to_string()
    } else {
        format!("[{parent}]")
    };
    let names = backticked(message);
    if message.starts_with("unknown field") {
        let given = names.first().copied().unwrap_or_default();
        let valid: Vec<&str> = names.iter().skip(1).copied().collect();
        let hint = match nearest(given, valid.iter().copied()) {
            Some(best) => format!("did you mean `{best}`?"),
            None if valid.is_empty() => "this table takes no keys".into(),
            None => format!("valid keys: {}", valid.join(", ")),
        };
        let message = format!("unknown key `{given}` in {section}; {hint}");
        return reporter.at(
            Severity::Error,
            DiagnosticCode::UnknownKey,
            path,
            true,
            message,
        );
    }
    if message.starts_with("unknown variant") {
        let given = names.first().copied().unwrap_or_default();
        let valid: Vec<&str> = names.iter().skip(1).copied().collect();
        let mut text = format!(
            "invalid value `{given}` for `{key}`; valid values: {}",
            valid.join(", ")
        );
        if let Some(best) = nearest(given, valid.iter().copied()) {
            text.push_str(&format!(" (did you mean `{best}`?)"));
        }
        return reporter.at(
            Severity::Error,
            DiagnosticCode::InvalidValue,
            path,
            false,
            text,
        );
    }
    if message.starts_with("missing field") {
        let field = names.first().copied().unwrap_or_default();
        let text = format!(
            "missing required key `{field}` in {}",
            if key.is_empty() {
                section
            } else {
                format!("`{key}`")
            }
        );
        return reporter.at(
            Severity::Error,
            DiagnosticCode::MissingKey,
            path,
            true,
            text,
        );
    }
    let where_ = if key.is_empty() {
        reporter.file.to_string()
    } else {
        format!("`{key}`")
    };
    let text = format!("invalid value for {where_}: {message}");
    reporter.at(
        Severity::Error,
        DiagnosticCode::InvalidValue,
        path,
        false,
        text,
    )
}
