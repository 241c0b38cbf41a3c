//! Credentials of declarative HTTP tools (`auth`): the names of the variables holding
//! secrets, never the secrets, resolved at each call — through the call's credential
//! source first ([`ToolContext::lookup_credential`]; in `keel serve`, the tenant's
//! `[server.tenants.<tenant>.credentials]`), else from the environment. When the source
//! decides the call's credentials and has none for the tool, the call fails with
//! `unauthorized` naming the setting to add, and the environment is not read: a server's
//! own variables never reach a tenant's call.
//!
//! ```toml
//! auth = { bearer_env = "CRM_TOKEN" }                 # Authorization: Bearer <secret>
//! auth = { headers = { "X-Api-Key" = "CRM_KEY" } }    # X-Api-Key: <secret>
//! ```

use std::collections::BTreeMap;
use std::sync::Arc;

use keel_core::tool::CredentialLookup;
use keel_core::{ToolContext, ToolError, ToolErrorCode};
use reqwest::header::{AUTHORIZATION, HeaderMap, HeaderName, HeaderValue};
use serde::{Deserialize, Serialize};
use serde_json::json;

/// An environment lookup, read at each call.
pub type CallEnv = Arc<dyn Fn(&str) -> Option<String> + Send + Sync>;

/// The process environment.
pub fn process_env() -> CallEnv {
    Arc::new(|name: &str| std::env::var(name).ok())
}

/// `auth`: credentials by the names of the variables holding them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HttpAuth {
    /// Sends `Authorization: Bearer <secret>`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bearer_env: Option<String>,
    /// Sends each header with its variable's secret.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
}

impl HttpAuth {
    /// Whether no credential is declared.
    pub fn is_empty(&self) -> bool {
        self.bearer_env.is_none() && self.headers.is_empty()
    }

    /// The credential names (variables), in declaration order.
    pub fn credential_names(&self) -> Vec<String> {
        self.bearer_env
            .iter()
            .chain(self.headers.values())
            .cloned()
            .collect()
    }
}

/// One credential header of a tool.
#[derive(Debug, Clone)]
struct Entry {
    header: HeaderName,
    /// The credential name (variable).
    var: String,
    /// `Bearer ` before the secret.
    bearer: bool,
    /// Where it is declared (`auth.bearer_env`, `auth.headers.X`).
    field: String,
}

/// A tool's compiled `auth`.
#[derive(Debug, Clone, Default)]
pub(super) struct AuthHeaders {
    entries: Vec<Entry>,
}

/// The headers and secret values of one call.
pub(super) struct Resolved {
    pub headers: HeaderMap,
    pub secrets: Vec<String>,
}

