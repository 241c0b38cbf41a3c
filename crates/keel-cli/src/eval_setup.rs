//! The setup hooks `keel eval run` provides, named by a suite's `[suite] setup_hook`.
//!
//! `release-service` — for the Detective: starts the release service in this process for
//! the whole run (reports filed into `<out>/risk-reports`), points `RELEASE_SERVICE_URL`
//! at it for the agent's tools, and before each trial sets the faults of the scenario's
//! `setup` (`{ faults = [...] }`, see `keel_detective::faults`), clearing them for a
//! scenario without one. Its faults are service-wide, so such a suite runs one trial at
//! a time.

use std::path::PathBuf;

use keel_config::{Diagnostic, DiagnosticCode};
use keel_detective::{FaultSetup, RunningService, ServiceConfig};
use keel_eval::{Scenario, Suite, TrialSetup};
use serde_json::Value;

use crate::CliError;

/// The Detective's release service with injected faults.
pub const RELEASE_SERVICE: &str = "release-service";

/// Every hook name `keel eval run` knows.
const KNOWN_HOOKS: [&str; 1] = [RELEASE_SERVICE];

/// Located problems with the suite's hook settings and setups, before anything runs: an
/// unknown hook name, a hook that needs `concurrency = 1`, a `setup` the hook cannot read.
pub fn check(suite: &Suite) -> Vec<Diagnostic> {
    let Some(hook) = suite.suite.setup_hook.as_deref() else {
        return Vec::new();
    };
    if !KNOWN_HOOKS.contains(&hook) {
        return vec![suite.source.error(
            DiagnosticCode::InvalidValue,
            "suite.setup_hook",
            format!(
                "unknown setup hook `{hook}`; keel eval run provides: {}",
                KNOWN_HOOKS.join(", ")
            ),
        )];
    }
    let mut problems = Vec::new();
    if suite.suite.concurrency > 1 {
        problems.push(suite.source.error(
            DiagnosticCode::InvalidValue,
            "suite.concurrency",
            format!(
                "setup_hook `{hook}` sets faults for the whole release service, so trials must run \
                 one at a time: set concurrency = 1"
            ),
        ));
    }
    for (index, scenario) in suite.scenarios.iter().enumerate() {
        if let Some(setup) = &scenario.setup
            && let Err(problem) = FaultSetup::from_value(setup)
        {
            problems.push(suite.source.error(
                DiagnosticCode::InvalidValue,
                &format!("scenarios[{index}].setup"),
                format!("scenario `{}`: {problem}", scenario.id),
            ));
        }
    }
    problems
}

/// The `release-service` hook: the running service whose faults it sets.
#[derive(Debug)]
pub struct ReleaseServiceHook {
    service: RunningService,
}

impl ReleaseServiceHook {
    /// Starts the release service on a free port, filing reports into `reports_dir`.
    pub async fn start(reports_dir: PathBuf) -> Result<Self, CliError> {
        let service = keel_detective::serve(ServiceConfig {
            port: 0,
            reports_dir,
            fixtures_dir: None,
        })
        .await
        .map_err(|e| CliError::failure(format!("setup_hook {RELEASE_SERVICE}: {e}")))?;
        Ok(Self { service })
    }

    /// `http://127.0.0.1:PORT`, the agent's `RELEASE_SERVICE_URL`.
    pub fn base_url(&self) -> String {
        self.service.base_url()
    }

    /// Stops the service.
    pub async fn shutdown(self) {
        self.service.shutdown().await;
    }
}

#[async_trait::async_trait]
impl TrialSetup for ReleaseServiceHook {
    async fn prepare(
        &self,
        _scenario: &Scenario,
        setup: &Value,
        _trial: u32,
    ) -> Result<(), String> {
        let setup = FaultSetup::from_value(setup)?;
        self.service.set_faults(setup.faults).await
    }
}
