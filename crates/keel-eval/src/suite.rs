//! The suite file: which agent to evaluate, how many trials, the pass thresholds and the
//! scenarios with their expectations in three dimensions (tool usage, decision quality,
//! robustness). Parsed with keel-config's located analysis, so every problem comes back as
//! a [`Diagnostic`] with the file, line, column and key path (`scenarios[2].expect.…`),
//! unknown keys with the nearest valid one. The format is documented in
//! `docs/evaluation.md`.

use std::collections::HashMap;

use keel_config::{Diagnostic, DiagnosticCode, Source, parse_toml_as};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A parsed suite file.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Suite {
    /// The `[suite]` table.
    pub suite: SuiteSettings,
    /// The `[[scenarios]]`.
    #[serde(default)]
    pub scenarios: Vec<Scenario>,
    /// The file the suite was parsed from (for located diagnostics found later).
    #[serde(skip)]
    pub source: Source,
}

/// The `[suite]` table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SuiteSettings {
    /// The suite's name (reports and baselines are keyed by it).
    pub name: String,
    /// What the suite covers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The agent to evaluate, by its keel.toml name (or set `agent_file`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    /// The agent to evaluate, as an agent file (or set `agent`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_file: Option<String>,
    /// The setup hook that applies the scenarios' `setup` values, by name. The library
    /// takes the hook itself in [`crate::RunOptions::setup`]; `keel eval run` provides
    /// `release-service` (the Detective's release service with injected faults).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub setup_hook: Option<String>,
    /// Models to evaluate the agent with (`provider:model`); empty = the agent's own.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub models: Vec<String>,
    /// Trials per scenario (at least 1).
    #[serde(default = "one")]
    pub trials: u32,
    /// Trials run at once (at least 1).
    #[serde(default = "one")]
    pub concurrency: u32,
    /// The `k` of pass@k and pass^k; defaults to `trials`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub k: Option<u32>,
    /// Per-dimension pass thresholds of one trial.
    #[serde(default)]
    pub thresholds: Thresholds,
    /// A scenario passes when at least this fraction of its trials pass (default 1.0).
    #[serde(default = "one_f64")]
    pub min_pass_rate: f64,
    /// A drop larger than this (absolute, 0..1) is a regression against a baseline
    /// (default 0.05).
    #[serde(default = "default_regression_threshold")]
    pub regression_threshold: f64,
}

fn one() -> u32 {
    1
}

fn one_f64() -> f64 {
    1.0
}

fn default_regression_threshold() -> f64 {
    0.05
}

/// Per-dimension pass thresholds: a trial passes when every dimension it has scored meets
/// its threshold.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Thresholds {
    /// Tool usage (default 1.0: every check must hold).
    #[serde(default = "one_f64")]
    pub tool_usage: f64,
    /// Decision quality (default 0.8).
    #[serde(default = "default_decision_quality")]
    pub decision_quality: f64,
    /// Robustness (default 1.0).
    #[serde(default = "one_f64")]
    pub robustness: f64,
}

fn default_decision_quality() -> f64 {
    0.8
}

impl Default for Thresholds {
    fn default() -> Self {
        Self {
            tool_usage: 1.0,
            decision_quality: 0.8,
            robustness: 1.0,
        }
    }
}

/// One `[[scenarios]]` entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// Unique id within the suite (`high_risk`).
    pub id: String,
    /// What the scenario covers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The user message of the run.
    pub input: String,
    /// Free-form setup passed to the runner (fixtures, injected faults).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub setup: Option<Value>,
    /// What the run must do.
    #[serde(default)]
    pub expect: Expectations,
}

/// `[scenarios.expect]`: the three dimensions, each optional.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Expectations {
    /// Behavioural checks on the tool calls.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_usage: Option<ToolUsageExpect>,
    /// Checks on the final answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decision_quality: Option<DecisionQualityExpect>,
    /// Checks on how the run ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub robustness: Option<RobustnessExpect>,
}

/// `[scenarios.expect.tool_usage]`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolUsageExpect {
    /// Tools that must be called at least once (one check each).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub required: Vec<String>,
    /// Tools that must not be called (one check each).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub forbidden: Vec<String>,
    /// Chains `[A, B, …]`: each tool's first call comes before the next one's (one check
    /// per chain).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub order: Vec<Vec<String>>,
    /// At most this many tool calls in the run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_calls: Option<u32>,
    /// When true: some tool call failed and the run recovered (see docs/evaluation.md).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub recovered_from_error: bool,
    /// Predicates on the arguments of every call of a tool.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub arguments: Vec<ArgumentCheck>,
}

