//! `keel detective serve`: the Detective's release service (fixtures, risk reports on disk).

use std::path::PathBuf;

use crate::CliError;

/// `keel detective` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum DetectiveCommand {
    /// Serve the release service on 127.0.0.1 until Ctrl-C.
    Serve {
        /// Port (the Detective's tools use RELEASE_SERVICE_URL, default http://127.0.0.1:8787).
        #[arg(long, default_value_t = keel_detective::DEFAULT_PORT)]
        port: u16,
        /// Where filed risk reports are kept.
        #[arg(long, value_name = "DIR", default_value = ".keel/risk-reports")]
        reports_dir: PathBuf,
    },
}

/// Runs `keel detective ...`.
pub async fn run(command: DetectiveCommand) -> Result<u8, CliError> {
    match command {
        DetectiveCommand::Serve { port, reports_dir } => {
            keel_detective::serve_forever(port, reports_dir)
                .await
                .map_err(|e| CliError::failure(format!("release service: {e}")))?;
            Ok(0)
        }
    }
}
