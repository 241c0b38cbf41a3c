//! `keel ui`: the trace viewer and dashboard in the browser, over the project's store and
//! trace files (`keel-ui`). Local use: no authentication, so it binds loopback only unless
//! `--allow-remote` says otherwise. Paused runs approved in the browser continue in this
//! process, like `keel approve` (scripted runs with their script, at the step they
//! reached); answers to the agent's questions continue or start runs here too, like `keel
//! reply`. The eval pages show the runs `keel eval run` saved in the same store. Requests
//! whose `Host` is not a loopback name, the bound address, or keel.toml's `[server]
//! public_url` / `allowed_hosts` get 421 (DNS rebinding).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use keel_telemetry::Redactor;
use keel_ui::{AppResumer, RunSource, Ui};

use crate::CliError;
use crate::agents::StoreArgs;

/// Flags of `keel ui`.
#[derive(Debug, clap::Args)]
pub struct UiArgs {
    #[command(flatten)]
    pub store: StoreArgs,
    /// Address to listen on (`HOST:PORT`; port 0 picks a free one).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8090")]
    pub bind: String,
    /// Allow a non-loopback address. The UI has no authentication: anyone who can reach
    /// the address can read every run and approve paused calls.
    #[arg(long)]
    pub allow_remote: bool,
    /// The trace directory (default: keel.toml `[telemetry] trace_dir`, else .keel/traces).
    #[arg(long, value_name = "DIR")]
    pub trace_dir: Option<PathBuf>,
}

/// Refuses a bind address that is not loopback unless `allow_remote`.
fn check_bind(addrs: &[SocketAddr], allow_remote: bool, text: &str) -> Result<(), CliError> {
    if addrs.is_empty() {
        return Err(CliError::usage(format!("--bind {text}: no address")));
    }
    if !allow_remote && addrs.iter().any(|a| !a.ip().is_loopback()) {
        return Err(CliError::usage(format!(
            "refusing to serve on {text}: it is not a loopback address and keel ui has no \
             authentication (anyone who reaches it can read every run and approve calls); \
             pass --allow-remote to do it anyway"
        )));
    }
    Ok(())
}

/// Runs `keel ui` until Ctrl-C.
pub async fn run(args: UiArgs) -> Result<u8, CliError> {
    let addrs: Vec<SocketAddr> = tokio::net::lookup_host(args.bind.as_str())
        .await
        .map_err(|e| CliError::usage(format!("--bind {}: {e}", args.bind)))?
        .collect();
    check_bind(&addrs, args.allow_remote, &args.bind)?;
    let opened = args.store.open().await?;
    let store = opened.events.clone();
    let config = crate::config::get();
    let redactor = match Redactor::from_config(&config.telemetry.redaction) {
        Ok(redactor) if redactor.is_enabled() => redactor,
        // Like stderr: at least the built-in rules, even when redaction is off for traces.
        _ => Redactor::default(),
    };
    let trace_dir = args
        .trace_dir
        .clone()
        .or_else(|| config.telemetry.trace_dir.clone())
        .unwrap_or_else(|| PathBuf::from(".keel/traces"));
    let mut resumer = AppResumer::from_static(crate::config::app()).with_models(Arc::new(
        |recipe: &keel_app::recipe::Recipe, steps: usize| match &recipe.script {
            Some(path) => crate::scripted::scripted_from(path, steps)
                .map(|(model, _)| Some(model))
                .map_err(|e| e.message),
            None => Ok(None),
        },
    ));
    if let Some(telemetry) = crate::config::telemetry_observer() {
        resumer = resumer.with_observer(telemetry);
    }
    let ui = Ui::new(RunSource::new(store, redactor))
        .with_resumer(Arc::new(resumer))
        .with_trace_dir(trace_dir)
        .with_eval_results(opened.eval_results)
        // Approve, deny and reply take the thread's lease, as `keel approve` does.
        .with_claims(opened.queue);
    let listener = tokio::net::TcpListener::bind(addrs.as_slice())
        .await
        .map_err(|e| CliError::failure(format!("cannot listen on {}: {e}", args.bind)))?;
    let local = listener
        .local_addr()
        .map_err(|e| CliError::failure(format!("cannot listen on {}: {e}", args.bind)))?;
    // Only the loopback names, the address it listens on and keel.toml's `[server]
    // public_url` / `allowed_hosts` reach the pages (DNS rebinding: see keel_ui::host).
    let hosts = keel_ui::AllowedHosts::for_server(&config.server, &[local]);
    let router = keel_ui::guard_hosts(keel_ui::router(ui), hosts);
    eprintln!("keel ui: serving http://{local}/ (Ctrl-C stops)");
    keel_ui::serve(listener, router, async {
        let _ = tokio::signal::ctrl_c().await;
    })
    .await
    .map_err(|e| CliError::failure(format!("keel ui: {e}")))?;
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(text: &str) -> Vec<SocketAddr> {
        vec![text.parse().unwrap()]
    }

    #[test]
    fn only_loopback_binds_without_allow_remote() {
        assert!(check_bind(&addr("127.0.0.1:8090"), false, "x").is_ok());
        assert!(check_bind(&addr("[::1]:8090"), false, "x").is_ok());
        let refused = check_bind(&addr("0.0.0.0:8090"), false, "0.0.0.0:8090").unwrap_err();
        assert_eq!(refused.code, crate::EXIT_USAGE);
        assert!(
            refused.message.contains("--allow-remote"),
            "{}",
            refused.message
        );
        assert!(check_bind(&addr("0.0.0.0:8090"), true, "x").is_ok());
        assert!(check_bind(&[], false, "x").is_err());
    }
}
