#!/usr/bin/env python3
"""Hugging Face transformers `generate` on a random-weight model of a real shape, as the peer that
`tachyon bench` is compared with on the same GPU: bf16 weights, a static KV cache, greedy decoding,
random prompt ids, EOS ignored (min_new_tokens = max_new_tokens).

    python3 bench/hf_generate.py --preset llama3-8b --batch 1 --prompt-len 128 --output-len 256 --json out.json

Decode tokens/s is measured as (time of prompt + N tokens - time of prompt + 1 token) / (N - 1), each
from its own generate call after a warm-up, so prefill is not counted in it. With --compile the
forward runs under torch.compile (mode reduce-overhead), as transformers documents for static caches.
Prints one summary line; --json writes every figure.
"""
import argparse
import json
import sys
import time

PRESETS = {
    # hidden, intermediate, layers, heads, kv heads, vocab, rope theta (synthetic presets of tachyon)
    "llama3-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                      num_key_value_heads=8, vocab_size=128256, rope_theta=500000.0, max_position_embeddings=8192),
    "llama3.2-1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                        num_key_value_heads=8, vocab_size=128256, rope_theta=500000.0, max_position_embeddings=8192,
                        head_dim=64, tie_word_embeddings=True),
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="llama3-8b", choices=sorted(PRESETS))
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--json")
    args = ap.parse_args()

    import torch
    import transformers
    from transformers import LlamaConfig, LlamaForCausalLM

    if not torch.cuda.is_available():
        sys.exit("hf_generate: no CUDA device")
    torch.manual_seed(0)
    config = LlamaConfig(**PRESETS[args.preset], rms_norm_eps=1e-5, torch_dtype="bfloat16")
    with torch.device("cuda"):
        model = LlamaForCausalLM(config).to(torch.bfloat16).eval()
    if args.compile:
        model.forward = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)
    prompt = torch.randint(10, config.vocab_size - 10, (args.batch, args.prompt_len), device="cuda")
    mask = torch.ones_like(prompt)

    def run(new_tokens):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(input_ids=prompt, attention_mask=mask, max_new_tokens=new_tokens,
                                 min_new_tokens=new_tokens, do_sample=False, cache_implementation="static",
                                 pad_token_id=0)
        torch.cuda.synchronize()
        assert out.shape[1] == args.prompt_len + new_tokens, out.shape
        return time.perf_counter() - t0

    run(args.output_len)  # warm-up (and compilation)
    run(1)
    first = min(run(1) for _ in range(args.iters))
    full = min(run(args.output_len) for _ in range(args.iters))
    tpot = (full - first) / (args.output_len - 1)
    result = {
        "bench": "hf_generate",
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(0),
        "preset": args.preset,
        "batch": args.batch,
        "prompt_len": args.prompt_len,
        "output_len": args.output_len,
        "compile": args.compile,
        "ttft_ms": first * 1e3,
        "tpot_ms": tpot * 1e3,
        "decode_tokens_per_s": args.batch / tpot,
        "e2e_ms": full * 1e3,
    }
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    print(f"hf generate {args.preset} batch {args.batch}{' compiled' if args.compile else ''}: "
          f"TTFT {first * 1e3:.1f} ms | TPOT {tpot * 1e3:.2f} ms | {args.batch / tpot:.1f} decode tok/s")


if __name__ == "__main__":
    main()
