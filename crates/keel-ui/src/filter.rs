//! The runs page's query string: filters, sorting and the page position, parsed strictly
//! (an unknown or malformed parameter is a 400 naming it) and written back into links.

use chrono::{DateTime, Utc};
use keel_core::store::{ThreadFilter, ThreadStatus, ThreadSummary};
use keel_core::{Event, EventKind, Part};

use crate::error::UiError;
use crate::row::RunRow;

/// Rows per page unless `limit` says otherwise.
pub(crate) const DEFAULT_LIMIT: usize = 25;
/// The largest `limit`.
pub(crate) const MAX_LIMIT: usize = 200;

/// A sortable column.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum SortKey {
    /// Last activity (the store's order).
    #[default]
    Updated,
    Started,
    Duration,
    Turns,
    ToolCalls,
    Tokens,
    Cost,
}

impl SortKey {
    pub(crate) const ALL: [SortKey; 7] = [
        SortKey::Updated,
        SortKey::Started,
        SortKey::Duration,
        SortKey::Turns,
        SortKey::ToolCalls,
        SortKey::Tokens,
        SortKey::Cost,
    ];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Updated => "updated",
            Self::Started => "started",
            Self::Duration => "duration",
            Self::Turns => "turns",
            Self::ToolCalls => "tool_calls",
            Self::Tokens => "tokens",
            Self::Cost => "cost",
        }
    }

    fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.as_str() == text)
    }
}

/// The parsed query of the runs page.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RunsFilter {
    pub state: Option<ThreadStatus>,
    pub state_text: String,
    pub agent: Option<String>,
    pub model: Option<String>,
    pub from: Option<DateTime<Utc>>,
    pub from_text: String,
    pub to: Option<DateTime<Utc>>,
    pub to_text: String,
    pub q: Option<String>,
    pub sort: SortKey,
    pub descending: bool,
    pub limit: usize,
    pub skip: usize,
    /// `rows`: only the table body (the live refresh of the page).
    pub fragment: Option<String>,
}

impl Default for RunsFilter {
    fn default() -> Self {
        Self {
            state: None,
            state_text: String::new(),
            agent: None,
            model: None,
            from: None,
            from_text: String::new(),
            to: None,
            to_text: String::new(),
            q: None,
            sort: SortKey::Updated,
            descending: true,
            limit: DEFAULT_LIMIT,
            skip: 0,
            fragment: None,
        }
    }
}

fn non_empty(value: &str) -> Option<String> {
    let value = value.trim();
    (!value.is_empty()).then(|| value.to_string())
}

fn parse_time(field: &str, text: &str, now: DateTime<Utc>) -> Result<DateTime<Utc>, UiError> {
    keel_app::threads::parse_since(text, now).map_err(|e| UiError::bad_input(field, e))
}

