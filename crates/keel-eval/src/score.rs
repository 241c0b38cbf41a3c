//! Deterministic scoring of one trial: every expectation of a scenario becomes one check
//! with an outcome and a human-readable reason; a dimension's score is the mean of its
//! checks' scores (each 0 or 1, a judge's verdict in between), and a dimension without
//! checks is absent, not 1.0. A trial passes when every present dimension meets its
//! threshold. The LLM judge that scores rubrics plugs in through [`Judge`] and
//! [`apply_judge`] (the model-backed one is [`crate::judge::ModelJudge`]).

use std::collections::BTreeMap;

use regex::{Regex, RegexBuilder};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::suite::{
    DecisionQualityExpect, ExpectedEnd, Fact, RobustnessExpect, Scenario, Thresholds,
    ToolUsageExpect, ValuePredicate,
};
use crate::trace::{RunTrace, TraceEnd};

/// An evaluation dimension (seed 004 §7).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Dimension {
    /// Behavioural validation of the tool calls.
    ToolUsage,
    /// Validation of the final answer.
    DecisionQuality,
    /// How the run handled failures.
    Robustness,
}

impl Dimension {
    /// Every dimension.
    pub const ALL: [Dimension; 3] = [
        Dimension::ToolUsage,
        Dimension::DecisionQuality,
        Dimension::Robustness,
    ];

    /// snake_case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ToolUsage => "tool_usage",
            Self::DecisionQuality => "decision_quality",
            Self::Robustness => "robustness",
        }
    }

    /// This dimension's threshold.
    pub fn threshold(self, thresholds: &Thresholds) -> f64 {
        match self {
            Self::ToolUsage => thresholds.tool_usage,
            Self::DecisionQuality => thresholds.decision_quality,
            Self::Robustness => thresholds.robustness,
        }
    }
}

/// One check's outcome.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckOutcome {
    /// Its dimension.
    pub dimension: Dimension,
    /// The kind of check (`required`, `order`, `required_fact`, `end_state`, …).
    pub check: String,
    /// Whether it held (for a judge: whether its score met the threshold).
    pub passed: bool,
    /// 1.0 or 0.0 (a judge's score for `rubric`).
    pub score: f64,
    /// Why, in words.
    pub reason: String,
}

/// A dimension's score in one trial.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct DimensionScore {
    /// Mean of its checks' scores, 0..=1.
    pub score: f64,
    /// Checks that held.
    pub passed: u32,
    /// Checks.
    pub total: u32,
    /// Whether `score` meets the suite's threshold.
    pub met: bool,
}

/// A trial's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TrialStatus {
    /// Every present dimension met its threshold.
    Passed,
    /// Some dimension fell short.
    Failed,
    /// The judge failed: the trial is never counted as passed.
    JudgeError,
}

/// One trial's scores.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrialScore {
    /// Passed, failed or judge error.
    pub status: TrialStatus,
    /// Per present dimension.
    pub dimensions: BTreeMap<Dimension, DimensionScore>,
    /// Every check, in scenario order.
    pub checks: Vec<CheckOutcome>,
    /// The judge's failure, when it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub judge_error: Option<String>,
    /// Why the run itself failed (setup, timeout, store or build error), when it did: the
    /// trial is then `failed` whatever its checks say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl TrialScore {
    /// Records that the trial's run failed with `error`: the trial is `failed`.
    pub fn fail_run(&mut self, error: impl Into<String>, thresholds: &Thresholds) {
        self.error = Some(error.into());
        self.finish(thresholds);
    }

    /// The score of `dimension`, when it has checks.
    pub fn score(&self, dimension: Dimension) -> Option<f64> {
        self.dimensions.get(&dimension).map(|d| d.score)
    }

    /// The checks that did not hold.
    pub fn failures(&self) -> impl Iterator<Item = &CheckOutcome> {
        self.checks.iter().filter(|c| !c.passed)
    }

    /// Recomputes the dimensions and the status from the checks.
    fn finish(&mut self, thresholds: &Thresholds) {
        self.dimensions.clear();
        for dimension in Dimension::ALL {
            let checks: Vec<&CheckOutcome> = self
                .checks
                .iter()
                .filter(|c| c.dimension == dimension)
                .collect();
            if checks.is_empty() {
                continue;
            }
            let total = checks.len() as f64;
            let score = checks.iter().map(|c| c.score).sum::<f64>() / total;
            let passed = checks.iter().filter(|c| c.passed).count();
            self.dimensions.insert(
                dimension,
                DimensionScore {
                    score,
                    passed: u32::try_from(passed).unwrap_or(u32::MAX),
                    total: u32::try_from(checks.len()).unwrap_or(u32::MAX),
                    met: score + 1e-9 >= dimension.threshold(thresholds),
                },
            );
        }
        self.status = if self.judge_error.is_some() {
            TrialStatus::JudgeError
        } else if self.error.is_some() {
            TrialStatus::Failed
        } else if self.dimensions.values().all(|d| d.met) {
            TrialStatus::Passed
        } else {
            TrialStatus::Failed
        };
    }
}

