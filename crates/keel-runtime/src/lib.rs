//! The async driver of Keel runs: `Agent`, `Runner`, the tool executor, approvals, user input and event fan-out.
