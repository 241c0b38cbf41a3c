//! What a queued job may make a worker do with the worker's own credentials.
//!
//! A worker resolves API keys from its own environment, so a job's custom base URL decides
//! where that key is sent, and a job's agent file decides which hosts its HTTP tools call
//! (with headers built from the worker's environment). Whoever can enqueue must not be able
//! to point either at a host of their choosing: a job (or the recorded run it continues)
//! may use a custom base URL or an agent file only when the worker allows it with
//! `--allow-base-url` / `--allow-agent-dir`. Anything else fails the job before the agent
//! is built, so no model call is made and no key leaves the process.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use url::{Host, Url};

use super::JobSpec;

/// The keyword accepted by `--allow-base-url` for any loopback address.
pub const LOOPBACK: &str = "loopback";

/// One `--allow-base-url` entry.
#[derive(Debug, Clone, PartialEq)]
enum BaseUrlRule {
    /// `loopback`: http(s) to 127.0.0.0/8, ::1 or `localhost`, any port and path.
    Loopback,
    /// A URL prefix: same scheme, host and port, and a path under the entry's path.
    Prefix(Url),
}

/// The worker's allowlist.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct JobPolicy {
    base_urls: Vec<BaseUrlRule>,
    agent_dirs: Vec<PathBuf>,
}

impl JobPolicy {
    /// Parses the flags: base URLs (`loopback` or `scheme://host[:port][/path]`) and
    /// existing directories (resolved, symlinks included). Errors name the bad entry.
    pub fn new(base_urls: &[String], agent_dirs: &[PathBuf]) -> Result<Self, String> {
        let mut policy = Self::default();
        for entry in base_urls.iter().map(|e| e.trim()).filter(|e| !e.is_empty()) {
            if entry.eq_ignore_ascii_case(LOOPBACK) {
                policy.base_urls.push(BaseUrlRule::Loopback);
                continue;
            }
            let url = Url::parse(entry).map_err(|e| {
                format!(
                    "--allow-base-url {}: {e} (expected `loopback` or scheme://host[:port][/path])",
                    display_url(entry)
                )
            })?;
            if !matches!(url.scheme(), "http" | "https") || !url.has_host() {
                return Err(format!(
                    "--allow-base-url {}: only http:// and https:// URLs with a host can be allowed",
                    display_url(entry)
                ));
            }
            if url.query().is_some() || url.fragment().is_some() || !url.username().is_empty() {
                return Err(format!(
                    "--allow-base-url {}: give scheme://host[:port][/path] only (no credentials, query or fragment)",
                    display_url(entry)
                ));
            }
            policy.base_urls.push(BaseUrlRule::Prefix(url));
        }
        for dir in agent_dirs.iter().filter(|d| !d.as_os_str().is_empty()) {
            let resolved = std::fs::canonicalize(dir)
                .map_err(|e| format!("--allow-agent-dir {}: {e}", dir.display()))?;
            if !resolved.is_dir() {
                return Err(format!(
                    "--allow-agent-dir {}: not a directory",
                    dir.display()
                ));
            }
            policy.agent_dirs.push(resolved);
        }
        Ok(policy)
    }

    /// A one-line description for the worker's start-up banner.
    pub fn describe(&self) -> String {
        let urls: Vec<String> = self
            .base_urls
            .iter()
            .map(|rule| match rule {
                BaseUrlRule::Loopback => LOOPBACK.to_string(),
                BaseUrlRule::Prefix(url) => url.to_string(),
            })
            .collect();
        let dirs: Vec<String> = self
            .agent_dirs
            .iter()
            .map(|d| d.display().to_string())
            .collect();
        format!(
            "custom base URLs: {}; agent files under: {}",
            if urls.is_empty() {
                "none".into()
            } else {
                urls.join(", ")
            },
            if dirs.is_empty() {
                "none".into()
            } else {
                dirs.join(", ")
            }
        )
    }

    /// Whether the worker may build `spec`; the error says what is refused and which flag
    /// allows it.
    pub fn check(&self, spec: &impl JobSpec) -> Result<(), String> {
        if let Some(base_url) = spec.base_url().filter(|u| !u.trim().is_empty()) {
            self.check_base_url(base_url)?;
        }
        if let Some(path) = spec.agent_file() {
            self.check_agent_file(path)?;
        }
        Ok(())
    }

