#!/usr/bin/env python3
"""Writes the committed seed corpus fuzz/corpus/<target>/ (small, deterministic).

Run from anywhere: python3 fuzz/make_seeds.py. Seeds for the decoder targets are realistic
stream bodies in the targets' raw mode (first byte even); the structure-aware targets get
a few pseudo-random byte strings (a fixed seed) for libFuzzer to start from.
"""
import json
import pathlib
import random

ROOT = pathlib.Path(__file__).resolve().parent
CORPUS = ROOT / "corpus"
rng = random.Random(94)


def write(target, name, data):
    path = CORPUS / target
    path.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    (path / name).write_bytes(data)


def sse(events):
    out = ""
    for name, data in events:
        if name:
            out += f"event: {name}\n"
        out += "data: " + (data if isinstance(data, str) else json.dumps(data)) + "\n\n"
    return out


anthropic = sse([
    ("message_start", {"type": "message_start", "message": {"id": "msg_1", "usage": {"input_tokens": 12, "output_tokens": 1, "cache_read_input_tokens": 3}}}),
    ("content_block_start", {"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": "", "signature": ""}}),
    ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "hmm"}}),
    ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {"type": "signature_delta", "signature": "sig"}}),
    ("content_block_stop", {"type": "content_block_stop", "index": 0}),
    ("content_block_start", {"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}}),
    ("content_block_delta", {"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": "Let me check. é"}}),
    ("content_block_stop", {"type": "content_block_stop", "index": 1}),
    ("content_block_start", {"type": "content_block_start", "index": 2, "content_block": {"type": "tool_use", "id": "toolu_1", "name": "calculator", "input": {}}}),
    ("content_block_delta", {"type": "content_block_delta", "index": 2, "delta": {"type": "input_json_delta", "partial_json": "{\"expression\": "}}),
    ("content_block_delta", {"type": "content_block_delta", "index": 2, "delta": {"type": "input_json_delta", "partial_json": "\"6*7\"}"}}),
    ("content_block_stop", {"type": "content_block_stop", "index": 2}),
    ("message_delta", {"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 30}}),
    ("message_stop", {"type": "message_stop"}),
])
anthropic_error = sse([
    ("message_start", {"type": "message_start", "message": {"id": "msg_2"}}),
    ("ping", {"type": "ping"}),
    ("error", {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
])
write("decode_anthropic", "tool_call", b"\x00" + anthropic.encode())
write("decode_anthropic", "tool_call_crlf_split", b"\x2a" + anthropic.replace("\n", "\r\n").encode())
write("decode_anthropic", "error_event", b"\x00" + anthropic_error.encode())
write("decode_anthropic", "truncated", b"\x00" + anthropic[: len(anthropic) // 2].encode())

chat = sse([
    (None, {"id": "chatcmpl-1", "choices": [{"index": 0, "delta": {"role": "assistant", "content": "Hi"}}]}),
    (None, {"id": "chatcmpl-1", "choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "call_1", "type": "function", "function": {"name": "calculator", "arguments": ""}}]}}]}),
    (None, {"id": "chatcmpl-1", "choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{\"expression\":\"6*7\"}"}}]}}]}),
    (None, {"id": "chatcmpl-1", "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}),
    (None, {"id": "chatcmpl-1", "choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 5, "prompt_tokens_details": {"cached_tokens": 2}, "cost": 0.001}}),
    (None, "[DONE]"),
])
write("decode_openai_chat", "tool_call", b"\x00" + chat.encode())
write("decode_openai_chat", "openrouter_comment", b"\x80" + (": OPENROUTER PROCESSING\n\n" + chat).encode())
write("decode_openai_chat", "no_done", b"\x00" + chat.replace("data: [DONE]\n\n", "").encode())
write("decode_openai_chat", "error", b"\x00" + sse([(None, {"error": {"message": "rate limited", "code": 429}})]).encode())
write("decode_openai_chat", "finish_error", b"\x00" + sse([(None, {"choices": [{"index": 0, "delta": {}, "finish_reason": "error"}]})]).encode())

responses = sse([
    ("response.created", {"type": "response.created", "response": {"id": "resp_1"}}),
    ("response.output_item.done", {"type": "response.output_item.done", "output_index": 0, "item": {"type": "reasoning", "id": "rs_1", "summary": []}}),
    ("response.output_text.delta", {"type": "response.output_text.delta", "output_index": 1, "delta": "Checking"}),
    ("response.output_item.added", {"type": "response.output_item.added", "output_index": 2, "item": {"type": "function_call", "call_id": "call_1", "name": "calculator"}}),
    ("response.function_call_arguments.delta", {"type": "response.function_call_arguments.delta", "output_index": 2, "delta": "{\"expression\":\"6*7\"}"}),
    ("response.output_item.done", {"type": "response.output_item.done", "output_index": 2, "item": {"type": "function_call", "call_id": "call_1", "name": "calculator", "arguments": "{\"expression\":\"6*7\"}"}}),
    ("response.completed", {"type": "response.completed", "response": {"id": "resp_1", "usage": {"input_tokens": 20, "output_tokens": 7, "input_tokens_details": {"cached_tokens": 4}}}}),
])
write("decode_responses", "tool_call", b"\x00" + responses.encode())
write("decode_responses", "incomplete", b"\x00" + sse([("response.incomplete", {"type": "response.incomplete", "response": {"incomplete_details": {"reason": "max_output_tokens"}}})]).encode())
write("decode_responses", "failed", b"\x00" + sse([("response.failed", {"type": "response.failed", "response": {"error": {"code": "server_error", "message": "boom"}}})]).encode())

ollama = "\n".join(json.dumps(x) for x in [
    {"model": "m", "message": {"role": "assistant", "content": "Hi"}, "done": False},
    {"model": "m", "message": {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "calculator", "arguments": {"expression": "6*7"}}}]}, "done": False},
    {"model": "m", "message": {"role": "assistant", "content": ""}, "done": True, "done_reason": "stop", "prompt_eval_count": 10, "eval_count": 3},
]) + "\n"
write("decode_ollama", "tool_call", b"\x00" + ollama.encode())
write("decode_ollama", "error", b"\x00" + b'{"error":"model not found"}\n')
write("decode_ollama", "string_arguments", b"\x00" + (json.dumps({"message": {"tool_calls": [{"id": "c1", "function": {"name": "t", "arguments": "{\"a\":1}"}}]}, "done": True, "done_reason": "length"}) + "\n").encode())

# framing: mode byte (bit 0: NDJSON, bit 1: small limit), split seed, body.
write("framing", "sse", b"\x00\x07" + anthropic.encode())
write("framing", "sse_mixed_endings", b"\x00\x13" + b": comment\r\nevent: a\rdata: 1\r\ndata:2\n\nid: 7\ndata\n\n\xc3\xa9data: x")
write("framing", "sse_small_limit", b"\x22\x05" + b"data: 0123456789abcdef\ndata: more\n\ndata: ok\n\n")
write("framing", "ndjson", b"\x01\x03" + ollama.encode())
write("framing", "ndjson_crlf_blank", b"\x01\x11" + b'{"a":1}\r\n\r\n  \n{"b":2}\r{"c"')

# calculator: mode 0 = raw text.
for i, text in enumerate(["2*(3+4)", "-2^2", "1/0", "((((1.5))))+.5-3.", "2^-1074", "1e5", " 7 * ( 8 - 2 ) / 3 "]):
    write("calculator", f"raw_{i}", b"\x00" + text.encode())

# Structure-aware targets: a few pseudo-random starts (the mode byte odd where it matters).
for target, prefix in [("calculator", b"\x01"), ("decode_anthropic", b"\x01"), ("decode_openai_chat", b"\x01"),
                       ("decode_responses", b"\x01"), ("decode_ollama", b"\x01"), ("repair", b""),
                       ("url_template", b""), ("mcp_convert", b"")]:
    for i in range(4):
        write(target, f"random_{i}", prefix + bytes(rng.randrange(256) for _ in range(rng.randrange(16, 200))))

# keel.toml and agent files: the shipped examples and a few small variations.
repo = ROOT.parent
example = (repo / "keel.example.toml").read_text()
write("config", "example", example)
write("config", "small", '[defaults]\nmodel = "anthropic:claude-sonnet-4-5"\n\n[mcp]\n[[mcp.servers]]\nname = "fs"\ncommand = "npx"\nargs = ["-y", "server"]\n')
write("config", "env_refs", '[defaults]\nmodel = "${MODEL:-openai:gpt-4o}"\n[telemetry]\nlevle = "x"\n')
write("config", "syntax_error", '[defaults\nmodel = \n')
agent = (repo / "agents/detective/agent.toml").read_text()
write("agent_file", "detective", agent)
write("agent_file", "small", 'name = "a"\ninstructions = "Do things."\nbuiltin_tools = ["calculator"]\nenv = ["HOST"]\n\n[[tools]]\nname = "get_thing"\ndescription = "Get a thing."\nusage = "get_thing — Usage Guide\\nArguments: id."\nurl = "http://${HOST}/things/{id}"\ninput_schema = { type = "object", properties = { id = { type = "string" } }, required = ["id"] }\n')
write("agent_file", "undeclared_env", 'name = "a"\ninstructions = "x"\n[[tools]]\nname = "t"\ndescription = "d"\nusage = "u"\nurl = "http://h/${SECRET}"\n')
