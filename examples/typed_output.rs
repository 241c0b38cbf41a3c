// Typed output: the answer parsed into a Rust type. Keel asks the model for JSON matching
// the type's JSON Schema (derived with schemars), validates the answer, and sends the
// violations back on the same thread (twice at most) before giving up with an error that
// lists them. The agent is keel.toml's `[agents.detective]`.
use schemars::JsonSchema;
use serde::Deserialize;

/// A release risk report.
#[derive(Debug, Deserialize, JsonSchema)]
struct Report {
    /// The release assessed, e.g. `v2.1.0`.
    release: String,
    /// The overall risk.
    risk: Risk,
    /// Why: one finding per entry.
    findings: Vec<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
enum Risk {
    Low,
    Medium,
    High,
}

#[tokio::main]
async fn main() -> Result<(), keel::Error> {
    let agent = keel::Agent::from_config("keel.toml", "detective")?;
    let report: Report = agent.prompt_typed("Assess release v2.1.0").await?;
    println!("{} risk: {:?}", report.release, report.risk);
    for finding in &report.findings {
        println!("- {finding}");
    }
    Ok(())
}
