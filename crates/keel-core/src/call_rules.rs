//! Call rules: conditions on a tool call that the runtime checks before the call runs,
//! from what already happened in the run — the tools that must have succeeded first (with
//! the same values of some arguments), how often the tool may succeed in one run, and
//! argument fields that must cite something the run's tools returned and quote no figure
//! or identifier they did not. A call that breaks a rule is not executed: it is answered
//! with an `invalid_input` error whose message tells the model what to do instead, like
//! any other tool error (data, never a panic).
//!
//! Checked before the call rather than by the critic after it: for a mutating tool (filing
//! a report, sending a message) the side effect cannot be taken back once it happened.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One rule about calls of `tool`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CallRule {
    /// The tool the rule is about.
    pub tool: String,
    /// Tools that must each have succeeded earlier in the run.
    pub after: Vec<String>,
    /// Top-level arguments whose values the earlier calls of `after` must share with this
    /// call (e.g. `release_id`: the data read must be about the same release).
    pub same: Vec<String>,
    /// At most this many successful calls of `tool` in one run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_successes: Option<u32>,
    /// JSON pointers into the arguments (`/findings`): each string there (or each string of
    /// the array there) must cite a figure, name or identifier present in the results of
    /// the run's successful tool calls, and every number and identifier it quotes must be
    /// one of theirs (or, for a number, computed from two of them: a sum, difference,
    /// ratio or percentage).
    pub grounded: Vec<String>,
}

/// A successful call of the run, as the rules see it.
#[derive(Debug, Clone, Copy)]
pub struct PastCall<'a> {
    /// The tool.
    pub tool: &'a str,
    /// Its arguments.
    pub arguments: &'a Value,
    /// Its result data.
    pub result: &'a Value,
}

/// Checks a call of `tool` with `arguments` against every rule about `tool`, given the
/// run's successful calls so far (in order) and the tools of the calls already let through
/// in the same turn (`in_flight`: they may still succeed, so they count against
/// `max_successes`, but not as having succeeded for `after`). `Err` holds the message for
/// the model.
pub fn check_call(
    rules: &[CallRule],
    tool: &str,
    arguments: &Value,
    past: &[PastCall<'_>],
    in_flight: &[&str],
) -> Result<(), String> {
    for rule in rules.iter().filter(|r| r.tool == tool) {
        check_after(rule, arguments, past)?;
        check_max(rule, past, in_flight)?;
        check_grounded(rule, arguments, past)?;
    }
    Ok(())
}

/// The tools no call could get past the rules right now, whatever its arguments: a rule's
/// `after` names a tool that has not succeeded in the run at all, or the tool reached its
/// `max_successes`. `succeeded` lists the tools of the run's successful calls. A model
/// whose decoding is constrained by a grammar (keel-local) leaves these out of it, so a
/// small model cannot spend its turns on calls that are bound to be refused.
pub fn withheld_tools(rules: &[CallRule], succeeded: &[&str]) -> Vec<String> {
    let mut withheld: Vec<String> = Vec::new();
    for rule in rules {
        let waiting = rule
            .after
            .iter()
            .any(|needed| !succeeded.contains(&needed.as_str()));
        let done = succeeded.iter().filter(|t| **t == rule.tool).count();
        let spent = rule
            .max_successes
            .is_some_and(|max| u32::try_from(done).unwrap_or(u32::MAX) >= max);
        if (waiting || spent) && !withheld.contains(&rule.tool) {
            withheld.push(rule.tool.clone());
        }
    }
    withheld
}

/// What one grounded argument may cite right now ([`grounded_arguments`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroundedArgument {
    /// The tool.
    pub tool: String,
    /// The JSON pointer into its arguments (a rule's `grounded` entry, e.g. `/findings`).
    pub pointer: String,
    /// The words and figures of the run's results, as the results write them, that count
    /// as a citation there: a string quoting any one of them (as a whole token) cites
    /// something. Sorted, longest first, at most [`MAX_CITATIONS`].
    pub citations: Vec<String>,
}

/// At most this many citations per grounded argument ([`GroundedArgument::citations`]):
/// a grammar built from them stays small; the longest (the most specific) are kept.
pub const MAX_CITATIONS: usize = 512;

