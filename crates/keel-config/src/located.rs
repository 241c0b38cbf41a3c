//! Located parsing of any TOML schema: the same analysis `keel config check` runs on
//! keel.toml and agent files (every problem collected, unknown keys with the nearest valid
//! key, `file:line:col` and the key path), offered to other crates for their own files
//! (e.g. keel-eval's suite files). No `${VAR}` expansion is applied.

use crate::analyze::analyze_as;
use crate::diagnostic::Diagnostic;

/// Parses `text` (shown as `file` in diagnostics) as a `T`, collecting every problem.
///
/// Returns what deserialized after every offending key was removed (`None` on a syntax
/// error or when nothing could be salvaged) and the diagnostics, in the order found. A
/// value is usable only when no diagnostic is an error.
pub fn parse_toml_as<T: serde::de::DeserializeOwned>(
    text: &str,
    file: &str,
) -> (Option<T>, Vec<Diagnostic>) {
    let analysis = analyze_as::<T>(text, file, None);
    (analysis.config, analysis.diagnostics)
}
