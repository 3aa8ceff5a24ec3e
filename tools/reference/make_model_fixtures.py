#!/usr/bin/env python3
"""Generate model-conformance fixtures: tiny random-weight Hugging Face models, the same models as
GGUF files, and the logits transformers computes for a fixed prompt plus 16 greedy decode steps.

    /path/to/venv/bin/python tools/reference/make_model_fixtures.py [--out tests/fixtures/models]
                                                                    [--only NAME ...]

Everything runs on CPU in float32 with fixed seeds, one thread and deterministic algorithms, so a
rerun with the same package versions reproduces the files bit for bit. See README.md next to this
file for the file formats and the GGUF conventions.
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import json
import math
import os
import platform
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import safetensors
import safetensors.numpy
import torch
import transformers
from transformers import (AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, MistralConfig,
                          MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config,
                          Qwen3ForCausalLM)

import gguf

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gguf_numpy_forward as npf  # noqa: E402

FORMAT_VERSION = 1
DECODE_STEPS = 16
BOS_ID = 1
EOS_ID = 2
MIN_GREEDY_MARGIN = 2e-3   # top-1 minus top-2 logit at every greedy choice
NOCACHE_TOL = 1e-5         # cached step-by-step vs one full pass, max abs logit difference
GGUF_NUMPY_TOL = 1e-4      # numpy (f64) forward of the F32 GGUF vs HF, max abs logit difference

REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Spec:
    name: str
    model_cls: type
    config: object
    gguf_arch: str
    prompt_len: int
    seed: int
    quant_variants: bool = False
    notes: list[str] = field(default_factory=list)


def common(vocab: int, inter: int, n_kv: int, eps: float, tie: bool) -> dict:
    return dict(vocab_size=vocab, hidden_size=64, intermediate_size=inter, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=n_kv, head_dim=16,
                max_position_embeddings=128, rms_norm_eps=eps, bos_token_id=BOS_ID,
                eos_token_id=EOS_ID, tie_word_embeddings=tie, hidden_act="silu")


def specs() -> list[Spec]:
    out = [
        Spec("llama", LlamaForCausalLM,
             LlamaConfig(**common(256, 96, 2, 1e-5, False),
                         rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
             "llama", 16, 1001, quant_variants=True),
        Spec("llama3-scaled", LlamaForCausalLM,
             LlamaConfig(**common(256, 96, 2, 1e-5, False),
                         rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0,
                                          "factor": 8.0, "low_freq_factor": 1.0,
                                          "high_freq_factor": 4.0,
                                          "original_max_position_embeddings": 64}),
             "llama", 20, 1002,
             notes=["original_max_position_embeddings is 64, not 32: with head_dim 16 and theta "
                    "500000 the per-pair wavelengths are 6.3, 32.5, 167.8, ... so 64 puts one pair "
                    "in each llama3 branch (kept / smoothly interpolated / divided by factor); "
                    "with 32 the interpolated branch would be empty."]),
        Spec("llama-tied", LlamaForCausalLM,
             LlamaConfig(**common(300, 96, 1, 1e-5, True),
                         rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
             "llama", 13, 1003),
        Spec("qwen2", Qwen2ForCausalLM,
             Qwen2Config(**common(256, 96, 2, 1e-6, False),
                         rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
                         use_sliding_window=False),
             "qwen2", 17, 1004),
        Spec("qwen3", Qwen3ForCausalLM,
             Qwen3Config(**{**common(264, 96, 2, 1e-6, False), "head_dim": 32},
                         rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
                         use_sliding_window=False, attention_bias=False),
             "qwen3", 20, 1005),
        Spec("mistral", MistralForCausalLM,
             MistralConfig(**common(256, 96, 2, 1e-5, False),
                           rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                           sliding_window=8),
             "llama", 20, 1006),
    ]
    return out


# ----------------------------------------------------------------------------------------------
# Weights


def init_weights(model: torch.nn.Module, seed: int) -> None:
    """Larger-than-default random weights so logits are far from flat and every architectural
    detail (rope layout, biases, norms) moves them visibly."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):  # input/post-attention/final norms and q/k norms
                std = 0.15 if ("q_norm" in name or "k_norm" in name) else 0.1
                p.copy_(1.0 + std * torch.randn(p.shape, generator=gen))
            elif name.endswith(".bias"):
                p.copy_(0.3 * torch.randn(p.shape, generator=gen))
            elif name.endswith("embed_tokens.weight") or name == "lm_head.weight":
                p.copy_(0.2 * torch.randn(p.shape, generator=gen))
            elif name.endswith(".weight"):
                p.copy_(0.15 * torch.randn(p.shape, generator=gen))
            else:
                raise RuntimeError(f"unexpected parameter {name}")


