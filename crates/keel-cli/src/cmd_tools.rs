//! `keel tools list|check`: show the tool catalog and check it against the tool contract.

use std::path::PathBuf;

use keel_core::{ToolRegistry, ToolSpec};

use crate::CliError;

/// `keel tools` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum ToolsCommand {
    /// List the tools with their descriptions.
    List {
        /// Print full specs as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Print each tool's spec and every contract violation; exits 1 on any violation.
    Check {
        /// Also check the tool declarations in this JSON file (a list of tool specs).
        #[arg(long, value_name = "FILE")]
        catalog: Option<PathBuf>,
    },
}

/// Runs `keel tools ...`.
pub fn run(command: ToolsCommand) -> Result<u8, CliError> {
    let builtin = keel_tools::builtin_registry().map_err(|e| CliError::failure(e.to_string()))?;
    match command {
        ToolsCommand::List { json } => {
            list(&builtin, json);
            Ok(0)
        }
        ToolsCommand::Check { catalog } => {
            let mut specs: Vec<ToolSpec> = builtin.specs().cloned().collect();
            if let Some(path) = catalog {
                specs.extend(load_catalog(&path)?);
            }
            Ok(check(&specs))
        }
    }
}

fn list(registry: &ToolRegistry, json: bool) {
    if json {
        let specs: Vec<&ToolSpec> = registry.specs().collect();
        println!(
            "{}",
            serde_json::to_string_pretty(&specs).unwrap_or_default()
        );
        return;
    }
    for spec in registry.specs() {
        println!(
            "{:<20} {:?}/{:?}  {}",
            spec.name, spec.effect, spec.approval, spec.description
        );
    }
}

fn load_catalog(path: &PathBuf) -> Result<Vec<ToolSpec>, CliError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| CliError::usage(format!("cannot read catalog {}: {e}", path.display())))?;
    serde_json::from_str(&text).map_err(|e| {
        CliError::usage(format!(
            "catalog {} is not a JSON list of tool specs: {e} (fields: name, description, usage, \
             input_schema, output_schema, timeout_ms, retry, page_limit, max_payload_bytes, effect, approval, version)",
            path.display()
        ))
    })
}

/// Checks every spec, registering them into one registry so duplicates are caught too.
/// Returns the exit code.
fn check(specs: &[ToolSpec]) -> u8 {
    let mut registry = ToolRegistry::new();
    let mut violations = 0usize;
    for spec in specs {
        println!(
            "{} v{} ({:?}, approval {:?}, timeout {} ms)",
            spec.name, spec.version, spec.effect, spec.approval, spec.timeout_ms
        );
        match registry.register(std::sync::Arc::new(DeclaredTool(spec.clone()))) {
            Ok(()) => println!("  ok"),
            Err(error) => {
                for problem in &error.problems {
                    println!("  VIOLATION {problem}");
                    violations += 1;
                }
            }
        }
    }
    if violations > 0 {
        eprintln!(
            "keel: {violations} contract violation{} found",
            if violations == 1 { "" } else { "s" }
        );
        1
    } else {
        println!("all {} tools comply with the tool contract", specs.len());
        0
    }
}

/// A spec without an implementation, registered only to run the registry's checks.
struct DeclaredTool(ToolSpec);

impl keel_core::DynTool for DeclaredTool {
    fn spec(&self) -> &ToolSpec {
        &self.0
    }

    fn call<'a>(
        &'a self,
        _args: serde_json::Value,
        _ctx: &'a keel_core::ToolContext,
    ) -> futures::future::BoxFuture<'a, Result<serde_json::Value, keel_core::ToolError>> {
        Box::pin(async {
            Err(keel_core::ToolError::new(
                keel_core::ToolErrorCode::NotFound,
                "declared only; no implementation",
            ))
        })
    }
}