/// For each `grounded` argument of a tool the rules do not withhold now, what a string
/// there may cite given the run's successful calls so far (`past`, in order): the words
/// and figures of their results that [`check_call`] would count as a citation, less the
/// values the tool shares with its reads (the `same` arguments of the `after` calls:
/// `v2.1.0` names the release assessed, it is no evidence about it). A provider that
/// constrains decoding with a grammar (keel-local) makes every string there open with one
/// of them, so a small model's call cannot be refused for citing nothing; it may still be
/// refused for quoting a figure no tool returned. Empty when no call succeeded yet.
pub fn grounded_arguments(
    rules: &[CallRule],
    past: &[PastCall<'_>],
    withheld: &[String],
) -> Vec<GroundedArgument> {
    if past.is_empty() {
        return Vec::new();
    }
    let mut grounded = Vec::new();
    for rule in rules
        .iter()
        .filter(|r| !r.grounded.is_empty() && !withheld.contains(&r.tool))
    {
        let mut facts = Facts::of(past.iter().map(|c| c.result));
        facts.exclude(
            past.iter()
                .filter(|c| rule.after.iter().any(|tool| tool == c.tool))
                .flat_map(|c| rule.same.iter().filter_map(|key| c.arguments.get(key))),
        );
        let citations = facts.citations(past.iter().map(|c| c.result));
        if citations.is_empty() {
            continue;
        }
        for pointer in &rule.grounded {
            grounded.push(GroundedArgument {
                tool: rule.tool.clone(),
                pointer: pointer.clone(),
                citations: citations.clone(),
            });
        }
    }
    grounded
}

/// How far the run got with one tool, as [`expected_tools`] sees it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ToolProgress {
    /// Successful calls.
    pub succeeded: u32,
    /// Failed calls, refusals by the rules included once the tool was no longer withheld
    /// (a call refused while it was withheld says nothing about the tool).
    pub failed: u32,
    /// Whether the latest failure is one a retry cannot fix (`not_found`, `forbidden`…).
    pub failed_for_good: bool,
}

impl ToolProgress {
    /// Counts a failed call with `code`. Bad arguments (`invalid_input`, a refusal by the
    /// rules included) and a result off its schema can be fixed by a corrected call, and
    /// timeouts or server errors by a retry; anything else (`not_found`, `forbidden`, …)
    /// no call of this tool can fix.
    pub fn record_failure(&mut self, code: crate::ToolErrorCode) {
        use crate::ToolErrorCode::{InvalidInput, OutputSchemaMismatch};
        self.failed = self.failed.saturating_add(1);
        self.failed_for_good =
            !code.is_retryable() && !matches!(code, InvalidInput | OutputSchemaMismatch);
    }

    /// Whether the run is done with this tool: it succeeded, failed in a way a retry
    /// cannot fix, or failed twice (one retry is all the rules' sequence asks for).
    pub fn settled(&self) -> bool {
        self.succeeded > 0 || self.failed_for_good || self.failed >= 2
    }
}

/// The tools the call rules still expect, in the order they declare them: each rule's
/// `after` tools the run is not done with, then — once none of those is missing, the
/// rule's tool is not withheld and the run is not done with it — the rule's own tool. A
/// rule with `after` declares a sequence ending in its tool ("file the report after both
/// reads"); this is where the run stands in it. `progress` says how far the run got with
/// a tool (absent: never called). A model that cannot decide well whether to call a tool
/// (keel-local's eager tools, for models under two billion parameters) is asked for another
/// call while this is not empty, restricted to these tools, and for a text answer once it
/// is; a rule without `after` expects nothing.
pub fn expected_tools(
    rules: &[CallRule],
    progress: &dyn Fn(&str) -> ToolProgress,
    withheld: &[String],
) -> Vec<String> {
    let mut expected: Vec<String> = Vec::new();
    let mut push = |tool: &str| {
        if !expected.iter().any(|t| t == tool) {
            expected.push(tool.to_owned());
        }
    };
    for rule in rules.iter().filter(|r| !r.after.is_empty()) {
        let missing: Vec<&String> = rule
            .after
            .iter()
            .filter(|tool| !progress(tool).settled())
            .collect();
        for tool in &missing {
            push(tool);
        }
        if missing.is_empty() && !withheld.contains(&rule.tool) && !progress(&rule.tool).settled() {
            push(&rule.tool);
        }
    }
    expected
}

