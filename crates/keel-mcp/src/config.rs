//! Configuration of MCP servers: the `[[mcp.servers]]` entries of `keel.toml`.
//!
//! An entry has a `name` and either `command` (with optional `args`, `env`,
//! `env_passthrough`, `cwd`) for a server started as a child process speaking MCP over
//! stdio, or `url` (with optional `headers`) for a Streamable HTTP server. Unknown keys are
//! rejected so a typo never silently changes behaviour. Values of `env` and `headers` may
//! reference environment variables as `${NAME}`; they are expanded when the server is
//! connected, so secrets stay out of the file.
//!
//! A stdio server does not inherit Keel's environment (which holds provider API keys and
//! `.env` values): it gets only [`BASE_ENV_PASSTHROUGH`], the names listed in
//! `env_passthrough`, and its `env` table ([`child_environment`]).

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Default time allowed for a server to start and answer the handshake.
pub const DEFAULT_STARTUP_TIMEOUT: Duration = Duration::from_secs(30);
/// Default time allowed for one `tools/call`.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// Environment variables every stdio server gets from Keel's environment (when set): what
/// a program needs to find executables, its home and temp directories, and the locale and
/// terminal. Everything else must be named in the server's `env` table or
/// `env_passthrough` list. `npx`/`node` and `uvx`/Python servers start with these
/// (npm's cache lives under `HOME`); proxies, registries and certificate bundles
/// (`HTTPS_PROXY`, `NPM_CONFIG_REGISTRY`, `NODE_OPTIONS`, `SSL_CERT_FILE`, ...) are opt-in.
#[cfg(not(windows))]
pub const BASE_ENV_PASSTHROUGH: &[&str] = &[
    "PATH", "HOME", "USER", "LANG", "LC_ALL", "LC_CTYPE", "TERM", "TMPDIR",
];
/// Environment variables every stdio server gets from Keel's environment (when set); on
/// Windows also what a process needs to start at all (`SystemRoot`, ...).
#[cfg(windows)]
pub const BASE_ENV_PASSTHROUGH: &[&str] = &[
    "PATH",
    "HOME",
    "USER",
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    "TERM",
    "TMPDIR",
    "SYSTEMROOT",
    "WINDIR",
    "COMSPEC",
    "PATHEXT",
    "TEMP",
    "TMP",
    "USERPROFILE",
    "APPDATA",
    "LOCALAPPDATA",
];

/// One MCP server Keel connects to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "RawServerConfig", into = "RawServerConfig")]
pub struct McpServerConfig {
    /// The server's name; tools are exposed as `<name>__<tool>` (sanitized).
    pub name: String,
    /// How to reach the server.
    pub transport: McpTransport,
    /// Time allowed to start the server and complete the handshake.
    pub startup_timeout: Duration,
    /// Time allowed for one tool call (also the proxied tools' `timeout_ms`).
    pub call_timeout: Duration,
}

/// How Keel talks to an MCP server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum McpTransport {
    /// A child process speaking newline-delimited JSON-RPC on stdin/stdout.
    Stdio {
        /// The program to run (looked up on `PATH` when not a path).
        command: String,
        /// Its arguments.
        args: Vec<String>,
        /// Environment variables set for the server (values may use `${VAR}`).
        env: BTreeMap<String, String>,
        /// Names of variables copied from Keel's environment in addition to
        /// [`BASE_ENV_PASSTHROUGH`] (e.g. `NPM_CONFIG_REGISTRY`); nothing else is inherited.
        env_passthrough: Vec<String>,
        /// Working directory, when not the current one.
        cwd: Option<String>,
    },
    /// A Streamable HTTP endpoint.
    Http {
        /// The MCP endpoint, e.g. `https://example.com/mcp`.
        url: String,
        /// Extra HTTP headers sent with every request (values may use `${VAR}`).
        headers: BTreeMap<String, String>,
    },
}

impl McpServerConfig {
    /// A stdio server with default timeouts.
    pub fn stdio(
        name: impl Into<String>,
        command: impl Into<String>,
        args: impl IntoIterator<Item = impl Into<String>>,
    ) -> Self {
        Self {
            name: name.into(),
            transport: McpTransport::Stdio {
                command: command.into(),
                args: args.into_iter().map(Into::into).collect(),
                env: BTreeMap::new(),
                env_passthrough: Vec::new(),
                cwd: None,
            },
            startup_timeout: DEFAULT_STARTUP_TIMEOUT,
            call_timeout: DEFAULT_CALL_TIMEOUT,
        }
    }