    fn check_base_url(&self, raw: &str) -> Result<(), String> {
        let refused = |why: &str| {
            format!(
                "the job's base URL {} is not allowed on this worker ({why}): the worker's API keys \
                 are sent only to allowed hosts; start the worker with --allow-base-url {} \
                 (or KEEL_WORKER_ALLOW_BASE_URLS) to allow it",
                display_url(raw),
                display_url(raw)
            )
        };
        let url =
            Url::parse(raw.trim()).map_err(|e| refused(&format!("it does not parse: {e}")))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(refused("only http:// and https:// are allowed"));
        }
        if self.base_urls.iter().any(|rule| rule.allows(&url)) {
            Ok(())
        } else if self.base_urls.is_empty() {
            Err(refused("the worker allows no custom base URL"))
        } else {
            Err(refused("it matches no --allow-base-url entry"))
        }
    }

    fn check_agent_file(&self, path: &Path) -> Result<(), String> {
        let refused = |why: String| {
            format!(
                "the job's agent file {} is not allowed on this worker ({why}): start the worker \
                 with --allow-agent-dir DIR (or KEEL_WORKER_ALLOW_AGENT_DIRS) naming a directory \
                 that holds it",
                path.display()
            )
        };
        let resolved = std::fs::canonicalize(path)
            .map_err(|e| refused(format!("it cannot be resolved: {e}")))?;
        if self.agent_dirs.is_empty() {
            return Err(refused("the worker allows no agent file".into()));
        }
        if self.agent_dirs.iter().any(|dir| resolved.starts_with(dir)) {
            Ok(())
        } else {
            Err(refused(format!(
                "it resolves to {}, outside every allowed directory",
                resolved.display()
            )))
        }
    }
}

impl BaseUrlRule {
    fn allows(&self, url: &Url) -> bool {
        match self {
            Self::Loopback => url.host().is_some_and(|host| is_loopback(&host)),
            Self::Prefix(allowed) => {
                url.scheme() == allowed.scheme()
                    && url.host() == allowed.host()
                    && url.port_or_known_default() == allowed.port_or_known_default()
                    && path_under(url.path(), allowed.path())
            }
        }
    }
}

fn is_loopback(host: &Host<&str>) -> bool {
    match host {
        Host::Ipv4(ip) => IpAddr::V4(*ip).is_loopback(),
        Host::Ipv6(ip) => IpAddr::V6(*ip).is_loopback(),
        Host::Domain(name) => name.eq_ignore_ascii_case("localhost"),
    }
}

/// Whether `path` is `prefix` or below it, segment by segment (`/v1` allows `/v1/chat`,
/// not `/v10`). Dot segments were resolved by the URL parser.
fn path_under(path: &str, prefix: &str) -> bool {
    let prefix = prefix.trim_end_matches('/');
    prefix.is_empty()
        || path == prefix
        || path
            .strip_prefix(prefix)
            .is_some_and(|rest| rest.starts_with('/'))
}

