//! What one local generation cost: prompt tokens reused from the KV cache and evaluated,
//! time to first token, prompt and decode times. [`crate::LocalModel::last_generation`]
//! returns the latest; each generation also logs them (`tracing`, target `keel_local`,
//! "local generation finished") and reports the reused tokens as
//! [`keel_core::Usage::cache_read_tokens`].

use std::time::Duration;

/// Figures of one finished (or stopped) generation.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct GenerationStats {
    /// Prompt tokens.
    pub prompt_tokens: u32,
    /// Special (control and user-defined) tokens among them: the chat format's own
    /// markers only, never anything a message or tool result spelled.
    pub special_tokens: u32,
    /// Prompt tokens found in the KV cache (not evaluated).
    pub cached_tokens: u32,
    /// Prompt tokens evaluated (`prompt_tokens - cached_tokens`).
    pub evaluated_tokens: u32,
    /// Tokens generated.
    pub output_tokens: u32,
    /// From the start of the job on the model's thread (tokenizing, grammar, cache lookup
    /// and prompt evaluation) to the first sampled token.
    pub time_to_first_token: Duration,
    /// Prompt evaluation alone.
    pub prompt_time: Duration,
    /// From the first sampled token to the last.
    pub decode_time: Duration,
}

impl GenerationStats {
    /// Evaluated prompt tokens per second (0 when nothing was timed).
    pub fn prompt_tokens_per_second(&self) -> f64 {
        rate(self.evaluated_tokens, self.prompt_time)
    }

    /// Generated tokens per second after the first.
    pub fn decode_tokens_per_second(&self) -> f64 {
        rate(self.output_tokens.saturating_sub(1), self.decode_time)
    }
}

fn rate(tokens: u32, time: Duration) -> f64 {
    let secs = time.as_secs_f64();
    if secs > 0.0 {
        f64::from(tokens) / secs
    } else {
        0.0
    }
}