    /// A Streamable HTTP server with default timeouts.
    pub fn http(name: impl Into<String>, url: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            transport: McpTransport::Http {
                url: url.into(),
                headers: BTreeMap::new(),
            },
            startup_timeout: DEFAULT_STARTUP_TIMEOUT,
            call_timeout: DEFAULT_CALL_TIMEOUT,
        }
    }

    /// Sets an environment variable of a stdio server (ignored for HTTP servers).
    pub fn with_env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        if let McpTransport::Stdio { env, .. } = &mut self.transport {
            env.insert(key.into(), value.into());
        }
        self
    }

    /// Lets a stdio server see the variable `name` of Keel's environment (ignored for HTTP
    /// servers); see [`BASE_ENV_PASSTHROUGH`] for what it sees anyway.
    pub fn with_env_passthrough(mut self, name: impl Into<String>) -> Self {
        if let McpTransport::Stdio {
            env_passthrough, ..
        } = &mut self.transport
        {
            env_passthrough.push(name.into());
        }
        self
    }

    /// Sets a header of an HTTP server (ignored for stdio servers).
    pub fn with_header(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        if let McpTransport::Http { headers, .. } = &mut self.transport {
            headers.insert(key.into(), value.into());
        }
        self
    }

    /// Sets the start-up timeout.
    pub fn with_startup_timeout(mut self, timeout: Duration) -> Self {
        self.startup_timeout = timeout;
        self
    }

    /// Sets the per-call timeout.
    pub fn with_call_timeout(mut self, timeout: Duration) -> Self {
        self.call_timeout = timeout;
        self
    }

    /// `"stdio"` or `"http"`.
    pub fn transport_kind(&self) -> &'static str {
        match self.transport {
            McpTransport::Stdio { .. } => "stdio",
            McpTransport::Http { .. } => "http",
        }
    }
}

/// The flat TOML shape of a `[[mcp.servers]]` entry.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawServerConfig {
    name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    command: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    args: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    env: Option<BTreeMap<String, String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    env_passthrough: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    cwd: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    url: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    headers: Option<BTreeMap<String, String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    startup_timeout_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    call_timeout_ms: Option<u64>,
}

impl TryFrom<RawServerConfig> for McpServerConfig {
    type Error = String;

    fn try_from(raw: RawServerConfig) -> Result<Self, String> {
        let name = raw.name.trim().to_string();
        if name.is_empty() {
            return Err("mcp.servers: `name` must not be empty".into());
        }
        let transport = match (raw.command, raw.url) {
            (Some(_), Some(_)) => {
                return Err(format!(
                    "mcp server `{name}`: set either `command` (stdio) or `url` (Streamable \
                     HTTP), not both"
                ));
            }
            (None, None) => {
                return Err(format!(
                    "mcp server `{name}`: missing `command` (stdio server) or `url` \
                     (Streamable HTTP server)"
                ));
            }
            (Some(command), None) => {
                if raw.headers.is_some() {
                    return Err(format!(
                        "mcp server `{name}`: `headers` only applies to `url` servers; use \
                         `env` for a `command` server"
                    ));
                }
                if command.trim().is_empty() {
                    return Err(format!("mcp server `{name}`: `command` must not be empty"));
                }
                let env_passthrough = raw.env_passthrough.unwrap_or_default();
                if let Some(bad) = env_passthrough.iter().find(|n| !is_env_name(n)) {
                    return Err(format!(
                        "mcp server `{name}`: `env_passthrough` entry `{bad}` is not an \
                         environment variable name (non-empty, no `=`, no NUL, no spaces)"
                    ));
                }
                McpTransport::Stdio {
                    command,
                    args: raw.args.unwrap_or_default(),
                    env: raw.env.unwrap_or_default(),
                    env_passthrough,
                    cwd: raw.cwd,
                }
            }
            (None, Some(url)) => {
                if raw.args.is_some()
                    || raw.env.is_some()
                    || raw.env_passthrough.is_some()
                    || raw.cwd.is_some()
                {
                    return Err(format!(
                        "mcp server `{name}`: `args`, `env`, `env_passthrough` and `cwd` only \
                         apply to `command` servers; use `headers` for a `url` server"
                    ));
                }
                if !(url.starts_with("http://") || url.starts_with("https://")) {
                    return Err(format!(
                        "mcp server `{name}`: `url` must start with http:// or https://, got \
                         `{url}`"
                    ));
                }
                McpTransport::Http {
                    url,
                    headers: raw.headers.unwrap_or_default(),
                }
            }
        };
        let startup_timeout = raw
            .startup_timeout_ms
            .map(Duration::from_millis)
            .unwrap_or(DEFAULT_STARTUP_TIMEOUT);
        let call_timeout = raw
            .call_timeout_ms
            .map(Duration::from_millis)
            .unwrap_or(DEFAULT_CALL_TIMEOUT);
        if startup_timeout.is_zero() || call_timeout.is_zero() {
            return Err(format!(
                "mcp server `{name}`: `startup_timeout_ms` and `call_timeout_ms` must be \
                 greater than 0"
            ));
        }
        Ok(Self {
            name,
            transport,
            startup_timeout,
            call_timeout,
        })
    }
}

