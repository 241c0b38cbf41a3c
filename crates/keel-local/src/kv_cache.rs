//! The prompt (KV) cache: one llama context per loaded model, kept between generations,
//! whose KV memory holds up to `slots` token sequences (llama.cpp sequence ids) in one
//! *unified* buffer of `cells` tokens.
//!
//! A new prompt is matched against every slot's recorded tokens; the slot with the
//! longest common prefix is extended in place (the next turn of the same thread), or,
//! when that would throw away more than it keeps (another thread sharing only the system
//! prompt), the common prefix is copied into a free or least-recently-used slot with
//! `llama_memory_seq_cp` — in a unified KV buffer a copy only tags the same cells with a
//! second sequence id, so a shared system prompt costs its memory once. Only the tokens
//! after the reused prefix are evaluated. When the buffer is full, whole slots are evicted
//! least recently used first and the batch is retried (llama.cpp refuses such a batch
//! before touching the memory, so the retry is safe).
//!
//! Invariant: a slot's recorded tokens are exactly what its sequence holds in the KV
//! memory. Tokens are recorded only after their `decode` succeeded; a failed decode
//! clears the slot. So a generation stopped at any point (cancellation, error, token
//! cap) leaves a slot the next request can reuse.

use std::num::NonZeroU32;

use llama_cpp_2::DecodeError;
use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::context::params::LlamaContextParams;
use llama_cpp_2::llama_backend::LlamaBackend;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::token::LlamaToken;

use keel_core::{ModelError, ModelErrorKind};

/// What a context is created with; a job with a different key gets a new context (and
/// an empty cache).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ContextKey {
    /// KV cells shared by all slots.
    pub cells: u32,
    /// Slots (sequences), at least 1.
    pub slots: u32,
    /// Prompt tokens per decode call.
    pub batch: u32,
    /// Decode threads.
    pub threads: u32,
    /// Prompt threads.
    pub batch_threads: u32,
}

/// One cached sequence.
#[derive(Debug, Default, Clone)]
struct Slot {
    /// The tokens its KV sequence holds, in order from position 0.
    tokens: Vec<LlamaToken>,
    /// The cache partition of the generation that filled it.
    partition: Option<String>,
    /// When it was last used (a counter, not a clock).
    last_used: u64,
}

/// How a prompt uses the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Plan {
    /// The slot the generation runs in.
    pub target: usize,
    /// Prompt tokens already in the KV memory (not evaluated again).
    pub keep: usize,
    /// Copy `keep` tokens from this slot into `target` first.
    pub source: Option<usize>,
}

/// Chooses the slot for a prompt. `slots` are each slot's recorded tokens and last use;
/// with `reuse` false nothing is kept (the cache is off). At least one prompt token is
/// always evaluated, since its logits are needed.
#[cfg(test)]
pub(crate) fn choose<T: PartialEq>(slots: &[(&[T], u64)], prompt: &[T], reuse: bool) -> Plan {
    let rules = Rules {
        reuse,
        eligible: &vec![true; slots.len()],
        whole_only: false,
    };
    choose_with(slots, prompt, &rules)
}

/// What a prompt may reuse.
pub(crate) struct Rules<'r> {
    /// The cache is on.
    pub reuse: bool,
    /// Per slot: may its tokens be reused (same cache partition)? A slot that may not is
    /// still evicted like any other, least recently used first.
    pub eligible: &'r [bool],
    /// Only a slot's whole recorded sequence can be kept, and nothing copied between
    /// slots: recurrent and hybrid models keep a state, not per-token cells, so
    /// llama.cpp can neither cut their sequence short nor copy part of it.
    pub whole_only: bool,
}