/// A predicate on a value: exactly one of `equals`, `matches`, `in`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ValuePredicate {
    /// The value equals this (numbers compare by value).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub equals: Option<Value>,
    /// The value (a string, else its JSON text) matches this regex.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub matches: Option<String>,
    /// The value equals one of these.
    #[serde(default, rename = "in", skip_serializing_if = "Option::is_none")]
    pub one_of: Option<Vec<Value>>,
}

/// `[[scenarios.expect.tool_usage.arguments]]`. (The predicate's three fields are repeated
/// here and in [`GroundTruth`] rather than `#[serde(flatten)]`ed from [`ValuePredicate`]:
/// serde's `flatten` does not work with `deny_unknown_fields`.)
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ArgumentCheck {
    /// The tool whose calls are checked (every call must satisfy the predicate).
    pub tool: String,
    /// JSON pointer into the arguments (`/severity`).
    pub pointer: String,
    /// The value equals this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub equals: Option<Value>,
    /// The value matches this regex.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub matches: Option<String>,
    /// The value is one of these.
    #[serde(default, rename = "in", skip_serializing_if = "Option::is_none")]
    pub one_of: Option<Vec<Value>>,
}

impl ArgumentCheck {
    /// The predicate part.
    pub fn predicate(&self) -> ValuePredicate {
        ValuePredicate {
            equals: self.equals.clone(),
            matches: self.matches.clone(),
            one_of: self.one_of.clone(),
        }
    }
}

/// `[scenarios.expect.decision_quality]`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DecisionQualityExpect {
    /// Known-correct values (one check each).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ground_truth: Vec<GroundTruth>,
    /// Facts the final answer must state (one check each).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub required_facts: Vec<Fact>,
    /// Claims the final answer must not make unless a tool result supports them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub forbidden_claims: Vec<Fact>,
    /// Criteria for an LLM judge (not scored yet: see [`crate::score::Judge`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rubric: Option<String>,
}

/// One ground-truth value.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GroundTruth {
    /// `output` (the final answer parsed as JSON) or `tool:NAME` (the arguments of the
    /// last call of NAME).
    pub source: String,
    /// JSON pointer into the source (`/severity`).
    pub pointer: String,
    /// The value equals this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub equals: Option<Value>,
    /// The value matches this regex.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub matches: Option<String>,
    /// The value is one of these.
    #[serde(default, rename = "in", skip_serializing_if = "Option::is_none")]
    pub one_of: Option<Vec<Value>>,
}

impl GroundTruth {
    /// The predicate part.
    pub fn predicate(&self) -> ValuePredicate {
        ValuePredicate {
            equals: self.equals.clone(),
            matches: self.matches.clone(),
            one_of: self.one_of.clone(),
        }
    }

    /// The tool name of a `tool:NAME` source.
    pub fn tool(&self) -> Option<&str> {
        self.source.strip_prefix("tool:")
    }
}

/// A fact or claim: accepted phrasings (case-insensitive substrings; any one suffices) or
/// a regex (matched as written; add `(?i)` for case-insensitivity).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Fact {
    /// One phrasing.
    Phrase(String),
    /// Accepted phrasings.
    Phrasings(Vec<String>),
    /// A regex.
    Regex(RegexFact),
}

/// `{ regex = "…" }`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegexFact {
    /// The pattern.
    pub regex: String,
}

