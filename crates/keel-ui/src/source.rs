//! [`RunSource`]: what the UI reads — an event store, seen through a [`Scope`] (a tenant's
//! thread-id namespace) and a redactor. The runs page is one call of the store's runs
//! list ([`EventStore::list_runs`]: filtered, sorted and paged by the store, which for
//! SQLite and Postgres answers from its index without reading every log); only a text
//! search loads logs, those of the page's rows, to check each hit against the redacted
//! text. The dashboard is one call too ([`EventStore::run_facts`]: the metrics facts of
//! each run, which the SQL stores keep in the same index).

use std::sync::Arc;

use futures::StreamExt;
use keel_core::run_metrics::{FactsPage, FactsQuery};
use keel_core::runs::{RunCursor, RunQuery, RunSummary};
use keel_core::store::StoreError;
use keel_core::{Event, EventStore};
use keel_telemetry::Redactor;

use crate::error::UiError;
use crate::filter::mentions;
use crate::row::RunRow;

/// Which threads a [`RunSource`] shows.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Scope {
    /// Every thread of the store (`keel ui` on a project's store).
    #[default]
    All,
    /// Only threads whose id starts with this prefix (a tenant's namespace); forks get a
    /// new id with the same prefix. A thread outside it is "not found".
    ThreadPrefix(String),
}

impl Scope {
    /// Whether `thread_id` is visible.
    pub fn allows(&self, thread_id: &str) -> bool {
        match self {
            Self::All => true,
            Self::ThreadPrefix(prefix) => thread_id.starts_with(prefix.as_str()),
        }
    }
}

/// An event store seen through a scope and a redactor.
#[derive(Clone)]
pub struct RunSource {
    store: Arc<dyn EventStore>,
    redactor: Arc<Redactor>,
    scope: Scope,
}

impl std::fmt::Debug for RunSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunSource")
            .field("scope", &self.scope)
            .finish_non_exhaustive()
    }
}

/// Logs loaded at once to check a text search's hits.
const VERIFY_AT_ONCE: usize = 4;

/// One page of the runs list.
#[derive(Debug, Clone)]
pub(crate) struct RunsPage {
    /// The rows, in the order asked for.
    pub rows: Vec<RunRow>,
    /// Where the next page starts (store thread id), when there is more.
    pub next: Option<RunCursor>,
    /// Rows the store's text search found that the redacted text does not show (the
    /// match was in a secret): left out.
    pub hidden: usize,
    /// Threads the store has not indexed yet (its first listing of a big store): not in
    /// this page.
    pub unindexed: u64,
}

impl RunSource {
    /// Every thread of `store`, redacted by `redactor`.
    pub fn new(store: Arc<dyn EventStore>, redactor: Redactor) -> Self {
        Self {
            store,
            redactor: Arc::new(redactor),
            scope: Scope::All,
        }
    }

