//! The files Keel itself writes in the models directory, opened without following symbolic
//! links, and the hash cache that lets an unchanged model file skip re-hashing.
//!
//! A pull writes `<file>.partial`, `<file>.partial.json` (and its `.tmp`), `<file>.lock`,
//! `<file>.sha256` and `.pull-*` staging folders. Each is opened with `O_NOFOLLOW` (and
//! `O_NONBLOCK`, so a FIFO put in its place cannot hang an open) and must be a regular file,
//! so a link planted in the models directory can never make Keel read, truncate or write a
//! file elsewhere.
//!
//! The hash cache `<file>.sha256` records a SHA-256 with the file's device, inode, size,
//! modification time and status-change time (ctime), to the nanosecond. Any write to the
//! file, and any `touch`/`utimensat` that puts its modification time back, sets its ctime to
//! the current time, and no unprivileged process can set ctime: so a file changed after it
//! was hashed no longer matches its record and is hashed again. A record is only written
//! for a file left alone for [`SETTLED`] before it was hashed (timestamps are coarse: a
//! change within the same clock tick as the last one can leave ctime as it was), and is
//! only read from a regular file owned by the current user and writable by no one else. So
//! the cache skips hashing an unchanged file; it is not a signature: the user who owns it
//! can write any record.

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sha2::{Digest, Sha256};

use super::{ModelsError, hex, io_error};

/// How long a file must have been left alone (since its ctime) before its hash is recorded.
const SETTLED: Duration = Duration::from_secs(2);

/// The first word of a hash cache record.
const CACHE_TAG: &str = "keel-sha256-v2";

/// Opens `path` with `options`, not following a symbolic link in its last component (and
/// not blocking on a FIFO). The caller checks that it is a regular file
/// ([`regular`]).
pub(super) fn open_nofollow(path: &Path, options: &mut OpenOptions) -> io::Result<File> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK);
    }
    #[cfg(not(unix))]
    if is_symlink(path) {
        return Err(io::Error::other("is a symbolic link"));
    }
    options.open(path)
}

/// The error for a failed [`open_nofollow`]: [`ModelsError::Symlink`] when `path` is a
/// link, else an I/O error.
pub(super) fn open_error(action: &'static str, path: &Path, error: &io::Error) -> ModelsError {
    if is_symlink(path) {
        symlink_error(path)
    } else {
        io_error(action, path, error)
    }
}

/// Opens `path` with [`open_nofollow`] and checks that it is a regular file.
pub(super) fn open_regular(
    path: &Path,
    options: &mut OpenOptions,
    action: &'static str,
) -> Result<File, ModelsError> {
    let file = open_nofollow(path, options).map_err(|e| open_error(action, path, &e))?;
    regular(&file, path)?;
    Ok(file)
}

/// Checks that an open file is a regular file (not a FIFO, device or directory).
pub(super) fn regular(file: &File, path: &Path) -> Result<(), ModelsError> {
    let meta = file
        .metadata()
        .map_err(|e| io_error("cannot read", path, &e))?;
    if meta.is_file() {
        Ok(())
    } else {
        Err(ModelsError::Io {
            action: "refusing",
            path: path.to_path_buf(),
            message: "not a regular file (remove it and pull again)".to_string(),
        })
    }
}

/// Whether `path` itself is a symbolic link.
pub(super) fn is_symlink(path: &Path) -> bool {
    fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink())
}

pub(super) fn symlink_error(path: &Path) -> ModelsError {
    ModelsError::Symlink {
        path: path.to_path_buf(),
    }
}

/// Refuses any of `paths` that is a symbolic link.
pub(super) fn refuse_symlinks(paths: &[&Path]) -> Result<(), ModelsError> {
    match paths.iter().find(|p| is_symlink(p)) {
        Some(path) => Err(symlink_error(path)),
        None => Ok(()),
    }
}

/// Reads a small file Keel wrote (at most `limit` bytes), not following a link. `Ok(None)`
/// when it does not exist.
pub(super) fn read_small(path: &Path, limit: u64) -> Result<Option<String>, ModelsError> {
    let file = match open_nofollow(path, OpenOptions::new().read(true)) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(open_error("cannot open", path, &e)),
    };
    regular(&file, path)?;
    let mut text = String::new();
    file.take(limit)
        .read_to_string(&mut text)
        .map_err(|e| io_error("cannot read", path, &e))?;
    Ok(Some(text))
}

