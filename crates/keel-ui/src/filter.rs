//! The runs page's query string: filters, sorting and the page position, parsed strictly
//! (an unknown or malformed parameter is a 400 naming it), turned into the store's
//! [`RunQuery`] and written back into links.

use chrono::{DateTime, Utc};
use keel_core::runs::{MAX_RUN_PAGE, RunCursor, RunQuery, RunSort};
use keel_core::store::ThreadStatus;
use keel_core::{Event, EventKind, Part};

use crate::error::UiError;

/// Rows per page unless `limit` says otherwise.
pub(crate) const DEFAULT_LIMIT: usize = 25;

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
    pub sort: RunSort,
    pub descending: bool,
    pub limit: usize,
    /// Where the page starts: the previous page's last row (its thread id as the URL
    /// names it).
    pub after: Option<RunCursor>,
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
            sort: RunSort::Updated,
            descending: true,
            limit: DEFAULT_LIMIT,
            after: None,
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

/// A search field: one line of text.
fn one_line(field: &str, value: &str) -> Result<Option<String>, UiError> {
    let value = non_empty(value);
    if value
        .as_deref()
        .is_some_and(|v| v.chars().any(char::is_control))
    {
        return Err(UiError::bad_input(
            field,
            "contains a line break or another control character: search for one line of text",
        ));
    }
    Ok(value)
}

impl RunsFilter {
    /// Parses a raw query string (`None`: no query). Empty values count as absent (a
    /// submitted form sends every field).
    pub(crate) fn parse(query: Option<&str>, now: DateTime<Utc>) -> Result<Self, UiError> {
        let mut filter = Self::default();
        let Some(query) = query else {
            return Ok(filter);
        };
        let mut after = None;
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
                "model" => filter.model = one_line("model", value)?,
                "q" => filter.q = one_line("q", value)?,
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
                        filter.sort = RunSort::parse(&text).ok_or_else(|| {
                            let keys: Vec<&str> = RunSort::ALL.iter().map(|k| k.as_str()).collect();
                            UiError::bad_input(
                                "sort",
                                format!("{text:?}: sort by {}", keys.join(", ")),
                            )
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
                            .filter(|n| (1..=MAX_RUN_PAGE).contains(n))
                            .ok_or_else(|| {
                                UiError::bad_input(
                                    "limit",
                                    format!("{text:?}: give a number from 1 to {MAX_RUN_PAGE}"),
                                )
                            })?;
                    }
                }
                "after" => after = non_empty(value),
                "fragment" => filter.fragment = non_empty(value),
                other => {
                    return Err(UiError::bad_input(
                        other,
                        "unknown parameter: use state, agent, model, from, to, q, sort, dir, limit or after",
                    ));
                }
            }
        }
        if let Some(text) = after {
            // The position belongs to an order: read it once the order is known.
            filter.after = Some(RunCursor::decode(filter.sort, &text).map_err(|e| {
                UiError::bad_input(
                    "after",
                    format!("{e} (follow the page links, or leave `after` out for the first page)"),
                )
            })?);
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

    /// The store's query: every filter, the order and the page; `store_id` maps the
    /// cursor's thread id from the URL's form to the store's.
    pub(crate) fn store_query(
        &self,
        thread_prefix: Option<String>,
        store_id: impl Fn(&str) -> String,
    ) -> RunQuery {
        RunQuery {
            thread_prefix,
            status: self.state,
            agent: self.agent.clone(),
            model: self.model.clone(),
            active_since: self.from,
            started_before: self.to,
            text: self.q.clone(),
            sort: self.sort,
            ascending: !self.descending,
            after: self.after.as_ref().map(|after| RunCursor {
                value: after.value,
                thread_id: store_id(&after.thread_id),
            }),
            limit: self.limit,
        }
    }

    /// The query string of this filter with another position and order (`after`: the
    /// cursor as the URL names it).
    pub(crate) fn query(
        &self,
        after: Option<&RunCursor>,
        sort: RunSort,
        descending: bool,
    ) -> String {
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
        if sort != RunSort::Updated {
            out.append_pair("sort", sort.as_str());
        }
        if !descending {
            out.append_pair("dir", "asc");
        }
        if self.limit != DEFAULT_LIMIT {
            out.append_pair("limit", &self.limit.to_string());
        }
        if let Some(after) = after {
            out.append_pair("after", &after.encode());
        }
        out.finish()
    }
}

/// Whether any message of the (redacted) log contains `needle` (lowercase): what the
/// store's text search found, checked again on what the page would show, so a search
/// never finds a run by a redacted secret.
pub(crate) fn mentions(events: &[Event], needle: &str) -> bool {
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
        let f = parse(
            "state=done&agent=a&q=hello+world&from=2h&sort=cost&dir=asc&limit=10&after=0.5~thr_1",
        )
        .unwrap_or_default();
        assert_eq!(
            f.state,
            Some(ThreadStatus::Ended(keel_core::EndState::Done))
        );
        assert_eq!(f.q.as_deref(), Some("hello world"));
        assert_eq!(f.sort, RunSort::Cost);
        assert!(!f.descending);
        assert_eq!(f.limit, 10);
        assert_eq!(
            f.after.as_ref().map(|a| a.thread_id.as_str()),
            Some("thr_1")
        );
        let again = parse(&f.query(f.after.as_ref(), f.sort, f.descending)).unwrap_or_default();
        assert_eq!(again.state, f.state);
        assert_eq!(again.from_text, "2h");
        assert_eq!(again.after, f.after);
        let query = f.store_query(Some("t.".into()), |id| format!("t.{id}"));
        assert_eq!(
            query.after.map(|a| a.thread_id),
            Some("t.thr_1".to_string())
        );
        assert!(query.ascending);
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
            ("limit=201", "`limit`"),
            ("sort=color", "`sort`"),
            ("dir=up", "`dir`"),
            ("after=x", "`after`"),
            ("after=1.5~t", "`after`"),
            ("q=two%0Alines", "`q`"),
            ("skip=10", "`skip`"),
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