fn valid_env_name(name: &str) -> bool {
    name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

impl AuthHeaders {
    /// Checks `auth` against the tool's fixed `headers` (a header cannot be both); each
    /// problem names the field and the fix.
    pub fn compile(
        auth: &HttpAuth,
        fixed: &BTreeMap<String, String>,
        problems: &mut Vec<String>,
    ) -> Self {
        let fixed_has = |name: &str| fixed.keys().any(|k| k.eq_ignore_ascii_case(name));
        let mut entries = Vec::new();
        if let Some(var) = &auth.bearer_env {
            if !valid_env_name(var) {
                problems.push(
                    "auth.bearer_env: not a variable name; name the variable holding the \
                     token (e.g. \"CRM_TOKEN\"), never the token itself"
                        .into(),
                );
            } else if fixed_has("authorization") {
                problems.push(
                    "auth.bearer_env: `headers` already sets Authorization; keep one of them"
                        .into(),
                );
            } else {
                entries.push(Entry {
                    header: AUTHORIZATION,
                    var: var.clone(),
                    bearer: true,
                    field: "auth.bearer_env".into(),
                });
            }
        }
        for (name, var) in &auth.headers {
            let field = format!("auth.headers.{name}");
            let Ok(header) = HeaderName::from_bytes(name.as_bytes()) else {
                problems.push(format!(
                    "{field}: `{name}` is not a valid header name (letters, digits and `-`)"
                ));
                continue;
            };
            if !valid_env_name(var) {
                problems.push(format!(
                    "{field}: not a variable name; name the variable holding the value, \
                     never the value itself"
                ));
            } else if fixed_has(name) || (header == AUTHORIZATION && auth.bearer_env.is_some()) {
                problems.push(format!(
                    "{field}: the header is also set elsewhere (`headers` or \
                     `auth.bearer_env`); keep one"
                ));
            } else {
                entries.push(Entry {
                    header,
                    var: var.clone(),
                    bearer: false,
                    field,
                });
            }
        }
        Self { entries }
    }

    /// Whether the tool declares no credential.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The call's credential headers (values marked sensitive) and the secrets, or an
    /// `unauthorized` error naming the credential and what to configure. Nothing is sent
    /// when this fails.
    pub fn resolve(
        &self,
        tool: &str,
        ctx: &ToolContext,
        env: &CallEnv,
    ) -> Result<Resolved, ToolError> {
        let mut headers = HeaderMap::new();
        let mut secrets = Vec::new();
        for entry in &self.entries {
            let Entry {
                header,
                var,
                bearer,
                field,
            } = entry;
            let failure = |why: String| {
                ToolError::new(
                    ToolErrorCode::Unauthorized,
                    format!("`{tool}` needs the credential `{var}` ({field}): {why}"),
                )
                .with_details(json!({"credential": var, "field": field}))
            };
            let secret = match ctx.lookup_credential(tool, var) {
                CredentialLookup::Found(secret) => secret,
                CredentialLookup::Missing { fix } => return Err(failure(fix)),
                CredentialLookup::Unmanaged => {
                    env(var).filter(|v| !v.is_empty()).ok_or_else(|| {
                        failure(format!(
                            "environment variable `{var}` is not set; export it or add it to .env"
                        ))
                    })?
                }
            };
            let text = if *bearer {
                format!("Bearer {secret}")
            } else {
                secret.clone()
            };
            let mut value = HeaderValue::from_str(&text).map_err(|_| {
                failure("its value has characters a header cannot carry (e.g. a newline)".into())
            })?;
            value.set_sensitive(true);
            headers.insert(header.clone(), value);
            secrets.push(secret);
            if *bearer {
                secrets.push(text);
            }
        }
        Ok(Resolved { headers, secrets })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use keel_core::CancellationToken;
    use keel_core::tool::{CredentialSource, StaticCredentials};

    fn compiled(auth: &HttpAuth) -> AuthHeaders {
        let mut problems = Vec::new();
        let compiled = AuthHeaders::compile(auth, &BTreeMap::new(), &mut problems);
        assert!(problems.is_empty(), "{problems:?}");
        compiled
    }

    fn ctx(source: Arc<dyn CredentialSource>) -> ToolContext {
        let mut ctx = ToolContext::new("t", "r", "c", CancellationToken::new());
        ctx.credentials = source;
        ctx
    }

    /// Answers `Missing` for everything (a server's tenant without entries).
    struct Strict;
    impl CredentialSource for Strict {
        fn credential(&self, _: &str, _: &str) -> Option<String> {
            None
        }
        fn lookup(&self, _: &str, key: &str) -> CredentialLookup {
            CredentialLookup::Missing {
                fix: format!("add `{key}` for this tenant"),
            }
        }
    }

    #[test]
    fn the_source_wins_over_the_environment_and_a_strict_source_never_falls_back() {
        let auth = HttpAuth {
            bearer_env: Some("SVC_TOKEN".into()),
            headers: BTreeMap::from([("X-Api-Key".into(), "SVC_KEY".into())]),
        };
        let auth = compiled(&auth);
        let env: CallEnv = Arc::new(|name: &str| Some(format!("env-{name}")));
        // No source: the environment, at the call.
        let plain = auth
            .resolve("svc", &ctx(Arc::new(keel_core::tool::NoCredentials)), &env)
            .unwrap();
        assert_eq!(plain.headers["authorization"], "Bearer env-SVC_TOKEN");
        assert!(plain.headers["authorization"].is_sensitive());
        assert_eq!(plain.headers["x-api-key"], "env-SVC_KEY");
        // A source with the credentials: its values.
        let source = StaticCredentials(BTreeMap::from([
            (("svc".into(), "SVC_TOKEN".into()), "tenant-token".into()),
            (("svc".into(), "SVC_KEY".into()), "tenant-key".into()),
        ]));
        let tenant = auth.resolve("svc", &ctx(Arc::new(source)), &env).unwrap();
        assert_eq!(tenant.headers["authorization"], "Bearer tenant-token");
        assert_eq!(tenant.headers["x-api-key"], "tenant-key");
        assert!(tenant.secrets.contains(&"tenant-token".to_string()));
        // A strict source without them: unauthorized, naming the fix; no env value used.
        let error = auth
            .resolve("svc", &ctx(Arc::new(Strict)), &env)
            .err()
            .unwrap();
        assert_eq!(error.code, ToolErrorCode::Unauthorized);
        assert!(
            error.message.contains("add `SVC_TOKEN` for this tenant"),
            "{}",
            error.message
        );
        assert!(!error.message.contains("env-"));
        // An unset variable without a source: unauthorized naming the variable.
        let none: CallEnv = Arc::new(|_: &str| None);
        let error = auth
            .resolve("svc", &ctx(Arc::new(keel_core::tool::NoCredentials)), &none)
            .err()
            .unwrap();
        assert_eq!(error.code, ToolErrorCode::Unauthorized);
        assert!(
            error.message.contains("`SVC_TOKEN` is not set"),
            "{}",
            error.message
        );
    }

    #[test]
    fn pasted_secrets_and_conflicts_are_refused_without_echoing_them() {
        let auth = HttpAuth {
            bearer_env: Some("sk-live 1234".into()),
            headers: BTreeMap::from([
                ("X-Api-Key".into(), "KEY".into()),
                ("bad header".into(), "KEY".into()),
            ]),
        };
        let fixed = BTreeMap::from([("x-api-key".to_string(), "fixed".to_string())]);
        let mut problems = Vec::new();
        AuthHeaders::compile(&auth, &fixed, &mut problems);
        assert_eq!(problems.len(), 3, "{problems:?}");
        assert!(problems.iter().all(|p| !p.contains("sk-live")));
    }
}