# ----------------------------------------------------------------------------------------------
# HF reference logits


def hf_load(d: Path, **overrides) -> torch.nn.Module:
    m = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager",
                                             **overrides)
    return m.eval()


@torch.no_grad()
def hf_greedy(model, prompt: list[int]) -> tuple[np.ndarray, list[int], np.ndarray]:
    """Prefill the prompt with a KV cache, then DECODE_STEPS single-token greedy steps."""
    # transformers 5.x renamed the cache argument/output `past_key_values` -> `cache`.
    kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    out = model(input_ids=torch.tensor([prompt]), use_cache=True)
    prompt_logits = out.logits[0].float().numpy().copy()
    past = getattr(out, kw)
    last = out.logits[0, -1]
    ids, rows = [], []
    for _ in range(DECODE_STEPS):
        tok = int(torch.argmax(last))
        ids.append(tok)
        out = model(input_ids=torch.tensor([[tok]]), use_cache=True, **{kw: past})
        past = getattr(out, kw)
        last = out.logits[0, -1]
        rows.append(last.float().numpy().copy())
    layers = getattr(past, "layers", None)
    cache_kind = type(layers[0]).__name__ if layers else type(past).__name__
    return prompt_logits, ids, np.stack(rows), cache_kind


@torch.no_grad()
def hf_full(model, ids: list[int]) -> np.ndarray:
    return model(input_ids=torch.tensor([ids]), use_cache=False).logits[0].float().numpy()


def greedy_margins(prompt_logits: np.ndarray, decode_logits: np.ndarray) -> np.ndarray:
    rows = np.concatenate([prompt_logits[-1:], decode_logits], axis=0)
    top2 = np.sort(rows, axis=-1)[:, -2:]
    return top2[:, 1] - top2[:, 0]


def make_prompt(seed: int, length: int, vocab: int) -> list[int]:
    rng = np.random.default_rng(seed)
    return [BOS_ID] + [int(x) for x in rng.integers(3, vocab, size=length - 1)]


def diff_stats(a: np.ndarray, b: np.ndarray) -> dict:
    d = np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))
    ref = float(np.max(np.abs(b)))
    return {"max_abs": float(d.max()), "max_rel": float(d.max() / ref) if ref else 0.0}


# ----------------------------------------------------------------------------------------------
# GGUF


