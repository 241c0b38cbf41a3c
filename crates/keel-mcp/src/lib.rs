//! Model Context Protocol for Keel: tools from MCP servers (stdio, Streamable HTTP) and Keel's tools served over MCP.
