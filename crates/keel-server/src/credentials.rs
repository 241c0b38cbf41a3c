//! Per-tenant tool credentials: a run of tenant T resolves its tools' credentials (the
//! variables named in an HTTP tool's or A2A agent's `auth`) through
//! [`TenantCredentials`], which answers only T's `[server.tenants.T.credentials]`
//! entries — each naming the environment variable or file holding T's secret. A credential
//! T has not configured fails the call with `unauthorized`, naming the setting to add; it
//! never falls back to the server's environment, which holds the server's own provider
//! keys. The entries themselves cannot name those keys ([`keel_config::credential_problems`],
//! refused by `keel config check` and when the server starts).
//!
//! The tenant of a run is its thread's: store thread ids are `<tenant>.<client id>`
//! ([`crate::tenancy`]); runs started by a run (agents as tools, handoffs, workflow steps)
//! inherit its credential source.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use keel_config::{CredentialRef, ServerConfig};
use keel_core::tool::{CredentialLookup, CredentialSource};

/// Largest secrets file read, in bytes.
const MAX_SECRET_FILE_BYTES: u64 = 64 * 1024;
/// Shorter values of the server's secrets are not looked for in tool declarations (too
/// likely to match by chance; real keys are far longer).
const MIN_SECRET_CHARS: usize = 8;

/// An environment lookup (the application's).
pub type Env = Arc<dyn Fn(&str) -> Option<String> + Send + Sync>;

/// Every tenant's credential entries, and where they are read.
#[derive(Clone)]
pub struct Credentials {
    tenants: Arc<BTreeMap<String, BTreeMap<String, CredentialRef>>>,
    env: Env,
    base_dir: PathBuf,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Names of variables and files only; no secret is held here.
        f.debug_struct("Credentials")
            .field("tenants", &self.tenants)
            .field("base_dir", &self.base_dir)
            .finish_non_exhaustive()
    }
}

impl Credentials {
    /// The entries of `config`'s `[server.tenants.<tenant>.credentials]`, read through `env`
    /// (variables) and relative to `base_dir` (files).
    pub fn new(config: &ServerConfig, env: Env, base_dir: &Path) -> Self {
        let tenants = config
            .tenants
            .iter()
            .map(|(tenant, settings)| (tenant.clone(), settings.credentials.clone()))
            .collect();
        Self {
            tenants: Arc::new(tenants),
            env,
            base_dir: base_dir.to_path_buf(),
        }
    }

    /// The entries of `app`'s keel.toml, read through its environment and relative to
    /// keel.toml's directory: what `keel serve` uses, and what a `keel worker` or `keel
    /// resume` driving a server run uses for the run's tenant.
    pub fn of_app(app: &keel_app::App) -> Self {
        Self::new(
            &app.config().server,
            app.shared_env(),
            &app.loaded().base_dir,
        )
    }

    /// The credential source of `tenant`'s runs.
    pub fn for_tenant(&self, tenant: &str) -> TenantCredentials {
        TenantCredentials {
            tenant: tenant.to_string(),
            all: self.clone(),
        }
    }

    /// The credential source of the runs on store thread `thread_id` (`<tenant>.<client
    /// id>`; a thread id without a tenant prefix gets a source that has nothing).
    pub fn for_thread(&self, thread_id: &str) -> TenantCredentials {
        self.for_tenant(crate::tenancy::tenant_of(thread_id).unwrap_or(""))
    }
}

/// The credentials of one tenant's runs (see the module docs).
#[derive(Clone)]
pub struct TenantCredentials {
    tenant: String,
    all: Credentials,
}

impl std::fmt::Debug for TenantCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TenantCredentials")
            .field("tenant", &self.tenant)
            .finish_non_exhaustive()
    }
}

impl TenantCredentials {
    /// The tenant.
    pub fn tenant(&self) -> &str {
        &self.tenant
    }

