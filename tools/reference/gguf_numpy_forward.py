"""Independent numpy forward pass over a GGUF file (llama / qwen2 / qwen3 / qwen2moe / qwen3moe
conventions; Mixtral is architecture `llama` with experts).

Used by make_model_fixtures.py to prove that the GGUF files it writes reproduce the Hugging Face
logits: in particular that the q/k row permutation applied for architecture `llama` turns HF's
half-split RoPE layout into the interleaved-pairs layout a GGUF `llama` loader rotates.

It deliberately shares no code with the HF side: it reads only the GGUF (metadata + tensors via
gguf.GGUFReader) and computes in float64.

    python tools/reference/gguf_numpy_forward.py tests/fixtures/models/llama/model.gguf 1 5 9
"""

from __future__ import annotations

import sys

import numpy as np

import gguf


def read_gguf(path: str) -> tuple[dict, dict[str, np.ndarray], dict[str, str]]:
    """Returns (metadata, tensors as float64 arrays in PyTorch shape order, tensor type names)."""
    reader = gguf.GGUFReader(path)
    meta: dict = {}
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):  # header pseudo-fields (version, counts)
            continue
        meta[key] = field.contents()
    tensors: dict[str, np.ndarray] = {}
    types: dict[str, str] = {}
    for t in reader.tensors:
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))  # GGUF ne[] is innermost first
        data = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type)
        tensors[t.name] = np.asarray(data, dtype=np.float64).reshape(shape)
        types[t.name] = t.tensor_type.name
    return meta, tensors, types


def _rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def _rope(x: np.ndarray, positions: np.ndarray, inv_freq: np.ndarray, style: str) -> np.ndarray:
    """x: [n, heads, head_dim]. style 'interleaved' rotates (x[2i], x[2i+1]); 'neox' rotates
    (x[i], x[i + head_dim/2]); pair i turns by positions * inv_freq[i]."""
    ang = positions[:, None].astype(np.float64) * inv_freq[None, :]  # [n, hd/2]
    cos = np.cos(ang)[:, None, :]
    sin = np.sin(ang)[:, None, :]
    out = np.empty_like(x)
    half = x.shape[-1] // 2
    if style == "interleaved":
        a, b = x[..., 0::2], x[..., 1::2]
        out[..., 0::2] = a * cos - b * sin
        out[..., 1::2] = a * sin + b * cos
    elif style == "neox":
        a, b = x[..., :half], x[..., half:]
        out[..., :half] = a * cos - b * sin
        out[..., half:] = a * sin + b * cos
    else:
        raise ValueError(style)
    return out


def _silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _moe(h: np.ndarray, t: dict[str, np.ndarray], p: str, top_k: int, norm: bool,
         shexp_gate: bool) -> tuple[np.ndarray, np.ndarray]:
    """Mixture-of-experts MLP of one layer (llama.cpp layout): router ffn_gate_inp [E, d] ->
    softmax over all E experts -> the top_k largest probabilities, renormalised to sum 1 when
    `norm` -> sum of the chosen SwiGLU experts (ffn_gate_exps / ffn_up_exps [E, f, d],
    ffn_down_exps [E, d, f]) weighted by them. Plus, when ffn_up_shexp exists (Qwen2-MoE), a
    shared SwiGLU expert scaled by sigmoid(h . ffn_gate_inp_shexp) (by 1 if that tensor is absent
    or shexp_gate is False). Returns (output [n, d], router probabilities [n, E])."""
    probs = _softmax(h @ t[p + "ffn_gate_inp.weight"].T)  # [n, E]
    n, n_exp = probs.shape
    top = np.argsort(-probs, axis=-1, kind="stable")[:, :top_k]  # [n, k]
    w = np.take_along_axis(probs, top, axis=-1)
    if norm:
        w = w / w.sum(axis=-1, keepdims=True)
    dense_w = np.zeros((n, n_exp))  # routing weight of every (token, expert); 0 if not chosen
    np.put_along_axis(dense_w, top, w, axis=-1)
    g = np.einsum("nd,efd->nef", h, t[p + "ffn_gate_exps.weight"])
    u = np.einsum("nd,efd->nef", h, t[p + "ffn_up_exps.weight"])
    y = np.einsum("nef,edf->ned", _silu(g) * u, t[p + "ffn_down_exps.weight"])  # every expert
    out = np.einsum("ne,ned->nd", dense_w, y)
    if p + "ffn_up_shexp.weight" in t:
        s = (_silu(h @ t[p + "ffn_gate_shexp.weight"].T) * (h @ t[p + "ffn_up_shexp.weight"].T)
             ) @ t[p + "ffn_down_shexp.weight"].T
        if shexp_gate and p + "ffn_gate_inp_shexp.weight" in t:
            s = s / (1.0 + np.exp(-(h @ t[p + "ffn_gate_inp_shexp.weight"])))[:, None]
        out = out + s
    return out, probs


