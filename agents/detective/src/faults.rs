//! Injected faults: rules that make the release service misbehave on purpose — an HTTP
//! error, a slow answer, a malformed body, a rejected report — so an evaluation can check
//! how the Detective copes. An evaluation's setup hook sets them before each trial through
//! [`crate::RunningService::set_faults`]; they replace the fixtures' own `behavior` for
//! the requests they match.
//!
//! A scenario's `setup` in a suite file (docs/evaluation.md) is a [`FaultSetup`]:
//!
//! ```toml
//! setup = { faults = [{ endpoint = "test-details", status = 500, times = 1 }] }
//! ```

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The endpoints a fault can hit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Endpoint {
    /// `GET /releases/{id}/summary` (the `get_release_summary` tool).
    Summary,
    /// `GET /releases/{id}/test-details` (the `get_test_details` tool).
    TestDetails,
    /// `POST /risk-reports` (the `file_risk_report` tool).
    RiskReports,
}

/// One rule: which requests it matches and what happens to them. Exactly one of `status`,
/// `delay_ms` and `malformed` says what happens.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FaultRule {
    /// The endpoint whose requests fail.
    pub endpoint: Endpoint,
    /// Only requests about this release (default: every release).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub release: Option<String>,
    /// Answer with this HTTP status (400–599) and a JSON error body.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    /// The error message of a `status` fault (default: one fitting the status).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Wait this long before answering normally (longer than a tool's `timeout_ms` makes
    /// the call time out). At most 600000.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay_ms: Option<u64>,
    /// Answer 200 with a JSON body cut off halfway.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub malformed: bool,
    /// Only the first `times` matching requests (default: every one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub times: Option<u32>,
}

/// The longest delay a rule may ask for.
const MAX_DELAY_MS: u64 = 600_000;

impl FaultRule {
    /// Checks the rule: exactly one effect, a status in 400–599, a bounded delay, `times`
    /// at least 1. The error names the field and the fix.
    pub fn validate(&self) -> Result<(), String> {
        let effects = usize::from(self.status.is_some())
            + usize::from(self.delay_ms.is_some())
            + usize::from(self.malformed);
        if effects != 1 {
            return Err(format!(
                "a fault needs exactly one of `status`, `delay_ms` and `malformed = true` (this one has {effects})"
            ));
        }
        if let Some(status) = self.status
            && !(400..=599).contains(&status)
        {
            return Err(format!(
                "`status` {status} is not an error status: use 400–599"
            ));
        }
        if self.message.is_some() && self.status.is_none() {
            return Err("`message` only goes with `status`".into());
        }
        if let Some(delay) = self.delay_ms
            && delay > MAX_DELAY_MS
        {
            return Err(format!(
                "`delay_ms` {delay} is too long: at most {MAX_DELAY_MS}"
            ));
        }
        if self.times == Some(0) {
            return Err("`times` must be at least 1 (leave it out for every request)".into());
        }
        Ok(())
    }
}

/// A scenario's `setup` for the release service: `{ faults = [...] }`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FaultSetup {
    /// The rules, first match wins.
    #[serde(default)]
    pub faults: Vec<FaultRule>,
}

impl FaultSetup {
    /// Reads a scenario's `setup` value (`null` is no faults) and validates every rule.
    /// The error names the offending rule (`faults[1]`) and the fix.
    pub fn from_value(setup: &Value) -> Result<Self, String> {
        if setup.is_null() {
            return Ok(Self::default());
        }
        let parsed: Self = serde_json::from_value(setup.clone()).map_err(|e| {
            format!(
                "{e} (a release-service setup is {{ faults = [{{ endpoint = \"summary\" | \"test-details\" | \"risk-reports\", status | delay_ms | malformed, release?, times?, message? }}] }})"
            )
        })?;
        for (index, rule) in parsed.faults.iter().enumerate() {
            rule.validate()
                .map_err(|e| format!("faults[{index}]: {e}"))?;
        }
        Ok(parsed)
    }
}

/// What the service does to one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum FaultAction {
    /// Answer this status with this message.
    Fail { status: u16, message: String },
    /// Wait, then answer normally.
    Delay(u64),
    /// Answer 200 with half a JSON body.
    Malformed,
}

/// The active rules with how many requests each may still hit.
#[derive(Debug, Default)]
pub(crate) struct ActiveFaults {
    rules: Vec<(FaultRule, Option<u32>)>,
}

impl ActiveFaults {
    /// Replaces the rules.
    pub(crate) fn set(&mut self, rules: Vec<FaultRule>) {
        self.rules = rules
            .into_iter()
            .map(|rule| {
                let remaining = rule.times;
                (rule, remaining)
            })
            .collect();
    }

