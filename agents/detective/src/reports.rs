//! Risk reports: validation of a filed report (each problem names the field and the fix),
//! their storage as one JSON file per report in a directory, and the idempotency index
//! (`Idempotency-Key` → report id) kept next to them so a retry after a restart finds the
//! report it already filed.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// The severities a report may have.
pub const SEVERITIES: [&str; 3] = ["high", "medium", "low"];

/// A filed risk report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RiskReport {
    /// `rr-<uuid>`.
    pub report_id: String,
    /// The release assessed.
    pub release_id: String,
    /// `high`, `medium` or `low`.
    pub severity: String,
    /// The key findings, one sentence each.
    pub findings: Vec<String>,
    /// An optional one-paragraph summary.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<String>,
    /// Optional recommended actions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub recommendations: Vec<String>,
    /// When it was filed (RFC 3339).
    pub created_at: String,
    /// The `Idempotency-Key` it was filed with, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
}

/// A validation problem: the field, what is wrong and how to fix it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FieldError {
    /// The offending field.
    pub field: String,
    /// What is wrong.
    pub message: String,
    /// How to fix it.
    pub fix: String,
}

impl FieldError {
    fn new(field: &str, message: impl Into<String>, fix: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            message: message.into(),
            fix: fix.into(),
        }
    }
}

const FIELDS: [&str; 5] = [
    "release_id",
    "severity",
    "findings",
    "summary",
    "recommendations",
];

/// The validated content of a `POST /risk-reports` body.
#[derive(Debug, Clone, PartialEq)]
pub struct NewReport {
    /// The release.
    pub release_id: String,
    /// The severity.
    pub severity: String,
    /// The findings.
    pub findings: Vec<String>,
    /// Optional summary.
    pub summary: Option<String>,
    /// Optional recommendations.
    pub recommendations: Vec<String>,
}

fn string_list(
    body: &Map<String, Value>,
    field: &str,
    required: bool,
) -> Result<Vec<String>, FieldError> {
    // The example quotes no fixture's figures (a model copies examples: issue 19).
    let fix = format!(
        "send `{field}` as a non-empty array of non-empty strings, e.g. [\"13 of 97 ledger tests fail\"]"
    );
    match body.get(field) {
        None | Some(Value::Null) if !required => Ok(Vec::new()),
        None | Some(Value::Null) => Err(FieldError::new(
            field,
            format!("`{field}` is required"),
            fix,
        )),
        Some(Value::Array(items)) => {
            let mut out = Vec::new();
            for (index, item) in items.iter().enumerate() {
                match item.as_str().map(str::trim) {
                    Some(text) if !text.is_empty() => out.push(text.to_string()),
                    _ => {
                        return Err(FieldError::new(
                            field,
                            format!("`{field}[{index}]` must be a non-empty string, got {item}"),
                            fix,
                        ));
                    }
                }
            }
            if out.is_empty() && required {
                return Err(FieldError::new(
                    field,
                    format!("`{field}` must not be empty"),
                    fix,
                ));
            }
            Ok(out)
        }
        Some(other) => Err(FieldError::new(
            field,
            format!("`{field}` must be an array of strings, got {other}"),
            fix,
        )),
    }
}

/// Validates a `POST /risk-reports` body. `release_exists` says whether a release id is known.
pub fn validate(
    body: &Value,
    release_exists: &dyn Fn(&str) -> bool,
) -> Result<NewReport, FieldError> {
    let Some(body) = body.as_object() else {
        return Err(FieldError::new(
            "body",
            "the body must be a JSON object",
            "send {\"release_id\": \"v2.1.0\", \"severity\": \"high\", \"findings\": [\"...\"]}",
        ));
    };
    if let Some(unknown) = body.keys().find(|key| !FIELDS.contains(&key.as_str())) {
        return Err(FieldError::new(
            unknown,
            format!("unknown field `{unknown}`"),
            format!("remove it; accepted fields are {}", FIELDS.join(", ")),
        ));
    }
    let release_id = match body
        .get("release_id")
        .and_then(Value::as_str)
        .map(str::trim)
    {
        Some(id) if !id.is_empty() => id.to_string(),
        _ => {
            return Err(FieldError::new(
                "release_id",
                "`release_id` is required and must be a non-empty string",
                "send the id of the release you assessed, e.g. \"v4.8.1\"",
            ));
        }
    };
    if !release_exists(&release_id) {
        return Err(FieldError::new(
            "release_id",
            format!("`release_id`: release `{release_id}` does not exist"),
            "use the id of a release returned by GET /releases/{id}/summary",
        ));
    }
    let severity = match body
        .get("severity")
        .and_then(Value::as_str)
        .map(|s| s.trim().to_lowercase())
    {
        Some(s) if SEVERITIES.contains(&s.as_str()) => s,
        _ => {
            let got = body
                .get("severity")
                .map(Value::to_string)
                .unwrap_or_else(|| "nothing".into());
            return Err(FieldError::new(
                "severity",
                format!("`severity` must be one of high, medium, low; got {got}"),
                "send \"severity\": \"high\", \"medium\" or \"low\"",
            ));
        }
    };
    let findings = string_list(body, "findings", true)?;
    let summary = match body.get("summary") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(other) => {
            return Err(FieldError::new(
                "summary",
                format!("`summary` must be a string, got {other}"),
                "send a one-paragraph string or leave it out",
            ));
        }
    };
    let recommendations = string_list(body, "recommendations", false)?;
    Ok(NewReport {
        release_id,
        severity,
        findings,
        summary,
        recommendations,
    })
}

