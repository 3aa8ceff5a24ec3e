#!/usr/bin/env python3
"""Writes a random-weight Llama checkpoint (config.json + model.safetensors, bf16) that borrows a
real model's tokenizer, for benchmarks that need a realistic per-token cost and real text: the
server's overhead (`tachyon serve` needs a tokenizer, which `synthetic:` models do not have).

  python3 bench/make_random_llama.py --tokenizer-from models/tachyon-demo --out /tmp/rand07b \
      --hidden 2048 --intermediate 5632 --layers 16 --heads 16 --kv-heads 4 --head-dim 128

The tokenizer files and the vocabulary size come from --tokenizer-from; weights are N(0, 0.02)
from a fixed seed, norms 1. Needs numpy only (the safetensors file is written directly).
"""
import argparse
import json
import os
import shutil
import struct

import numpy as np


def bf16_bits(a: np.ndarray) -> np.ndarray:
    """f32 -> bf16 bit patterns, rounded to nearest even (the values here are finite)."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def save_bf16(tensors: dict, path: str) -> None:
    """A safetensors file of BF16 tensors: an 8-byte header size, the JSON header, the data."""
    header, offset, blobs = {}, 0, []
    for name, value in tensors.items():
        data = bf16_bits(value).tobytes()
        header[name] = {"dtype": "BF16", "shape": list(value.shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for b in blobs:
            f.write(b)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokenizer-from", required=True, help="a model directory with config.json and tokenizer files")
    ap.add_argument("--out", required=True)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--intermediate", type=int, default=5632)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    src = args.tokenizer_from
    cfg = json.load(open(os.path.join(src, "config.json")))
    cfg.update(hidden_size=args.hidden, intermediate_size=args.intermediate, num_hidden_layers=args.layers,
               num_attention_heads=args.heads, num_key_value_heads=args.kv_heads, head_dim=args.head_dim,
               tie_word_embeddings=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "tokenizer.model"):
        if os.path.exists(os.path.join(src, name)):
            shutil.copy(os.path.join(src, name), args.out)

    rng = np.random.default_rng(args.seed)
    randn = lambda *shape: rng.standard_normal(shape, dtype=np.float32) * np.float32(0.02)
    h, inter, vocab = args.hidden, args.intermediate, cfg["vocab_size"]
    q, kv = args.heads * args.head_dim, args.kv_heads * args.head_dim
    tensors = {"model.embed_tokens.weight": randn(vocab, h), "model.norm.weight": np.ones(h, np.float32)}
    for i in range(args.layers):
        p = f"model.layers.{i}."
        for name, shape in (("self_attn.q_proj", (q, h)), ("self_attn.k_proj", (kv, h)), ("self_attn.v_proj", (kv, h)),
                            ("self_attn.o_proj", (h, q)), ("mlp.gate_proj", (inter, h)), ("mlp.up_proj", (inter, h)),
                            ("mlp.down_proj", (h, inter))):
            tensors[p + name + ".weight"] = randn(*shape)
        tensors[p + "input_layernorm.weight"] = np.ones(h, np.float32)
        tensors[p + "post_attention_layernorm.weight"] = np.ones(h, np.float32)
    save_bf16(tensors, os.path.join(args.out, "model.safetensors"))
    print(f"{args.out}: {sum(v.size for v in tensors.values()):,} parameters")


if __name__ == "__main__":
    main()
