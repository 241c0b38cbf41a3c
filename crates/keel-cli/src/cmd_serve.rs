//! `keel serve`: the HTTP server of `keel-server` over keel.toml's agents and the store,
//! with embedded workers, until SIGTERM or Ctrl-C (then a graceful stop). This file is the
//! flags and the start-up line; everything else lives in `keel_server`.

use std::sync::Arc;

use crate::CliError;
use crate::agents::StoreArgs;
use crate::config;

/// Flags of `keel serve`.
#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// Address to listen on (default: keel.toml [server] bind, else 127.0.0.1:8080).
    #[arg(long, value_name = "ADDR")]
    pub bind: Option<String>,
    /// Embedded workers driving queued runs (0: none, run `keel worker` processes) (default:
    /// keel.toml [server] workers, else 2).
    #[arg(long, value_name = "N")]
    pub workers: Option<usize>,
    #[command(flatten)]
    pub store: StoreArgs,
}

/// Runs `keel serve`.
pub async fn serve(args: ServeArgs) -> Result<u8, CliError> {
    let mut settings = config::get().server.clone();
    if let Some(bind) = args.bind {
        settings.bind = bind;
    }
    if let Some(workers) = args.workers {
        settings.workers = workers;
    }
    let opened = args.store.open().await?;
    let env: keel_app::Env = Arc::new(|name: &str| std::env::var(name).ok());
    let app = Arc::new(config::app_with_env(env));
    let (bind, workers, backend) = (settings.bind.clone(), settings.workers, opened.backend);
    let mut server = keel_server::Server::new(app, &opened, settings)
        .map_err(|e| CliError::usage(e.to_string()))?;
    if let Some(telemetry) = config::telemetry_observer() {
        server = server.with_observer(telemetry);
    }
    let listener = tokio::net::TcpListener::bind(&bind)
        .await
        .map_err(|e| CliError::failure(format!("cannot listen on {bind}: {e}")))?;
    let address = listener
        .local_addr()
        .map_or(bind, |address| address.to_string());
    println!(
        "keel serve listening on http://{address} (store {backend}, {workers} embedded workers; \
         API description at /openapi.json)"
    );
    let report = server
        .serve(listener, stop_signal())
        .await
        .map_err(|e| CliError::failure(e.to_string()))?;
    if report.left_to_queue {
        eprintln!(
            "keel: runs still in progress after the grace period were interrupted and given \
             back to the queue; another worker continues them from their logs"
        );
    }
    Ok(0)
}

/// Ctrl-C or SIGTERM.
async fn stop_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
    eprintln!("keel serve: stopping (runs in progress get [server] shutdown_grace_ms to finish)");
}