fn check_after(rule: &CallRule, arguments: &Value, past: &[PastCall<'_>]) -> Result<(), String> {
    let same = |call: &PastCall<'_>| {
        rule.same
            .iter()
            .all(|key| call.arguments.get(key) == arguments.get(key))
    };
    let missing: Vec<&str> = rule
        .after
        .iter()
        .filter(|needed| !past.iter().any(|c| c.tool == needed.as_str() && same(c)))
        .map(String::as_str)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    let with_same = if rule.same.is_empty() {
        String::new()
    } else {
        let values: Vec<String> = rule
            .same
            .iter()
            .map(|key| {
                format!(
                    "`{key}` {}",
                    arguments
                        .get(key)
                        .map_or("(absent)".into(), Value::to_string)
                )
            })
            .collect();
        format!(" with the same {}", values.join(" and "))
    };
    Err(format!(
        "`{}` was not run: it may only run after {} succeeded in this run{with_same}; still \
         missing: {}. Call {} first, then call `{}` again with what they returned.",
        rule.tool,
        names(&rule.after),
        names(&missing),
        if missing.len() == 1 { "it" } else { "them" },
        rule.tool
    ))
}

fn check_max(rule: &CallRule, past: &[PastCall<'_>], in_flight: &[&str]) -> Result<(), String> {
    let Some(max) = rule.max_successes else {
        return Ok(());
    };
    let done = past.iter().filter(|c| c.tool == rule.tool).count();
    let pending = in_flight.iter().filter(|t| **t == rule.tool).count();
    if u32::try_from(done + pending).unwrap_or(u32::MAX) < max {
        return Ok(());
    }
    let times = |n: u32| {
        if n == 1 {
            "once".to_string()
        } else {
            format!("{n} times")
        }
    };
    let already = if pending > 0 {
        "it is already being called in this turn".to_string()
    } else {
        format!(
            "it already succeeded {} in this run",
            times(u32::try_from(done).unwrap_or(u32::MAX))
        )
    };
    Err(format!(
        "`{}` was not run: {already}, and it may succeed at most {} per run. Do not call it \
         again: use the result it returned.",
        rule.tool,
        times(max),
    ))
}

fn check_grounded(rule: &CallRule, arguments: &Value, past: &[PastCall<'_>]) -> Result<(), String> {
    if rule.grounded.is_empty() {
        return Ok(());
    }
    let mut facts = Facts::of(past.iter().map(|c| c.result));
    // The values the call shares with its reads (`release_id`) name what is assessed, not
    // evidence about it: "v2.1.0 looks fine" cites nothing, though `v2.1.0` came back.
    facts.exclude(rule.same.iter().filter_map(|key| arguments.get(key)));
    let mut problems = Vec::new();
    let mut judge = |at: String, text: &str| match facts.judge(text) {
        Judgement::Grounded => {}
        Judgement::CitesNothing => problems.push(format!(
            "{at} {text:?} cites nothing that this run's tool results contain"
        )),
        Judgement::Invents(invented) => problems.push(format!(
            "{at} {text:?} quotes {} that no tool returned in this run",
            names(&invented)
        )),
    };
    for pointer in &rule.grounded {
        match arguments.pointer(pointer) {
            Some(Value::String(text)) => judge(pointer.clone(), text),
            Some(Value::Array(items)) => {
                for (i, item) in items.iter().enumerate() {
                    if let Some(text) = item.as_str() {
                        judge(format!("{pointer}/{i}"), text);
                    }
                }
            }
            _ => {}
        }
    }
    if problems.is_empty() {
        return Ok(());
    }
    Err(format!(
        "`{}` was not run: {}. Each must quote figures, names or identifiers the tools \
         returned in this run (a count, a metric, a test or change name), and only those: \
         the usage examples are invented. Fix {} and call `{}` again.",
        rule.tool,
        problems.join("; "),
        if problems.len() == 1 { "it" } else { "them" },
        rule.tool
    ))
}

fn names<S: AsRef<str>>(tools: &[S]) -> String {
    let quoted: Vec<String> = tools.iter().map(|t| format!("`{}`", t.as_ref())).collect();
    match quoted.as_slice() {
        [] => String::new(),
        [one] => one.clone(),
        [init @ .., last] => format!("{} and {last}", init.join(", ")),
    }
}

/// Words too common in tool results and findings alike to count as a citation.
const COMMON: &[&str] = &[
    "about", "after", "also", "been", "from", "have", "into", "more", "none", "null", "only",
    "over", "release", "releases", "test", "tests", "than", "that", "their", "them", "they",
    "this", "true", "false", "were", "what", "when", "which", "with", "without",
];

/// How a finding stands against the run's results ([`Facts::judge`]).
#[derive(Debug, PartialEq)]
enum Judgement {
    /// It quotes something the results contain, and no figure or identifier they do not.
    Grounded,
    /// It quotes nothing the results contain ("The release looks fine").
    CitesNothing,
    /// It quotes figures or identifiers the results do not contain — typically copied
    /// from a usage example ("13 of 97 ledger tests fail: ledger::test_journal_balances"),
    /// even when it also quotes a real figure.
    Invents(Vec<String>),
}

/// What a run's results contain: the numbers and the words of their string values (keys
/// are structure, not facts: a finding "passed" cites nothing; but a key may be named
/// without inventing anything: "response_time_p95 450").
struct Facts {
    /// Distinct numbers, sorted.
    numbers: Vec<f64>,
    words: std::collections::HashSet<String>,
    keys: std::collections::HashSet<String>,
    /// Tokens that never count (see [`Facts::exclude`]).
    excluded: std::collections::HashSet<String>,
}

/// Above this many distinct numbers in a run's results, a number of a finding that is
/// none of them is not checked further (sums, differences, ratios of two of them would
/// cost too much to enumerate, and would match almost anything): it cites nothing, and
/// invents nothing either.
const MAX_NUMBERS_FOR_DERIVED: usize = 300;

impl Facts {
    fn of<'a>(results: impl Iterator<Item = &'a Value>) -> Self {
        let mut facts = Facts {
            numbers: Vec::new(),
            words: std::collections::HashSet::new(),
            keys: std::collections::HashSet::new(),
            excluded: std::collections::HashSet::new(),
        };
        let mut stack: Vec<&Value> = results.collect();
        while let Some(value) = stack.pop() {
            match value {
                Value::Number(n) => facts.numbers.extend(n.as_f64()),
                Value::String(s) => {
                    for token in tokens(s) {
                        if let Some(n) = number(&token) {
                            facts.numbers.push(n);
                        }
                        // `payments::test_capture_refund` is cited by its parts too
                        // ("capture refund fails").
                        facts.words.extend(
                            token
                                .split(['_', '.', '-'])
                                .filter(|part| !part.is_empty() && *part != token)
                                .map(str::to_string),
                        );
                        facts.words.extend(unversioned(&token));
                        facts.words.insert(token);
                    }
                }
                Value::Array(items) => stack.extend(items),
                Value::Object(map) => {
                    facts.keys.extend(map.keys().flat_map(|k| tokens(k)));
                    stack.extend(map.values());
                }
                Value::Bool(_) | Value::Null => {}
            }
        }
        facts.numbers.sort_by(f64::total_cmp);
        facts.numbers.dedup_by(|a, b| close(*a, *b));
        facts
    }

    /// Stops the string values in `values` (and their tokens) from counting as citations.
    fn exclude<'a>(&mut self, values: impl Iterator<Item = &'a Value>) {
        for text in values.filter_map(Value::as_str) {
            for token in tokens(text) {
                for variant in unversioned(&token).into_iter().chain([token]) {
                    self.words.remove(&variant);
                    self.excluded.insert(variant);
                }
            }
        }
    }

    /// Whether a lowercase word counts as a citation when a finding quotes it.
    fn cites_word(&self, word: &str) -> bool {
        self.words.contains(word) && word.chars().count() >= 4 && !COMMON.contains(&word)
    }

    /// The tokens of `results` (and the parts of their identifiers) that quoted alone
    /// would make [`Facts::judge`] say `Grounded`, as the results write them: their
    /// numbers and their distinctive words, less the excluded ones; deduplicated without
    /// regard to case, longest first, at most [`MAX_CITATIONS`].
    fn citations<'a>(&self, results: impl Iterator<Item = &'a Value>) -> Vec<String> {
        let mut seen = std::collections::HashSet::new();
        let mut citations: Vec<String> = Vec::new();
        let mut add = |quote: &str| {
            if seen.insert(quote.to_lowercase()) {
                citations.push(quote.to_string());
            }
        };
        let mut stack: Vec<&Value> = results.collect();
        while let Some(value) = stack.pop() {
            match value {
                Value::Number(n) => add(&n.to_string()),
                Value::String(s) => {
                    for token in raw_tokens(s) {
                        let lower = token.to_lowercase();
                        if self.excluded.contains(&lower) {
                            continue;
                        }
                        if number(&lower).is_some() || self.cites_word(&lower) {
                            add(token);
                        }
                        for part in token.split(['_', '.', '-']).filter(|p| *p != token) {
                            let lower = part.to_lowercase();
                            if !self.excluded.contains(&lower) && self.cites_word(&lower) {
                                add(part);
                            }
                        }
                    }
                }
                Value::Array(items) => stack.extend(items),
                Value::Object(map) => stack.extend(map.values()),
                Value::Bool(_) | Value::Null => {}
            }
        }
        citations.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        citations.truncate(MAX_CITATIONS);
        citations
    }

    /// Whether `text` cites a number (as is, as a percentage of a fraction, or a sum,
    /// difference or ratio of two) or a distinctive word of the results, and whether it
    /// quotes a number or an identifier (`test_journal_balances`, `v4.8.1`) they lack.
    fn judge(&self, text: &str) -> Judgement {
        let mut cites = false;
        let mut invented: Vec<String> = Vec::new();
        for token in tokens(text)
            .into_iter()
            .filter(|t| !self.excluded.contains(t))
        {
            match number(&token) {
                Some(n) => match self.supports(n, &token) {
                    Some(true) => cites = true,
                    // "one of the payment tests": a number word that is no figure of the
                    // results is prose, not an invented figure.
                    Some(false) if !is_number_word(&token) && !invented.contains(&token) => {
                        invented.push(token);
                    }
                    _ => {}
                },
                None if self.words.contains(&token) => cites |= self.cites_word(&token),
                None if is_identifier(&token)
                    && !self.keys.contains(&token)
                    && !invented.contains(&token) =>
                {
                    invented.push(token);
                }
                None => {}
            }
        }
        if !invented.is_empty() {
            Judgement::Invents(invented)
        } else if cites {
            Judgement::Grounded
        } else {
            Judgement::CitesNothing
        }
    }

    /// Whether the number `n` (written `token`) is one of the results' numbers or is
    /// computed from them the way a finding would: a percentage of a fraction (`2%` for
    /// 0.02) and back, the sum or difference of two (`144 tests ran`, `coverage down 3
    /// points`), their ratio or relative change, rounded as written (`5 times its
    /// baseline`, `p95 up 45%`). `None` when there are too many numbers to say.
    fn supports(&self, n: f64, token: &str) -> Option<bool> {
        let percent = token.ends_with('%');
        let exact = |m: f64| close(n, m) || (percent && close(n / 100.0, m)) || close(n, m * 100.0);
        if self.numbers.iter().any(|&m| exact(m)) {
            return Some(true);
        }
        if self.numbers.len() > MAX_NUMBERS_FOR_DERIVED {
            return None;
        }
        // Half a unit of the last digit written: "45%" stands for 44.5..45.5.
        let decimals = token
            .trim_end_matches('%')
            .split_once('.')
            .map_or(0, |(_, fraction)| fraction.len());
        let half_unit = 0.5 / 10f64.powi(i32::try_from(decimals).unwrap_or(i32::MAX));
        let rounded = |m: f64| (n - m).abs() <= half_unit + 1e-9;
        for (i, &a) in self.numbers.iter().enumerate() {
            for &b in self.numbers.iter().skip(i + 1) {
                let difference = (b - a).abs();
                if exact(a + b) || exact(difference) {
                    return Some(true);
                }
                for (x, y) in [(a, b), (b, a)] {
                    if y != 0.0 && (rounded(x / y) || rounded((x - y).abs() / y.abs() * 100.0)) {
                        return Some(true);
                    }
                }
            }
        }
        Some(false)
    }
}