/// [`choose`] under [`Rules`].
pub(crate) fn choose_with<T: PartialEq>(
    slots: &[(&[T], u64)],
    prompt: &[T],
    rules: &Rules<'_>,
) -> Plan {
    let max_keep = if rules.reuse {
        prompt.len().saturating_sub(1)
    } else {
        0
    };
    let common: Vec<usize> = slots
        .iter()
        .enumerate()
        .map(|(i, (tokens, _))| {
            if !rules.eligible.get(i).copied().unwrap_or(false) {
                return 0;
            }
            let c = tokens
                .iter()
                .zip(prompt)
                .take_while(|(a, b)| a == b)
                .count()
                .min(max_keep);
            if rules.whole_only && c != tokens.len() {
                0
            } else {
                c
            }
        })
        .collect();
    // The best match; among equal matches the one with the least to throw away.
    let best = (0..slots.len()).max_by_key(|&i| {
        let len = slots.get(i).map_or(0, |(t, _)| t.len());
        let c = common.get(i).copied().unwrap_or(0);
        (c, std::cmp::Reverse(len.saturating_sub(c)))
    });
    let Some(best) = best else {
        return Plan {
            target: 0,
            keep: 0,
            source: None,
        };
    };
    let best_keep = common.get(best).copied().unwrap_or(0);
    let best_len = slots.get(best).map_or(0, |(t, _)| t.len());
    // Extend in place when that keeps at least as much as it discards (or nothing is
    // cached anywhere, or there is only one slot).
    if (best_keep > 0 && best_len.saturating_sub(best_keep) <= best_keep) || slots.len() == 1 {
        return Plan {
            target: best,
            keep: best_keep,
            source: None,
        };
    }
    // Otherwise a free slot, else the least recently used one other than `best`.
    let target = (0..slots.len())
        .filter(|&i| i != best || best_keep == 0)
        .min_by_key(|&i| {
            let (tokens, last_used) = slots.get(i).map_or((0, 0), |(t, u)| (t.len(), *u));
            (tokens > 0, last_used)
        })
        .unwrap_or(best);
    if best_keep > 0 && target != best && !rules.whole_only {
        Plan {
            target,
            keep: best_keep,
            source: Some(best),
        }
    } else {
        Plan {
            target,
            keep: common.get(target).copied().unwrap_or(0),
            source: None,
        }
    }
}

/// The cached context of one model.
pub(crate) struct PromptCache<'m> {
    ctx: LlamaContext<'m>,
    key: ContextKey,
    /// Recurrent or hybrid model: see [`Rules::whole_only`].
    recurrent: bool,
    slots: Vec<Slot>,
    clock: u64,
}

fn other(what: impl std::fmt::Display) -> ModelError {
    ModelError::new(ModelErrorKind::Other, what.to_string())
}

fn seq_id(slot: usize) -> i32 {
    i32::try_from(slot).unwrap_or(0)
}

fn to_u32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

impl<'m> PromptCache<'m> {
    /// Creates the context.
    pub fn new(
        model: &'m LlamaModel,
        backend: &LlamaBackend,
        key: ContextKey,
    ) -> Result<Self, ModelError> {
        let slots = key.slots.max(1);
        let params = LlamaContextParams::default()
            .with_n_ctx(NonZeroU32::new(key.cells))
            .with_n_batch(key.batch)
            .with_n_ubatch(key.batch)
            .with_n_seq_max(slots)
            .with_kv_unified(true)
            .with_n_threads(i32::try_from(key.threads).unwrap_or(i32::MAX))
            .with_n_threads_batch(i32::try_from(key.batch_threads).unwrap_or(i32::MAX));
        let ctx = model.new_context(backend, params).map_err(|e| {
            other(format!(
                "cannot create a llama context of {} tokens: {e}",
                key.cells
            ))
        })?;
        Ok(Self {
            ctx,
            key,
            recurrent: model.is_recurrent() || model.is_hybrid(),
            slots: vec![Slot::default(); usize::try_from(slots).unwrap_or(1)],
            clock: 0,
        })
    }

    /// The key it was created with.
    pub fn key(&self) -> ContextKey {
        self.key
    }

