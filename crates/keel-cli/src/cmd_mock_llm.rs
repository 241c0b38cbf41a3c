//! `keel mock-llm`: a scripted mock LLM server for testing agents offline.

use std::path::PathBuf;

use keel_testkit::mock_llm::{self, MockScript};

use crate::CliError;

/// Flags of `keel mock-llm`.
#[derive(Debug, clap::Args)]
pub struct MockLlmArgs {
    /// The mock script (see docs/mock-llm.md).
    #[arg(long, value_name = "FILE")]
    pub script: PathBuf,
    /// Port on 127.0.0.1 (0 picks a free one; the chosen port is printed).
    #[arg(long, default_value_t = 0)]
    pub port: u16,
}

/// Runs the server until Ctrl-C.
pub async fn run(args: MockLlmArgs) -> Result<u8, CliError> {
    let script = MockScript::from_file(&args.script).map_err(|e| CliError::usage(e.to_string()))?;
    mock_llm::serve(script, args.port)
        .await
        .map_err(|e| CliError::failure(format!("mock-llm: {e}")))?;
    Ok(0)
}