    fn setting(&self, key: &str) -> String {
        format!("server.tenants.{}.credentials.{key}", self.tenant)
    }

    fn missing(&self, tool: &str, key: &str) -> CredentialLookup {
        let tenant = &self.tenant;
        let upper = tenant.to_ascii_uppercase().replace('-', "_");
        CredentialLookup::Missing {
            fix: format!(
                "tenant `{tenant}` has no credential `{key}` (tool `{tool}` calls its service \
                 with it, and never with the server's own environment); add it to keel.toml \
                 as `[server.tenants.{tenant}.credentials]` `{key} = {{ env = \"{upper}_{key}\" }}` \
                 naming the variable that holds {tenant}'s secret (or `{{ file = \"/path\" }}`), \
                 then restart the server"
            ),
        }
    }

    fn read_file(&self, key: &str, file: &str) -> Result<String, String> {
        let path = self.all.base_dir.join(file);
        let shown = path.display();
        let opened = std::fs::File::open(&path).map_err(|e| {
            format!(
                "cannot read the file `{shown}` named by `{}`: {e}",
                self.setting(key)
            )
        })?;
        let mut text = String::new();
        opened
            .take(MAX_SECRET_FILE_BYTES + 1)
            .read_to_string(&mut text)
            .map_err(|e| {
                format!(
                    "cannot read the file `{shown}` named by `{}`: {e}",
                    self.setting(key)
                )
            })?;
        if text.len() as u64 > MAX_SECRET_FILE_BYTES {
            return Err(format!(
                "the file `{shown}` named by `{}` is larger than {MAX_SECRET_FILE_BYTES} bytes; \
                 it should hold the secret only",
                self.setting(key)
            ));
        }
        let secret = text.trim();
        if secret.is_empty() {
            return Err(format!(
                "the file `{shown}` named by `{}` is empty; write {}'s secret in it",
                self.setting(key),
                self.tenant
            ));
        }
        Ok(secret.to_string())
    }
}

impl CredentialSource for TenantCredentials {
    fn credential(&self, tool: &str, key: &str) -> Option<String> {
        match self.lookup(tool, key) {
            CredentialLookup::Found(secret) => Some(secret),
            CredentialLookup::Missing { .. } | CredentialLookup::Unmanaged => None,
        }
    }