/// An LLM judge's verdict on a rubric.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JudgeVerdict {
    /// 0..=1.
    pub score: f64,
    /// Why.
    pub rationale: String,
}

/// Why a judge produced no verdict.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("judge failed: {0}")]
pub struct JudgeError(pub String);

/// Scores a scenario's rubric against a trial (an LLM judge: [`crate::judge::ModelJudge`]).
#[async_trait::async_trait]
pub trait Judge: Send + Sync {
    /// The verdict on `rubric` for `scenario`'s run `trace`.
    async fn judge(
        &self,
        rubric: &str,
        scenario: &Scenario,
        trace: &RunTrace,
    ) -> Result<JudgeVerdict, JudgeError>;
}

/// Adds a judge's result to a trial as the `rubric` check of decision quality (its score
/// is the verdict's, clamped to 0..=1) and recomputes the status; a judge error makes the
/// trial `judge_error`, never passed.
pub fn apply_judge(
    score: &mut TrialScore,
    verdict: Result<JudgeVerdict, JudgeError>,
    thresholds: &Thresholds,
) {
    match verdict {
        Ok(verdict) => {
            let value = if verdict.score.is_finite() {
                verdict.score.clamp(0.0, 1.0)
            } else {
                0.0
            };
            score.checks.push(CheckOutcome {
                dimension: Dimension::DecisionQuality,
                check: "rubric".into(),
                passed: value + 1e-9 >= thresholds.decision_quality,
                score: value,
                reason: format!("judge scored {value:.2}: {}", verdict.rationale),
            });
        }
        Err(error) => score.judge_error = Some(error.to_string()),
    }
    score.finish(thresholds);
}

/// Scores one trial of `scenario` from its `trace` with the suite's `thresholds`. The
/// rubric is not scored here (see [`apply_judge`]).
pub fn score_scenario(
    scenario: &Scenario,
    trace: &RunTrace,
    thresholds: &Thresholds,
) -> TrialScore {
    let mut checks = Vec::new();
    if let Some(tools) = &scenario.expect.tool_usage {
        tool_usage(tools, trace, &mut checks);
    }
    if let Some(dq) = &scenario.expect.decision_quality {
        decision_quality(dq, trace, &mut checks);
    }
    if let Some(rb) = &scenario.expect.robustness {
        robustness(rb, trace, &mut checks);
    }
    let mut score = TrialScore {
        status: TrialStatus::Failed,
        dimensions: BTreeMap::new(),
        checks,
        judge_error: None,
        error: None,
    };
    score.finish(thresholds);
    score
}

fn check(dimension: Dimension, kind: &str, passed: bool, reason: String) -> CheckOutcome {
    CheckOutcome {
        dimension,
        check: kind.into(),
        passed,
        score: if passed { 1.0 } else { 0.0 },
        reason,
    }
}

