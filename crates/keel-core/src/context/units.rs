//! Compaction units: the pieces a strategy may keep or drop. An assistant message with
//! tool calls and the tool message(s) answering it form ONE unit, so no strategy can ever
//! leave an orphan tool call or an orphan tool result in the context.

use std::collections::HashSet;
use std::ops::Range;

use crate::message::{Message, Part, Role};

/// What a unit holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnitKind {
    /// A user message.
    User,
    /// A summary that replaced earlier messages.
    Summary,
    /// An assistant message without tool calls.
    AssistantText,
    /// An assistant message with tool calls and the results answering them.
    ToolExchange {
        /// Some result is an error.
        has_error: bool,
        /// Every call has a result and every result answers a call of the unit.
        complete: bool,
    },
    /// Tool results without their call (left by an older, broken compaction). Never kept.
    OrphanResults,
    /// Anything else (e.g. a system message in the history).
    Other,
}

/// A run of consecutive messages kept or dropped together.
#[derive(Debug, Clone, PartialEq)]
pub struct Unit {
    /// The messages, as indices into the context.
    pub range: Range<usize>,
    /// Their estimated (corrected) tokens.
    pub tokens: u64,
    /// What they are.
    pub kind: UnitKind,
}

impl Unit {
    /// Whether keeping this unit could send an orphan call or result.
    pub fn is_broken(&self) -> bool {
        matches!(
            self.kind,
            UnitKind::OrphanResults
                | UnitKind::ToolExchange {
                    complete: false,
                    ..
                }
        )
    }
}

/// Splits a context into units; `cost` gives each message's (corrected) tokens.
pub fn split(messages: &[Message], cost: &dyn Fn(&Message) -> u64) -> Vec<Unit> {
    let mut units = Vec::new();
    let mut index = 0;
    while let Some(message) = messages.get(index) {
        let mut end = index.saturating_add(1);
        let kind = match message.role {
            Role::Assistant if message.tool_calls().next().is_some() => {
                while messages.get(end).is_some_and(|m| m.role == Role::Tool) {
                    end = end.saturating_add(1);
                }
                exchange_kind(messages.get(index..end).unwrap_or_default())
            }
            Role::Assistant => UnitKind::AssistantText,
            Role::Tool => UnitKind::OrphanResults,
            Role::User
                if message
                    .parts
                    .iter()
                    .any(|p| matches!(p, Part::Summary { .. })) =>
            {
                UnitKind::Summary
            }
            Role::User => UnitKind::User,
            Role::System => UnitKind::Other,
        };
        let tokens = messages
            .get(index..end)
            .unwrap_or_default()
            .iter()
            .map(cost)
            .fold(0u64, u64::saturating_add);
        units.push(Unit {
            range: index..end,
            tokens,
            kind,
        });
        index = end;
    }
    units
}

fn exchange_kind(messages: &[Message]) -> UnitKind {
    let calls: HashSet<&str> = messages
        .iter()
        .filter(|m| m.role == Role::Assistant)
        .flat_map(Message::tool_calls)
        .map(|c| c.id.as_str())
        .collect();
    let results: Vec<_> = messages.iter().flat_map(Message::tool_results).collect();
    let answered: HashSet<&str> = results.iter().map(|r| r.call_id.as_str()).collect();
    UnitKind::ToolExchange {
        has_error: results.iter().any(|r| r.is_error()),
        complete: calls == answered,
    }
}

/// Index of the unit holding the first user message (protected by every strategy).
pub fn first_user(units: &[Unit]) -> Option<usize> {
    units.iter().position(|u| u.kind == UnitKind::User)
}

/// Total tokens of the units.
pub fn total(units: &[Unit]) -> u64 {
    units.iter().map(|u| u.tokens).fold(0, u64::saturating_add)
}

/// Builds the kept context and the input ranges that were dropped (merged when adjacent).
pub fn assemble(
    messages: &[Message],
    units: &[Unit],
    keep: &[bool],
) -> (Vec<Message>, Vec<Range<usize>>) {
    let mut out = Vec::new();
    let mut dropped: Vec<Range<usize>> = Vec::new();
    for (unit, kept) in units.iter().zip(keep.iter().copied()) {
        if kept {
            out.extend(
                messages
                    .get(unit.range.clone())
                    .unwrap_or_default()
                    .iter()
                    .cloned(),
            );
        } else {
            match dropped.last_mut() {
                Some(last) if last.end == unit.range.start => last.end = unit.range.end,
                _ => dropped.push(unit.range.clone()),
            }
        }
    }
    (out, dropped)
}

/// How many messages the ranges cover.
pub fn count(ranges: &[Range<usize>]) -> usize {
    ranges.iter().map(ExactSizeIterator::len).sum()
}

/// Whether a context holds an orphan: a tool call without its result, or a result
/// without its call in the assistant message just before it. Used by tests and checks.
pub fn find_orphan(messages: &[Message]) -> Option<String> {
    let mut open: HashSet<String> = HashSet::new();
    for (index, message) in messages.iter().enumerate() {
        match message.role {
            Role::Tool => {
                for result in message.tool_results() {
                    if !open.remove(&result.call_id) {
                        return Some(format!(
                            "message {index}: result for unknown call {}",
                            result.call_id
                        ));
                    }
                }
            }
            _ => {
                if let Some(call) = open.iter().next() {
                    return Some(format!(
                        "message {index}: call {call} has no result before it"
                    ));
                }
                open = message.tool_calls().map(|c| c.id.clone()).collect();
            }
        }
    }
    None
}