    /// Never `Unmanaged`: a tenant's run gets the tenant's secret or a clear refusal.
    fn lookup(&self, tool: &str, key: &str) -> CredentialLookup {
        let Some(entry) = self
            .all
            .tenants
            .get(&self.tenant)
            .and_then(|entries| entries.get(key))
        else {
            return self.missing(tool, key);
        };
        if !entry.allows(tool) {
            return CredentialLookup::Missing {
                fix: format!(
                    "`{}` is given only to {}; add `{tool}` to its `tools` list to let this \
                     tool use it",
                    self.setting(key),
                    entry
                        .tools
                        .iter()
                        .map(|t| format!("`{t}`"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            };
        }
        let found = match (&entry.env, &entry.file) {
            (Some(var), _) => (self.all.env)(var)
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
                .ok_or_else(|| {
                    format!(
                        "the variable `{var}` named by `{}` is not set in the server's \
                         environment; set it to {}'s secret and restart the server",
                        self.setting(key),
                        self.tenant
                    )
                }),
            (None, Some(file)) => self.read_file(key, file),
            (None, None) => Err(format!(
                "`{}` names neither `env` nor `file`",
                self.setting(key)
            )),
        };
        match found {
            Ok(secret) => CredentialLookup::Found(secret),
            Err(fix) => CredentialLookup::Missing { fix },
        }
    }
}

/// The HTTP tools declared in the agent files keel.toml's agents name (`[agents.<name>]
/// file = "…"`), which keel.toml's own parse does not hold: an agent file keeps its
/// `${VAR}` references as written, expanded when the agent is built. An agent file that
/// cannot be read is left to the agent's build, which reports it.
pub fn agent_file_http_tools(
    loaded: &keel_config::LoadedConfig,
) -> Vec<keel_tools::HttpToolConfig> {
    loaded
        .config
        .agents
        .iter()
        .filter(|(_, table)| table.file.is_some())
        .filter_map(|(name, _)| {
            keel_app::definition::Resolved::load(
                loaded,
                &keel_app::definition::AgentRef::Named(name.clone()),
            )
            .ok()
        })
        .flat_map(|resolved| resolved.definition.tools.unwrap_or_default())
        .filter_map(|entry| match entry {
            keel_config::ToolEntry::Http(tool) => Some(*tool),
            keel_config::ToolEntry::Named(_) => None,
        })
        .collect()
}

/// Why the server refuses its credential settings: entries naming the server's own
/// secrets (provider API keys, the store URL), and HTTP tools — of keel.toml and of
/// `agent_file_tools` (see [`agent_file_http_tools`]) — whose fixed `url` or `headers`
/// hold the value of one of them or a `${VAR}` reference to one (either would be sent on
/// every tenant's calls). Messages name variables and tools, never values.
pub fn problems(
    server: &ServerConfig,
    app: &keel_config::KeelConfig,
    agent_file_tools: &[keel_tools::HttpToolConfig],
    env: &dyn Fn(&str) -> Option<String>,
) -> Vec<String> {
    let mut config = app.clone();
    config.server = server.clone();
    let mut out: Vec<String> = keel_config::credential_problems(&config)
        .into_iter()
        .map(|(_, message)| message)
        .collect();
    let inline = app.agents.values().flat_map(|agent| {
        agent
            .tools
            .iter()
            .flatten()
            .filter_map(|entry| match entry {
                keel_config::ToolEntry::Http(tool) => Some(tool.as_ref()),
                keel_config::ToolEntry::Named(_) => None,
            })
    });
    let tools: Vec<_> = app
        .tools
        .http
        .iter()
        .chain(inline)
        .chain(agent_file_tools)
        .collect();
    for (var, what) in keel_config::server_secret_vars(app) {
        let value = env(&var).filter(|v| v.trim().len() >= MIN_SECRET_CHARS);
        let references = [format!("${{{var}}}"), format!("${{{var}:-")];
        for tool in &tools {
            let fields = std::iter::once(("url".to_string(), &tool.url)).chain(
                tool.headers
                    .iter()
                    .map(|(name, text)| (format!("headers.{name}"), text)),
            );
            for (field, text) in fields {
                let holds_value = value.as_deref().is_some_and(|v| text.contains(v.trim()));
                let names_var = references.iter().any(|r| text.contains(r.as_str()));
                if holds_value || names_var {
                    out.push(format!(
                        "tool `{}` sends the value of `{var}` ({what}) in `{field}`: every \
                         tenant's calls would carry the server's own secret. Name a credential \
                         in the tool's `auth` instead (e.g. `auth = {{ bearer_env = \"{}_TOKEN\" }}`) \
                         and give each tenant its own in `[server.tenants.<tenant>.credentials]`",
                        tool.name,
                        tool.name.to_ascii_uppercase()
                    ));
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]
    use super::*;

    fn credentials(
        toml: &str,
        env: &'static [(&'static str, &'static str)],
        dir: &Path,
    ) -> Credentials {
        let config = keel_config::KeelConfig::from_toml_str(toml).unwrap().server;
        let env: Env = Arc::new(move |name: &str| {
            env.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| (*v).to_string())
        });
        Credentials::new(&config, env, dir)
    }

    fn fix(lookup: CredentialLookup) -> String {
        match lookup {
            CredentialLookup::Missing { fix } => fix,
            other => panic!("expected Missing, got {other:?}"),
        }
    }

    #[test]
    fn a_tenant_gets_its_own_entries_and_a_refusal_for_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("beta.token"), "beta-file-secret\n").unwrap();
        let all = credentials(
            "[server.tenants.alpha.credentials]\nSVC_TOKEN = { env = \"ALPHA_SVC\" }\n\
             ONLY_CRM = { env = \"ALPHA_SVC\", tools = [\"crm\"] }\n\
             UNSET = { env = \"ALPHA_UNSET\" }\n\
             [server.tenants.beta.credentials]\nSVC_TOKEN = { file = \"beta.token\" }\n\
             GONE = { file = \"missing.token\" }\n",
            &[("ALPHA_SVC", "alpha-secret"), ("SVC_TOKEN", "server-own")],
            dir.path(),
        );
        let alpha = all.for_thread("alpha.thr_1");
        assert_eq!(
            alpha.lookup("svc", "SVC_TOKEN"),
            CredentialLookup::Found("alpha-secret".into())
        );
        let beta = all.for_thread("beta.thr_9");
        assert_eq!(
            beta.lookup("svc", "SVC_TOKEN"),
            CredentialLookup::Found("beta-file-secret".into())
        );
        // Not configured: refused, naming the setting; the server's own SVC_TOKEN is unused.
        let gamma = all.for_thread("gamma.thr_2");
        let message = fix(gamma.lookup("svc", "SVC_TOKEN"));
        assert!(
            message.contains("[server.tenants.gamma.credentials]"),
            "{message}"
        );
        assert!(
            message.contains("SVC_TOKEN = { env = \"GAMMA_SVC_TOKEN\" }"),
            "{message}"
        );
        assert!(!message.contains("server-own"));
        assert_eq!(gamma.credential("svc", "SVC_TOKEN"), None);
        // Another tool than the listed ones, an unset variable, an unreadable file.
        assert!(fix(alpha.lookup("svc", "ONLY_CRM")).contains("given only to `crm`"));
        assert_eq!(
            alpha.lookup("crm", "ONLY_CRM"),
            CredentialLookup::Found("alpha-secret".into())
        );
        assert!(fix(alpha.lookup("svc", "UNSET")).contains("`ALPHA_UNSET`"));
        assert!(fix(beta.lookup("svc", "GONE")).contains("missing.token"));
        // A thread id without a tenant: nothing.
        assert!(fix(all.for_thread("plain").lookup("svc", "SVC_TOKEN")).contains("tenant ``"));
        // Debug output never holds a secret.
        assert!(
            !format!("{all:?} {alpha:?} {:?}", alpha.lookup("svc", "SVC_TOKEN"))
                .contains("alpha-secret")
        );
    }

    #[test]
    fn entries_naming_the_servers_own_keys_are_refused() {
        let app = keel_config::KeelConfig::from_toml_str(
            "[providers.corp]\nkind = \"openai\"\napi_key_env = \"CORP_LLM_KEY\"\n",
        )
        .unwrap();
        let entry = |var: &str| keel_config::CredentialRef {
            env: Some(var.into()),
            ..Default::default()
        };
        let mut server = ServerConfig::default();
        server.tenants.insert(
            "alpha".into(),
            keel_config::TenantConfig {
                credentials: BTreeMap::from([
                    ("A".into(), entry("OPENAI_API_KEY")),
                    ("B".into(), entry("ANTHROPIC_API_KEY")),
                    ("C".into(), entry("CORP_LLM_KEY")),
                    ("D".into(), entry("KEEL_STORE")),
                    ("E".into(), entry("ALPHA_OWN")),
                ]),
                ..Default::default()
            },
        );
        let problems = problems(&server, &app, &[], &|_| None);
        assert_eq!(problems.len(), 4, "{problems:#?}");
        assert!(
            problems[0].contains("the API key of model provider `openai`"),
            "{}",
            problems[0]
        );
        assert!(problems[2].contains("`corp`"), "{}", problems[2]);
    }
}