/// A version written with a leading `v` is also the version without it: `2.1.0` quotes
/// `v2.1.0`.
fn unversioned(token: &str) -> Option<String> {
    let rest = token.strip_prefix('v')?;
    rest.starts_with(|c: char| c.is_ascii_digit())
        .then(|| rest.to_string())
}

/// A token that names something exactly — a code identifier (`test_journal_balances`) or
/// a version (`v4.8.1`, `1.0.215`) — so a finding quoting it must have got it from a tool.
fn is_identifier(token: &str) -> bool {
    token.contains('_')
        || (token.contains('.')
            && token.chars().any(|c| c.is_ascii_digit())
            && number(token).is_none())
}

/// Lowercase tokens: runs of letters, digits and `_ . % -` inside words (`test_x`,
/// `1.0.215`, `2%`), without leading or trailing punctuation.
fn tokens(text: &str) -> Vec<String> {
    raw_tokens(text).map(str::to_lowercase).collect()
}

/// [`tokens`] as the text writes them.
fn raw_tokens(text: &str) -> impl Iterator<Item = &str> {
    text.split(|c: char| !(c.is_alphanumeric() || matches!(c, '_' | '.' | '%' | '-')))
        .map(|t| t.trim_matches(|c: char| matches!(c, '.' | '-' | '_')))
        .filter(|t| !t.is_empty())
}