impl RiskReport {
    /// Whether this report has exactly the content `new` would file (used to tell a retry
    /// from a different report sent with a reused `Idempotency-Key`).
    pub fn has_content_of(&self, new: &NewReport) -> bool {
        self.release_id == new.release_id
            && self.severity == new.severity
            && self.findings == new.findings
            && self.summary == new.summary
            && self.recommendations == new.recommendations
    }
}

/// True for ids safe to use as file names (`rr-` plus letters, digits and `-`).
pub fn is_report_id(id: &str) -> bool {
    id.starts_with("rr-")
        && id.len() <= 64
        && id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
}

/// Reports as JSON files in one directory.
#[derive(Debug, Clone)]
pub struct ReportStore {
    dir: PathBuf,
}

impl ReportStore {
    /// A store in `dir` (created if missing).
    pub fn open(dir: &Path) -> std::io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        Ok(Self {
            dir: dir.to_path_buf(),
        })
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Writes a report (atomically: temporary file, then rename).
    pub async fn save(&self, report: &RiskReport) -> std::io::Result<PathBuf> {
        let path = self.dir.join(format!("{}.json", report.report_id));
        let text = serde_json::to_vec_pretty(report).map_err(std::io::Error::other)?;
        write_atomically(&path, &text).await?;
        Ok(path)
    }

    /// The report with this id, if any.
    pub async fn get(&self, id: &str) -> std::io::Result<Option<RiskReport>> {
        if !is_report_id(id) {
            return Ok(None);
        }
        match tokio::fs::read(self.dir.join(format!("{id}.json"))).await {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(std::io::Error::other),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(error) => Err(error),
        }
    }

    /// Every report (optionally of one release), oldest first. Unreadable files are skipped.
    pub async fn list(&self, release_id: Option<&str>) -> std::io::Result<Vec<RiskReport>> {
        let mut entries = tokio::fs::read_dir(&self.dir).await?;
        let mut out = Vec::new();
        while let Some(entry) = entries.next_entry().await? {
            let name = entry.file_name().to_string_lossy().into_owned();
            if !name.starts_with("rr-") || !name.ends_with(".json") {
                continue;
            }
            let Ok(bytes) = tokio::fs::read(entry.path()).await else {
                continue;
            };
            let Ok(report) = serde_json::from_slice::<RiskReport>(&bytes) else {
                continue;
            };
            if release_id.is_none_or(|id| id == report.release_id) {
                out.push(report);
            }
        }
        out.sort_by(|a, b| {
            a.created_at
                .cmp(&b.created_at)
                .then(a.report_id.cmp(&b.report_id))
        });
        Ok(out)
    }
}

/// Writes `bytes` to `path` so readers (and a restart after a crash) see the old content or
/// the new one, never a part: a temporary file in the same directory, flushed to disk, then
/// renamed over `path`.
async fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use tokio::io::AsyncWriteExt;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let temporary = path.with_file_name(format!(".{name}.tmp"));
    let mut file = tokio::fs::File::create(&temporary).await?;
    file.write_all(bytes).await?;
    file.sync_all().await?;
    drop(file);
    tokio::fs::rename(&temporary, path).await
}

/// The file of the idempotency index, in the reports directory.
pub const IDEMPOTENCY_FILE: &str = "idempotency-keys.json";

/// `Idempotency-Key` → report id, persisted as [`IDEMPOTENCY_FILE`] next to the reports.
///
/// The reports themselves stay the source of truth: [`IdempotencyIndex::load`] also takes
/// the key of every report on disk, so a crash between writing a report and writing the
/// index loses nothing.
#[derive(Debug)]
pub struct IdempotencyIndex {
    path: PathBuf,
    keys: BTreeMap<String, String>,
}

impl IdempotencyIndex {
    /// The index of `store`'s directory: the index file (if any) plus the keys recorded in
    /// the reports. A malformed index file is an error naming it (it is never silently
    /// replaced, which would forget keys).
    pub async fn load(store: &ReportStore) -> std::io::Result<Self> {
        let path = store.dir().join(IDEMPOTENCY_FILE);
        let mut keys: BTreeMap<String, String> = match tokio::fs::read(&path).await {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|error| {
                std::io::Error::other(format!(
                    "{} is not a JSON object of idempotency key → report id ({error}); fix or \
                     delete it (it is rebuilt from the reports)",
                    path.display()
                ))
            })?,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => BTreeMap::new(),
            Err(error) => return Err(error),
        };
        for report in store.list(None).await? {
            if let Some(key) = report.idempotency_key {
                keys.entry(key).or_insert(report.report_id);
            }
        }
        Ok(Self { path, keys })
    }

    /// The report id filed with `key`, if any.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.keys.get(key).map(String::as_str)
    }

    /// Records `key` → `report_id` and writes the index to disk (atomically).
    pub async fn record(&mut self, key: &str, report_id: &str) -> std::io::Result<()> {
        self.keys.insert(key.to_string(), report_id.to_string());
        let text = serde_json::to_vec_pretty(&self.keys).map_err(std::io::Error::other)?;
        write_atomically(&self.path, &text).await
    }
}