    /// The context (for logits).
    pub fn ctx(&self) -> &LlamaContext<'m> {
        &self.ctx
    }

    /// Tokens recorded in a slot.
    pub fn tokens(&self, slot: usize) -> &[LlamaToken] {
        self.slots.get(slot).map_or(&[], |s| s.tokens.as_slice())
    }

    /// Picks the slot for `prompt` and trims or copies its KV memory so that it holds
    /// exactly the reused prefix. Returns the plan (`keep` tokens need no evaluation).
    pub fn prepare(&mut self, prompt: &[LlamaToken], reuse: bool, partition: Option<&str>) -> Plan {
        let views: Vec<(&[LlamaToken], u64)> = self
            .slots
            .iter()
            .map(|s| (s.tokens.as_slice(), s.last_used))
            .collect();
        let eligible: Vec<bool> = self
            .slots
            .iter()
            .map(|s| s.partition.as_deref() == partition)
            .collect();
        let rules = Rules {
            reuse,
            eligible: &eligible,
            whole_only: self.recurrent,
        };
        let mut plan = choose_with(&views, prompt, &rules);
        self.clock = self.clock.saturating_add(1);
        let target = plan.target;
        match plan.source {
            Some(source) => {
                self.clear(target);
                let copied = self.ctx.kv_cache_seq_cp(
                    seq_id(source),
                    seq_id(target),
                    Some(0),
                    Some(to_u32(plan.keep)),
                );
                if copied.is_ok() {
                    let prefix = self
                        .tokens(source)
                        .get(..plan.keep)
                        .map(<[LlamaToken]>::to_vec)
                        .unwrap_or_default();
                    if let Some(slot) = self.slots.get_mut(target) {
                        slot.tokens = prefix;
                    }
                } else {
                    plan.keep = 0;
                }
            }
            None => {
                // Partial removal fails only for recurrent models: start that slot over.
                let trimmed =
                    self.ctx
                        .kv_cache_seq_rm(seq_id(target), Some(to_u32(plan.keep)), None);
                if trimmed.is_ok() {
                    if let Some(slot) = self.slots.get_mut(target) {
                        slot.tokens.truncate(plan.keep);
                    }
                } else {
                    self.clear(target);
                    plan.keep = 0;
                }
            }
        }
        plan.source = None;
        if let Some(slot) = self.slots.get_mut(target) {
            slot.last_used = self.clock;
            if slot.partition.as_deref() != partition {
                slot.partition = partition.map(str::to_string);
            }
        }
        plan
    }

    /// Empties a slot.
    fn clear(&mut self, slot: usize) {
        let _ = self.ctx.kv_cache_seq_rm(seq_id(slot), None, None);
        if let Some(slot) = self.slots.get_mut(slot) {
            slot.tokens.clear();
        }
    }

    /// Decodes `tokens` at the end of `slot` (logits for the last one when `logits`),
    /// evicting other slots, least recently used first, while the KV memory is full.
    /// On success the tokens are recorded; on failure the slot is cleared.
    pub fn decode(
        &mut self,
        slot: usize,
        tokens: &[LlamaToken],
        logits: bool,
        batch: &mut LlamaBatch,
    ) -> Result<(), ModelError> {
        let start = self.tokens(slot).len();
        batch.clear();
        for (i, token) in tokens.iter().enumerate() {
            let pos = i32::try_from(start.saturating_add(i)).unwrap_or(i32::MAX);
            let last = logits && i + 1 == tokens.len();
            if let Err(e) = batch.add(*token, pos, &[seq_id(slot)], last) {
                return Err(other(e));
            }
        }
        loop {
            match self.ctx.decode(batch) {
                Ok(()) => break,
                Err(DecodeError::NoKvCacheSlot) => {
                    let victim = (0..self.slots.len())
                        .filter(|&i| i != slot && !self.tokens(i).is_empty())
                        .min_by_key(|&i| self.slots.get(i).map_or(0, |s| s.last_used));
                    match victim {
                        Some(victim) => {
                            tracing::debug!(slot = victim, "KV cache full: evicting a slot");
                            self.clear(victim);
                        }
                        None => {
                            self.clear(slot);
                            return Err(ModelError::new(
                                ModelErrorKind::ContextOverflow,
                                format!("the local KV cache ({} tokens) is full", self.key.cells),
                            ));
                        }
                    }
                }
                Err(e) => {
                    self.clear(slot);
                    return Err(other(format!("llama.cpp decode failed: {e}")));
                }
            }
        }
        if let Some(s) = self.slots.get_mut(slot) {
            s.tokens.extend_from_slice(tokens);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(slots: &[(&[u32], u64)], prompt: &[u32]) -> Plan {
        choose(slots, prompt, true)
    }

    #[test]
    fn extends_the_same_thread_in_place() {
        let a: &[u32] = &[1, 2, 3, 4, 5];
        let prompt = [1, 2, 3, 4, 5, 6, 7];
        assert_eq!(
            plan(&[(a, 1), (&[], 0)], &prompt),
            Plan {
                target: 0,
                keep: 5,
                source: None
            }
        );
        // A short divergent tail (the last reply re-rendered) is trimmed in place.
        let b: &[u32] = &[1, 2, 3, 4, 9];
        assert_eq!(
            plan(&[(&[], 0), (b, 1)], &prompt),
            Plan {
                target: 1,
                keep: 4,
                source: None
            }
        );
    }

    #[test]
    fn shares_a_prefix_without_destroying_another_thread() {
        // Slot 0: a long conversation; the new prompt shares only its first 2 tokens.
        let a: &[u32] = &[1, 2, 3, 4, 5, 6, 7, 8];
        let prompt = [1, 2, 9, 9];
        assert_eq!(
            plan(&[(a, 5), (&[], 0), (&[7], 1)], &prompt),
            Plan {
                target: 1,
                keep: 2,
                source: Some(0)
            }
        );
        // No free slot: the least recently used other than the source.
        let c: &[u32] = &[7];
        let d: &[u32] = &[8];
        assert_eq!(
            plan(&[(a, 5), (c, 3), (d, 2)], &prompt),
            Plan {
                target: 2,
                keep: 2,
                source: Some(0)
            }
        );
    }

    #[test]
    fn always_evaluates_one_token_and_honours_off() {
        let a: &[u32] = &[1, 2, 3];
        assert_eq!(plan(&[(a, 1)], &[1, 2, 3]).keep, 2);
        assert_eq!(choose(&[(a, 1)], &[1, 2, 3, 4], false).keep, 0);
        // Nothing in common: a free slot, else the least recently used.
        let b: &[u32] = &[5];
        assert_eq!(plan(&[(a, 2), (b, 1)], &[9]).target, 1);
        assert_eq!(plan(&[(a, 2), (&[], 3)], &[9]).target, 1);
        assert_eq!(plan(&[], &[9]).target, 0);
    }

    #[test]
    fn never_reuses_another_partitions_slot() {
        // Slot 0 holds another tenant's prompt, which the new one extends exactly: it is
        // not reused (nothing kept, so neither the counters nor the timing tell), and it
        // is still evicted least recently used first.
        let a: &[u32] = &[1, 2, 3, 4, 5];
        let rules = Rules {
            reuse: true,
            eligible: &[false, true],
            whole_only: false,
        };
        let plan = choose_with(&[(a, 1), (&[9], 2)], &[1, 2, 3, 4, 5, 6], &rules);
        assert_eq!(plan.keep, 0);
        assert_eq!(plan.source, None);
        assert_eq!(plan.target, 0);
        // The same partition reuses it.
        let rules = Rules {
            eligible: &[true, true],
            ..rules
        };
        assert_eq!(
            choose_with(&[(a, 1), (&[9], 2)], &[1, 2, 3, 4, 5, 6], &rules).keep,
            5
        );
    }

    #[test]
    fn recurrent_models_keep_whole_sequences_only() {
        let a: &[u32] = &[1, 2, 3, 4, 5, 6, 7, 8];
        let rules = Rules {
            reuse: true,
            eligible: &[true, true],
            whole_only: true,
        };
        // A prefix of slot 0 cannot be cut out of a recurrent state, nor copied.
        let plan = choose_with(&[(a, 5), (&[], 0)], &[1, 2, 9, 9], &rules);
        assert_eq!((plan.keep, plan.source), (0, None));
        // The whole sequence extended: kept.
        let prompt = [1, 2, 3, 4, 5, 6, 7, 8, 9];
        let plan = choose_with(&[(a, 5), (&[], 0)], &prompt, &rules);
        assert_eq!((plan.target, plan.keep, plan.source), (0, 8, None));
    }
}
