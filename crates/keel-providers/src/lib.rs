//! Model adapters.
