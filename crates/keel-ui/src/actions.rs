//! What the pages change: approve or deny a paused call (recorded through
//! `keel-runtime`'s `Thread::approve` / `deny`, exactly as `keel approve` does, then the run
//! is continued in the background by a [`Resumer`] — for `keel ui`, [`AppResumer`] over
//! `keel_app::resume::resume_thread`), answer the agent's question (as `keel reply`: a run
//! still waiting records it with `Thread::answer_user` and continues; after a run that
//! ended `clarify_needed` the answer starts the thread's next run, [`Resumer::reply`]), and
//! fork a thread from a turn (`keel_app::threads::fork`). Form posts from another site are
//! refused.

use std::sync::Arc;

use async_trait::async_trait;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::Redirect;
use keel_app::App;
use keel_app::recipe::Recipe;
use keel_app::resume::{self, Latest, Runner};
use keel_core::{EventStore, Message, Model};
use keel_runtime::{RunContext, RunObserver, RunOutcome, RunStatus, Thread};

use crate::error::UiError;
use crate::{Scope, Ui};

/// Continues a thread's run after a decision was recorded on it.
#[async_trait]
pub trait Resumer: Send + Sync {
    /// Continues thread `thread_id` of `store` until it ends or pauses again; returns a
    /// line saying how it ended, or why it could not continue.
    async fn resume(&self, store: Arc<dyn EventStore>, thread_id: &str) -> Result<String, String>;

    /// Starts the next run of thread `thread_id` with `message` as the user's message and
    /// the agent of the thread's last run (`keel reply` after a run ended
    /// `clarify_needed`); returns a line saying how it went, or why it could not start.
    /// The default refuses.
    async fn reply(
        &self,
        store: Arc<dyn EventStore>,
        thread_id: &str,
        message: &str,
    ) -> Result<String, String> {
        let _ = (store, message);
        Err(format!(
            "this UI cannot start runs: answer with `keel reply {thread_id} ANSWER`"
        ))
    }
}

/// A line saying how a run stands after it returned.
fn said(outcome: &RunOutcome) -> String {
    match &outcome.status {
        RunStatus::Ended { end_state } => format!("run {} ended {end_state}", outcome.run_id),
        RunStatus::AwaitingApproval { call_id, tool } => format!(
            "run {} waits for approval of {tool} ({call_id})",
            outcome.run_id
        ),
    }
}

/// Supplies the model a resumed run continues with, from the recipe its run recorded and
/// the number of model answers the run (and the runs it continues) already consumed —
/// e.g. the CLI's `--script` models, positioned at the right step. `Ok(None)`: build the
/// recipe's model as usual.
pub type ModelHook =
    Arc<dyn Fn(&Recipe, usize) -> Result<Option<Arc<dyn Model>>, String> + Send + Sync>;

enum AppRef {
    Shared(Arc<App>),
    Static(&'static App),
}

impl AppRef {
    fn get(&self) -> &App {
        match self {
            Self::Shared(app) => app,
            Self::Static(app) => app,
        }
    }
}

/// The [`Resumer`] of `keel approve`: the agent (or workflow) the run recorded is rebuilt
/// by `keel_app::resume::resume_thread` and continues.
pub struct AppResumer {
    app: AppRef,
    models: Option<ModelHook>,
    observers: Vec<Arc<dyn RunObserver>>,
}

impl std::fmt::Debug for AppResumer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppResumer")
            .field("models", &self.models.is_some())
            .field("observers", &self.observers.len())
            .finish_non_exhaustive()
    }
}

impl AppResumer {
    /// Resumes with `app`'s configuration.
    pub fn new(app: Arc<App>) -> Self {
        Self {
            app: AppRef::Shared(app),
            models: None,
            observers: Vec::new(),
        }
    }

    /// Resumes with a process-wide `app` (the CLI's).
    pub fn from_static(app: &'static App) -> Self {
        Self {
            app: AppRef::Static(app),
            models: None,
            observers: Vec::new(),
        }
    }

    /// Resumed runs take their model from `hook` when it gives one.
    pub fn with_models(mut self, hook: ModelHook) -> Self {
        self.models = Some(hook);
        self
    }

    /// Resumed runs are also reported to `observer` (e.g. the telemetry sink that writes
    /// trace files).
    pub fn with_observer(mut self, observer: Arc<dyn RunObserver>) -> Self {
        self.observers.push(observer);
        self
    }
}