def permute_for_interleaved_rope(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Reorder the output rows of a q or k projection (weight [n_heads*hd, in] or bias
    [n_heads*hd]) from HF's half-split RoPE layout to interleaved pairs: within each head, new
    row 2*j + r is old row r*hd/2 + j (j < hd/2, r in {0,1}). So the pair rotated by frequency j,
    HF's (j, j + hd/2), lands on adjacent rows (2j, 2j+1)."""
    rows = w.shape[0]
    hd = rows // n_heads
    rest = w.shape[1:]
    return w.reshape(n_heads, 2, hd // 2, *rest).swapaxes(1, 2).reshape(w.shape).copy()


def llama3_rope_freq_factors(head_dim: int, rp: dict) -> np.ndarray:
    """Per-pair divisors of the RoPE frequency for llama3 scaling (the rope_freqs.weight tensor):
    theta_j = pos * base^(-2j/hd) / factors[j]."""
    base = float(rp["rope_theta"])
    factor = float(rp["factor"])
    lo = float(rp.get("low_freq_factor", 1.0))
    hi = float(rp.get("high_freq_factor", 4.0))
    old_ctx = float(rp["original_max_position_embeddings"])
    lo_wavelen = old_ctx / lo
    hi_wavelen = old_ctx / hi
    out = []
    for j in range(head_dim // 2):
        freq = base ** (-(2.0 * j) / head_dim)
        wavelen = 2.0 * math.pi / freq
        if wavelen < hi_wavelen:
            out.append(1.0)
        elif wavelen > lo_wavelen:
            out.append(factor)
        else:
            smooth = (old_ctx / wavelen - lo) / (hi - lo)
            out.append(1.0 / ((1.0 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


HF_TO_GGUF_LAYER = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def gguf_tensors(spec: Spec, hf: dict[str, np.ndarray]) -> list[tuple[str, np.ndarray]]:
    """HF safetensors (name -> f32 array) to GGUF (name, f32 array), in file order."""
    cfg = spec.config
    n_head, n_kv = cfg.num_attention_heads, cfg.num_key_value_heads
    out: list[tuple[str, np.ndarray]] = []
    rp = cfg.rope_parameters
    if rp.get("rope_type") == "llama3":
        out.append(("rope_freqs.weight", llama3_rope_freq_factors(cfg.head_dim, rp)))
    out.append(("token_embd.weight", hf["model.embed_tokens.weight"]))
    for L in range(cfg.num_hidden_layers):
        prefix = f"model.layers.{L}."
        for hf_suffix, gg_suffix in HF_TO_GGUF_LAYER.items():
            key = prefix + hf_suffix
            if key not in hf:
                continue
            w = hf[key]
            if spec.gguf_arch == "llama" and hf_suffix.startswith(("self_attn.q_proj",
                                                                   "self_attn.k_proj")):
                w = permute_for_interleaved_rope(w, n_head if "q_proj" in hf_suffix else n_kv)
            out.append((f"blk.{L}.{gg_suffix}", w))
    out.append(("output_norm.weight", hf["model.norm.weight"]))
    if not cfg.tie_word_embeddings:
        out.append(("output.weight", hf["lm_head.weight"]))
    used = {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"}
    used |= {f"model.layers.{L}.{s}" for L in range(cfg.num_hidden_layers) for s in HF_TO_GGUF_LAYER}
    missing = set(hf) - used
    if missing:
        raise RuntimeError(f"{spec.name}: HF tensors not mapped to GGUF: {sorted(missing)}")
    return out


def write_gguf(path: Path, spec: Spec, tensors: list[tuple[str, np.ndarray]],
               matrix_type: gguf.GGMLQuantizationType) -> None:
    cfg = spec.config
    arch = spec.gguf_arch
    ftype = {gguf.GGMLQuantizationType.F32: gguf.LlamaFileType.ALL_F32,
             gguf.GGMLQuantizationType.F16: gguf.LlamaFileType.MOSTLY_F16,
             gguf.GGMLQuantizationType.Q8_0: gguf.LlamaFileType.MOSTLY_Q8_0}[matrix_type]
    w = gguf.GGUFWriter(str(path), arch)  # writes general.architecture
    w.add_name(f"tachyon-fixture-{spec.name}")
    w.add_file_type(int(ftype))
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    w.add_vocab_size(cfg.vocab_size)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"]))
    w.add_rope_dimension_count(cfg.head_dim)
    if cfg.head_dim * cfg.num_attention_heads != cfg.hidden_size:
        w.add_key_length(cfg.head_dim)
        w.add_value_length(cfg.head_dim)
    sw = getattr(cfg, "sliding_window", None)
    if sw and (spec.gguf_arch == "llama" or getattr(cfg, "use_sliding_window", False)):
        w.add_sliding_window(int(sw))
    for name, arr in tensors:
        arr = np.ascontiguousarray(arr, dtype=np.float32)
        if arr.ndim == 2 and matrix_type != gguf.GGMLQuantizationType.F32:
            q = gguf.quants.quantize(arr, matrix_type)
            if matrix_type == gguf.GGMLQuantizationType.F16:
                w.add_tensor(name, q)
            else:
                w.add_tensor(name, q, raw_dtype=matrix_type)
        else:
            w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def check_gguf_readback(path: Path, spec: Spec, tensors: list[tuple[str, np.ndarray]],
                        matrix_type: gguf.GGMLQuantizationType) -> None:
    meta, got, types = npf.read_gguf(str(path))
    arch = spec.gguf_arch
    assert meta["general.architecture"] == arch
    assert int(meta[f"{arch}.embedding_length"]) == spec.config.hidden_size
    assert int(meta[f"{arch}.attention.head_count_kv"]) == spec.config.num_key_value_heads
    assert [n for n, _ in tensors] == list(got), "tensor set/order differs after read-back"
    for name, arr in tensors:
        assert got[name].shape == arr.shape, (name, got[name].shape, arr.shape)
        if types[name] == "F32":
            assert np.array_equal(got[name], arr.astype(np.float64)), name
        else:
            assert arr.ndim == 2 and types[name] == matrix_type.name, (name, types[name])


# ----------------------------------------------------------------------------------------------
# One fixture


def versions() -> dict:
    from importlib.metadata import version
    return {"python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__, "safetensors": safetensors.__version__,
            "gguf": version("gguf"), "numpy": np.__version__}


def build(spec: Spec, out_root: Path) -> dict:
    d = out_root / spec.name
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    cfg = spec.config

    torch.manual_seed(spec.seed)
    model = spec.model_cls(cfg)
    init_weights(model, spec.seed)
    model.save_pretrained(d, safe_serialization=True)
    for f in d.iterdir():
        f.chmod(0o644)  # safetensors writes 0600
    del model
    model = hf_load(d)  # everything below uses exactly the saved files

    # Prompt: the first candidate whose greedy choices all have a clear top-1.
    for attempt in range(50):
        prompt = make_prompt(spec.seed * 100 + attempt, spec.prompt_len, cfg.vocab_size)
        prompt_logits, decode_ids, decode_logits, cache_kind = hf_greedy(model, prompt)
        margins = greedy_margins(prompt_logits, decode_logits)
        if margins.min() >= MIN_GREEDY_MARGIN:
            break
    else:
        raise RuntimeError(f"{spec.name}: no prompt with clear greedy choices")
    final_argmax = int(np.argmax(decode_logits[-1]))
    all_ids = prompt + decode_ids  # fed tokens at positions 0 .. P+15
    P = len(prompt)

    # The step-by-step cached decode must equal one uncached pass over the whole sequence.
    full = hf_full(model, all_ids)
    nocache = {"prompt": diff_stats(prompt_logits, full[:P]),
               "decode": diff_stats(decode_logits, full[P:])}
    worst = max(nocache["prompt"]["max_abs"], nocache["decode"]["max_abs"])
    assert worst <= NOCACHE_TOL, f"{spec.name}: cache vs no-cache logits differ by {worst}"
    hf_seq = np.concatenate([prompt_logits, decode_logits])  # logits at every fed position

    checks: dict = {"cache_vs_nocache": nocache, "hf_cache_layer": cache_kind,
                    "greedy_margin_min": float(margins.min())}

    if spec.name == "mistral":
        nowin = hf_full(hf_load(d, sliding_window=None), all_ids)
        W = cfg.sliding_window
        inside = diff_stats(full[:W], nowin[:W])
        outside = diff_stats(full[W:], nowin[W:])
        assert inside["max_abs"] < 1e-5, inside
        assert outside["max_abs"] > 0.1, f"sliding window has no effect in transformers: {outside}"
        checks["sliding_window_effect_hf"] = {
            f"positions_lt_{W}_vs_no_window": inside, f"positions_ge_{W}_vs_no_window": outside}

    if cfg.rope_parameters.get("rope_type") == "llama3":
        factors = llama3_rope_freq_factors(cfg.head_dim, cfg.rope_parameters)
        branches = {"kept": int(np.sum(factors == 1.0)),
                    "divided_by_factor": int(np.sum(factors == cfg.rope_parameters["factor"]))}
        branches["interpolated"] = len(factors) - branches["kept"] - branches["divided_by_factor"]
        assert min(branches.values()) >= 1, branches
        base = cfg.rope_parameters["rope_theta"] ** (
            -np.arange(0, cfg.head_dim, 2, dtype=np.float64) / cfg.head_dim)
        hf_inv = model.model.rotary_emb.inv_freq.double().numpy()
        inv_check = diff_stats(base / factors, hf_inv)
        assert inv_check["max_rel"] < 1e-6, inv_check
        plain = hf_full(hf_load(d, rope_parameters={"rope_type": "default",
                                                     "rope_theta": cfg.rope_parameters["rope_theta"]}),
                        all_ids)
        eff = diff_stats(full, plain)
        assert eff["max_abs"] > 0.1, eff
        checks["llama3_rope"] = {"freq_factors": [float(x) for x in factors],
                                 "pairs_per_branch": branches,
                                 "hf_inv_freq_vs_base_over_factors": inv_check,
                                 "logits_vs_unscaled_rope": eff}

    # GGUF files, built from the saved safetensors.
    hf_tensors = safetensors.numpy.load_file(str(d / "model.safetensors"))
    tensors = gguf_tensors(spec, hf_tensors)
    files = [("model.gguf", gguf.GGMLQuantizationType.F32)]
    if spec.quant_variants:
        files += [("model-f16.gguf", gguf.GGMLQuantizationType.F16),
                  ("model-q8_0.gguf", gguf.GGMLQuantizationType.Q8_0)]
    extra_arrays: list[tuple[str, np.ndarray, str]] = []
    gguf_checks: dict = {}
    for fname, mtype in files:
        write_gguf(d / fname, spec, tensors, mtype)
        check_gguf_readback(d / fname, spec, tensors, mtype)
        meta, tw, _ = npf.read_gguf(str(d / fname))
        np_seq = npf.forward(meta, tw, all_ids)
        st = diff_stats(np_seq, hf_seq)
        st["greedy_ids_match"] = bool(np.array_equal(
            np_seq[P - 1:P + DECODE_STEPS - 1].argmax(-1), np.array(decode_ids)))
        gguf_checks[fname] = {"numpy_forward_vs_hf": st}
        if mtype == gguf.GGMLQuantizationType.F32:
            assert st["max_abs"] <= GGUF_NUMPY_TOL and st["greedy_ids_match"], (fname, st)
            gguf_checks[fname]["sensitivity"] = sensitivity(spec, meta, tw, all_ids, np_seq)
        else:
            extra_arrays.append((f"gguf_{mtype.name.lower()}_prompt_logits",
                                 np_seq[:P].astype(np.float32),
                                 f"numpy float64 forward of {fname} (dequantized weights) over the "
                                 "prompt; not HF output"))

    # expected.bin + expected.json
    arrays = [("prompt_logits", prompt_logits.astype(np.float32),
               "HF logits at prompt positions 0..P-1 (prefill with use_cache=True)"),
              ("decode_logits", decode_logits.astype(np.float32),
               "HF logits after feeding decode_ids[k] at position P+k with the KV cache")]
    arrays += extra_arrays
    blob = bytearray()
    arr_meta = []
    for name, a, what in arrays:
        a = np.ascontiguousarray(a, dtype="<f4")
        arr_meta.append({"name": name, "dtype": "f32le", "shape": list(a.shape),
                         "offset": len(blob), "nbytes": a.nbytes, "description": what})
        blob += a.tobytes()
    (d / "expected.bin").write_bytes(bytes(blob))

    expected = {
        "format_version": FORMAT_VERSION,
        "name": spec.name,
        "hf_architecture": cfg.architectures[0] if cfg.architectures else spec.model_cls.__name__,
        "gguf_architecture": spec.gguf_arch,
        "gguf_rope_style": "interleaved" if spec.gguf_arch == "llama" else "neox",
        "hf_rope_style": "neox",
        "versions": versions(),
        "seed": spec.seed,
        "vocab_size": cfg.vocab_size,
        "prompt_ids": prompt,
        "decode_steps": DECODE_STEPS,
        "decode_ids": decode_ids,
        "final_argmax": final_argmax,
        "binary": "expected.bin",
        "binary_sha256": hashlib.sha256(bytes(blob)).hexdigest(),
        "arrays": arr_meta,
        "gguf_files": {f: {"matrix_type": t.name} for f, t in files},
        "checks": checks,
        "gguf_checks": gguf_checks,
        "notes": spec.notes,
    }
    (d / "expected.json").write_text(to_json(expected) + "\n")
    return expected


def to_json(obj, indent: int = 0) -> str:
    """JSON with objects one key per line but lists of scalars on one line."""
    pad = " " * (indent + 1)
    if isinstance(obj, dict):
        if not obj:
            return "{}"
        items = [f"{pad}{json.dumps(k)}: {to_json(v, indent + 1)}" for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + "\n" + " " * indent + "}"
    if isinstance(obj, list) and any(isinstance(v, (dict, list)) for v in obj):
        return "[\n" + ",\n".join(pad + to_json(v, indent + 1) for v in obj) + "\n" + " " * indent + "]"
    return json.dumps(obj)


def sensitivity(spec: Spec, meta: dict, t: dict, ids: list[int], base: np.ndarray) -> dict:
    """How far the logits move when one architectural detail is got wrong (numpy forward over the
    F32 GGUF): evidence that the fixture would catch that mistake."""
    out = {}

    def record(label, logits):
        s = diff_stats(logits, base)
        s["argmax_changed_positions"] = int(np.sum(logits.argmax(-1) != base.argmax(-1)))
        out[label] = s

    other = "neox" if spec.gguf_arch == "llama" else "interleaved"
    record(f"rope_style_{other}", npf.forward(meta, t, ids, rope_style=other))
    if "rope_freqs.weight" in t:
        record("rope_freqs_ignored", npf.forward(
            meta, {k: v for k, v in t.items() if k != "rope_freqs.weight"}, ids))
    if any(k.endswith(".bias") for k in t):
        record("biases_ignored", npf.forward(
            meta, {k: v for k, v in t.items() if not k.endswith(".bias")}, ids))
    if any("q_norm" in k for k in t):
        record("qk_norm_ignored", npf.forward(
            meta, {k: v for k, v in t.items() if "q_norm" not in k and "k_norm" not in k}, ids))
    if f"{spec.gguf_arch}.attention.sliding_window" in meta:
        record("sliding_window_ignored", npf.forward(meta, t, ids, sliding_window=0))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(REPO_ROOT / "tests" / "fixtures" / "models"))
    ap.add_argument("--only", nargs="*", default=None, help="fixture names to (re)build")
    args = ap.parse_args()

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    transformers.logging.set_verbosity_error()

    out_root = Path(args.out)
    out_root.mkdir(parents=True, exist_ok=True)
    chosen = [s for s in specs() if args.only is None or s.name in args.only]
    if args.only and len(chosen) != len(args.only):
        ap.error(f"unknown fixture in {args.only}; known: {[s.name for s in specs()]}")
    for spec in chosen:
        e = build(spec, out_root)
        g = e["gguf_checks"]["model.gguf"]["numpy_forward_vs_hf"]
        nc = e["checks"]["cache_vs_nocache"]
        size = sum(f.stat().st_size for f in (out_root / spec.name).iterdir())
        print(f"{spec.name:14s} P={len(e['prompt_ids']):2d} V={e['vocab_size']} "
              f"margin>={e['checks']['greedy_margin_min']:.3f} "
              f"nocache={max(nc['prompt']['max_abs'], nc['decode']['max_abs']):.2e} "
              f"gguf-numpy max_abs={g['max_abs']:.2e} max_rel={g['max_rel']:.2e} "
              f"dir={size / 1024:.0f} KiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
