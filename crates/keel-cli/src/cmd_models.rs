//! `keel models pull|list`: the embedded local models (GGUF files under
//! `~/.cache/keel/models`, or `KEEL_MODELS_DIR`).

use crate::CliError;

/// `keel models` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum ModelsCommand {
    /// Download a known model and verify its checksum (default: smollm2).
    Pull {
        /// The model name.
        #[arg(default_value = keel_local::models::DEFAULT_MODEL)]
        name: String,
    },
    /// List installed and known models.
    List,
}

/// Runs `keel models ...`.
pub async fn run(command: ModelsCommand) -> Result<u8, CliError> {
    match command {
        ModelsCommand::Pull { name } => {
            let path = keel_local::models::pull(&name)
                .await
                .map_err(|e| CliError::failure(e.to_string()))?;
            println!("{}", path.display());
            Ok(0)
        }
        ModelsCommand::List => {
            let installed =
                keel_local::models::list().map_err(|e| CliError::failure(e.to_string()))?;
            for known in keel_local::models::known_models() {
                let present = installed
                    .iter()
                    .any(|m| m.name.as_deref() == Some(known.name));
                println!(
                    "{:<10} {:<11} {}",
                    known.name,
                    if present { "installed" } else { "not pulled" },
                    known.description
                );
            }
            for model in installed.iter().filter(|m| m.name.is_none()) {
                println!(
                    "{:<10} {:<11} {}",
                    "(file)",
                    "installed",
                    model.path.display()
                );
            }
            Ok(0)
        }
    }
}