#[async_trait]
impl Resumer for AppResumer {
    async fn resume(&self, store: Arc<dyn EventStore>, thread_id: &str) -> Result<String, String> {
        let thread = resume::load_existing(store.as_ref(), thread_id)
            .await
            .map_err(|e| e.to_string())?;
        let model = match (&self.models, resume::recorded_runner(&thread)) {
            (Some(hook), Ok(Runner::Agent(Some(recipe)))) => {
                let steps = match resume::latest_run(&thread) {
                    Ok(Latest::Continue { consumed_steps, .. }) => consumed_steps,
                    _ => 0,
                };
                let steps = resume::script_steps(store.as_ref(), &thread, steps)
                    .await
                    .unwrap_or(steps);
                hook(&recipe, steps)?
            }
            _ => None,
        };
        let observers = self.observers.clone();
        let resumed = resume::resume_thread(
            self.app.get(),
            store,
            thread_id,
            &Recipe::default(),
            model,
            move |mut context| {
                for observer in observers {
                    context = context.with_observer(observer);
                }
                context
            },
        )
        .await
        .map_err(|e| e.to_string())?;
        Ok(said(&resumed.outcome))
    }

    async fn reply(
        &self,
        store: Arc<dyn EventStore>,
        thread_id: &str,
        message: &str,
    ) -> Result<String, String> {
        let mut thread = resume::load_existing(store.as_ref(), thread_id)
            .await
            .map_err(|e| e.to_string())?;
        let recipe = match resume::recorded_runner(&thread).map_err(|e| e.to_string())? {
            Runner::Agent(Some(recipe)) => Recipe {
                submission: None,
                ..recipe
            },
            Runner::Agent(None) => {
                return Err(format!(
                    "the last run of thread {thread_id} recorded no agent: answer with                      `keel reply {thread_id} ANSWER` and the agent's flags"
                ));
            }
            Runner::Workflow(_) => {
                return Err(format!(
                    "thread {thread_id} belongs to a workflow: answer with `keel reply {thread_id} ANSWER`"
                ));
            }
        };
        // A new run: a scripted model starts its script from the first step, as `keel reply`.
        let model = match &self.models {
            Some(hook) => hook(&recipe, 0)?,
            None => None,
        };
        let app = self.app.get();
        let built = recipe
            .build_agent(app, model)
            .await
            .map_err(|e| format!("cannot rebuild the agent of thread {thread_id}'s run: {e}"))?;
        let mut context = app.run_context(store, recipe.approve, built.approve);
        for observer in &self.observers {
            context = context.with_observer(observer.clone());
        }
        let outcome = built
            .agent
            .run(vec![Message::user(message)], &mut thread, &context)
            .await
            .map_err(|e| keel_app::worker::run_error(&e))?;
        Ok(said(&outcome))
    }
}

/// Refuses a form posted from another site (the UI has no session to protect it with: a
/// page elsewhere must not be able to approve calls on a loopback `keel ui`).
fn same_origin(headers: &HeaderMap) -> Result<(), UiError> {
    match cross_site_refusal(headers) {
        Some(why) => Err(UiError::forbidden(why)),
        None => Ok(()),
    }
}

/// Why a form post with `headers` comes from another site and must be refused, if it
/// does (`keel serve`'s `/ui` login checks its form the same way).
pub fn cross_site_refusal(headers: &HeaderMap) -> Option<String> {
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    // Browsers say where a request comes from; `same-origin` is the UI's own form.
    if let Some(site) = text("sec-fetch-site") {
        return match site {
            "same-origin" | "none" => None,
            other => Some(format!(
                "form posts from other sites are refused (sec-fetch-site: {other})"
            )),
        };
    }
    if let (Some(origin), Some(host)) = (text("origin"), text("host")) {
        let bare = origin
            .strip_prefix("http://")
            .or_else(|| origin.strip_prefix("https://"))
            .unwrap_or(origin);
        if bare != host {
            return Some(format!("a form from {origin} may not post to {host}"));
        }
    }
    None
}

/// The fields of a posted form (or a query string), in order.
pub fn form(body: &str) -> Vec<(String, String)> {
    form_urlencoded::parse(body.as_bytes())
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect()
}

fn field<'a>(fields: &'a [(String, String)], name: &str) -> Option<&'a str> {
    fields
        .iter()
        .rev()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
        .filter(|v| !v.trim().is_empty())
}

/// `POST /runs/{thread}/approve` (`call_id`).
pub(crate) async fn approve(
    State(ui): State<Ui>,
    Path(thread_id): Path<String>,
    headers: HeaderMap,
    session: Option<axum::Extension<crate::CsrfToken>>,
    by: Option<axum::Extension<crate::DecidedBy>>,
    body: String,
) -> Result<Redirect, UiError> {
    let ui = ui.for_request(session.as_ref().map(|s| &s.0));
    let by = by.map_or_else(|| "keel ui".to_string(), |b| b.0.0);
    decide(ui, thread_id, headers, body, true, by).await
}

