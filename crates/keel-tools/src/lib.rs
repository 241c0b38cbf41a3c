//! Keel's built-in tools: the reference tools (ping_pong, calculator, delay, failure_injection) and declarative HTTP tools.