/// Creates (or replaces) a small file, not following a link: writes `<path>.tmp`, then
/// renames it over `path`.
pub(super) fn write_small(path: &Path, tmp: &Path, text: &str) -> Result<(), ModelsError> {
    let mut file = open_regular(
        tmp,
        OpenOptions::new().write(true).create(true).truncate(true),
        "cannot write",
    )?;
    file.write_all(text.as_bytes())
        .and_then(|()| file.sync_all())
        .map_err(|e| io_error("cannot write", tmp, &e))?;
    drop(file);
    fs::rename(tmp, path).map_err(|e| io_error("cannot write", path, &e))
}

/// Removes a file (or a link: never what it points to); absent is fine.
pub(super) fn remove_if_present(path: &Path) -> Result<(), ModelsError> {
    match fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io_error("cannot remove", path, &e)),
    }
}

/// Creates the directory `path`, which must not exist (no link is followed), and checks
/// that what is there now is a directory.
pub(super) fn create_fresh_dir(path: &Path) -> io::Result<()> {
    fs::create_dir(path)?;
    let meta = fs::symlink_metadata(path)?;
    if meta.is_dir() {
        Ok(())
    } else {
        Err(io::Error::other("is not a directory"))
    }
}

/// Flushes a directory's entries (a rename in it) to disk; best effort.
pub(super) fn sync_dir(dir: &Path) {
    #[cfg(unix)]
    if let Ok(dir) = File::open(dir) {
        let _ = dir.sync_all();
    }
    #[cfg(not(unix))]
    let _ = dir;
}

/// What identifies a file's contents as they were when hashed: any write, truncation,
/// replacement or timestamp change shows in one of these.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct FileStamp {
    dev: u64,
    ino: u64,
    size: u64,
    mtime_ns: i128,
    ctime_ns: i128,
}

impl FileStamp {
    #[cfg(unix)]
    pub(super) fn of(meta: &fs::Metadata) -> Self {
        use std::os::unix::fs::MetadataExt;
        let ns = |secs: i64, nanos: i64| i128::from(secs) * 1_000_000_000 + i128::from(nanos);
        Self {
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.size(),
            mtime_ns: ns(meta.mtime(), meta.mtime_nsec()),
            ctime_ns: ns(meta.ctime(), meta.ctime_nsec()),
        }
    }

    #[cfg(not(unix))]
    pub(super) fn of(meta: &fs::Metadata) -> Self {
        let mtime_ns = meta
            .modified()
            .ok()
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .map_or(0, |d| i128::try_from(d.as_nanos()).unwrap_or(0));
        Self {
            dev: 0,
            ino: 0,
            size: meta.len(),
            mtime_ns,
            ctime_ns: mtime_ns,
        }
    }

    /// The file's size.
    pub(super) fn size(&self) -> u64 {
        self.size
    }

    /// The stamp of what `path` names now (following a link), if anything.
    pub(super) fn of_path(path: &Path) -> Option<Self> {
        fs::metadata(path).ok().map(|m| Self::of(&m))
    }

    /// Whether the file had been left alone for [`SETTLED`] at `time`.
    fn settled_at(&self, time: SystemTime) -> bool {
        let now_ns = time
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| i128::try_from(d.as_nanos()).unwrap_or(i128::MAX));
        let settled_ns = i128::try_from(SETTLED.as_nanos()).unwrap_or(i128::MAX);
        now_ns.saturating_sub(self.ctime_ns) >= settled_ns
    }

    /// The cache record for `sha256`.
    fn record(&self, sha256: &str) -> String {
        format!(
            "{CACHE_TAG} {sha256} {} {} {} {} {}\n",
            self.dev, self.ino, self.size, self.mtime_ns, self.ctime_ns
        )
    }

    /// The hash a record holds, if it is well formed.
    fn parse(text: &str) -> Option<(String, Self)> {
        let mut fields = text.split_ascii_whitespace();
        if fields.next()? != CACHE_TAG {
            return None;
        }
        let hash = fields.next()?;
        let stamp = Self {
            dev: fields.next()?.parse().ok()?,
            ino: fields.next()?.parse().ok()?,
            size: fields.next()?.parse().ok()?,
            mtime_ns: fields.next()?.parse().ok()?,
            ctime_ns: fields.next()?.parse().ok()?,
        };
        let is_hex = hash.len() == 64
            && hash
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        (fields.next().is_none() && is_hex).then(|| (hash.to_string(), stamp))
    }
}