/// `POST /runs/{thread}/deny` (`call_id`, optional `reason`).
pub(crate) async fn deny(
    State(ui): State<Ui>,
    Path(thread_id): Path<String>,
    headers: HeaderMap,
    session: Option<axum::Extension<crate::CsrfToken>>,
    by: Option<axum::Extension<crate::DecidedBy>>,
    body: String,
) -> Result<Redirect, UiError> {
    let ui = ui.for_request(session.as_ref().map(|s| &s.0));
    let by = by.map_or_else(|| "keel ui".to_string(), |b| b.0.0);
    decide(ui, thread_id, headers, body, false, by).await
}

async fn decide(
    ui: Ui,
    thread_id: String,
    headers: HeaderMap,
    body: String,
    approve: bool,
    by: String,
) -> Result<Redirect, UiError> {
    same_origin(&headers)?;
    let thread_id = ui.store_id(&thread_id);
    let fields = form(&body);
    let call_id = field(&fields, "call_id")
        .ok_or_else(|| UiError::bad_input("call_id", "missing: which call to decide"))?
        .to_string();
    let events = ui.source.load_raw(&thread_id).await?;
    // After the thread is found: another tenant's thread is not found either way.
    ui.check_csrf(field(&fields, "csrf"))?;
    let claim = claim(&ui, &thread_id).await?;
    let (store, events) = match &claim {
        // Read again under the lease: what the holder before wrote is seen.
        Some(claim) => (claim.store(), ui.source.load_raw(&thread_id).await?),
        None => (ui.source.store().clone(), events),
    };
    let mut thread = Thread::from_events(&thread_id, events);
    let context = RunContext::new(store.clone());
    let recorded = if approve {
        thread.approve(&context, &call_id, Some(by)).await
    } else {
        let reason = field(&fields, "reason").map(str::to_string);
        thread.deny_by(&context, &call_id, reason, Some(by)).await
    };
    if let Err(error) = recorded {
        release(claim).await;
        return Err(UiError::conflict(ui.source.redact(&error.to_string())));
    }
    let decision = if approve { "approved" } else { "denied" };
    match ui.resumer.clone() {
        Some(resumer) => {
            ui.note(
                &thread_id,
                Some(format!("{decision} call {call_id}; the run continues…")),
            );
            let id = thread_id.clone();
            let background = ui.clone();
            tokio::spawn(async move {
                let resumed = resumer.resume(store, &id).await;
                release(claim).await;
                let said = match resumed {
                    Ok(line) => format!("{decision} call {call_id}; {line}"),
                    Err(error) => format!(
                        "{decision} call {call_id}, but the run could not continue: {error} \
                         (continue it with `keel resume {id}`)"
                    ),
                };
                tracing::info!(thread = %id, "{}", background.source.redact(&said));
                background.note(&id, Some(background.source.redact(&said)));
            });
        }
        None => {
            release(claim).await;
            ui.note(
                &thread_id,
                Some(format!(
                    "{decision} call {call_id}; continue the run with `keel resume {thread_id}`"
                )),
            );
        }
    }
    Ok(Redirect::to(&ui.run_href(&thread_id, "")))
}

/// The thread's lease when this UI drives threads itself ([`Ui::with_claims`]); a thread
/// another driver holds is a 409 naming the holder.
async fn claim(ui: &Ui, thread_id: &str) -> Result<Option<keel_app::claim::ThreadClaim>, UiError> {
    let Some(queue) = &ui.claims else {
        return Ok(None);
    };
    keel_app::claim::ThreadClaim::take(
        ui.source.store().clone(),
        queue.clone(),
        thread_id,
        "keel ui",
    )
    .await
    .map(Some)
    .map_err(|e| UiError::conflict(ui.source.redact(&e.to_string())))
}

/// Ends a lease [`claim`] took, if it took one.
async fn release(claim: Option<keel_app::claim::ThreadClaim>) {
    if let Some(claim) = claim {
        claim.release().await;
    }
}

/// How long an answer's post waits for the run it continues or starts to show in the log,
/// so the page it redirects to follows the run live (a worker of `keel serve` may take a
/// moment to pick the job up; past this the page says the run continues).
const REPLY_SHOWS_WITHIN: std::time::Duration = std::time::Duration::from_secs(5);