    /// Restricts the source to `scope`.
    pub fn with_scope(mut self, scope: Scope) -> Self {
        self.scope = scope;
        self
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn EventStore> {
        &self.store
    }

    /// The scope.
    pub fn scope(&self) -> &Scope {
        &self.scope
    }

    /// Text as shown: redacted.
    pub(crate) fn redact(&self, text: &str) -> String {
        self.redactor.redact_str(text).into_owned()
    }

    /// A store failure as a page (redacted: a store URL may carry a password).
    pub(crate) fn store_error(&self, error: impl std::fmt::Display) -> UiError {
        UiError::store(self.redact(&error.to_string()))
    }

    /// A visible thread's log, unredacted (for actions); 404 when it does not exist or is
    /// outside the scope.
    pub(crate) async fn load_raw(&self, thread_id: &str) -> Result<Vec<Event>, UiError> {
        let missing = || UiError::not_found(format!("there is no run {thread_id}"));
        if !self.scope.allows(thread_id) {
            return Err(missing());
        }
        let events = self
            .store
            .load(thread_id)
            .await
            .map_err(|e| self.store_error(e))?;
        if events.is_empty() {
            return Err(missing());
        }
        Ok(events)
    }

    /// A visible thread's log as shown: every event redacted.
    pub(crate) async fn load(&self, thread_id: &str) -> Result<Vec<Event>, UiError> {
        let events = self.load_raw(thread_id).await?;
        Ok(self.redact_events(events))
    }

    pub(crate) fn redact_events(&self, events: Vec<Event>) -> Vec<Event> {
        if !self.redactor.is_enabled() {
            return events;
        }
        events
            .into_iter()
            .map(|event| {
                keel_telemetry::redact_event(&self.redactor, &event)
                    .1
                    .unwrap_or_else(|| unreadable(&event))
            })
            .collect()
    }

    /// The scope as a thread-id prefix for the store.
    pub(crate) fn thread_prefix(&self) -> Option<String> {
        match &self.scope {
            Scope::All => None,
            Scope::ThreadPrefix(prefix) => Some(prefix.clone()),
        }
    }

    /// One page of the runs list (`query.thread_prefix` is set to the scope's). A text
    /// search's hits are checked against each row's redacted log; a row that only matched
    /// inside a redacted secret is left out.
    pub(crate) async fn page(&self, mut query: RunQuery) -> Result<RunsPage, UiError> {
        query.thread_prefix = self.thread_prefix();
        let page = self.store.list_runs(&query).await.map_err(|e| match e {
            StoreError::InvalidQuery(problem) => UiError::bad_input("q", problem),
            other => self.store_error(other),
        })?;
        let needle = query.text_needle().filter(|_| self.redactor.is_enabled());
        let visible = page
            .runs
            .into_iter()
            .filter(|run| self.scope.allows(&run.thread_id));
        // A search hit is checked against the log as the run page shows it (redacted);
        // a few logs at a time.
        let checked: Vec<Result<(RunSummary, bool), UiError>> = futures::stream::iter(visible)
            .map(|run| {
                let needle = needle.clone();
                async move {
                    let Some(needle) = needle else {
                        return Ok((run, true));
                    };
                    let events = self
                        .store
                        .load(&run.thread_id)
                        .await
                        .map_err(|e| self.store_error(e))?;
                    let shown = mentions(&self.redact_events(events), &needle);
                    Ok((run, shown))
                }
            })
            .buffered(VERIFY_AT_ONCE)
            .collect()
            .await;
        let mut rows = Vec::with_capacity(checked.len());
        let mut hidden = 0usize;
        for result in checked {
            let (run, shown) = result?;
            if shown {
                rows.push(RunRow::from_summary(self.redact_summary(run)));
            } else {
                hidden += 1;
            }
        }
        Ok(RunsPage {
            rows,
            next: page.next,
            hidden,
            unindexed: page.unindexed,
        })
    }

    /// The texts of a row as shown: redacted.
    fn redact_summary(&self, mut run: RunSummary) -> RunSummary {
        if self.redactor.is_enabled() {
            run.goal = run.goal.map(|goal| self.redact(&goal));
            run.agent = run.agent.map(|agent| self.redact(&agent));
            run.model = run.model.map(|model| self.redact(&model));
        }
        run
    }

    /// The metrics facts of every visible thread `query` lets through (for the dashboard,
    /// like `keel stats`), in `list_threads`' order; `query.thread_prefix` is set to the
    /// scope's.
    pub(crate) async fn facts(&self, mut query: FactsQuery) -> Result<FactsPage, UiError> {
        query.thread_prefix = self.thread_prefix();
        let mut page = self
            .store
            .run_facts(&query)
            .await
            .map_err(|e| self.store_error(e))?;
        page.threads
            .retain(|thread| self.scope.allows(&thread.thread_id));
        Ok(page)
    }
}

/// An event the redactor could not round-trip (it never happens for events this build
/// wrote): shown as a notice, never unredacted.
fn unreadable(event: &Event) -> Event {
    Event {
        kind: keel_core::EventKind::Notice {
            code: "unreadable_event".into(),
            message: format!("a {} event could not be redacted", event.kind.name()),
            data: None,
        },
        ..event.clone()
    }
}