/// The sidecar that caches a file's SHA-256: `<file>.sha256`, one line
/// `keel-sha256-v2 <sha256> <dev> <inode> <size> <mtime ns> <ctime ns>`.
///
/// It is only believed when it is a regular file (not a link) owned by the current user and
/// writable by no one else, and names the file's current device, inode, size, mtime and
/// ctime. Any write to the file, or a change of its timestamps, sets its ctime (which no
/// unprivileged process can set back), so the file is hashed again. Keel only writes a
/// record for a file left alone for two seconds before it was hashed, so a change in the
/// same clock tick cannot hide behind an unchanged ctime. The sidecar saves re-hashing an
/// unchanged file; it is not a signature (its owner can write any record).
pub fn hash_cache_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_os_string();
    name.push(".sha256");
    PathBuf::from(name)
}

/// The hashes this process computed, by path, with the stamp of the file they are for (the
/// same rules as the sidecar; it serves a read-only models directory, where no sidecar can
/// be written).
static HASHED: Mutex<Option<HashMap<PathBuf, (FileStamp, String)>>> = Mutex::new(None);

fn remembered(path: &Path, stamp: &FileStamp) -> Option<String> {
    let hashed = HASHED.lock().unwrap_or_else(PoisonError::into_inner);
    match hashed.as_ref()?.get(path) {
        Some((recorded, hash)) if recorded == stamp => Some(hash.clone()),
        _ => None,
    }
}

fn remember(path: &Path, stamp: FileStamp, hash: &str) {
    let mut hashed = HASHED.lock().unwrap_or_else(PoisonError::into_inner);
    hashed
        .get_or_insert_with(HashMap::new)
        .insert(path.to_path_buf(), (stamp, hash.to_string()));
}

/// The SHA-256 the cache records for `path` as it is now: from what this process hashed,
/// else from a sidecar that is a regular file (not a link) owned by the current user and
/// writable by no one else, whose record names the file's current device, inode, size,
/// mtime and ctime.
pub(super) fn cached_hash(path: &Path) -> Option<String> {
    let stamp = FileStamp::of_path(path)?;
    if let Some(hash) = remembered(path, &stamp) {
        return Some(hash);
    }
    let cache = hash_cache_path(path);
    let file = open_nofollow(&cache, OpenOptions::new().read(true)).ok()?;
    let meta = file.metadata().ok()?;
    if !meta.is_file() || !owned_by_us(&meta) {
        tracing::debug!(
            path = %cache.display(),
            "ignoring a hash cache not owned by this user or writable by others"
        );
        return None;
    }
    let mut text = String::new();
    file.take(512).read_to_string(&mut text).ok()?;
    let (hash, recorded) = FileStamp::parse(&text)?;
    (recorded == stamp).then_some(hash)
}

#[cfg(unix)]
fn owned_by_us(meta: &fs::Metadata) -> bool {
    use std::os::unix::fs::MetadataExt;
    meta.uid() == rustix::process::geteuid().as_raw() && meta.mode() & 0o022 == 0
}

#[cfg(not(unix))]
fn owned_by_us(_meta: &fs::Metadata) -> bool {
    false
}

/// SHA-256 of everything `reader` yields, lowercase hex (`path` names it in errors).
pub(super) fn sha256_reader(reader: &mut impl Read, path: &Path) -> Result<String, ModelsError> {
    let mut hasher = Sha256::new();
    let mut buffer = vec![0u8; 1 << 20];
    loop {
        let n = reader
            .read(&mut buffer)
            .map_err(|e| io_error("cannot read", path, &e))?;
        if n == 0 {
            break;
        }
        hasher.update(buffer.get(..n).unwrap_or_default());
    }
    Ok(hex(&hasher.finalize()))
}