fn tool_usage(expect: &ToolUsageExpect, trace: &RunTrace, out: &mut Vec<CheckOutcome>) {
    let d = Dimension::ToolUsage;
    let called: Vec<&str> = trace.tool_calls.iter().map(|c| c.name.as_str()).collect();
    for tool in &expect.required {
        let n = called.iter().filter(|c| **c == tool).count();
        out.push(if n > 0 {
            check(d, "required", true, format!("`{tool}` called ({n}×)"))
        } else {
            check(
                d,
                "required",
                false,
                format!("required tool `{tool}` never called"),
            )
        });
    }
    for tool in &expect.forbidden {
        let n = called.iter().filter(|c| **c == tool).count();
        out.push(if n == 0 {
            check(d, "forbidden", true, format!("`{tool}` not called"))
        } else {
            check(
                d,
                "forbidden",
                false,
                format!("forbidden tool `{tool}` called ({n}×)"),
            )
        });
    }
    for chain in &expect.order {
        out.push(order_check(chain, &called));
    }
    if let Some(max) = expect.max_calls {
        let n = called.len();
        let ok = n <= max as usize;
        out.push(check(
            d,
            "max_calls",
            ok,
            if ok {
                format!("{n} tool calls (at most {max})")
            } else {
                format!("{n} tool calls, more than the {max} allowed")
            },
        ));
    }
    if expect.recovered_from_error {
        out.push(recovery_check(trace));
    }
    for arg in &expect.arguments {
        let calls: Vec<_> = trace.calls_of(&arg.tool).collect();
        let predicate = arg.predicate();
        let what = format!("`{}` argument `{}`", arg.tool, arg.pointer);
        if calls.is_empty() {
            out.push(check(
                d,
                "argument",
                false,
                format!("{what}: `{}` never called", arg.tool),
            ));
            continue;
        }
        let failures: Vec<String> = calls
            .iter()
            .enumerate()
            .filter_map(|(i, call)| match call.arguments.pointer(&arg.pointer) {
                None => Some(format!("call {} has no `{}`", i + 1, arg.pointer)),
                Some(value) => predicate
                    .test(value)
                    .err()
                    .map(|why| format!("call {}: {why}", i + 1)),
            })
            .collect();
        out.push(if failures.is_empty() {
            check(
                d,
                "argument",
                true,
                format!(
                    "{what} {} in all {} call(s)",
                    predicate.describe(),
                    calls.len()
                ),
            )
        } else {
            check(
                d,
                "argument",
                false,
                format!("{what}: {}", failures.join("; ")),
            )
        });
    }
}

fn order_check(chain: &[String], called: &[&str]) -> CheckOutcome {
    let d = Dimension::ToolUsage;
    let shown = chain
        .iter()
        .map(|t| format!("`{t}`"))
        .collect::<Vec<_>>()
        .join(" before ");
    let mut firsts = Vec::with_capacity(chain.len());
    for tool in chain {
        match called.iter().position(|c| c == tool) {
            Some(i) => firsts.push((tool, i)),
            None => {
                return check(d, "order", false, format!("{shown}: `{tool}` never called"));
            }
        }
    }
    for pair in firsts.windows(2) {
        if let [(a, ia), (b, ib)] = pair
            && ib < ia
        {
            return check(d, "order", false, format!("`{b}` called before `{a}`"));
        }
    }
    check(d, "order", true, format!("{shown}, as expected"))
}

