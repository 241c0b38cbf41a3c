//! The pricing table: per-token prices, context window and output limit of common models,
//! shipped as `data/pricing.json` (its source is named in the file) and overridable.

use std::path::Path;
use std::sync::{Arc, OnceLock};

use keel_core::Usage;
use serde::{Deserialize, Serialize};

/// Prices and limits of one model. Prices are US dollars per million tokens.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelPricing {
    /// Provider name (`anthropic`, `openai`, `openai-responses`, `openrouter`, `ollama`).
    /// `openai` entries also serve `openai-responses` and `openrouter` (`openai/…`).
    pub provider: String,
    /// Model name or prefix (`claude-sonnet-4-5` matches `claude-sonnet-4-5-20250929`);
    /// `*` is the provider's fallback.
    pub model: String,
    /// Uncached input, USD per million tokens.
    pub input: f64,
    /// Output, USD per million tokens.
    pub output: f64,
    /// Input read from the prompt cache, USD per million tokens.
    #[serde(default)]
    pub cache_read: f64,
    /// Input written to the prompt cache, USD per million tokens.
    #[serde(default)]
    pub cache_write: f64,
    /// Context window, tokens.
    pub context_window: u32,
    /// Maximum output tokens.
    pub max_output_tokens: u32,
}

impl ModelPricing {
    /// The cost of a usage in US dollars. `usage.input_tokens` includes cached tokens.
    pub fn cost(&self, usage: &Usage) -> f64 {
        let cached = usage
            .cache_read_tokens
            .saturating_add(usage.cache_write_tokens);
        let uncached = usage.input_tokens.saturating_sub(cached);
        (uncached as f64 * self.input
            + usage.output_tokens as f64 * self.output
            + usage.cache_read_tokens as f64 * self.cache_read
            + usage.cache_write_tokens as f64 * self.cache_write)
            / 1_000_000.0
    }
}

/// A pricing table file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct PricingTable {
    /// Where the prices come from.
    #[serde(default)]
    pub source: String,
    /// The entries. Later entries win over earlier ones with the same provider and model.
    pub models: Vec<ModelPricing>,
}

/// Errors loading a pricing file.
#[derive(Debug, thiserror::Error)]
pub enum PricingError {
    /// The file could not be read.
    #[error("cannot read pricing file {path}: {source}")]
    Read {
        /// The path.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not a valid pricing table.
    #[error(
        "pricing file {path} is invalid: {source} (expected {{\"models\": [{{\"provider\", \"model\", \"input\", \"output\", \"context_window\", \"max_output_tokens\"}}]}})"
    )]
    Parse {
        /// The path.
        path: String,
        /// Why.
        source: serde_json::Error,
    },
}

const BUILTIN: &str = include_str!("../data/pricing.json");

impl PricingTable {
    /// The table shipped with Keel.
    pub fn builtin() -> Arc<PricingTable> {
        static TABLE: OnceLock<Arc<PricingTable>> = OnceLock::new();
        TABLE
            .get_or_init(|| Arc::new(serde_json::from_str(BUILTIN).unwrap_or_default()))
            .clone()
    }

    /// Loads a table from a JSON file.
    pub fn from_file(path: &Path) -> Result<PricingTable, PricingError> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| PricingError::Read {
            path: shown.clone(),
            source,
        })?;
        serde_json::from_str(&text).map_err(|source| PricingError::Parse {
            path: shown,
            source,
        })
    }

    /// The built-in table with `overrides` layered on top (overrides win).
    pub fn with_overrides(overrides: PricingTable) -> PricingTable {
        let mut table = (*Self::builtin()).clone();
        table.models.extend(overrides.models);
        table
    }

    /// The entry for a model: the longest matching name or prefix, else the provider's
    /// `*` fallback. OpenAI-family providers share the `openai` entries; OpenRouter model
    /// names (`anthropic/claude-sonnet-4.5`) are looked up without the vendor prefix.
    pub fn lookup(&self, provider: &str, model: &str) -> Option<&ModelPricing> {
        let family = match provider {
            "openai-responses" => "openai",
            other => other,
        };
        let (family, model) = match (provider, model.split_once('/')) {
            ("openrouter", Some((vendor, name))) => (vendor, name),
            _ => (family, model),
        };
        let model = model.replace('.', "-");
        let mut best: Option<&ModelPricing> = None;
        for entry in self.models.iter().rev() {
            if entry.provider != family && entry.provider != provider {
                continue;
            }
            let candidate = entry.model.replace('.', "-");
            let matches = model == candidate
                || (model.starts_with(&candidate)
                    && model.get(candidate.len()..).is_some_and(|rest| {
                        rest.starts_with('-') || rest.starts_with(':') || rest.starts_with('@')
                    }));
            if matches && best.is_none_or(|b| b.model.len() < entry.model.len() || b.model == "*") {
                best = Some(entry);
            }
        }
        best.or_else(|| {
            self.models
                .iter()
                .rev()
                .find(|e| e.model == "*" && e.provider == family)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_parses_and_matches_prefixes() {
        let table = PricingTable::builtin();
        assert!(table.source.contains("anthropic.com"));
        let sonnet = table
            .lookup("anthropic", "claude-sonnet-4-5-20250929")
            .unwrap();
        assert_eq!(sonnet.model, "claude-sonnet-4-5");
        assert_eq!(
            table.lookup("openai", "gpt-4o-mini").unwrap().model,
            "gpt-4o-mini"
        );
        assert_eq!(
            table.lookup("openai", "gpt-4o-2024-08-06").unwrap().model,
            "gpt-4o"
        );
        assert_eq!(
            table.lookup("openai-responses", "gpt-5").unwrap().model,
            "gpt-5"
        );
        let or = table
            .lookup("openrouter", "anthropic/claude-sonnet-4.5")
            .unwrap();
        assert_eq!(or.model, "claude-sonnet-4-5");
        assert_eq!(table.lookup("ollama", "mystery:7b").unwrap().model, "*");
        assert_eq!(
            table.lookup("ollama", "llama3.1:8b").unwrap().model,
            "llama3.1"
        );
        assert!(table.lookup("openai", "unknown-model").is_none());
    }

    #[test]
    fn cost_counts_cache_separately() {
        let table = PricingTable::builtin();
        let p = table.lookup("anthropic", "claude-sonnet-4-5").unwrap();
        let usage = Usage {
            input_tokens: 1_000_000,
            output_tokens: 1_000_000,
            cache_read_tokens: 500_000,
            cache_write_tokens: 0,
        };
        let cost = p.cost(&usage);
        assert!((cost - (1.5 + 15.0 + 0.15)).abs() < 1e-9, "{cost}");
    }

    #[test]
    fn overrides_win() {
        let mut extra = PricingTable::default();
        extra.models.push(ModelPricing {
            provider: "openai".into(),
            model: "gpt-4o".into(),
            input: 1.0,
            output: 1.0,
            cache_read: 0.0,
            cache_write: 0.0,
            context_window: 1,
            max_output_tokens: 1,
        });
        let table = PricingTable::with_overrides(extra);
        assert_eq!(table.lookup("openai", "gpt-4o").unwrap().context_window, 1);
    }
}
