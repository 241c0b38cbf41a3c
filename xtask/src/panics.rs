//! Counting every panic in the process while a harness runs — contained or not — through
//! one process-wide panic hook that chains to the previous one (so the message is still
//! printed). A [`PanicWatch`] reads how many panics happened since it started.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, Once};

static PANICS: AtomicUsize = AtomicUsize::new(0);
static INSTALL: Once = Once::new();
/// The first panics' locations and messages, for the report.
static SEEN: Mutex<Vec<String>> = Mutex::new(Vec::new());
const KEPT: usize = 10;

/// Counts the panics that happen after [`PanicWatch::start`].
#[derive(Debug)]
pub struct PanicWatch {
    before: usize,
    seen_before: usize,
}

impl PanicWatch {
    /// Installs the counting hook (once per process) and starts counting.
    pub fn start() -> Self {
        INSTALL.call_once(|| {
            let previous = std::panic::take_hook();
            std::panic::set_hook(Box::new(move |info| {
                PANICS.fetch_add(1, Ordering::SeqCst);
                let mut seen = match SEEN.lock() {
                    Ok(seen) => seen,
                    Err(poisoned) => poisoned.into_inner(),
                };
                if seen.len() < KEPT {
                    let location = info
                        .location()
                        .map(|l| format!("{}:{}", l.file(), l.line()))
                        .unwrap_or_default();
                    let payload = info
                        .payload()
                        .downcast_ref::<&str>()
                        .map(|s| (*s).to_string())
                        .or_else(|| info.payload().downcast_ref::<String>().cloned())
                        .unwrap_or_default();
                    seen.push(format!("{location}: {payload}"));
                }
                drop(seen);
                previous(info);
            }));
        });
        Self {
            before: PANICS.load(Ordering::SeqCst),
            seen_before: Self::seen().len(),
        }
    }

    /// Panics since [`PanicWatch::start`].
    pub fn count(&self) -> usize {
        PANICS.load(Ordering::SeqCst).saturating_sub(self.before)
    }

    /// Where the (first few) panics since the start happened, with their messages.
    pub fn messages(&self) -> Vec<String> {
        Self::seen().into_iter().skip(self.seen_before).collect()
    }

    fn seen() -> Vec<String> {
        match SEEN.lock() {
            Ok(seen) => seen.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }
}
