#!/usr/bin/env python3
"""Writes tests/fixtures/ops/rope_tables.json: RoPE inverse frequencies and attention scales as
Hugging Face transformers computes them (its own rope initialisation functions), for the scaling
schemes that ops::make_rope_table implements. Run by hand with a Python that has torch and
transformers (e.g. /work/refvenv/bin/python); commit the small JSON it writes.

    python tools/reference/make_rope_fixtures.py [--out tests/fixtures/ops/rope_tables.json]
"""
import argparse
import json
import pathlib

import torch
import transformers
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

# name, head_dim, rope_parameters (HF field names)
CASES = [
    ("default_qwen2", 64, {"rope_type": "default", "rope_theta": 1000000.0}),
    ("linear_x4", 128, {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0}),
    ("llama3_8b", 128, {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                        "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
    ("llama3_3b_factor32", 64, {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "low_freq_factor": 1.0,
                                "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
    ("llama3_odd", 48, {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 2.5, "low_freq_factor": 2.0,
                        "high_freq_factor": 8.0, "original_max_position_embeddings": 512}),
    ("yarn_qwen_x4", 128, {"rope_type": "yarn", "rope_theta": 1000000.0, "factor": 4.0,
                           "original_max_position_embeddings": 32768}),
    ("yarn_betas", 64, {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 8.0, "beta_fast": 16.0, "beta_slow": 2.0,
                        "original_max_position_embeddings": 4096}),
    ("yarn_attention_factor", 64, {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 2.0,
                                   "attention_factor": 1.25, "original_max_position_embeddings": 2048}),
    ("yarn_no_truncate", 128, {"rope_type": "yarn", "rope_theta": 500000.0, "factor": 16.0, "truncate": False,
                               "original_max_position_embeddings": 8192}),
]


# Positions at which cos/sin are recorded (HF's f32 angle = position * inv_freq, then cos/sin).
POSITIONS = [0, 1, 4095, 131071]


def compute(head_dim, params):
    num_heads = 4
    config = LlamaConfig(hidden_size=head_dim * num_heads, num_attention_heads=num_heads, head_dim=head_dim,
                         max_position_embeddings=131072, rope_parameters=dict(params))
    if params["rope_type"] == "default":
        inv_freq, attention_scale = LlamaRotaryEmbedding.compute_default_rope_parameters(config)
    else:
        inv_freq, attention_scale = ROPE_INIT_FUNCTIONS[params["rope_type"]](config, "cpu")
    rotary = LlamaRotaryEmbedding(config)
    x = torch.zeros(1, len(POSITIONS), head_dim, dtype=torch.float32)
    cos, sin = rotary(x, torch.tensor([POSITIONS], dtype=torch.int64))
    half = head_dim // 2
    return (f32_list(inv_freq), float(attention_scale),
            [f32_list(row) for row in cos[0, :, :half]], [f32_list(row) for row in sin[0, :, :half]])


def f32_list(t):
    # 9 significant digits round-trip an f32 exactly.
    return [float(f"{v:.9g}") for v in t.to(torch.float32).tolist()]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=str(pathlib.Path(__file__).resolve().parents[2] /
                                             "tests/fixtures/ops/rope_tables.json"))
    args = parser.parse_args()
    cases = []
    for name, head_dim, params in CASES:
        inv_freq, attention_scale, cos, sin = compute(head_dim, params)
        cases.append({"name": name, "rotary_dim": head_dim, "rope_parameters": params,
                      "inv_freq": inv_freq, "attention_scale": attention_scale,
                      "positions": POSITIONS, "cos": cos, "sin": sin})
    out = {"generator": "tools/reference/make_rope_fixtures.py",
           "transformers": transformers.__version__, "torch": torch.__version__, "cases": cases}
    # One case per line keeps the file small and diffable.
    text = json.dumps({k: v for k, v in out.items() if k != "cases"})[:-1] + ', "cases": [\n'
    text += ",\n".join(json.dumps(c) for c in cases) + "\n]}\n"
    pathlib.Path(args.out).write_text(text)
    print(f"wrote {len(cases)} cases to {args.out}")


if __name__ == "__main__":
    main()
