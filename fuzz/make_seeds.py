#!/usr/bin/env python3
"""Writes the seed corpora of fuzz/corpus/<target>/: copies of the project's small real files and
small hand-made inputs for the formats that have none here (llama2.c, KV wire messages, HTTP
requests, API bodies). Run from the repository root; the output is committed, so this only needs
running again when the seeds should change. Files of ../shared are never copied: scripts/fuzz
reads them in place."""
import json
import os
import shutil
import struct

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS = os.path.join(ROOT, "fuzz", "corpus")


def out(target, name, data):
    d = os.path.join(CORPUS, target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def copy(target, name, src):
    out(target, name, open(os.path.join(ROOT, src), "rb").read())


def crc32c(data, crc=0):
    crc ^= 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


# --- binary formats -------------------------------------------------------------------------
copy("safetensors", "reference.safetensors", "tests/fixtures/io/reference.safetensors")
copy("gguf", "reference.gguf", "tests/fixtures/io/reference.gguf")


def llama2c(dim=8, hidden=16, layers=1, heads=2, kv_heads=2, vocab=4, seq=4, shared=True):
    head = dim // heads
    kv_dim = kv_heads * head
    floats = (vocab * dim + layers * dim + layers * dim * dim + 2 * layers * dim * kv_dim + layers * dim * dim +
              layers * dim + 3 * layers * hidden * dim + dim + seq * head)
    if not shared:
        floats += vocab * dim
    header = struct.pack("<7i", dim, hidden, layers, heads, kv_heads, vocab if shared else -vocab, seq)
    return header + b"".join(struct.pack("<f", ((i * 37) % 17 - 8) / 16.0) for i in range(floats))


out("llama2c", "legacy_shared.bin", llama2c())
out("llama2c", "legacy_unshared_gqa.bin", llama2c(heads=2, kv_heads=1, shared=False))


def kv_transfer(layers=2, kv_heads=1, head_dim=4, num_tokens=3, transfer_id=7):
    num_computed = num_tokens - 1
    layer_data = []
    for l in range(layers):
        layer_data.append(b"".join(struct.pack("<f", float(l + i)) for i in range(2 * num_computed * kv_heads * head_dim)))
    body = struct.pack("<9I", layers, kv_heads, head_dim, 1, 32, 16, num_tokens, 2, num_computed)
    body += struct.pack("<3Q", transfer_id, 1234, 5)
    body += b"".join(struct.pack("<Q", len(d)) for d in layer_data)
    body += b"".join(struct.pack("<I", crc32c(d)) for d in layer_data)
    body += b"".join(struct.pack("<i", t) for t in range(1, num_tokens + 1))
    size = 12 + len(body) + 4
    header = struct.pack("<IHHI", 0x48564B54, 1, 0, size) + body
    header += struct.pack("<I", crc32c(header))
    return [header] + layer_data


def framed(messages):
    return b"".join(struct.pack("<I", len(m)) + m for m in messages)


out("kv_wire", "transfer_f32.bin", framed(kv_transfer()))
out("kv_wire", "transfer_one_layer.bin", framed(kv_transfer(layers=1, num_tokens=2)))
region = struct.pack("<IHHQQQI", 0x44564B54, 1, 0, 7, 0, 64, 8) + b"handle!!"
region += struct.pack("<I", crc32c(region))
out("kv_wire", "region.bin", framed([region]))
ack = struct.pack("<IHHQII", 0x41564B54, 1, 0, 7, 3, 5) + b"nope!"
ack += struct.pack("<I", crc32c(ack))
out("kv_wire", "ack.bin", framed([ack]))

# --- JSON files -----------------------------------------------------------------------------
for name in ["llama", "llama-tied", "llama3-scaled", "mistral", "qwen2", "qwen3"]:
    copy("model_config", f"{name}.json", f"tests/fixtures/models/{name}/config.json")
copy("model_config", "tachyon-demo.json", "models/tachyon-demo/config.json")
awq = json.load(open(os.path.join(ROOT, "tests/fixtures/models/llama/config.json")))
awq["quantization_config"] = {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True,
                              "version": "gemm"}
out("model_config", "llama-awq.json", json.dumps(awq))

copy("tokenizer_json", "tiny_metaspace.json", "tests/fixtures/tokenizer/tiny_metaspace/tokenizer.json")
out("tokenizer_json", "nested_bytelevel.json", json.dumps({
    "version": "1.0",
    "added_tokens": [{"id": 5, "content": "<|end|>", "special": True, "lstrip": False, "rstrip": True,
                      "normalized": False, "single_word": False}],
    "normalizer": {"type": "Sequence", "normalizers": [{"type": "NFC"}, {"type": "Replace", "pattern": {"String": " "},
                                                                                    "content": " "}]},
    "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": "\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+|\\s+"}, "behavior": "Isolated",
         "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]},
    "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False},
    "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True},
    "model": {"type": "BPE", "dropout": None, "unk_token": None, "byte_fallback": False, "ignore_merges": False,
              "vocab": {"H": 0, "e": 1, "l": 2, "o": 3, "He": 4, "ll": 6, "Hell": 7, "Hello": 8, "Ġ": 9, "w": 10},
              "merges": ["H e", "l l", "He ll", "Hell o"]},
}))