/// Numbers written as words, as in "zero tests ran".
const NUMBER_WORDS: [&str; 13] = [
    "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
    "eleven", "twelve",
];

fn is_number_word(token: &str) -> bool {
    NUMBER_WORDS.contains(&token)
}

/// A token that is a number (`450`, `0.78`, `2%`, `-3`, or a number word: `zero`…`twelve`).
fn number(token: &str) -> Option<f64> {
    if let Some(n) = NUMBER_WORDS.iter().position(|w| *w == token) {
        return u32::try_from(n).ok().map(f64::from);
    }
    token
        .trim_end_matches('%')
        .parse::<f64>()
        .ok()
        .filter(|n| n.is_finite())
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9_f64.max(b.abs() * 1e-6)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn rule() -> CallRule {
        CallRule {
            tool: "file_risk_report".into(),
            after: vec!["get_release_summary".into(), "get_test_details".into()],
            same: vec!["release_id".into()],
            max_successes: Some(1),
            grounded: vec!["/findings".into()],
        }
    }

    fn summary() -> Value {
        json!({"version": "v2.1.0", "changes": ["Added payment processing"],
               "tests": {"passed": 142, "failed": 2},
               "deployment_metrics": {"error_rate": 0.02, "response_time_p95": 450}})
    }

    fn details() -> Value {
        json!({"failing_tests": [{"name": "payments::capture::test_capture_partial_refund"}]})
    }

    #[test]
    fn withheld_until_every_read_succeeded_and_again_once_spent() {
        let rules = [rule()];
        assert_eq!(withheld_tools(&rules, &[]), ["file_risk_report"]);
        assert_eq!(
            withheld_tools(&rules, &["get_release_summary"]),
            ["file_risk_report"]
        );
        assert!(withheld_tools(&rules, &["get_test_details", "get_release_summary"]).is_empty());
        assert_eq!(
            withheld_tools(
                &rules,
                &[
                    "get_release_summary",
                    "get_test_details",
                    "file_risk_report"
                ]
            ),
            ["file_risk_report"]
        );
        // A rule with neither `after` nor a limit withholds nothing.
        let grounded_only = CallRule {
            tool: "note".into(),
            grounded: vec!["/text".into()],
            ..CallRule::default()
        };
        assert!(withheld_tools(&[grounded_only], &[]).is_empty());
    }

    #[test]
    fn expected_tools_walk_the_declared_sequence() {
        fn at<'a>(done: &'a [(&'a str, ToolProgress)]) -> impl Fn(&str) -> ToolProgress + 'a {
            move |tool: &str| {
                done.iter()
                    .find(|(t, _)| *t == tool)
                    .map_or(ToolProgress::default(), |(_, p)| *p)
            }
        }
        let rules = [rule()];
        let ok = ToolProgress {
            succeeded: 1,
            ..ToolProgress::default()
        };
        let retryable = ToolProgress {
            failed: 1,
            ..ToolProgress::default()
        };
        let mut gone = ToolProgress::default();
        gone.record_failure(crate::ToolErrorCode::NotFound);
        let mut refused = ToolProgress::default();
        refused.record_failure(crate::ToolErrorCode::InvalidInput);
        assert!(!refused.settled(), "bad arguments can be corrected once");
        refused.record_failure(crate::ToolErrorCode::InvalidInput);
        assert!(refused.settled(), "but not forever");
        let withheld = ["file_risk_report".to_owned()];
        // Nothing called yet: both reads, in the declared order.
        assert_eq!(
            expected_tools(&rules, &at(&[]), &withheld),
            ["get_release_summary", "get_test_details"]
        );
        // One read done, the other failed once (a retry is still expected).
        assert_eq!(
            expected_tools(
                &rules,
                &at(&[("get_release_summary", ok), ("get_test_details", retryable)]),
                &withheld
            ),
            ["get_test_details"]
        );
        // Both reads done, the report is no longer withheld: the report.
        let read = [("get_release_summary", ok), ("get_test_details", ok)];
        assert_eq!(
            expected_tools(&rules, &at(&[read[0], read[1]]), &[]),
            ["file_risk_report"]
        );
        // Filed: nothing more.
        assert!(
            expected_tools(
                &rules,
                &at(&[read[0], read[1], ("file_risk_report", ok)]),
                &withheld
            )
            .is_empty()
        );
        // The release does not exist: no call can help, nothing is expected.
        assert!(
            expected_tools(
                &rules,
                &at(&[("get_release_summary", gone), ("get_test_details", gone)]),
                &withheld
            )
            .is_empty()
        );
        // A rule without `after` declares no sequence.
        let limit_only = CallRule {
            tool: "send".into(),
            max_successes: Some(1),
            ..CallRule::default()
        };
        assert!(expected_tools(&[limit_only], &at(&[]), &[]).is_empty());
    }

    #[test]
    fn the_reads_must_come_first_for_the_same_release() {
        let report = json!({"release_id": "v2.1.0", "findings": ["2 payment tests fail"]});
        let args_a = json!({"release_id": "v2.1.0"});
        let args_b = json!({"release_id": "v2.0.3"});
        let (s, d) = (summary(), details());
        let none = check_call(&[rule()], "file_risk_report", &report, &[], &[]).unwrap_err();
        assert!(none.contains("still missing: `get_release_summary` and `get_test_details`"));
        assert!(none.contains("`release_id` \"v2.1.0\""), "{none}");
        let other_release = [
            PastCall {
                tool: "get_release_summary",
                arguments: &args_a,
                result: &s,
            },
            PastCall {
                tool: "get_test_details",
                arguments: &args_b,
                result: &d,
            },
        ];
        let error =
            check_call(&[rule()], "file_risk_report", &report, &other_release, &[]).unwrap_err();
        assert!(
            error.contains("still missing: `get_test_details`."),
            "{error}"
        );
        let both = [
            PastCall {
                tool: "get_release_summary",
                arguments: &args_a,
                result: &s,
            },
            PastCall {
                tool: "get_test_details",
                arguments: &args_a,
                result: &d,
            },
        ];
        check_call(&[rule()], "file_risk_report", &report, &both, &[]).unwrap();
        // Two filings in one turn: the second is refused before either runs.
        let twice = check_call(
            &[rule()],
            "file_risk_report",
            &report,
            &both,
            &["file_risk_report"],
        )
        .unwrap_err();
        assert!(
            twice.contains("already being called in this turn"),
            "{twice}"
        );
        // Rules about other tools do not apply.
        check_call(&[rule()], "get_release_summary", &args_a, &[], &[]).unwrap();
    }

    #[test]
    fn a_tool_succeeds_at_most_max_successes_times() {
        let args = json!({"release_id": "v2.1.0"});
        let (s, d) = (summary(), details());
        let filed = json!({"report_id": "rr-1"});
        let report = json!({"release_id": "v2.1.0", "findings": ["error rate 2%"]});
        let past = [
            PastCall {
                tool: "get_release_summary",
                arguments: &args,
                result: &s,
            },
            PastCall {
                tool: "get_test_details",
                arguments: &args,
                result: &d,
            },
            PastCall {
                tool: "file_risk_report",
                arguments: &report,
                result: &filed,
            },
        ];
        let error = check_call(&[rule()], "file_risk_report", &report, &past, &[]).unwrap_err();
        assert!(
            error.contains("already succeeded once in this run"),
            "{error}"
        );
        assert!(error.contains("at most once per run"), "{error}");
    }

    /// Both reads of v2.1.0 succeeded, with `summary` and `details` as their results.
    fn both_reads<'a>(
        args: &'a Value,
        summary: &'a Value,
        details: &'a Value,
    ) -> [PastCall<'a>; 2] {
        [
            PastCall {
                tool: "get_release_summary",
                arguments: args,
                result: summary,
            },
            PastCall {
                tool: "get_test_details",
                arguments: args,
                result: details,
            },
        ]
    }

    #[test]
    fn findings_must_cite_what_the_tools_returned() {
        let args = json!({"release_id": "v2.1.0"});
        let (s, d) = (summary(), details());
        let past = both_reads(&args, &s, &d);
        let grounded = json!({"release_id": "v2.1.0", "findings": [
            "Error rate 2% against its baseline",
            "p95 latency 450 ms",
            "test_capture_partial_refund fails",
            "Adds payment processing",
            "142 tests pass",
            "capture partial refund is broken",
            "two payment tests fail"
        ]});
        check_call(&[rule()], "file_risk_report", &grounded, &past, &[]).unwrap();
        let meaningless = json!({"release_id": "v2.1.0",
            "findings": ["passed", "failed", "The release looks fine", "error rate 7%",
                         "v2.1.0 is fine", "Release v2.1.0: fine"]});
        let error =
            check_call(&[rule()], "file_risk_report", &meaningless, &past, &[]).unwrap_err();
        for bad in [
            "/findings/0 \"passed\"",
            "/findings/1 \"failed\"",
            "/findings/2",
            "/findings/3",
            "/findings/4",
            "/findings/5",
        ] {
            assert!(error.contains(bad), "{bad} not in {error}");
        }
    }

    #[test]
    fn grounded_arguments_list_what_a_finding_may_cite() {
        let args = json!({"release_id": "v2.1.0"});
        let (s, d) = (summary(), details());
        let past = both_reads(&args, &s, &d);
        // Nothing succeeded yet, or the tool is withheld: nothing to constrain.
        assert!(grounded_arguments(&[rule()], &[], &[]).is_empty());
        assert!(grounded_arguments(&[rule()], &past, &["file_risk_report".into()]).is_empty());
        let grounded = grounded_arguments(&[rule()], &past, &[]);
        let [argument] = grounded.as_slice() else {
            panic!("one grounded argument expected: {grounded:?}")
        };
        assert_eq!(argument.tool, "file_risk_report");
        assert_eq!(argument.pointer, "/findings");
        let citations = &argument.citations;
        // As the results write them, the identifier and its distinctive parts, figures.
        for expected in [
            "test_capture_partial_refund",
            "payments",
            "capture",
            "partial",
            "refund",
            "Added",
            "payment",
            "processing",
            "142",
            "0.02",
            "450",
        ] {
            assert!(
                citations.iter().any(|c| c == expected),
                "{expected} not in {citations:?}"
            );
        }
        // Not the release id the reads were called with, nor short or common words.
        for absent in ["v2.1.0", "2.1.0", "v2", "test", "Release"] {
            assert!(
                !citations.iter().any(|c| c == absent),
                "{absent} in {citations:?}"
            );
        }
        // Longest first, and every one of them alone is a finding the rules accept.
        assert!(
            citations.windows(2).all(|w| w[0].len() >= w[1].len()),
            "{citations:?}"
        );
        for citation in citations {
            let call = json!({"release_id": "v2.1.0", "findings": [citation]});
            check_call(&[rule()], "file_risk_report", &call, &past, &[])
                .unwrap_or_else(|e| panic!("{citation}: {e}"));
        }
    }

    #[test]
    fn findings_quoting_figures_or_names_no_tool_returned_are_refused() {
        let args = json!({"release_id": "v2.1.0"});
        let (s, d) = (summary(), details());
        let past = both_reads(&args, &s, &d);
        // Figures as the results hold them, or computed from two of them (144 = 142 + 2,
        // 140 = 142 - 2), and prose numbers ("one of").
        let computed = json!({"release_id": "v2.1.0", "findings": [
            "144 tests ran, 2 failed",
            "error rate 2% (0.02), 140 more passes than failures",
            "response_time_p95 is 450",
            "release 2.1.0: one of the payment tests fails: test_capture_partial_refund"
        ]});
        check_call(&[rule()], "file_risk_report", &computed, &past, &[]).unwrap();
        // The 1.5B's findings half copied from the usage example: each cites one real
        // figure (142, 450) beside invented ones.
        let copied = json!({"release_id": "v2.1.0", "findings": [
            "2 of 142 ledger tests fail: ledger::test_journal_balances",
            "p95 latency 450 ms against a 415 ms baseline",
            "v4.8.1 had the same failures"
        ]});
        let error = check_call(&[rule()], "file_risk_report", &copied, &past, &[]).unwrap_err();
        assert!(
            error.contains("/findings/0 \"2 of 142 ledger tests fail: ledger::test_journal_balances\" quotes `test_journal_balances` that no tool returned"),
            "{error}"
        );
        assert!(
            error.contains("/findings/1") && error.contains("`415`"),
            "{error}"
        );
        assert!(
            error.contains("/findings/2") && error.contains("`v4.8.1`"),
            "{error}"
        );
        assert!(error.contains("usage examples are invented"), "{error}");
        // Ratios and relative changes, rounded as written: 450 / 310 = 1.45 (+45.2%).
        let latency = json!({"p95": 450, "p95_baseline": 310});
        let facts = Facts::of([&latency].into_iter());
        assert_eq!(
            facts.judge("p95 up 45% on its baseline"),
            Judgement::Grounded
        );
        assert_eq!(
            facts.judge("p95 at 1.5 times its baseline"),
            Judgement::Grounded
        );
        assert_eq!(
            facts.judge("p95 up 60%"),
            Judgement::Invents(vec!["60%".into()])
        );
        assert_eq!(facts.judge("p95 is fine"), Judgement::CitesNothing);
    }

    #[test]
    fn tokens_keep_identifiers_versions_and_percentages() {
        assert_eq!(
            tokens("Bumped serde 1.0.210 -> 1.0.215; 2% of payments::capture::test_x."),
            [
                "bumped", "serde", "1.0.210", "1.0.215", "2%", "of", "payments", "capture",
                "test_x"
            ]
        );
        assert_eq!(number("2%"), Some(2.0));
        assert_eq!(number("zero"), Some(0.0));
        assert_eq!(number("1.0.210"), None);
    }
}
