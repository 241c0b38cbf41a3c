//! Model adapters speaking real wire protocols: Anthropic Messages, OpenAI Chat Completions, OpenAI Responses, OpenRouter and Ollama.