fn recovery_check(trace: &RunTrace) -> CheckOutcome {
    let d = Dimension::ToolUsage;
    let failed: Vec<_> = trace.tool_calls.iter().filter(|c| c.failed()).collect();
    if failed.is_empty() {
        return check(
            d,
            "recovered_from_error",
            false,
            "no tool call failed, so there was no error to recover from".into(),
        );
    }
    let answered = trace.end == TraceEnd::Ended(keel_core::EndState::Done)
        && !trace.answer().trim().is_empty();
    let unrecovered: Vec<&str> = failed
        .iter()
        .filter(|f| {
            let at = trace
                .tool_calls
                .iter()
                .position(|c| c.id == f.id)
                .unwrap_or(0);
            !trace
                .tool_calls
                .iter()
                .skip(at + 1)
                .any(|c| c.name == f.name && c.succeeded())
        })
        .map(|f| f.name.as_str())
        .collect();
    if answered {
        check(
            d,
            "recovered_from_error",
            true,
            format!(
                "{} failed call(s); the run still ended `done` with an answer",
                failed.len()
            ),
        )
    } else if unrecovered.is_empty() {
        check(
            d,
            "recovered_from_error",
            true,
            format!(
                "{} failed call(s), each later retried successfully",
                failed.len()
            ),
        )
    } else {
        check(
            d,
            "recovered_from_error",
            false,
            format!(
                "`{}` failed and was never called successfully afterwards, and the run ended \
                 `{}` without an answer",
                unrecovered.join("`, `"),
                trace.end.as_str()
            ),
        )
    }
}

impl ValuePredicate {
    /// `equals "high"`, `matches /re/`, `in [..]`.
    pub fn describe(&self) -> String {
        if let Some(v) = &self.equals {
            format!("equals {v}")
        } else if let Some(re) = &self.matches {
            format!("matches /{re}/")
        } else if let Some(list) = &self.one_of {
            format!("in {}", Value::Array(list.clone()))
        } else {
            "(no predicate)".into()
        }
    }

    /// Ok when `value` satisfies the predicate, else why not.
    pub fn test(&self, value: &Value) -> Result<(), String> {
        if let Some(expected) = &self.equals {
            return if json_eq(value, expected) {
                Ok(())
            } else {
                Err(format!("expected {expected}, got {value}"))
            };
        }
        if let Some(pattern) = &self.matches {
            let re = Regex::new(pattern).map_err(|e| format!("invalid regex /{pattern}/: {e}"))?;
            let text = match value {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            return if re.is_match(&text) {
                Ok(())
            } else {
                Err(format!("{value} does not match /{pattern}/"))
            };
        }
        if let Some(list) = &self.one_of {
            return if list.iter().any(|e| json_eq(value, e)) {
                Ok(())
            } else {
                Err(format!("{value} not in {}", Value::Array(list.clone())))
            };
        }
        Err("no predicate (`equals`, `matches` or `in`)".into())
    }
}

/// JSON equality where numbers compare by value (`3` equals `3.0`).
fn json_eq(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => match (x.as_f64(), y.as_f64()) {
            (Some(x), Some(y)) => x == y,
            _ => x == y,
        },
        _ => a == b,
    }
}

/// The final answer as JSON: the whole text, else the body of a fenced code block, else the
/// outermost `{…}`.
fn answer_json(text: &str) -> Option<Value> {
    let trimmed = text.trim();
    if let Ok(v) = serde_json::from_str(trimmed) {
        return Some(v);
    }
    if let Some(start) = trimmed.find("```") {
        let rest = trimmed.get(start + 3..)?;
        let body_start = rest.find('\n').map_or(0, |i| i + 1);
        let body = rest.get(body_start..)?;
        if let Some(end) = body.find("```")
            && let Ok(v) = serde_json::from_str(body.get(..end)?.trim())
        {
            return Some(v);
        }
    }
    let open = trimmed.find('{')?;
    let close = trimmed.rfind('}')?;
    serde_json::from_str(trimmed.get(open..=close)?).ok()
}

/// Whether `text` states `fact`: any phrasing as a case-insensitive substring, or the regex.
fn states(fact: &Fact, text: &str) -> bool {
    let lower = text.to_lowercase();
    let phrase = |p: &String| lower.contains(&p.to_lowercase());
    match fact {
        Fact::Phrase(p) => phrase(p),
        Fact::Phrasings(ps) => ps.iter().any(phrase),
        Fact::Regex(r) => RegexBuilder::new(&r.regex)
            .build()
            .is_ok_and(|re| re.is_match(text)),
    }
}