/// A URL for messages: no credentials, query or fragment.
pub fn display_url(raw: &str) -> String {
    match Url::parse(raw.trim()) {
        Ok(mut url) => {
            let _ = url.set_username("");
            let _ = url.set_password(None);
            url.set_query(None);
            url.set_fragment(None);
            url.to_string()
        }
        Err(_) => {
            // Unparsable: keep what is before any `@`, `?` or `#` of the authority only.
            let cut = raw
                .find(['?', '#'])
                .map_or(raw, |end| raw.get(..end).unwrap_or(raw));
            match cut.split_once("://") {
                Some((scheme, rest)) => {
                    let host = rest.rsplit_once('@').map_or(rest, |(_, host)| host);
                    format!("{scheme}://{host}")
                }
                None => cut.to_string(),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use super::*;

    /// What the policy looks at in a job's agent spec.
    struct Spec {
        base_url: Option<String>,
        agent: Option<PathBuf>,
    }

    impl JobSpec for Spec {
        fn base_url(&self) -> Option<&str> {
            self.base_url.as_deref()
        }
        fn agent_file(&self) -> Option<&Path> {
            self.agent.as_deref()
        }
        fn submission(&self) -> Option<&str> {
            None
        }
        fn set_submission(&mut self, _submission: Option<String>) {}
    }

    fn spec(base_url: Option<&str>, agent: Option<PathBuf>) -> Spec {
        Spec {
            base_url: base_url.map(str::to_string),
            agent,
        }
    }

    #[test]
    fn nothing_custom_is_allowed_by_default() {
        let policy = JobPolicy::default();
        policy.check(&spec(None, None)).unwrap();
        let error = policy
            .check(&spec(
                Some("https://user:pw@evil.example/v1?k=secret"),
                None,
            ))
            .unwrap_err();
        assert!(error.contains("--allow-base-url"), "{error}");
        assert!(error.contains("https://evil.example/v1"), "{error}");
        assert!(
            !error.contains("pw") && !error.contains("secret"),
            "{error}"
        );
    }

    #[test]
    fn prefixes_match_scheme_host_port_and_whole_segments() {
        let policy = JobPolicy::new(&["https://llm.internal.example/v1".into()], &[]).unwrap();
        for ok in [
            "https://llm.internal.example/v1",
            "https://llm.internal.example/v1/",
            "https://LLM.internal.example:443/v1/chat",
        ] {
            policy.check(&spec(Some(ok), None)).unwrap();
        }
        for bad in [
            "http://llm.internal.example/v1",
            "https://llm.internal.example:8443/v1",
            "https://llm.internal.example/v10",
            "https://llm.internal.example/",
            "https://llm.internal.example/v1/../admin",
            "https://llm.internal.example.evil.example/v1",
            "https://llm.internal.example@evil.example/v1",
            "file:///etc/passwd",
        ] {
            assert!(
                policy.check(&spec(Some(bad), None)).is_err(),
                "{bad} was allowed"
            );
        }
    }

    #[test]
    fn loopback_is_expressible() {
        let policy = JobPolicy::new(&["loopback".into()], &[]).unwrap();
        for ok in [
            "http://127.0.0.1:41234/v1",
            "http://127.5.0.1/",
            "http://[::1]:8080/x",
            "http://localhost:11434",
        ] {
            policy.check(&spec(Some(ok), None)).unwrap();
        }
        for bad in [
            "http://10.0.0.1/v1",
            "http://127.0.0.1.evil.example/",
            "http://0.0.0.0/",
        ] {
            assert!(
                policy.check(&spec(Some(bad), None)).is_err(),
                "{bad} was allowed"
            );
        }
    }

    #[test]
    fn bad_entries_are_refused() {
        for entry in [
            "ftp://host/x",
            "not a url",
            "https://u:p@host/",
            "https://host/?q=1",
        ] {
            assert!(JobPolicy::new(&[entry.into()], &[]).is_err(), "{entry}");
        }
        assert!(JobPolicy::new(&[], &["/nonexistent/keel-dir".into()]).is_err());
    }

    #[test]
    fn agent_files_must_resolve_inside_an_allowed_directory() {
        let root = tempfile::tempdir().unwrap();
        let allowed = root.path().join("agents");
        let other = root.path().join("other");
        std::fs::create_dir_all(&allowed).unwrap();
        std::fs::create_dir_all(&other).unwrap();
        std::fs::write(allowed.join("a.toml"), "x").unwrap();
        std::fs::write(other.join("b.toml"), "x").unwrap();
        let policy = JobPolicy::new(&[], std::slice::from_ref(&allowed)).unwrap();
        policy
            .check(&spec(None, Some(allowed.join("a.toml"))))
            .unwrap();
        for bad in [
            other.join("b.toml"),
            allowed.join("../other/b.toml"),
            allowed.join("missing.toml"),
        ] {
            let error = policy.check(&spec(None, Some(bad.clone()))).unwrap_err();
            assert!(error.contains("--allow-agent-dir"), "{error}");
        }
        #[cfg(unix)]
        {
            std::os::unix::fs::symlink(other.join("b.toml"), allowed.join("link.toml")).unwrap();
            assert!(
                policy
                    .check(&spec(None, Some(allowed.join("link.toml"))))
                    .is_err(),
                "a symlink out of the allowed directory was followed"
            );
        }
        let error = JobPolicy::default()
            .check(&spec(None, Some(allowed.join("a.toml"))))
            .unwrap_err();
        assert!(error.contains("allows no agent file"), "{error}");
    }
}