/// `POST /runs/{thread}/reply` (`answer`): answers the question the thread's latest run
/// asked. A run still waiting records the answer (`Thread::answer_user`) and continues
/// through [`Resumer::resume`]; after a run that ended `clarify_needed` the answer starts
/// the next run ([`Resumer::reply`]), as `keel reply` does.
pub(crate) async fn reply(
    State(ui): State<Ui>,
    Path(url_id): Path<String>,
    headers: HeaderMap,
    session: Option<axum::Extension<crate::CsrfToken>>,
    body: String,
) -> Result<Redirect, UiError> {
    let ui = ui.for_request(session.as_ref().map(|s| &s.0));
    same_origin(&headers)?;
    let thread_id = ui.store_id(&url_id);
    let fields = form(&body);
    let answer = field(&fields, "answer")
        .ok_or_else(|| UiError::bad_input("answer", "missing: type the answer to the question"))?
        .trim()
        .to_string();
    let events = ui.source.load_raw(&thread_id).await?;
    // After the thread is found: another tenant's thread is not found either way.
    ui.check_csrf(field(&fields, "csrf"))?;
    let question = crate::run_page::pending_question(&events)
        .ok_or_else(|| UiError::conflict(format!("run {url_id} is not waiting for an answer")))?;
    let resumer = ui.resumer.clone().ok_or_else(|| {
        UiError::conflict(format!(
            "this UI cannot continue runs: answer with `keel reply {url_id} ANSWER`"
        ))
    })?;
    let claim = claim(&ui, &thread_id).await?;
    let (store, events) = match &claim {
        // Read again under the lease: what the holder before wrote is seen.
        Some(claim) => (claim.store(), ui.source.load_raw(&thread_id).await?),
        None => (ui.source.store().clone(), events),
    };
    let before = events.len();
    if question.in_run {
        let mut thread = Thread::from_events(&thread_id, events);
        let context = RunContext::new(store.clone());
        if let Err(error) = thread.answer_user(&context, &answer).await {
            release(claim).await;
            return Err(UiError::conflict(ui.source.redact(&error.to_string())));
        }
    }
    ui.note(
        &thread_id,
        Some(if question.in_run {
            "answered; the run continues…".to_string()
        } else {
            "answered; the thread's next run starts with the answer…".to_string()
        }),
    );
    let id = thread_id.clone();
    let background = ui.clone();
    let in_run = question.in_run;
    let task_store = store.clone();
    let task = tokio::spawn(async move {
        let done = if in_run {
            resumer.resume(task_store, &id).await
        } else {
            resumer.reply(task_store, &id, &answer).await
        };
        release(claim).await;
        let said = match done {
            Ok(line) => format!("answered; {line}"),
            Err(error) => format!(
                "the answer was not taken up: {error} (answer with `keel reply {id} ANSWER`)"
            ),
        };
        let said = background.source.redact(&said);
        tracing::info!(thread = %id, "{said}");
        background.note(&id, Some(said));
    });
    // The page this redirects to follows the run live only once the log shows it going.
    let deadline = tokio::time::Instant::now() + REPLY_SHOWS_WITHIN;
    while tokio::time::Instant::now() < deadline && !task.is_finished() {
        match store.load(&thread_id).await {
            Ok(now) if now.len() > before && !crate::run_page::ended(&now) => break,
            Ok(_) => {}
            Err(_) => break,
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    Ok(Redirect::to(&ui.run_href(&thread_id, "")))
}

/// `POST /runs/{thread}/fork` (`at_seq`): a new thread with the log up to `at_seq`.
pub(crate) async fn fork(
    State(ui): State<Ui>,
    Path(thread_id): Path<String>,
    headers: HeaderMap,
    session: Option<axum::Extension<crate::CsrfToken>>,
    body: String,
) -> Result<Redirect, UiError> {
    let ui = ui.for_request(session.as_ref().map(|s| &s.0));
    same_origin(&headers)?;
    let thread_id = ui.store_id(&thread_id);
    let fields = form(&body);
    let at_seq: u64 = field(&fields, "at_seq")
        .ok_or_else(|| UiError::bad_input("at_seq", "missing: the last event to copy"))?
        .trim()
        .parse()
        .map_err(|_| UiError::bad_input("at_seq", "give a whole number"))?;
    let events = ui.source.load_raw(&thread_id).await?;
    // After the thread is found: another tenant's thread is not found either way.
    ui.check_csrf(field(&fields, "csrf"))?;
    if at_seq >= events.len() as u64 {
        return Err(UiError::bad_input(
            "at_seq",
            format!("run {thread_id} has {} events", events.len()),
        ));
    }
    let store = ui.source.store();
    let target = match ui.source.scope() {
        Scope::All => {
            keel_app::threads::fork(store.as_ref(), &thread_id, at_seq)
                .await
                .map_err(|e| ui.source.store_error(e))?
                .thread_id
        }
        Scope::ThreadPrefix(prefix) => {
            let target = format!("{prefix}thr_{}", keel_core::event::new_trace_id());
            store
                .fork_thread(&thread_id, at_seq, &target)
                .await
                .map_err(|e| ui.source.store_error(e))?;
            target
        }
    };
    ui.note(
        &target,
        Some(format!(
            "forked from {thread_id} at event {at_seq}; continue it with `keel resume {target}`"
        )),
    );
    Ok(Redirect::to(&ui.run_href(&target, "")))
}
