//! `keel config check`: validates keel.toml — unknown keys (with the nearest valid key),
//! invalid values, missing environment variables and files — and reports every problem.

use std::path::Path;

use crate::CliError;

/// `keel config` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum ConfigCommand {
    /// Check keel.toml (or --config FILE) and list every problem; exits 1 on any error.
    Check {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

/// Runs `keel config ...`.
pub fn run(command: ConfigCommand, config: Option<&Path>) -> Result<u8, CliError> {
    match command {
        ConfigCommand::Check { json } => {
            let diagnostics = keel_config::check(config);
            if json {
                println!("{}", keel_config::render_json(&diagnostics));
            } else if diagnostics.is_empty() {
                println!(
                    "{}: ok",
                    config
                        .map(|p| p.display().to_string())
                        .unwrap_or_else(|| "keel.toml".into())
                );
            } else {
                print!("{}", keel_config::render_text(&diagnostics));
            }
            let errors = diagnostics.iter().filter(|d| d.is_error()).count();
            Ok(if errors > 0 { 1 } else { 0 })
        }
    }
}
