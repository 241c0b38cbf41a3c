//! Test doubles for Keel: a [`ScriptedModel`](scripted::ScriptedModel) that replays
//! scripted responses and records every request, and a wire-protocol mock LLM server
//! ([`mock_llm`]) with fault injection, so agents are tested without a real model; and
//! headless Chromium over WebDriver ([`browser`]) for tests of pages Keel writes or serves.
//!
//! Nothing here may reach the network beyond 127.0.0.1.

pub mod browser;
pub mod mock_llm;
pub mod scripted;

pub use scripted::{RecordedRequest, ScriptStep, ScriptedModel};