impl RunsFilter {
    /// Parses a raw query string (`None`: no query). Empty values count as absent (a
    /// submitted form sends every field).
    pub(crate) fn parse(query: Option<&str>, now: DateTime<Utc>) -> Result<Self, UiError> {
        let mut filter = Self::default();
        let Some(query) = query else {
            return Ok(filter);
        };
        for (key, value) in form_urlencoded::parse(query.as_bytes()) {
            let value = value.as_ref();
            match key.as_ref() {
                "state" => {
                    filter.state = match non_empty(value) {
                        Some(text) => Some(
                            keel_app::threads::parse_status(&text)
                                .map_err(|e| UiError::bad_input("state", e))?,
                        ),
                        None => None,
                    };
                    filter.state_text = value.trim().to_string();
                }
                "agent" => filter.agent = non_empty(value),
                "model" => filter.model = non_empty(value),
                "q" => filter.q = non_empty(value),
                "from" => {
                    filter.from = match non_empty(value) {
                        Some(text) => Some(parse_time("from", &text, now)?),
                        None => None,
                    };
                    filter.from_text = value.trim().to_string();
                }
                "to" => {
                    filter.to = match non_empty(value) {
                        Some(text) => Some(parse_time("to", &text, now)?),
                        None => None,
                    };
                    filter.to_text = value.trim().to_string();
                }
                "sort" => {
                    if let Some(text) = non_empty(value) {
                        filter.sort = SortKey::parse(&text).ok_or_else(|| {
                            let keys: Vec<&str> = SortKey::ALL.iter().map(|k| k.as_str()).collect();
                            UiError::bad_input("sort", format!("{text:?}: use {}", keys.join(", ")))
                        })?;
                    }
                }
                "dir" => {
                    filter.descending = match value.trim() {
                        "" | "desc" => true,
                        "asc" => false,
                        other => {
                            return Err(UiError::bad_input(
                                "dir",
                                format!("{other:?}: use asc or desc"),
                            ));
                        }
                    }
                }
                "limit" => {
                    if let Some(text) = non_empty(value) {
                        filter.limit = text
                            .parse::<usize>()
                            .ok()
                            .filter(|n| (1..=MAX_LIMIT).contains(n))
                            .ok_or_else(|| {
                                UiError::bad_input(
                                    "limit",
                                    format!("{text:?}: give a number from 1 to {MAX_LIMIT}"),
                                )
                            })?;
                    }
                }
                "skip" => {
                    if let Some(text) = non_empty(value) {
                        filter.skip = text.parse::<usize>().map_err(|_| {
                            UiError::bad_input("skip", format!("{text:?}: give a whole number"))
                        })?;
                    }
                }
                "fragment" => filter.fragment = non_empty(value),
                other => {
                    return Err(UiError::bad_input(
                        other,
                        "unknown parameter: use state, agent, model, from, to, q, sort, dir, limit or skip",
                    ));
                }
            }
        }
        if let (Some(from), Some(to)) = (filter.from, filter.to)
            && from > to
        {
            return Err(UiError::bad_input(
                "to",
                format!("{} is before `from` ({})", filter.to_text, filter.from_text),
            ));
        }
        Ok(filter)
    }

    /// What the store filters itself: agent, status and the start of the time range (a
    /// run active at or after `from`).
    pub(crate) fn store_filter(&self) -> ThreadFilter {
        ThreadFilter {
            agent: self.agent.clone(),
            updated_since: self.from,
            status: self.state,
            limit: None,
        }
    }

    /// Whether the page must test threads' logs against filters the store cannot apply.
    pub(crate) fn needs_scan(&self) -> bool {
        self.model.is_some() || self.q.is_some() || self.to.is_some()
    }

    /// The end of the time range: a run started at or before `to`.
    pub(crate) fn matches_summary(&self, summary: &ThreadSummary) -> bool {
        self.to.is_none_or(|to| summary.created_at <= to)
    }

    /// The model (a case-insensitive part of the id) and the text search (user,
    /// assistant and tool messages, case-insensitive).
    pub(crate) fn matches_row(&self, row: &RunRow, events: &[Event]) -> bool {
        if let Some(model) = &self.model
            && !row
                .models
                .iter()
                .any(|m| m.to_lowercase().contains(&model.to_lowercase()))
        {
            return false;
        }
        match &self.q {
            Some(q) => mentions(events, &q.to_lowercase()),
            None => true,
        }
    }

    /// Orders a page's rows (the store's order is last activity, newest first).
    pub(crate) fn sort_rows(&self, rows: &mut [RunRow]) {
        let key = |row: &RunRow| -> f64 {
            match self.sort {
                SortKey::Updated => row.updated.timestamp_millis() as f64,
                SortKey::Started => row.started.timestamp_millis() as f64,
                SortKey::Duration => row.duration_ms as f64,
                SortKey::Turns => f64::from(row.turns),
                SortKey::ToolCalls => f64::from(row.tool_calls),
                SortKey::Tokens => row.tokens as f64,
                SortKey::Cost => row.cost_usd.unwrap_or(0.0),
            }
        };
        rows.sort_by(|a, b| {
            let order = key(a).total_cmp(&key(b));
            if self.descending {
                order.reverse()
            } else {
                order
            }
        });
    }