/// Hashes the file at `path` (following a link: a model file may be one) through one open
/// descriptor, and records the hash in the cache when the file had been left alone for
/// [`SETTLED`] and did not change while it was read.
pub(super) fn hash_and_record(path: &Path) -> Result<String, ModelsError> {
    let started = SystemTime::now();
    let mut file = File::open(path).map_err(|e| io_error("cannot open", path, &e))?;
    let stamp = |file: &File| {
        file.metadata()
            .map(|m| FileStamp::of(&m))
            .map_err(|e| io_error("cannot read", path, &e))
    };
    let before = stamp(&file)?;
    let hash = sha256_reader(&mut file, path)?;
    let after = stamp(&file)?;
    if before == after && before.settled_at(started) && FileStamp::of_path(path) == Some(after) {
        remember(path, after, &hash);
        record_hash(path, &hash, &after);
    }
    Ok(hash)
}

/// Writes the cache record (best effort: a read-only models directory only means hashing
/// again next time). Removes whatever is at the sidecar's path first (a link is removed,
/// never followed) and creates a new file, so a sidecar someone else owns is replaced.
fn record_hash(path: &Path, sha256: &str, stamp: &FileStamp) {
    let cache = hash_cache_path(path);
    let write = || -> io::Result<()> {
        match fs::remove_file(&cache) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        let mut options = OpenOptions::new();
        options.write(true).create_new(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            options.mode(0o644);
        }
        let mut file = open_nofollow(&cache, &mut options)?;
        file.write_all(stamp.record(sha256).as_bytes())
    };
    if let Err(error) = write() {
        tracing::debug!(path = %cache.display(), %error, "cannot write the hash cache");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stamp() -> FileStamp {
        FileStamp {
            dev: 2049,
            ino: 1234,
            size: 7500,
            mtime_ns: 1_700_000_000_123_456_789,
            ctime_ns: 1_700_000_001_000_000_001,
        }
    }

    #[test]
    fn a_record_names_the_exact_file_state_it_is_for() {
        let hash = "ab".repeat(32);
        let record = stamp().record(&hash);
        assert_eq!(FileStamp::parse(&record), Some((hash.clone(), stamp())));
        // Any field that differs is another file, or the same file changed.
        for changed in [
            FileStamp { dev: 1, ..stamp() },
            FileStamp { ino: 1, ..stamp() },
            FileStamp { size: 1, ..stamp() },
            FileStamp {
                mtime_ns: stamp().mtime_ns + 1,
                ..stamp()
            },
            FileStamp {
                ctime_ns: stamp().ctime_ns + 1,
                ..stamp()
            },
        ] {
            assert_ne!(FileStamp::parse(&record).map(|r| r.1), Some(changed));
        }
        // The old `<hash> <size> <mtime>` format, a short hash, extra fields: not records.
        assert_eq!(
            FileStamp::parse(&format!("{hash} 7500 1700000000123456789\n")),
            None
        );
        assert_eq!(FileStamp::parse(&stamp().record("abc")), None);
        assert_eq!(FileStamp::parse(&format!("{} x", record.trim())), None);
        assert_eq!(FileStamp::parse(&stamp().record(&"AB".repeat(32))), None);
    }

    /// A sidecar is read when it records the file as it is and only its owner can write it.
    #[cfg(unix)]
    #[test]
    fn the_sidecar_is_read_when_it_records_the_file_as_it_is() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("keel-local-sidecar-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let file = dir.join("model.gguf");
        fs::write(&file, b"weights").unwrap();
        let stamp = FileStamp::of_path(&file).unwrap();
        let cache = hash_cache_path(&file);
        let claimed = "cd".repeat(32);
        let write = |text: &str, mode: u32| {
            let _ = fs::remove_file(&cache);
            fs::write(&cache, text).unwrap();
            fs::set_permissions(&cache, fs::Permissions::from_mode(mode)).unwrap();
        };
        write(&stamp.record(&claimed), 0o644);
        assert_eq!(cached_hash(&file), Some(claimed.clone()));
        write(&stamp.record(&claimed), 0o646);
        assert_eq!(cached_hash(&file), None);
        write(
            &FileStamp {
                ino: stamp.ino + 1,
                ..stamp
            }
            .record(&claimed),
            0o644,
        );
        assert_eq!(cached_hash(&file), None);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn only_a_file_left_alone_long_enough_is_recorded() {
        let ctime = UNIX_EPOCH + Duration::from_nanos(1_700_000_001_000_000_001);
        assert!(!stamp().settled_at(ctime));
        assert!(!stamp().settled_at(ctime + SETTLED - Duration::from_nanos(1)));
        assert!(stamp().settled_at(ctime + SETTLED));
        assert!(!stamp().settled_at(UNIX_EPOCH));
    }
}