impl From<McpServerConfig> for RawServerConfig {
    fn from(config: McpServerConfig) -> Self {
        let mut raw = RawServerConfig {
            name: config.name,
            startup_timeout_ms: Some(duration_ms(config.startup_timeout)),
            call_timeout_ms: Some(duration_ms(config.call_timeout)),
            ..RawServerConfig::default()
        };
        match config.transport {
            McpTransport::Stdio {
                command,
                args,
                env,
                env_passthrough,
                cwd,
            } => {
                raw.command = Some(command);
                raw.args = Some(args);
                raw.env = Some(env);
                raw.env_passthrough = (!env_passthrough.is_empty()).then_some(env_passthrough);
                raw.cwd = cwd;
            }
            McpTransport::Http { url, headers } => {
                raw.url = Some(url);
                raw.headers = Some(headers);
            }
        }
        raw
    }
}

fn duration_ms(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// True for a name that can be an environment variable.
fn is_env_name(name: &str) -> bool {
    !name.is_empty()
        && !name
            .chars()
            .any(|c| c == '=' || c == '\0' || c.is_whitespace())
}

/// The complete environment of a stdio server: the variables of `parent` named in
/// [`BASE_ENV_PASSTHROUGH`] or `passthrough` (when set there), then the server's `env`
/// table with `${VAR}` references expanded from Keel's environment (these win). Nothing
/// else of `parent` is included, so API keys and `.env` values stay in Keel.
pub fn child_environment(
    parent: impl IntoIterator<Item = (std::ffi::OsString, std::ffi::OsString)>,
    passthrough: &[String],
    env: &BTreeMap<String, String>,
) -> Result<BTreeMap<std::ffi::OsString, std::ffi::OsString>, String> {
    let allowed = |name: &std::ffi::OsStr| {
        let Some(name) = name.to_str() else {
            return false;
        };
        let base = if cfg!(windows) {
            BASE_ENV_PASSTHROUGH
                .iter()
                .any(|b| b.eq_ignore_ascii_case(name))
        } else {
            BASE_ENV_PASSTHROUGH.contains(&name)
        };
        base || passthrough.iter().any(|p| p == name)
    };
    let mut out: BTreeMap<_, _> = parent
        .into_iter()
        .filter(|(name, _)| allowed(name))
        .collect();
    for (key, value) in env {
        out.insert(key.into(), expand_env(value, &format!("env.{key}"))?.into());
    }
    Ok(out)
}

/// Expands `${NAME}` references from the process environment. A missing variable is an
/// error naming it.
pub(crate) fn expand_env(value: &str, field: &str) -> Result<String, String> {
    let mut out = String::with_capacity(value.len());
    let mut rest = value;
    while let Some(start) = rest.find("${") {
        out.push_str(rest.get(..start).unwrap_or_default());
        let after = rest.get(start + 2..).unwrap_or_default();
        let Some(end) = after.find('}') else {
            return Err(format!("{field}: unterminated `${{` in `{value}`"));
        };
        let name = after.get(..end).unwrap_or_default();
        match std::env::var(name) {
            Ok(resolved) => out.push_str(&resolved),
            Err(_) => {
                return Err(format!(
                    "{field}: environment variable `{name}` is not set (referenced as \
                     `${{{name}}}`); export it or put it in .env"
                ));
            }
        }
        rest = after.get(end + 1..).unwrap_or_default();
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Deserialize, Serialize)]
    struct File {
        servers: Vec<McpServerConfig>,
    }

    fn parse(text: &str) -> Result<Vec<McpServerConfig>, String> {
        serde_json::from_str::<File>(text)
            .map(|f| f.servers)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn parses_stdio_and_http_entries() {
        let servers = parse(
            r#"{"servers":[
                {"name":"everything","command":"npx","args":["-y","x"],"env":{"A":"1"}},
                {"name":"remote","url":"https://example.invalid/mcp","headers":{"Authorization":"Bearer ${T}"},"call_timeout_ms":5000}
            ]}"#,
        )
        .unwrap();
        assert_eq!(servers[0].transport_kind(), "stdio");
        assert_eq!(servers[1].transport_kind(), "http");
        assert_eq!(servers[1].call_timeout, Duration::from_secs(5));
        assert_eq!(servers[0].startup_timeout, DEFAULT_STARTUP_TIMEOUT);
    }

    #[test]
    fn rejects_unknown_keys_and_mixed_transports() {
        let error = parse(r#"{"servers":[{"name":"a","command":"x","comand":"y"}]}"#).unwrap_err();
        assert!(error.contains("comand"), "{error}");
        let error =
            parse(r#"{"servers":[{"name":"a","command":"x","url":"http://h"}]}"#).unwrap_err();
        assert!(error.contains("not both"), "{error}");
        let error = parse(r#"{"servers":[{"name":"a"}]}"#).unwrap_err();
        assert!(error.contains("missing `command`"), "{error}");
        let error = parse(r#"{"servers":[{"name":"a","url":"http://h","env":{}}]}"#).unwrap_err();
        assert!(error.contains("only apply to `command`"), "{error}");
        let error = parse(r#"{"servers":[{"name":"a","url":"http://h","env_passthrough":["X"]}]}"#)
            .unwrap_err();
        assert!(error.contains("env_passthrough"), "{error}");
        let error = parse(r#"{"servers":[{"name":"a","command":"x","env_passthrough":["A=B"]}]}"#)
            .unwrap_err();
        assert!(error.contains("`A=B`"), "{error}");
    }

    #[test]
    fn env_passthrough_round_trips() {
        let servers = parse(
            r#"{"servers":[{"name":"n","command":"npx","env_passthrough":["NPM_CONFIG_REGISTRY"]}]}"#,
        )
        .unwrap();
        let expected = McpServerConfig::stdio("n", "npx", Vec::<String>::new())
            .with_env_passthrough("NPM_CONFIG_REGISTRY");
        assert_eq!(servers[0], expected);
        let json = serde_json::to_string(&File { servers }).unwrap();
        assert_eq!(parse(&json).unwrap()[0], expected);
    }

    #[test]
    fn child_environment_keeps_only_the_allowlist_the_passthrough_and_env() {
        let parent = [
            ("PATH", "/usr/bin"),
            ("HOME", "/home/k"),
            ("OPENAI_API_KEY", "sk-secret"),
            ("ANTHROPIC_API_KEY", "sk-ant-secret"),
            ("NPM_CONFIG_REGISTRY", "https://registry.example"),
            ("LOG_LEVEL", "parent"),
        ]
        .map(|(k, v)| (k.into(), v.into()));
        let mut env = BTreeMap::new();
        env.insert("LOG_LEVEL".to_string(), "debug".to_string());
        let child = child_environment(parent, &["NPM_CONFIG_REGISTRY".to_string()], &env).unwrap();
        let names: Vec<&str> = child.keys().filter_map(|k| k.to_str()).collect();
        assert_eq!(
            names,
            ["HOME", "LOG_LEVEL", "NPM_CONFIG_REGISTRY", "PATH"],
            "{child:?}"
        );
        assert_eq!(child[std::ffi::OsStr::new("LOG_LEVEL")], "debug");
        let error = child_environment(
            std::iter::empty(),
            &[],
            &BTreeMap::from([("K".to_string(), "${KEEL_MCP_SURELY_UNSET_VAR}".to_string())]),
        )
        .unwrap_err();
        assert!(error.contains("env.K"), "{error}");
    }

    #[test]
    fn expands_environment_references() {
        assert_eq!(expand_env("plain", "f").unwrap(), "plain");
        let path = std::env::var("PATH").unwrap();
        assert_eq!(expand_env("x${PATH}y", "f").unwrap(), format!("x{path}y"));
        let error =
            expand_env("${KEEL_MCP_SURELY_UNSET_VAR}", "headers.Authorization").unwrap_err();
        assert!(error.contains("KEEL_MCP_SURELY_UNSET_VAR"), "{error}");
    }
}
