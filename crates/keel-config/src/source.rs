//! A configuration file's text kept after loading, so problems found later (an unknown
//! tool or model named by an agent, found when the agent is built) are reported like load
//! problems: `FILE:LINE:COL: error: ...` with the key path.

use std::path::PathBuf;

use toml::de::DeTable;

use crate::analyze::{Reporter, Seg, SpanIndex};
use crate::diagnostic::{Diagnostic, DiagnosticCode, Severity};

/// A file's name (as shown), path and text.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Source {
    /// The name shown in diagnostics (e.g. `keel.toml`, `agents/detective/agent.toml`).
    pub name: String,
    /// The file, when the text came from one.
    pub path: Option<PathBuf>,
    /// The text.
    pub text: String,
}

impl Source {
    /// A source.
    pub fn new(name: impl Into<String>, path: Option<PathBuf>, text: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            path,
            text: text.into(),
        }
    }

    /// An error diagnostic at `key` (`agents.helper.tools[1]`, `model`): the position of
    /// that key (or of its nearest ancestor present in the text).
    pub fn error(&self, code: DiagnosticCode, key: &str, message: impl Into<String>) -> Diagnostic {
        let (spanned, _) = DeTable::parse_recoverable(&self.text);
        let spans = SpanIndex::build(spanned.get_ref());
        let reporter = Reporter::new(&self.text, &self.name, &spans);
        reporter.at(Severity::Error, code, &parse_key(key), true, message.into())
    }
}

/// `a.b[0].c` as key path segments.
pub(crate) fn parse_key(key: &str) -> Vec<Seg> {
    let mut out = Vec::new();
    for part in key.split('.').filter(|p| !p.is_empty()) {
        let (name, mut rest) = part.split_once('[').map_or((part, ""), |(n, r)| (n, r));
        if !name.is_empty() {
            out.push(Seg::Key(name.to_string()));
        }
        while let Some((index, after)) = rest.split_once(']') {
            if let Ok(i) = index.parse() {
                out.push(Seg::Index(i));
            }
            rest = after.strip_prefix('[').unwrap_or(after);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn keys_parse_into_segments_and_locate() {
        assert_eq!(
            parse_key("agents.x.tools[1].name"),
            vec![
                Seg::Key("agents".into()),
                Seg::Key("x".into()),
                Seg::Key("tools".into()),
                Seg::Index(1),
                Seg::Key("name".into()),
            ]
        );
        let source = Source::new(
            "keel.toml",
            None,
            "[agents.x]\nmodel = \"a:b\"\ntools = [\"calculator\", \"nope\"]\n",
        );
        let d = source.error(DiagnosticCode::UnknownReference, "agents.x.tools[1]", "bad");
        assert_eq!((d.line, d.column), (Some(3), Some(24)));
        assert_eq!(d.key.as_deref(), Some("agents.x.tools[1]"));
        assert_eq!(d.render(), "keel.toml:3:24: error: bad");
    }
}
