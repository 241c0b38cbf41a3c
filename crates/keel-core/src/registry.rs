//! The tool registry: the catalog of tools an agent may call, checked at registration.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::tool::{DynTool, Tool, ToolDefinition, ToolSpec, TypedTool};

/// Why a tool was refused at registration. The message names the tool and every rule it
/// breaks.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot register tool `{tool}`: {}", problems.join("; "))]
pub struct RegistryError {
    /// The tool's name as given.
    pub tool: String,
    /// One line per broken rule.
    pub problems: Vec<String>,
}

/// Tools by name, in a deterministic (sorted) order.
#[derive(Clone, Default)]
pub struct ToolRegistry {
    tools: BTreeMap<String, Arc<dyn DynTool>>,
}

impl std::fmt::Debug for ToolRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.tools.keys()).finish()
    }
}

impl ToolRegistry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers a tool, refusing duplicates and contract violations (name rule, empty
    /// usage guidance, invalid schemas).
    pub fn register(&mut self, tool: Arc<dyn DynTool>) -> Result<(), RegistryError> {
        let spec = tool.spec();
        let mut problems = spec.contract_violations();
        if self.tools.contains_key(&spec.name) {
            problems.push(format!(
                "tool `{}`: a tool with this name is already registered; names must be unique",
                spec.name
            ));
        }
        if !problems.is_empty() {
            return Err(RegistryError {
                tool: spec.name.clone(),
                problems,
            });
        }
        self.tools.insert(spec.name.clone(), tool);
        Ok(())
    }

    /// Registers a typed tool.
    pub fn register_typed<T: Tool>(&mut self, tool: T) -> Result<(), RegistryError> {
        self.register(Arc::new(TypedTool::new(tool)))
    }

    /// Builder-style [`register`](Self::register).
    pub fn with(mut self, tool: Arc<dyn DynTool>) -> Result<Self, RegistryError> {
        self.register(tool)?;
        Ok(self)
    }

    /// The tool with this name.
    pub fn get(&self, name: &str) -> Option<&Arc<dyn DynTool>> {
        self.tools.get(name)
    }

    /// All specs, sorted by name.
    pub fn specs(&self) -> impl Iterator<Item = &ToolSpec> {
        self.tools.values().map(|tool| tool.spec())
    }

    /// All tool names, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tools.keys().map(String::as_str)
    }

    /// Provider-facing definitions, sorted by name.
    pub fn definitions(&self) -> Vec<ToolDefinition> {
        self.specs().map(ToolSpec::definition).collect()
    }

    /// Number of tools.
    pub fn len(&self) -> usize {
        self.tools.len()
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.tools.is_empty()
    }

    /// A registry with only the named tools. Unknown names are returned as the error.
    pub fn subset<'n>(
        &self,
        names: impl IntoIterator<Item = &'n str>,
    ) -> Result<ToolRegistry, Vec<String>> {
        let mut out = ToolRegistry::new();
        let mut unknown = Vec::new();
        for name in names {
            match self.tools.get(name) {
                Some(tool) => {
                    out.tools.insert(name.to_string(), Arc::clone(tool));
                }
                None => unknown.push(name.to_string()),
            }
        }
        if unknown.is_empty() {
            Ok(out)
        } else {
            Err(unknown)
        }
    }

    /// Renders every tool's usage guidance as the "Tools" section of a system prompt, in
    /// name order, so the prompt is deterministic.
    pub fn render_guidance(&self) -> String {
        let mut out = String::from("# Tools\n");
        for spec in self.specs() {
            out.push_str(&format!(
                "\n## {} (v{})\n{}\n",
                spec.name, spec.version, spec.description
            ));
            out.push('\n');
            out.push_str(spec.usage.trim());
            out.push('\n');
        }
        out
    }
}