impl Fact {
    /// How the fact is shown in reasons: `["a", "b"]` or `/re/`.
    pub fn describe(&self) -> String {
        match self {
            Fact::Phrase(p) => format!("{p:?}"),
            Fact::Phrasings(ps) => format!(
                "[{}]",
                ps.iter()
                    .map(|p| format!("{p:?}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            Fact::Regex(r) => format!("/{}/", r.regex),
        }
    }
}

/// `[scenarios.expect.robustness]`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RobustnessExpect {
    /// How the run must end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_state: Option<ExpectedEnd>,
    /// The final answer reports the failure: it contains one of these phrasings
    /// (case-insensitive).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub error_reported: Vec<String>,
    /// When true: the run produced a non-empty final answer (graceful degradation).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub final_answer: bool,
}

/// The end state a scenario expects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExpectedEnd {
    /// Ended `done`.
    Done,
    /// Ended `failed`.
    Failed,
    /// Ended `clarify_needed`.
    ClarifyNeeded,
    /// Ended `budget_exceeded`.
    BudgetExceeded,
    /// Ended `unrecoverable_tool_contract`.
    UnrecoverableToolContract,
    /// Ended `cancelled`.
    Cancelled,
    /// Paused for an approval or for the user.
    Paused,
    /// Paused for an approval.
    AwaitingApproval,
    /// Paused for the user's answer.
    AwaitingUser,
}

impl ExpectedEnd {
    /// snake_case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Done => "done",
            Self::Failed => "failed",
            Self::ClarifyNeeded => "clarify_needed",
            Self::BudgetExceeded => "budget_exceeded",
            Self::UnrecoverableToolContract => "unrecoverable_tool_contract",
            Self::Cancelled => "cancelled",
            Self::Paused => "paused",
            Self::AwaitingApproval => "awaiting_approval",
            Self::AwaitingUser => "awaiting_user",
        }
    }
}

impl Suite {
    /// Parses a suite file's `text` (`file` is its name in diagnostics), then checks what
    /// the schema cannot: duplicate or empty scenario ids, an empty scenario list,
    /// thresholds outside 0..=1, zero trials, predicates with not exactly one of
    /// `equals`/`matches`/`in`, invalid regexes, bad JSON pointers and sources. Every
    /// problem is returned, sorted by position.
    pub fn parse(text: &str, file: &str) -> Result<Suite, Vec<Diagnostic>> {
        let (parsed, mut diagnostics) = parse_toml_as::<Suite>(text, file);
        let source = Source::new(file, None, text);
        let suite = parsed.map(|mut suite| {
            suite.source = source;
            suite
        });
        if let Some(suite) = &suite {
            diagnostics.extend(suite.semantic_checks());
        }
        match suite {
            Some(suite) if diagnostics.iter().all(|d| !d.is_error()) => Ok(suite),
            _ => {
                diagnostics.sort_by_key(|d| (d.line.unwrap_or(usize::MAX), d.column.unwrap_or(0)));
                Err(diagnostics)
            }
        }
    }

    /// The `k` of pass@k / pass^k: `suite.k`, else the number of trials.
    pub fn k(&self) -> u32 {
        self.suite.k.unwrap_or(self.suite.trials)
    }

    /// Diagnostics for every tool an expectation names that is not in `known` (the
    /// agent's tool catalog); the runner calls this once it has built the agent.
    pub fn check_tools(&self, known: &[&str]) -> Vec<Diagnostic> {
        let mut out = Vec::new();
        let mut check = |key: String, name: &str| {
            if !known.contains(&name) {
                let hint = match keel_config::diagnostic::nearest(name, known.iter().copied()) {
                    Some(best) => format!("did you mean `{best}`?"),
                    None => format!("the agent's tools: {}", known.join(", ")),
                };
                out.push(self.source.error(
                    DiagnosticCode::UnknownReference,
                    &key,
                    format!("`{key}` names tool `{name}`, which the agent does not have; {hint}"),
                ));
            }
        };
        for (i, scenario) in self.scenarios.iter().enumerate() {
            let base = format!("scenarios[{i}].expect");
            if let Some(tools) = &scenario.expect.tool_usage {
                for (j, name) in tools.required.iter().enumerate() {
                    check(format!("{base}.tool_usage.required[{j}]"), name);
                }
                for (j, name) in tools.forbidden.iter().enumerate() {
                    check(format!("{base}.tool_usage.forbidden[{j}]"), name);
                }
                for (j, chain) in tools.order.iter().enumerate() {
                    for (l, name) in chain.iter().enumerate() {
                        check(format!("{base}.tool_usage.order[{j}][{l}]"), name);
                    }
                }
                for (j, arg) in tools.arguments.iter().enumerate() {
                    check(format!("{base}.tool_usage.arguments[{j}].tool"), &arg.tool);
                }
            }
            if let Some(dq) = &scenario.expect.decision_quality {
                for (j, truth) in dq.ground_truth.iter().enumerate() {
                    if let Some(tool) = truth.tool() {
                        check(
                            format!("{base}.decision_quality.ground_truth[{j}].source"),
                            tool,
                        );
                    }
                }
            }
        }
        out
    }

