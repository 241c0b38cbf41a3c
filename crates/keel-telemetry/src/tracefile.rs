//! Per-trace JSONL files: `<trace_dir>/<trace_id>.jsonl`, one [`TraceRecord`] per line —
//! every event of the run, every span and every per-turn record, already redacted — and
//! the reader that loads them back.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};

use keel_core::Event;
use serde::{Deserialize, Serialize};

use crate::error::TelemetryError;
use crate::ids::valid_trace_id;
use crate::spans::SpanRecord;
use crate::turns::TurnRecord;

/// One line of a trace file.
// Records are read and written one at a time, never stored in bulk hot paths; boxing the
// event variant would only add an allocation per line.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "record", rename_all = "snake_case")]
pub enum TraceRecord {
    /// A run event, as recorded (redacted).
    Event {
        /// The event.
        event: Event,
    },
    /// A finished span.
    Span {
        /// The span.
        span: SpanRecord,
    },
    /// A per-turn telemetry record.
    Turn {
        /// The record.
        turn: TurnRecord,
    },
    /// An event whose redacted form no longer reads as an [`Event`] (kept as JSON).
    RawEvent {
        /// The redacted event.
        event: serde_json::Value,
    },
}

fn file_key(trace_id: &str) -> String {
    if valid_trace_id(trace_id) {
        trace_id.to_ascii_lowercase()
    } else {
        crate::ids::derive_trace_id(trace_id)
    }
}

/// The path of a trace's file.
pub fn trace_file_path(dir: &Path, trace_id: &str) -> PathBuf {
    dir.join(format!("{trace_id}.jsonl"))
}

/// Reads every record of a trace file, in order. Blank lines are skipped; a line that is
/// not a record is an error naming the file and line.
pub fn read_trace_file(path: &Path) -> Result<Vec<TraceRecord>, TelemetryError> {
    let file = File::open(path).map_err(|e| TelemetryError::io(path, e))?;
    let mut out = Vec::new();
    for (i, line) in BufReader::new(file).lines().enumerate() {
        let line = line.map_err(|e| TelemetryError::io(path, e))?;
        if line.trim().is_empty() {
            continue;
        }
        let record = serde_json::from_str(&line).map_err(|e| TelemetryError::TraceFile {
            path: path.to_path_buf(),
            line: i.saturating_add(1),
            message: e.to_string(),
        })?;
        out.push(record);
    }
    Ok(out)
}

/// Reads the trace `id` from `dir`. `id` may be a unique prefix of a trace id.
pub fn read_trace(dir: &Path, id: &str) -> Result<Vec<TraceRecord>, TelemetryError> {
    let exact = trace_file_path(dir, id);
    if exact.is_file() {
        return read_trace_file(&exact);
    }
    let matches: Vec<PathBuf> = list_trace_files(dir)?
        .into_iter()
        .filter(|p| {
            p.file_stem()
                .and_then(|s| s.to_str())
                .is_some_and(|s| s.starts_with(id))
        })
        .collect();
    match matches.as_slice() {
        [one] => read_trace_file(one),
        [] => Err(TelemetryError::io(
            exact,
            std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "no such trace; see `keel trace list`",
            ),
        )),
        _ => Err(TelemetryError::Config {
            field: "trace id".into(),
            message: format!("`{id}` matches {} traces; give more digits", matches.len()),
        }),
    }
}

/// The traces in `dir` that hold events of thread `thread_id` (one per request on the
/// thread; runs it started — agents called as tools — are in the same traces), oldest
/// first. Unreadable files are skipped.
pub fn read_thread_traces(
    dir: &Path,
    thread_id: &str,
) -> Result<Vec<Vec<TraceRecord>>, TelemetryError> {
    let mut found: Vec<(chrono::DateTime<chrono::Utc>, Vec<TraceRecord>)> = Vec::new();
    for path in list_trace_files(dir)? {
        let Ok(records) = read_trace_file(&path) else {
            continue;
        };
        let first = records.iter().find_map(|r| match r {
            TraceRecord::Event { event } if &*event.thread_id == thread_id => Some(event.ts),
            _ => None,
        });
        if let Some(ts) = first {
            found.push((ts, records));
        }
    }
    found.sort_by_key(|(ts, _)| *ts);
    Ok(found.into_iter().map(|(_, records)| records).collect())
}

/// The trace files in `dir`, sorted by name. A missing directory has none.
pub fn list_trace_files(dir: &Path) -> Result<Vec<PathBuf>, TelemetryError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(TelemetryError::io(dir, e)),
    };
    let mut out: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "jsonl"))
        .collect();
    out.sort();
    Ok(out)
}

/// Appends records to trace files, keeping a bounded number of files open.
#[derive(Debug)]
pub struct TraceFileWriter {
    dir: PathBuf,
    open: HashMap<String, BufWriter<File>>,
    max_open: usize,
}

impl TraceFileWriter {
    /// A writer for `dir` (created on first write).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            open: HashMap::new(),
            max_open: 64,
        }
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Appends one record (already redacted) to the file of `trace_id`.
    pub fn append(&mut self, trace_id: &str, record: &TraceRecord) -> Result<(), TelemetryError> {
        let line = serde_json::to_string(record).map_err(|e| TelemetryError::TraceFile {
            path: trace_file_path(&self.dir, trace_id),
            line: 0,
            message: e.to_string(),
        })?;
        self.append_line(trace_id, &line)
    }

    /// Appends one JSON line (already redacted) to the file of `trace_id`.
    pub fn append_line(&mut self, trace_id: &str, line: &str) -> Result<(), TelemetryError> {
        // The id becomes a file name: never let it name another directory.
        let name = file_key(trace_id);
        if !self.open.contains_key(&name) {
            if self.open.len() >= self.max_open {
                self.flush()?;
                self.open.clear();
            }
            std::fs::create_dir_all(&self.dir).map_err(|e| TelemetryError::io(&self.dir, e))?;
            let path = trace_file_path(&self.dir, &name);
            let file = OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)
                .map_err(|e| TelemetryError::io(&path, e))?;
            self.open.insert(name.clone(), BufWriter::new(file));
        }
        let path = trace_file_path(&self.dir, &name);
        let Some(w) = self.open.get_mut(&name) else {
            return Ok(());
        };
        w.write_all(line.as_bytes())
            .and_then(|()| w.write_all(b"\n"))
            .map_err(|e| TelemetryError::io(path, e))
    }

    /// Closes the file of a finished trace.
    pub fn close(&mut self, trace_id: &str) -> Result<(), TelemetryError> {
        let name = file_key(trace_id);
        if let Some(mut w) = self.open.remove(&name) {
            w.flush()
                .map_err(|e| TelemetryError::io(trace_file_path(&self.dir, &name), e))?;
        }
        Ok(())
    }

    /// Flushes every open file.
    pub fn flush(&mut self) -> Result<(), TelemetryError> {
        for (id, w) in &mut self.open {
            w.flush()
                .map_err(|e| TelemetryError::io(trace_file_path(&self.dir, id), e))?;
        }
        Ok(())
    }
}
