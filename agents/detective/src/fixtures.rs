//! Release fixtures: the data the release service answers with, one JSON file per release
//! in `agents/detective/fixtures/releases/` (embedded in the binary, or read from a
//! directory given in [`crate::ServiceConfig::fixtures_dir`]).

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::DetectiveError;

/// How the service misbehaves for a release (failure-case fixtures).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Behavior {
    /// Answer the release's endpoints with this HTTP status instead of data.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fail_status: Option<u16>,
    /// Wait this long before answering, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay_ms: Option<u64>,
}

/// One release as the service knows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReleaseFixture {
    /// The release id used in URLs (`v2.1.0`).
    pub id: String,
    /// What the fixture is for (not served).
    #[serde(default)]
    pub description: String,
    /// The severity a careful analyst should choose (for evaluation; not served).
    #[serde(default)]
    pub expected_severity: Option<String>,
    /// Failure-case behaviour.
    #[serde(default)]
    pub behavior: Behavior,
    /// `GET /releases/{id}/summary`.
    pub summary: Value,
    /// `GET /releases/{id}/test-details`.
    pub test_details: Value,
}

/// The fixtures shipped with the crate.
const EMBEDDED: [&str; 14] = [
    include_str!("../fixtures/releases/v1.9.8.json"),
    include_str!("../fixtures/releases/v2.0.3.json"),
    include_str!("../fixtures/releases/v2.0.4.json"),
    include_str!("../fixtures/releases/v2.1.0.json"),
    include_str!("../fixtures/releases/v2.2.0-rc1.json"),
    include_str!("../fixtures/releases/v2.3.0.json"),
    include_str!("../fixtures/releases/v2.3.1.json"),
    include_str!("../fixtures/releases/v2.4.0.json"),
    include_str!("../fixtures/releases/v2.5.0.json"),
    include_str!("../fixtures/releases/v2.6.0.json"),
    include_str!("../fixtures/releases/v2.7.0-broken.json"),
    include_str!("../fixtures/releases/v2.8.0-slow.json"),
    include_str!("../fixtures/releases/v2.9.0.json"),
    include_str!("../fixtures/releases/v3.0.0.json"),
];

/// Releases by id.
pub type Releases = BTreeMap<String, ReleaseFixture>;

/// The embedded fixtures.
pub fn embedded() -> Result<Releases, DetectiveError> {
    let mut out = Releases::new();
    for (index, text) in EMBEDDED.iter().enumerate() {
        let fixture: ReleaseFixture =
            serde_json::from_str(text).map_err(|error| DetectiveError::Fixture {
                path: format!("embedded fixture #{index}"),
                message: error.to_string(),
            })?;
        out.insert(fixture.id.clone(), fixture);
    }
    Ok(out)
}

/// Every `*.json` fixture in `dir`.
pub fn load_dir(dir: &Path) -> Result<Releases, DetectiveError> {
    let fixture_error = |path: &Path, message: String| DetectiveError::Fixture {
        path: path.display().to_string(),
        message,
    };
    let entries = std::fs::read_dir(dir).map_err(|e| fixture_error(dir, e.to_string()))?;
    let mut out = Releases::new();
    for entry in entries {
        let path = entry.map_err(|e| fixture_error(dir, e.to_string()))?.path();
        if path.extension().and_then(|e| e.to_str()) != Some("json") {
            continue;
        }
        let text =
            std::fs::read_to_string(&path).map_err(|e| fixture_error(&path, e.to_string()))?;
        let fixture: ReleaseFixture =
            serde_json::from_str(&text).map_err(|e| fixture_error(&path, e.to_string()))?;
        out.insert(fixture.id.clone(), fixture);
    }
    if out.is_empty() {
        return Err(fixture_error(
            dir,
            "no *.json release fixtures in this directory".into(),
        ));
    }
    Ok(out)
}
