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
                          MistralForCausalLM, MixtralConfig, MixtralForCausalLM, Qwen2Config,
                          Qwen2ForCausalLM, Qwen2MoeConfig, Qwen2MoeForCausalLM, Qwen3Config,
                          Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM)

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
MIN_ROUTER_MARGIN = 1e-3   # MoE: k-th minus (k+1)-th router probability, every position and layer
MAX_PROMPT_ATTEMPTS = 400

REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Spec:
    name: str
    model_cls: type
    config: object
    gguf_arch: str
    prompt_len: int
    seed: int
    quant_variants: bool = False   # F16 and Q8_0 GGUF files as well
    q8_0_variant: bool = False     # a Q8_0 GGUF file as well (without F16)
    router_std: float = 0.3        # MoE router (ffn_gate_inp) init std (see README)
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
        Spec("qwen3-moe", Qwen3MoeForCausalLM,
             Qwen3MoeConfig(**{**common(256, 96, 2, 1e-6, False), "head_dim": 32,
                               "num_hidden_layers": 3},
                            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
                            use_sliding_window=False, attention_bias=False,
                            num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                            norm_topk_prob=True, mlp_only_layers=[1], decoder_sparse_step=1),
             "qwen3moe", 20, 1007, q8_0_variant=True,
             notes=["Layers 0 and 2 are MoE (8 experts, top-2, renormalised); layer 1 is in "
                    "mlp_only_layers, a dense SiLU-gated MLP of intermediate_size 96 "
                    "(GGUF ffn_gate/ffn_up/ffn_down, no ffn_gate_inp).",
                    "transformers 5.x writes the expert count of Qwen3-MoE as "
                    "config.json `num_local_experts` (its attribute_map aliases num_experts); "
                    "released Qwen3-MoE checkpoints spell it `num_experts`.",
                    "model-q8_0.gguf: every 2-D and 3-D tensor Q8_0 along its last axis except "
                    "the routers blk.L.ffn_gate_inp.weight, which stay F32 (as llama.cpp keeps "
                    "them); norms F32."]),
        Spec("qwen2-moe", Qwen2MoeForCausalLM,
             Qwen2MoeConfig(**common(256, 96, 2, 1e-6, False),
                            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
                            use_sliding_window=False, qkv_bias=True,
                            num_experts=8, num_experts_per_tok=4, moe_intermediate_size=32,
                            shared_expert_intermediate_size=48, norm_topk_prob=False,
                            decoder_sparse_step=1, mlp_only_layers=[]),
             "qwen2moe", 18, 1008, router_std=0.15,
             notes=["Router init std 0.15 (not 0.3): with top-4 of 8 the 4th and 5th "
                    "probabilities of a peaked router are both small, and their 1e-3 gap "
                    "(checks.router_margin_min) then fails at too many positions.",
                    "Both layers are MoE: 8 experts, top-4, NOT renormalised (the chosen softmax "
                    "probabilities weight the experts as they are), plus a shared SwiGLU expert "
                    "(intermediate 48) scaled by sigmoid(h . shared_expert_gate) and added.",
                    "intermediate_size (96, GGUF feed_forward_length) is unused: no dense layer."]),
        Spec("mixtral", MixtralForCausalLM,
             MixtralConfig(**common(256, 48, 2, 1e-5, False),
                           rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
                           sliding_window=None, num_local_experts=4, num_experts_per_tok=2),
             "llama", 16, 1009,
             notes=["GGUF architecture llama (as llama.cpp converts Mixtral): q/k rows permuted "
                    "for interleaved RoPE; experts' intermediate size is "
                    "llama.feed_forward_length (48); routing always renormalises the top-2 "
                    "(no expert_weights_norm key)."]),
    ]
    return out