    fn error(&self, code: DiagnosticCode, key: &str, message: String) -> Diagnostic {
        self.source.error(code, key, message)
    }

    /// `file:line:col` of scenario `id`'s rubric (of the scenario itself when it has none),
    /// for errors found while running — an unreachable judge — to point at the suite.
    pub fn rubric_location(&self, id: &str) -> String {
        let Some(index) = self.scenarios.iter().position(|s| s.id == id) else {
            return self.source.name.clone();
        };
        let key = format!("scenarios[{index}].expect.decision_quality.rubric");
        let at = self.source.error(DiagnosticCode::InvalidValue, &key, "");
        match (at.line, at.column) {
            (Some(line), Some(column)) => format!("{}:{line}:{column}", at.file),
            (Some(line), None) => format!("{}:{line}", at.file),
            _ => at.file,
        }
    }

    fn semantic_checks(&self) -> Vec<Diagnostic> {
        let mut out = Vec::new();
        let s = &self.suite;
        match (&s.agent, &s.agent_file) {
            (Some(_), Some(_)) => out.push(
                self.error(
                    DiagnosticCode::InvalidValue,
                    "suite.agent_file",
                    "set either `suite.agent` (a keel.toml agent name) or `suite.agent_file`, \
                 not both"
                        .into(),
                ),
            ),
            (None, None) => out.push(
                self.error(
                    DiagnosticCode::MissingKey,
                    "suite",
                    "missing `suite.agent` (a keel.toml agent name) or `suite.agent_file` (an \
                 agent file): the suite must say which agent it evaluates"
                        .into(),
                ),
            ),
            _ => {}
        }
        for (key, value) in [
            ("suite.trials", s.trials),
            ("suite.concurrency", s.concurrency),
        ] {
            if value == 0 {
                out.push(self.error(
                    DiagnosticCode::InvalidValue,
                    key,
                    format!("`{key}` must be at least 1"),
                ));
            }
        }
        if let Some(k) = s.k
            && (k == 0 || k > s.trials)
        {
            out.push(self.error(
                DiagnosticCode::InvalidValue,
                "suite.k",
                format!(
                    "`suite.k` must be between 1 and `suite.trials` ({}), got {k}",
                    s.trials
                ),
            ));
        }
        for (key, value) in [
            ("suite.thresholds.tool_usage", s.thresholds.tool_usage),
            (
                "suite.thresholds.decision_quality",
                s.thresholds.decision_quality,
            ),
            ("suite.thresholds.robustness", s.thresholds.robustness),
            ("suite.min_pass_rate", s.min_pass_rate),
            ("suite.regression_threshold", s.regression_threshold),
        ] {
            if !(0.0..=1.0).contains(&value) {
                out.push(self.error(
                    DiagnosticCode::InvalidValue,
                    key,
                    format!("`{key}` must be between 0 and 1, got {value}"),
                ));
            }
        }
        if self.scenarios.is_empty() {
            out.push(
                self.error(
                    DiagnosticCode::MissingKey,
                    "suite",
                    "the suite has no scenarios: add at least one `[[scenarios]]` table with `id` \
                 and `input`"
                        .into(),
                ),
            );
        }
        let mut seen: HashMap<&str, usize> = HashMap::new();
        for (i, scenario) in self.scenarios.iter().enumerate() {
            let base = format!("scenarios[{i}]");
            if scenario.id.trim().is_empty() {
                out.push(self.error(
                    DiagnosticCode::InvalidValue,
                    &format!("{base}.id"),
                    format!("`{base}.id` is empty: give the scenario a unique id"),
                ));
            } else if let Some(first) = seen.get(scenario.id.as_str()) {
                out.push(self.error(
                    DiagnosticCode::InvalidValue,
                    &format!("{base}.id"),
                    format!(
                        "duplicate scenario id `{}` (also `scenarios[{first}].id`): ids must be \
                         unique",
                        scenario.id
                    ),
                ));
            } else {
                seen.insert(&scenario.id, i);
            }
            self.check_expectations(&scenario.expect, &format!("{base}.expect"), &mut out);
        }
        out
    }