def forward(meta: dict, t: dict[str, np.ndarray], token_ids, rope_style: str | None = None,
            sliding_window: int | None = None, moe_top_k: int | None = None,
            moe_norm: bool | None = None, shexp_gate: bool = True,
            trace: dict | None = None) -> np.ndarray:
    """Full causal forward over token_ids at positions 0..n-1; returns logits [n, vocab] (f64).

    rope_style / sliding_window / moe_top_k / moe_norm / shexp_gate override what the file implies
    (for negative controls). A layer is MoE when blk.L.ffn_gate_inp.weight exists. If `trace` is
    a dict, trace["router_probs"][L] receives the router probabilities [n, E] of MoE layer L."""
    arch = meta["general.architecture"]
    n_embd = int(meta[f"{arch}.embedding_length"])
    n_layer = int(meta[f"{arch}.block_count"])
    n_head = int(meta[f"{arch}.attention.head_count"])
    n_kv = int(meta[f"{arch}.attention.head_count_kv"])
    eps = float(meta[f"{arch}.attention.layer_norm_rms_epsilon"])
    theta = float(meta.get(f"{arch}.rope.freq_base", 10000.0))  # llama.cpp's default
    head_dim = int(meta.get(f"{arch}.attention.key_length", n_embd // n_head))
    rot_dim = int(meta.get(f"{arch}.rope.dimension_count", head_dim))
    assert rot_dim == head_dim
    if rope_style is None:
        rope_style = "interleaved" if arch == "llama" else "neox"
    if sliding_window is None:
        sliding_window = int(meta.get(f"{arch}.attention.sliding_window", 0))

    if moe_top_k is None:
        moe_top_k = int(meta.get(f"{arch}.expert_used_count", 0))
    if moe_norm is None:  # llama (Mixtral) and qwen3moe renormalise; qwen2moe does not
        moe_norm = bool(meta.get(f"{arch}.expert_weights_norm", arch != "qwen2moe"))
    if trace is not None:
        trace["router_probs"] = {}

    inv_freq = theta ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    if "rope_freqs.weight" in t:  # llama3-style per-pair divisors of the frequency
        inv_freq = inv_freq / t["rope_freqs.weight"]

    ids = np.asarray(token_ids, dtype=np.int64)
    n = len(ids)
    pos = np.arange(n)
    x = t["token_embd.weight"][ids]  # [n, n_embd]

    # mask[q, k] true where attention is allowed: causal, and within the window when set.
    mask = pos[None, :] <= pos[:, None]
    if sliding_window > 0:
        mask &= pos[None, :] > pos[:, None] - sliding_window
    group = n_head // n_kv

    def lin(h, name):
        y = h @ t[name + ".weight"].T
        if name + ".bias" in t:
            y = y + t[name + ".bias"]
        return y

    for L in range(n_layer):
        p = f"blk.{L}."
        h = _rms_norm(x, t[p + "attn_norm.weight"], eps)
        q = lin(h, p + "attn_q").reshape(n, n_head, head_dim)
        k = lin(h, p + "attn_k").reshape(n, n_kv, head_dim)
        v = lin(h, p + "attn_v").reshape(n, n_kv, head_dim)
        if p + "attn_q_norm.weight" in t:
            q = _rms_norm(q, t[p + "attn_q_norm.weight"], eps)
            k = _rms_norm(k, t[p + "attn_k_norm.weight"], eps)
        q = _rope(q, pos, inv_freq, rope_style)
        k = _rope(k, pos, inv_freq, rope_style)
        att_out = np.empty((n, n_head, head_dim))
        for hh in range(n_head):
            kv = hh // group
            s = (q[:, hh, :] @ k[:, kv, :].T) / np.sqrt(head_dim)
            s = np.where(mask, s, -np.inf)
            s = s - s.max(axis=-1, keepdims=True)
            w = np.exp(s)
            w /= w.sum(axis=-1, keepdims=True)
            att_out[:, hh, :] = w @ v[:, kv, :]
        x = x + lin(att_out.reshape(n, n_head * head_dim), p + "attn_output")
        h = _rms_norm(x, t[p + "ffn_norm.weight"], eps)
        if p + "ffn_gate_inp.weight" in t:
            y, probs = _moe(h, t, p, moe_top_k, moe_norm, shexp_gate)
            x = x + y
            if trace is not None:
                trace["router_probs"][L] = probs
            continue
        g = lin(h, p + "ffn_gate")
        u = lin(h, p + "ffn_up")
        x = x + lin(g / (1.0 + np.exp(-g)) * u, p + "ffn_down")

    x = _rms_norm(x, t["output_norm.weight"], eps)
    head = t["output.weight"] if "output.weight" in t else t["token_embd.weight"]
    return x @ head.T


def main(argv: list[str]) -> int:
    if len(argv) < 3:
        print(__doc__)
        return 2
    meta, tensors, _ = read_gguf(argv[1])
    logits = forward(meta, tensors, [int(a) for a in argv[2:]])
    np.set_printoptions(precision=5, suppress=True, linewidth=140)
    print("argmax per position:", logits.argmax(axis=-1).tolist())
    print("last row (first 16):", logits[-1, :16])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