def moe_info(cfg) -> dict | None:
    """The MoE settings of a config (None for a dense model), in the form expected.json records."""
    n_exp = getattr(cfg, "num_experts", None) or getattr(cfg, "num_local_experts", None)
    if not n_exp:
        return None
    mlp_only = list(getattr(cfg, "mlp_only_layers", None) or [])
    step = int(getattr(cfg, "decoder_sparse_step", 1) or 1)
    moe_layers = [L for L in range(cfg.num_hidden_layers)
                  if L not in mlp_only and (L + 1) % step == 0]
    return {"num_experts": int(n_exp), "top_k": int(cfg.num_experts_per_tok),
            # Mixtral has no flag: it always renormalises the chosen probabilities.
            "norm_topk_prob": bool(getattr(cfg, "norm_topk_prob", True)),
            "moe_intermediate_size": int(getattr(cfg, "moe_intermediate_size", None)
                                         or cfg.intermediate_size),
            "shared_expert_intermediate_size": getattr(cfg, "shared_expert_intermediate_size",
                                                       None),
            "mlp_only_layers": mlp_only,
            "moe_layers": moe_layers}


# ----------------------------------------------------------------------------------------------
# Weights


def init_weights(model: torch.nn.Module, seed: int, router_std: float = 0.3) -> None:
    """Larger-than-default random weights so logits are far from flat and every architectural
    detail (rope layout, biases, norms) moves them visibly. MoE routers get `router_std` so the
    routing is decisive (see MIN_ROUTER_MARGIN)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):  # input/post-attention/final norms and q/k norms
                std = 0.15 if ("q_norm" in name or "k_norm" in name) else 0.1
                p.copy_(1.0 + std * torch.randn(p.shape, generator=gen))
            elif name.endswith(".bias"):
                p.copy_(0.3 * torch.randn(p.shape, generator=gen))
            elif name.endswith(".mlp.gate.weight"):  # MoE router [E, hidden]
                p.copy_(router_std * torch.randn(p.shape, generator=gen))
            elif name.endswith((".experts.gate_up_proj", ".experts.down_proj")):  # 3-D, in memory
                p.copy_(0.15 * torch.randn(p.shape, generator=gen))
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


@torch.no_grad()
def hf_router_probs(model, ids: list[int]) -> dict[int, np.ndarray]:
    """Router probabilities [n, E] of every MoE layer (layer index -> array) for one uncached
    pass over ids: the routers' float32 logits, softmax in float64."""
    logits: dict[int, np.ndarray] = {}
    hooks = []
    for L, layer in enumerate(model.model.layers):
        for m in layer.modules():
            if type(m).__name__.endswith("TopKRouter"):
                hooks.append(m.register_forward_hook(
                    lambda mod, inp, out, L=L: logits.__setitem__(
                        L, out[0].detach().double().numpy().copy())))
    try:
        model(input_ids=torch.tensor([ids]), use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    out = {}
    for L, z in logits.items():
        e = np.exp(z - z.max(axis=-1, keepdims=True))
        out[L] = e / e.sum(axis=-1, keepdims=True)
    return out


def router_margin(probs: dict[int, np.ndarray], top_k: int, rows: slice = slice(None)) -> float:
    """Smallest gap between the k-th and (k+1)-th largest router probability over the given
    positions of every MoE layer: how far float rounding is from flipping an expert choice."""
    gaps = []
    for pr in probs.values():
        srt = -np.sort(-pr[rows], axis=-1)
        gaps.append(float((srt[:, top_k - 1] - srt[:, top_k]).min()))
    return min(gaps)


def router_choice(probs: dict[int, np.ndarray], top_k: int) -> dict[int, np.ndarray]:
    """The chosen experts (as sorted index sets) per MoE layer and position."""
    return {L: np.sort(np.argsort(-pr, axis=-1, kind="stable")[:, :top_k], axis=-1)
            for L, pr in probs.items()}


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


# MoE: HF router (Qwen2/3-MoE `mlp.gate`, Mixtral `block_sparse_moe.gate`) -> ffn_gate_inp, and the
# per-expert 2-D tensors save_pretrained writes, stacked into one 3-D GGUF tensor [E, out, in].
MOE_ROUTERS = ("mlp.gate.weight", "block_sparse_moe.gate.weight")
MOE_EXPERTS = {  # GGUF name: (Qwen suffix, Mixtral suffix) under <...>.experts.<e>.
    "ffn_gate_exps.weight": ("gate_proj.weight", "w1.weight"),
    "ffn_up_exps.weight": ("up_proj.weight", "w3.weight"),
    "ffn_down_exps.weight": ("down_proj.weight", "w2.weight"),
}
MOE_SHARED = {  # Qwen2-MoE shared expert (2-D, as is)
    "mlp.shared_expert.gate_proj.weight": "ffn_gate_shexp.weight",
    "mlp.shared_expert.up_proj.weight": "ffn_up_shexp.weight",
    "mlp.shared_expert.down_proj.weight": "ffn_down_shexp.weight",
}
MOE_SHARED_GATE = "mlp.shared_expert_gate.weight"  # [1, hidden] -> ffn_gate_inp_shexp [hidden]

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
    moe_used: set[str] = set()
    moe = moe_info(cfg)
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
        for router in MOE_ROUTERS:
            if prefix + router not in hf:
                continue
            out.append((f"blk.{L}.ffn_gate_inp.weight", hf[prefix + router]))
            moe_used.add(prefix + router)
            experts = prefix + router[:-len("gate.weight")] + "experts."
            for gg_name, (qwen_sfx, mixtral_sfx) in MOE_EXPERTS.items():
                sfx = mixtral_sfx if router.startswith("block_sparse_moe") else qwen_sfx
                keys = [f"{experts}{e}.{sfx}" for e in range(moe["num_experts"])]
                out.append((f"blk.{L}.{gg_name}", np.stack([hf[k] for k in keys])))
                moe_used.update(keys)
            if prefix + MOE_SHARED_GATE in hf:
                out.append((f"blk.{L}.ffn_gate_inp_shexp.weight",
                            hf[prefix + MOE_SHARED_GATE].reshape(-1)))
                moe_used.add(prefix + MOE_SHARED_GATE)
                for hf_suffix, gg_name in MOE_SHARED.items():
                    out.append((f"blk.{L}.{gg_name}", hf[prefix + hf_suffix]))
                    moe_used.add(prefix + hf_suffix)
    out.append(("output_norm.weight", hf["model.norm.weight"]))
    if not cfg.tie_word_embeddings:
        out.append(("output.weight", hf["lm_head.weight"]))
    used = {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"}
    used |= {f"model.layers.{L}.{s}" for L in range(cfg.num_hidden_layers) for s in HF_TO_GGUF_LAYER}
    used |= moe_used
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
    moe = moe_info(cfg)
    if moe:
        w.add_expert_count(moe["num_experts"])
        w.add_expert_used_count(moe["top_k"])
        if arch in ("qwen2moe", "qwen3moe"):  # llama (Mixtral): experts use feed_forward_length
            w.add_expert_feed_forward_length(moe["moe_intermediate_size"])
            w.add_expert_weights_norm(moe["norm_topk_prob"])
        if moe["shared_expert_intermediate_size"]:
            w.add_expert_shared_feed_forward_length(moe["shared_expert_intermediate_size"])
    sw = getattr(cfg, "sliding_window", None)
    if sw and (spec.gguf_arch == "llama" or getattr(cfg, "use_sliding_window", False)):
        w.add_sliding_window(int(sw))
    for name, arr in tensors:
        arr = np.ascontiguousarray(arr, dtype=np.float32)
        if (arr.ndim in (2, 3) and not name.endswith("ffn_gate_inp.weight")
                and matrix_type != gguf.GGMLQuantizationType.F32):  # routers stay F32
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
            assert arr.ndim in (2, 3) and types[name] == matrix_type.name, (name, types[name])
    moe = moe_info(spec.config)
    if moe:
        assert int(meta[f"{arch}.expert_count"]) == moe["num_experts"]
        assert int(meta[f"{arch}.expert_used_count"]) == moe["top_k"]


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

    moe = moe_info(cfg)
    # MoE: transformers' plain per-expert loop (its default may be a grouped matmul kernel).
    load_kw = {"experts_implementation": "eager"} if moe else {}

    torch.manual_seed(spec.seed)
    model = spec.model_cls(cfg)
    init_weights(model, spec.seed, spec.router_std)
    model.save_pretrained(d, safe_serialization=True)
    for f in d.iterdir():
        f.chmod(0o644)  # safetensors writes 0600
    del model
    model = hf_load(d, **load_kw)  # everything below uses exactly the saved files

    # GGUF files, built from the saved safetensors (they do not depend on the prompt).
    hf_tensors = safetensors.numpy.load_file(str(d / "model.safetensors"))
    tensors = gguf_tensors(spec, hf_tensors)
    files = [("model.gguf", gguf.GGMLQuantizationType.F32)]
    if spec.quant_variants:
        files += [("model-f16.gguf", gguf.GGMLQuantizationType.F16),
                  ("model-q8_0.gguf", gguf.GGMLQuantizationType.Q8_0)]
    elif spec.q8_0_variant:
        files += [("model-q8_0.gguf", gguf.GGMLQuantizationType.Q8_0)]
    gguf_read: dict[str, tuple[dict, dict]] = {}
    for fname, mtype in files:
        write_gguf(d / fname, spec, tensors, mtype)
        check_gguf_readback(d / fname, spec, tensors, mtype)
        meta, tw, _ = npf.read_gguf(str(d / fname))
        gguf_read[fname] = (meta, tw)

    # Prompt: the first candidate whose greedy choices all have a clear top-1 and, for MoE, whose
    # routing is clear at every position and MoE layer (HF over prompt + decode tokens; each
    # quantized file's own numpy routing over the prompt, whose logits expected.bin holds) and
    # chooses every expert of every MoE layer at least once.
    for attempt in range(MAX_PROMPT_ATTEMPTS):
        prompt = make_prompt(spec.seed * 100 + attempt, spec.prompt_len, cfg.vocab_size)
        prompt_logits, decode_ids, decode_logits, cache_kind = hf_greedy(model, prompt)
        margins = greedy_margins(prompt_logits, decode_logits)
        if margins.min() < MIN_GREEDY_MARGIN:
            continue
        if moe:
            hf_probs = hf_router_probs(model, prompt + decode_ids)
            if router_margin(hf_probs, moe["top_k"]) < MIN_ROUTER_MARGIN:
                continue
            if any(len(np.unique(c)) < moe["num_experts"]
                   for c in router_choice(hf_probs, moe["top_k"]).values()):
                continue  # some expert never chosen: its weights would go untested
            quant_margins = []
            for fname, mtype in files[1:]:
                tr: dict = {}
                npf.forward(*gguf_read[fname], prompt, trace=tr)
                quant_margins.append(router_margin(tr["router_probs"], moe["top_k"]))
            if quant_margins and min(quant_margins) < MIN_ROUTER_MARGIN:
                continue
        break
    else:
        raise RuntimeError(f"{spec.name}: no prompt with clear greedy choices"
                           + (" and clear routing" if moe else ""))
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

    if moe:
        k = moe["top_k"]
        hf_probs = hf_router_probs(model, all_ids)
        hf_choice = router_choice(hf_probs, k)
        rm = router_margin(hf_probs, k)
        assert rm >= MIN_ROUTER_MARGIN, rm
        checks["router_margin_min"] = rm
        checks["router_margin_min_per_layer"] = {
            str(L): router_margin({L: pr}, k) for L, pr in hf_probs.items()}
        checks["router_logit_gap_min"] = min(
            float(np.min(np.log(-np.sort(-pr, -1)[:, k - 1]) - np.log(-np.sort(-pr, -1)[:, k])))
            for pr in hf_probs.values())
        checks["router_margin_note"] = (
            "k-th minus (k+1)-th largest router softmax probability (HF float32 router logits, "
            "softmax in float64), minimum over all P+16 positions of each MoE layer; "
            "router_logit_gap_min: the same gap between router logits")
        assert all(len(np.unique(c)) == moe["num_experts"] for c in hf_choice.values())
        checks["expert_use_counts"] = {
            str(L): np.bincount(c.ravel(), minlength=moe["num_experts"]).tolist()
            for L, c in hf_choice.items()}
        checks["hf_experts_implementation"] = "eager"
        grouped = hf_full(hf_load(d, experts_implementation="grouped_mm"), all_ids)
        checks["experts_grouped_mm_vs_eager"] = diff_stats(grouped, full)

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

    # The GGUF files (written above): numpy forward vs HF.
    extra_arrays: list[tuple[str, np.ndarray, str]] = []
    gguf_checks: dict = {}
    for fname, mtype in files:
        meta, tw = gguf_read[fname]
        tr: dict = {}
        np_seq = npf.forward(meta, tw, all_ids, trace=tr)
        st = diff_stats(np_seq, hf_seq)
        st["greedy_ids_match"] = bool(np.array_equal(
            np_seq[P - 1:P + DECODE_STEPS - 1].argmax(-1), np.array(decode_ids)))
        gguf_checks[fname] = {"numpy_forward_vs_hf": st}
        if moe:
            np_choice = router_choice(tr["router_probs"], moe["top_k"])
            routing = {
                "router_margin_min": router_margin(tr["router_probs"], moe["top_k"]),
                "router_margin_min_prompt": router_margin(tr["router_probs"], moe["top_k"],
                                                          slice(0, P)),
                "router_max_abs_prob_diff_vs_hf": max(
                    float(np.abs(tr["router_probs"][L] - hf_probs[L]).max()) for L in hf_probs),
                "expert_choices_differing_from_hf": int(sum(
                    np.any(np_choice[L] != hf_choice[L], axis=-1).sum() for L in hf_choice)),
            }
            gguf_checks[fname]["routing"] = routing
        if mtype == gguf.GGMLQuantizationType.F32:
            assert st["max_abs"] <= GGUF_NUMPY_TOL and st["greedy_ids_match"], (fname, st)
            if moe:
                assert routing["expert_choices_differing_from_hf"] == 0, routing
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
    if moe:
        expected = {**{k: v for k, v in expected.items() if k != "notes"}, "moe": moe,
                    "notes": spec.notes}
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
    moe = moe_info(spec.config)
    if moe:
        k = moe["top_k"]
        label = "moe_no_renormalisation" if moe["norm_topk_prob"] else "moe_renormalised"
        record(label, npf.forward(meta, t, ids, moe_norm=not moe["norm_topk_prob"]))
        record(f"moe_top_k_{k - 1}", npf.forward(meta, t, ids, moe_top_k=k - 1))
        record(f"moe_top_k_{k + 1}", npf.forward(meta, t, ids, moe_top_k=k + 1))
    if any(k.endswith("ffn_gate_inp_shexp.weight") for k in t):
        record("shared_expert_gate_ignored", npf.forward(meta, t, ids, shexp_gate=False))
        record("shared_expert_ignored", npf.forward(
            meta, {k: v for k, v in t.items() if "shexp" not in k}, ids))
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
        rm = e["checks"].get("router_margin_min")
        print(f"{spec.name:14s} P={len(e['prompt_ids']):2d} V={e['vocab_size']} "
              f"margin>={e['checks']['greedy_margin_min']:.3f} "
              + (f"router>={rm:.4f} " if rm is not None else "") +
              f"nocache={max(nc['prompt']['max_abs'], nc['decode']['max_abs']):.2e} "
              f"gguf-numpy max_abs={g['max_abs']:.2e} max_rel={g['max_rel']:.2e} "
              f"dir={size / 1024:.0f} KiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