copy("tokenizer_config", "tiny_bytelevel.json", "tests/fixtures/tokenizer/tiny_bytelevel/tokenizer_config.json")
copy("tokenizer_config", "tachyon-demo.json", "models/tachyon-demo/tokenizer_config.json")
out("tokenizer_config", "added_tokens.json", json.dumps({
    "add_bos_token": True, "add_eos_token": False, "bos_token": "<s>",
    "eos_token": {"content": "</s>", "special": True},
    "added_tokens_decoder": {"300": {"content": "<|im_start|>", "special": True, "lstrip": False, "rstrip": False},
                             "301": {"content": "<|im_end|>", "special": True}, "302": {"content": "<tool>",
                                                                                       "special": False}},
    "chat_template": [{"name": "default", "template": "{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}"},
                      {"name": "tool_use", "template": "{{ tools | tojson }}"}],
}))

# --- chat templates: template, NUL, messages ------------------------------------------------
conversation = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello.", "tool_calls": [
                    {"type": "function", "function": {"name": "get", "arguments": {"city": "Paris"}}}]},
                {"role": "tool", "content": "{\"t\": 20}"}, {"role": "user", "content": "Thanks"}]
for name in ["tachyon-demo", "llama3-8b-instruct", "google-gemma-2-2b-it", "microsoft-Phi-3.5-mini-instruct",
             "Qwen-Qwen2.5-7B-Instruct", "mistralai-Mistral-Nemo-Instruct-2407"]:
    text = open(os.path.join(ROOT, f"tests/fixtures/chat_templates/templates/{name}.jinja"), "rb").read()
    out("chat_template", f"{name}.bin", text + b"\0" + json.dumps(conversation).encode())
out("chat_template", "features.bin",
    "{% macro m(x, y=2) %}{{ x ~ y }}{% endmacro %}{% set ns = namespace(n=0) %}"
    "{% for msg in messages if msg.role != 'tool' %}{% set ns.n = ns.n + 1 %}{{ m(loop.index) }}"
    "{{ msg.content | trim | upper | replace('A', 'b') }}{{ msg['content'][1:3] }}"
    "{% if msg.tool_calls is defined %}{{ msg.tool_calls | tojson(indent=2) }}{% endif %}"
    "{% endfor %}{{ ns.n }}{{ [1, 2, 3] | join(',') }}{{ {'a': 1}.items() | list | length }}"
    "{{ 'x' * 3 }}{{ range(3) | sum }}{% raw %}{{ raw }}{% endraw %}{{ raise_exception('no') if false }}\0"
    + json.dumps(conversation))

# --- OpenAI request bodies ------------------------------------------------------------------
bodies = {
    "completion.json": {"model": "fuzz", "prompt": "Once upon a time", "max_tokens": 8, "temperature": 0.7,
                        "top_p": 0.9, "stop": ["\n", "end"], "seed": 3, "logprobs": 2},
    "completion_ids.json": {"prompt": [[1, 2, 3], [4, 5]], "n": 2, "stream": True,
                            "stream_options": {"include_usage": True}, "max_tokens": 4},
    "chat.json": {"model": "fuzz", "messages": conversation[:2], "max_tokens": 16, "presence_penalty": 0.5,
                  "frequency_penalty": 0.1, "logprobs": True, "top_logprobs": 3},
    "chat_parts.json": {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"},
                                                                 {"type": "text", "text": "b"}]}],
                        "stream": True, "stop": "x", "max_completion_tokens": 5, "logit_bias": {"3": -100}},
}
for name, body in bodies.items():
    out("openai_request", name, json.dumps(body))

# --- HTTP requests --------------------------------------------------------------------------
chat = json.dumps(bodies["chat.json"])
out("http_request", "health.txt", "GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
out("http_request", "chat.txt", f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                                f"Content-Length: {len(chat)}\r\n\r\n{chat}")
out("http_request", "chunked.txt", "POST /v1/completions?x=1 HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
                                   "Expect: 100-continue\r\n\r\n5\r\n{\"pro\r\n3;ext=1\r\nmpt\r\n0\r\n\r\n")
internal_body = "event: tachyon\ndata: {\"role\":\"prefill\",\"kv_blocks_total\":10}\n\ndata: [DONE]\r\n\r\n"
out("http_request", "internal.txt",
    "POST /internal/v1/prefill/chat/completions HTTP/1.0\r\nX-Tachyon-Transfer-Id: 18446744073709551615\r\n"
    "X-Tachyon-Min-Prompt-Tokens: 12\r\nX-Tachyon-Response-Id: chatcmpl-abc_1\r\nX-Tachyon-Created: 1700000000\r\n"
    f"X-Tachyon-Kv-Address: [::1]:9000\r\nConnection: keep-alive\r\nContent-Length: {len(internal_body)}\r\n\r\n"
    + internal_body)
load = json.dumps({"role": "decode", "kv_blocks_total": 100, "kv_blocks_free": 50, "num_running": 1,
                   "num_waiting": 0, "pending_adoptions": 0, "transfers_in_flight": 0, "kv_port": 9001})
out("http_request", "load.txt", f"GET http://127.0.0.1:8000/ HTTP/1.1\r\nContent-Length: {len(load)}\r\n\r\n{load}")