    fn check_expectations(&self, expect: &Expectations, base: &str, out: &mut Vec<Diagnostic>) {
        if let Some(tools) = &expect.tool_usage {
            for (j, chain) in tools.order.iter().enumerate() {
                if chain.len() < 2 {
                    let key = format!("{base}.tool_usage.order[{j}]");
                    out.push(self.error(
                        DiagnosticCode::InvalidValue,
                        &key,
                        format!(
                            "`{key}` must name at least two tools, `[\"A\", \"B\"]` meaning A \
                             is called before B"
                        ),
                    ));
                }
            }
            for (j, arg) in tools.arguments.iter().enumerate() {
                let key = format!("{base}.tool_usage.arguments[{j}]");
                self.check_pointer(&arg.pointer, &format!("{key}.pointer"), out);
                self.check_predicate(&arg.predicate(), &key, out);
            }
        }
        if let Some(dq) = &expect.decision_quality {
            for (j, truth) in dq.ground_truth.iter().enumerate() {
                let key = format!("{base}.decision_quality.ground_truth[{j}]");
                if truth.source != "output" && truth.tool().is_none_or(str::is_empty) {
                    out.push(self.error(
                        DiagnosticCode::InvalidValue,
                        &format!("{key}.source"),
                        format!(
                            "invalid `{key}.source` `{}`: use `output` (the final answer as \
                             JSON) or `tool:NAME` (the last call of NAME's arguments)",
                            truth.source
                        ),
                    ));
                }
                self.check_pointer(&truth.pointer, &format!("{key}.pointer"), out);
                self.check_predicate(&truth.predicate(), &key, out);
            }
            for (field, facts) in [
                ("required_facts", &dq.required_facts),
                ("forbidden_claims", &dq.forbidden_claims),
            ] {
                for (j, fact) in facts.iter().enumerate() {
                    let key = format!("{base}.decision_quality.{field}[{j}]");
                    match fact {
                        Fact::Regex(r) => {
                            self.check_regex(&r.regex, &format!("{key}.regex"), out);
                        }
                        Fact::Phrasings(ps) if ps.is_empty() || ps.iter().any(|p| p.is_empty()) => {
                            out.push(self.error(
                                DiagnosticCode::InvalidValue,
                                &key,
                                format!("`{key}` needs at least one non-empty phrasing"),
                            ));
                        }
                        Fact::Phrase(p) if p.is_empty() => out.push(self.error(
                            DiagnosticCode::InvalidValue,
                            &key,
                            format!("`{key}` is an empty phrasing"),
                        )),
                        _ => {}
                    }
                }
            }
        }
        if let Some(rb) = &expect.robustness
            && rb.error_reported.iter().any(String::is_empty)
        {
            let key = format!("{base}.robustness.error_reported");
            out.push(self.error(
                DiagnosticCode::InvalidValue,
                &key,
                format!("`{key}` has an empty phrasing: remove it"),
            ));
        }
    }

    fn check_pointer(&self, pointer: &str, key: &str, out: &mut Vec<Diagnostic>) {
        if !pointer.is_empty() && !pointer.starts_with('/') {
            out.push(self.error(
                DiagnosticCode::InvalidValue,
                key,
                format!(
                    "`{key}` `{pointer}` is not a JSON pointer: write `/{pointer}` (pointers \
                     start with `/`; `\"\"` is the whole value)"
                ),
            ));
        }
    }

    fn check_predicate(&self, p: &ValuePredicate, key: &str, out: &mut Vec<Diagnostic>) {
        let count = usize::from(p.equals.is_some())
            + usize::from(p.matches.is_some())
            + usize::from(p.one_of.is_some());
        if count != 1 {
            out.push(self.error(
                DiagnosticCode::InvalidValue,
                key,
                format!("`{key}` needs exactly one of `equals`, `matches` or `in` (found {count})"),
            ));
        }
        if let Some(re) = &p.matches {
            self.check_regex(re, &format!("{key}.matches"), out);
        }
    }

    fn check_regex(&self, pattern: &str, key: &str, out: &mut Vec<Diagnostic>) {
        if let Err(e) = regex::Regex::new(pattern) {
            let detail = e
                .to_string()
                .lines()
                .last()
                .unwrap_or_default()
                .trim()
                .to_string();
            out.push(self.error(
                DiagnosticCode::InvalidValue,
                key,
                format!("`{key}` is not a valid regex: {detail}"),
            ));
        }
    }
}
