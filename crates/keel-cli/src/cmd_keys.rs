//! `keel keys create|list|revoke`: the API keys of `keel serve`, kept hashed in the store
//! (see `keel_server::keys`). `create` prints the key once; it cannot be shown again.

use serde_json::json;

use crate::CliError;
use crate::agents::StoreArgs;
use crate::output::OutputFormat;

/// `keel keys` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum KeysCommand {
    /// Create a key for a tenant and print it (once).
    Create {
        /// The tenant the key acts for (lowercase letters, digits, `_`, `-`).
        #[arg(long, value_name = "TENANT")]
        tenant: String,
        /// A label for people (e.g. the client's name).
        #[arg(long, value_name = "NAME")]
        name: Option<String>,
        #[command(flatten)]
        store: StoreArgs,
        /// Output format.
        #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
        output: OutputFormat,
    },
    /// List keys (never the keys themselves), revoked ones included.
    List {
        /// Only this tenant's keys.
        #[arg(long, value_name = "TENANT")]
        tenant: Option<String>,
        #[command(flatten)]
        store: StoreArgs,
        /// Output format.
        #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
        output: OutputFormat,
    },
    /// Revoke a key by its id (the `KEY_ID` column of `keel keys list`).
    Revoke {
        /// The key's id.
        #[arg(value_name = "KEY_ID")]
        key_id: String,
        #[command(flatten)]
        store: StoreArgs,
    },
}

/// Runs `keel keys`.
pub async fn run(command: KeysCommand) -> Result<u8, CliError> {
    use keel_server::keys::{self, KeyError};
    let error = |e: KeyError| match e {
        KeyError::Invalid(message) => CliError::usage(message),
        KeyError::Store(message) => CliError::failure(message),
    };
    match command {
        KeysCommand::Create {
            tenant,
            name,
            store,
            output,
        } => {
            let opened = store.open().await?;
            let created = keys::create(opened.serving.as_ref(), &tenant, name)
                .await
                .map_err(error)?;
            match output {
                OutputFormat::Json => println!(
                    "{}",
                    json!({"key": created.key, "key_id": created.info.key_id, "tenant": created.info.tenant, "name": created.info.name})
                ),
                OutputFormat::Text => {
                    println!("{}", created.key);
                    eprintln!(
                        "keel: key {} for tenant {} created; it is shown only now — store it \
                         safely (revoke with `keel keys revoke {}`)",
                        created.info.key_id, created.info.tenant, created.info.key_id
                    );
                }
            }
            Ok(0)
        }
        KeysCommand::List {
            tenant,
            store,
            output,
        } => {
            let opened = store.open().await?;
            let listed = keys::list(opened.serving.as_ref(), tenant.as_deref())
                .await
                .map_err(error)?;
            match output {
                OutputFormat::Json => println!("{}", json!({"keys": listed})),
                OutputFormat::Text => {
                    println!(
                        "{:<14} {:<20} {:<20} {:<10} CREATED",
                        "KEY_ID", "TENANT", "NAME", "STATUS"
                    );
                    for key in listed {
                        println!(
                            "{:<14} {:<20} {:<20} {:<10} {}",
                            key.key_id,
                            key.tenant,
                            key.name.as_deref().unwrap_or("-"),
                            if key.revoked_at.is_some() {
                                "revoked"
                            } else {
                                "active"
                            },
                            key.created_at.to_rfc3339()
                        );
                    }
                }
            }
            Ok(0)
        }
        KeysCommand::Revoke { key_id, store } => {
            let opened = store.open().await?;
            if keys::revoke(opened.serving.as_ref(), &key_id)
                .await
                .map_err(error)?
            {
                eprintln!("keel: key {key_id} revoked");
                Ok(0)
            } else {
                Err(CliError::failure(format!(
                    "no active key has id {key_id} (see `keel keys list`)"
                )))
            }
        }
    }
}
