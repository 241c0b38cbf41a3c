//! An unauthenticated flood against a real `keel serve` process: 10,000 requests with
//! made-up methods (up to 2,000 bytes) and made-up paths, no key. Nothing a request without
//! a key sends may grow the server: after a warm-up, its resident memory stays within a
//! bound and `/metrics` keeps the same series (only the counts' digits grow). The figures
//! are printed (docs/server.md "Security model" quotes them).

use std::path::Path;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::serve_shutdown::serve;

const WARM_UP: usize = 1_000;
const FLOOD: usize = 10_000;
/// Connections sending at once.
const SENDERS: usize = 8;
/// The most the server's RSS may grow over the flood after the warm-up (allocator slack
/// and thread stacks; a leak of even 100 bytes a request is 1 MB, of a 2,000-byte method
/// string 20 MB).
const RSS_SLACK_KB: u64 = 8 * 1024;

/// A small deterministic generator (SplitMix64): the same flood every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn token(&mut self, max: u64) -> String {
        const CHARS: &[u8] =
            b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.!~*";
        let len = 1 + self.below(max);
        (0..len)
            .map(|_| CHARS[self.below(CHARS.len() as u64) as usize] as char)
            .collect()
    }
}

/// The `i`th request of the flood: a method and a path.
fn request(rng: &mut Rng) -> (String, String) {
    let method = match rng.below(4) {
        0 => {
            ["GET", "POST", "DELETE", "PUT", "PATCH", "OPTIONS"][rng.below(6) as usize].to_string()
        }
        1 => rng.token(16),
        _ => rng.token(2_000),
    };
    let prefix = [
        "/",
        "/v1/",
        "/v1/threads/",
        "/ui/",
        "/a2a/",
        "/metrics/",
        "/.well-known/",
    ][rng.below(7) as usize];
    let path = format!("{prefix}{}/{}", rng.token(40), rng.token(12));
    (method, path)
}

/// Sends one request (no key) and reads the whole answer; the status.
async fn send(
    address: &str,
    method: &str,
    path: &str,
    authorization: Option<&str>,
) -> (u16, String) {
    let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
    let auth = authorization.map_or_else(String::new, |a| format!("Authorization: {a}\r\n"));
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {address}\r\n{auth}Content-Length: 0\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await.unwrap();
    let text = String::from_utf8_lossy(&response).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

async fn flood(address: &str, rng: &mut Rng, count: usize) {
    let requests: Vec<(String, String)> = (0..count).map(|_| request(rng)).collect();
    let chunks: Vec<Vec<(String, String)>> = requests
        .chunks(count.div_ceil(SENDERS))
        .map(<[_]>::to_vec)
        .collect();
    let mut senders = Vec::new();
    for chunk in chunks {
        let address = address.to_string();
        senders.push(tokio::spawn(async move {
            for (method, path) in chunk {
                let (status, _) = send(&address, &method, &path, None).await;
                assert!(
                    (300..500).contains(&status),
                    "{status} for {method:.40} {path}"
                );
            }
        }));
    }
    for sender in senders {
        sender.await.unwrap();
    }
}

fn rss_kb(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// The series of `/metrics` (every sample line without its value).
fn series(metrics: &str) -> Vec<String> {
    metrics
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| l.rsplit_once(' ').map(|(name, _)| name.to_string()))
        .collect()
}

fn keel_toml(dir: &Path) {
    std::fs::write(
        dir.join("keel.toml"),
        "[agents.bot]\nmodel = \"openai:gpt-4.1-mini\"\ninstructions = \"Help.\"\n\
         [server]\noperators = [\"ops\"]\n[server.limits]\nrequests_per_minute = 0\n",
    )
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_made_up_requests_without_a_key_leave_memory_and_metrics_flat() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    keel_toml(root);
    let store_url = format!("sqlite://{}", root.join("keel.db").display());
    let opened = keel_store::open(&store_url).await.unwrap();
    let ops = keel_server::keys::create(opened.serving.as_ref(), "ops", None)
        .await
        .unwrap()
        .key;
    drop(opened);
    let (server, url) = serve(root, &store_url, "serve_flood");
    let pid = server.0.id();
    let address = url
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_string();
    let bearer = format!("Bearer {ops}");
    let metrics = || async {
        let (status, body) = send(&address, "GET", "/metrics", Some(&bearer)).await;
        assert_eq!(status, 200, "{body}");
        body
    };

    let mut rng = Rng(20261203);
    flood(&address, &mut rng, WARM_UP).await;
    let _ = metrics().await; // the scrape's own series exists from here on
    let before_metrics = metrics().await;
    let before_rss = rss_kb(pid);
    flood(&address, &mut rng, FLOOD).await;
    let after_metrics = metrics().await;
    let after_rss = rss_kb(pid);

    println!(
        "after {WARM_UP} warm-up requests: RSS {before_rss} kB, /metrics {} bytes, {} series; \
         after {FLOOD} more: RSS {after_rss} kB ({:+} kB), /metrics {} bytes, {} series",
        before_metrics.len(),
        series(&before_metrics).len(),
        after_rss as i64 - before_rss as i64,
        after_metrics.len(),
        series(&after_metrics).len(),
    );
    assert_eq!(
        series(&before_metrics),
        series(&after_metrics),
        "the flood added series"
    );
    // Only counts changed: each sample's digits, a few bytes at most.
    assert!(
        after_metrics.len() <= before_metrics.len() + 8 * series(&after_metrics).len(),
        "/metrics grew from {} to {} bytes",
        before_metrics.len(),
        after_metrics.len()
    );
    assert!(
        after_rss <= before_rss + RSS_SLACK_KB,
        "the server's RSS grew from {before_rss} kB to {after_rss} kB over {FLOOD} requests"
    );
}