    /// The action for a request to `endpoint` about `release`, counting it against the
    /// first matching rule that has requests left.
    pub(crate) fn take(
        &mut self,
        endpoint: Endpoint,
        release: Option<&str>,
    ) -> Option<FaultAction> {
        let (rule, remaining) = self.rules.iter_mut().find(|(rule, remaining)| {
            rule.endpoint == endpoint
                && remaining.is_none_or(|left| left > 0)
                && rule
                    .release
                    .as_deref()
                    .is_none_or(|wanted| release == Some(wanted))
        })?;
        if let Some(left) = remaining {
            *left = left.saturating_sub(1);
        }
        Some(if let Some(status) = rule.status {
            FaultAction::Fail {
                status,
                message: rule
                    .message
                    .clone()
                    .unwrap_or_else(|| default_message(endpoint, status)),
            }
        } else if let Some(ms) = rule.delay_ms {
            FaultAction::Delay(ms)
        } else {
            FaultAction::Malformed
        })
    }
}

/// The message a real service would send with `status`.
fn default_message(endpoint: Endpoint, status: u16) -> String {
    match (endpoint, status) {
        (Endpoint::RiskReports, 400..=499) => {
            "risk reports are not accepted for this release right now (release freeze); do not retry".into()
        }
        (_, 503) => "the release service is temporarily unavailable; try again later".into(),
        (_, 500..=599) => "the release database failed; try again later".into(),
        (_, _) => format!("the request was refused with status {status}"),
    }
}

/// Half of `body`'s JSON text: what a connection cut mid-answer leaves.
pub(crate) fn malformed_body(body: &Value) -> String {
    let text = body.to_string();
    let half = text.len() / 2;
    // Cut on a character boundary at or before the middle.
    let cut = (0..=half)
        .rev()
        .find(|&i| text.is_char_boundary(i))
        .unwrap_or(0);
    text.get(..cut).unwrap_or_default().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rule(value: Value) -> FaultRule {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn a_rule_with_times_stops_matching_after_that_many_requests() {
        let mut faults = ActiveFaults::default();
        faults.set(vec![rule(
            json!({"endpoint": "summary", "status": 500, "times": 1}),
        )]);
        assert!(matches!(
            faults.take(Endpoint::Summary, Some("v2.1.0")),
            Some(FaultAction::Fail { status: 500, .. })
        ));
        assert_eq!(faults.take(Endpoint::Summary, Some("v2.1.0")), None);
    }

    #[test]
    fn rules_match_their_endpoint_and_release_only() {
        let mut faults = ActiveFaults::default();
        faults.set(vec![rule(
            json!({"endpoint": "test-details", "release": "v2.1.0", "malformed": true}),
        )]);
        assert_eq!(faults.take(Endpoint::Summary, Some("v2.1.0")), None);
        assert_eq!(faults.take(Endpoint::TestDetails, Some("v1.9.8")), None);
        assert_eq!(
            faults.take(Endpoint::TestDetails, Some("v2.1.0")),
            Some(FaultAction::Malformed)
        );
        assert_eq!(
            faults.take(Endpoint::TestDetails, Some("v2.1.0")),
            Some(FaultAction::Malformed)
        );
        faults.set(Vec::new());
        assert_eq!(faults.take(Endpoint::TestDetails, Some("v2.1.0")), None);
    }

    #[test]
    fn setups_are_validated_naming_the_rule_and_the_fix() {
        assert_eq!(
            FaultSetup::from_value(&Value::Null).unwrap(),
            FaultSetup::default()
        );
        let two = FaultSetup::from_value(&json!({"faults": [
            {"endpoint": "summary", "delay_ms": 10},
            {"endpoint": "summary", "status": 500, "delay_ms": 10}
        ]}))
        .unwrap_err();
        assert!(
            two.starts_with("faults[1]: a fault needs exactly one of"),
            "{two}"
        );
        let status =
            FaultSetup::from_value(&json!({"faults": [{"endpoint": "summary", "status": 200}]}))
                .unwrap_err();
        assert!(status.contains("use 400–599"), "{status}");
        let unknown =
            FaultSetup::from_value(&json!({"faults": [{"endpoint": "sumary", "status": 500}]}))
                .unwrap_err();
        assert!(unknown.contains("unknown variant `sumary`"), "{unknown}");
        let key = FaultSetup::from_value(&json!({"fautls": []})).unwrap_err();
        assert!(key.contains("unknown field `fautls`"), "{key}");
    }

    #[test]
    fn a_malformed_body_is_invalid_json_cut_on_a_character_boundary() {
        let body = json!({"release": "v2.1.0", "note": "ééééééééé"});
        let text = malformed_body(&body);
        assert!(serde_json::from_str::<Value>(&text).is_err());
        assert!(body.to_string().starts_with(&text));
    }
}