fn decision_quality(expect: &DecisionQualityExpect, trace: &RunTrace, out: &mut Vec<CheckOutcome>) {
    let d = Dimension::DecisionQuality;
    for truth in &expect.ground_truth {
        let predicate = truth.predicate();
        let what = format!("ground truth `{}` {}", truth.pointer, predicate.describe());
        let source = match truth.tool() {
            Some(tool) => match trace.calls_of(tool).last() {
                Some(call) => Ok(call.arguments.clone()),
                None => Err(format!("{what}: `{tool}` never called")),
            },
            None => answer_json(trace.answer())
                .ok_or_else(|| format!("{what}: the final answer is not JSON")),
        };
        out.push(match source {
            Err(reason) => check(d, "ground_truth", false, reason),
            Ok(value) => match value.pointer(&truth.pointer) {
                None => check(
                    d,
                    "ground_truth",
                    false,
                    format!("{what}: `{}` has no `{}`", truth.source, truth.pointer),
                ),
                Some(found) => match predicate.test(found) {
                    Ok(()) => check(
                        d,
                        "ground_truth",
                        true,
                        format!("{what} (in `{}`)", truth.source),
                    ),
                    Err(why) => check(
                        d,
                        "ground_truth",
                        false,
                        format!("{what} (in `{}`): {why}", truth.source),
                    ),
                },
            },
        });
    }
    let answer = trace.answer();
    let total = expect.required_facts.len();
    for (i, fact) in expect.required_facts.iter().enumerate() {
        let n = i + 1;
        out.push(if states(fact, answer) {
            check(
                d,
                "required_fact",
                true,
                format!("fact {n} of {total} stated: {}", fact.describe()),
            )
        } else {
            check(
                d,
                "required_fact",
                false,
                format!(
                    "fact {n} of {total} missing: none of {} in the answer",
                    fact.describe()
                ),
            )
        });
    }
    for claim in &expect.forbidden_claims {
        let shown = claim.describe();
        out.push(if !states(claim, answer) {
            check(d, "forbidden_claim", true, format!("no claim {shown}"))
        } else if trace.tool_result_texts().any(|t| states(claim, t)) {
            check(
                d,
                "forbidden_claim",
                true,
                format!("claim {shown} is in the answer but a tool result supports it"),
            )
        } else {
            check(
                d,
                "forbidden_claim",
                false,
                format!("hallucination: the answer claims {shown}, which no tool result supports"),
            )
        });
    }
}

fn robustness(expect: &RobustnessExpect, trace: &RunTrace, out: &mut Vec<CheckOutcome>) {
    let d = Dimension::Robustness;
    if let Some(expected) = expect.end_state {
        let actual = trace.end;
        let ok = match expected {
            ExpectedEnd::Paused => {
                matches!(actual, TraceEnd::AwaitingApproval | TraceEnd::AwaitingUser)
            }
            other => other.as_str() == actual.as_str(),
        };
        let mut reason = if ok {
            format!("ended `{}`", actual.as_str())
        } else {
            format!(
                "expected end state `{}`, got `{}`",
                expected.as_str(),
                actual.as_str()
            )
        };
        if !ok && let Some(why) = &trace.end_reason {
            reason.push_str(&format!(" ({why})"));
        }
        out.push(check(d, "end_state", ok, reason));
    }
    if !expect.error_reported.is_empty() {
        let phrasings = Fact::Phrasings(expect.error_reported.clone());
        let ok = states(&phrasings, trace.answer());
        out.push(check(
            d,
            "error_reported",
            ok,
            if ok {
                format!("the answer reports the failure ({})", phrasings.describe())
            } else {
                format!(
                    "the answer does not report the failure: none of {} in it",
                    phrasings.describe()
                )
            },
        ));
    }
    if expect.final_answer {
        let ok = !trace.answer().trim().is_empty();
        out.push(check(
            d,
            "final_answer",
            ok,
            if ok {
                "the run produced a final answer".into()
            } else {
                format!("no final answer (ended `{}`)", trace.end.as_str())
            },
        ));
    }
}
