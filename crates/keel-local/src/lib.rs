//! The embedded local model: llama.cpp through llama-cpp-2 with grammar-constrained tool calls.
