//! [`RunSource`]: what the UI reads — an event store, seen through a [`Scope`] (a tenant's
//! thread-id namespace) and a redactor. Listing pages through the store's thread listing
//! (most recently updated first) and loads only the logs of the threads it shows or must
//! test against a filter the store cannot apply (model, text, end of the time range),
//! within a scan budget per request.

use std::sync::Arc;

use keel_core::store::{ThreadFilter, ThreadSummary};
use keel_core::{Event, EventStore};
use keel_telemetry::Redactor;

use crate::error::UiError;
use crate::filter::RunsFilter;
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

/// At most this many threads are examined per runs-page request when a filter needs
/// their logs; the page then offers to continue the search from where it stopped.
pub(crate) const SCAN_BUDGET: usize = 2000;

/// Summaries fetched from the store per step of a scan.
const CHUNK: usize = 200;

/// One page of the runs list.
#[derive(Debug, Clone)]
pub(crate) struct RunsPage {
    /// The rows, in the order asked for.
    pub rows: Vec<RunRow>,
    /// Where the next page starts in the store's listing, when there is more.
    pub next_skip: Option<usize>,
    /// Whether the scan budget ran out before the page was full.
    pub budget_exhausted: bool,
    /// Threads examined.
    pub scanned: usize,
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

    /// Up to `limit` summaries of the store listing from position `skip` (the store lists
    /// most recently updated first). Fewer than asked means the listing ended.
    async fn listing(
        &self,
        base: &ThreadFilter,
        skip: usize,
        limit: usize,
    ) -> Result<Vec<ThreadSummary>, UiError> {
        let filter = ThreadFilter {
            limit: Some(skip.saturating_add(limit)),
            ..base.clone()
        };
        let all = self
            .store
            .list_threads(&filter)
            .await
            .map_err(|e| self.store_error(e))?;
        Ok(all.into_iter().skip(skip).collect())
    }

    /// One page of runs matching `filter`.
    pub(crate) async fn page(&self, filter: &RunsFilter) -> Result<RunsPage, UiError> {
        let base = filter.store_filter();
        let mut position = filter.skip;
        let mut rows = Vec::new();
        let mut scanned = 0usize;
        let mut exhausted = false;
        let mut more = true;
        let scanning = filter.needs_scan() || self.scope != Scope::All;
        'scan: while rows.len() < filter.limit {
            let want = if scanning {
                CHUNK
            } else {
                filter.limit.saturating_sub(rows.len()).saturating_add(1)
            };
            let chunk = self.listing(&base, position, want).await?;
            if chunk.len() < want {
                more = false;
            }
            if chunk.is_empty() {
                break;
            }
            for summary in chunk {
                if rows.len() >= filter.limit {
                    more = true;
                    break 'scan;
                }
                if scanned >= SCAN_BUDGET {
                    exhausted = true;
                    more = true;
                    break 'scan;
                }
                position = position.saturating_add(1);
                scanned += 1;
                if !self.scope.allows(&summary.thread_id) || !filter.matches_summary(&summary) {
                    continue;
                }
                let events = self
                    .store
                    .load(&summary.thread_id)
                    .await
                    .map_err(|e| self.store_error(e))?;
                let events = self.redact_events(events);
                let row = RunRow::new(&summary, &events);
                if filter.matches_row(&row, &events) {
                    rows.push(row);
                }
            }
            if !more {
                break;
            }
        }
        filter.sort_rows(&mut rows);
        Ok(RunsPage {
            rows,
            next_skip: more.then_some(position),
            budget_exhausted: exhausted,
            scanned,
        })
    }

    /// The logs of every visible thread matching `filter` (for the dashboard, like
    /// `keel stats`), thread by thread.
    pub(crate) async fn for_each_log(
        &self,
        filter: &ThreadFilter,
        mut each: impl FnMut(Vec<Event>),
    ) -> Result<(), UiError> {
        let threads = self
            .store
            .list_threads(filter)
            .await
            .map_err(|e| self.store_error(e))?;
        for summary in threads {
            if !self.scope.allows(&summary.thread_id) {
                continue;
            }
            let events = self
                .store
                .load(&summary.thread_id)
                .await
                .map_err(|e| self.store_error(e))?;
            each(events);
        }
        Ok(())
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
