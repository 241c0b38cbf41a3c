//! A wire-protocol mock LLM server (Anthropic, OpenAI Chat, OpenAI Responses, Ollama) with scripted turns and fault injection.