    /// The query string of this filter with another position and order.
    pub(crate) fn query(&self, skip: usize, sort: SortKey, descending: bool) -> String {
        let mut out = form_urlencoded::Serializer::new(String::new());
        let pairs = [
            ("state", self.state_text.as_str()),
            ("agent", self.agent.as_deref().unwrap_or("")),
            ("model", self.model.as_deref().unwrap_or("")),
            ("from", self.from_text.as_str()),
            ("to", self.to_text.as_str()),
            ("q", self.q.as_deref().unwrap_or("")),
        ];
        for (key, value) in pairs {
            if !value.is_empty() {
                out.append_pair(key, value);
            }
        }
        if sort != SortKey::Updated {
            out.append_pair("sort", sort.as_str());
        }
        if !descending {
            out.append_pair("dir", "asc");
        }
        if self.limit != DEFAULT_LIMIT {
            out.append_pair("limit", &self.limit.to_string());
        }
        if skip > 0 {
            out.append_pair("skip", &skip.to_string());
        }
        out.finish()
    }
}

/// Whether any message of the log contains `needle` (lowercase).
fn mentions(events: &[Event], needle: &str) -> bool {
    let hit = |text: &str| text.to_lowercase().contains(needle);
    let message_hit = |message: &keel_core::Message| {
        message.parts.iter().any(|part| match part {
            Part::Text { text } | Part::Summary { text, .. } => hit(text),
            Part::ToolCall(call) => hit(&call.arguments),
            Part::ToolResult(result) => hit(&result.content),
            _ => false,
        })
    };
    events.iter().any(|event| match &event.kind {
        EventKind::UserMessage { message }
        | EventKind::ModelResponded { message, .. }
        | EventKind::AgentMessage { message, .. } => message_hit(message),
        EventKind::ToolCallFinished { result } => hit(&result.content),
        EventKind::UserAnswered { answer } => hit(answer),
        EventKind::UserAsked { question, .. } => hit(question),
        EventKind::RunEnded {
            final_text: Some(text),
            ..
        } => hit(text),
        _ => false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(q: &str) -> Result<RunsFilter, UiError> {
        RunsFilter::parse(Some(q), Utc::now())
    }

    #[test]
    fn filters_parse_and_round_trip() {
        let f = parse("state=done&agent=a&q=hello+world&from=2h&sort=cost&dir=asc&limit=10")
            .unwrap_or_default();
        assert_eq!(
            f.state,
            Some(ThreadStatus::Ended(keel_core::EndState::Done))
        );
        assert_eq!(f.q.as_deref(), Some("hello world"));
        assert_eq!(f.sort, SortKey::Cost);
        assert!(!f.descending);
        assert_eq!(f.limit, 10);
        assert!(f.needs_scan());
        let again = parse(&f.query(0, f.sort, f.descending)).unwrap_or_default();
        assert_eq!(again.state, f.state);
        assert_eq!(again.from_text, "2h");
        assert_eq!(
            parse("state=&agent=").unwrap_or_default(),
            RunsFilter::default()
        );
    }

    #[test]
    fn malformed_parameters_are_named() {
        for (query, field) in [
            ("state=bogus", "`state`"),
            ("from=yesterday", "`from`"),
            ("limit=0", "`limit`"),
            ("limit=x", "`limit`"),
            ("sort=color", "`sort`"),
            ("dir=up", "`dir`"),
            ("skip=-1", "`skip`"),
            ("colour=red", "`colour`"),
            ("from=2026-01-02T00:00:00Z&to=2026-01-01T00:00:00Z", "`to`"),
        ] {
            let error = parse(query).err();
            let message = error.map(|e| (e.status.as_u16(), e.message));
            assert!(
                matches!(&message, Some((400, m)) if m.contains(field)),
                "{query}: {message:?}"
            );
        }
    }
}
