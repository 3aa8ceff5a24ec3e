#!/usr/bin/env python3
"""Train proposal heads over a target's final hidden state (the engine's --spec-heads).

  train_heads.py --data DATA --target models/tachyon-demo --out heads.safetensors
                 [--heads 4] [--ffn 128] [--budget-s 150 | --steps N] [--log LOG]
                 [--draft models/tachyon-demo-draft] [--positions 2000] [--json OUT]

The heads are those of src/speculative/spec_heads.h, computed here exactly as the engine does.
Head i turns (x_i, t_i) into (x_{i+1}, t_{i+1}):

    n       = rms_norm(x_i) * in_norm_i
    g, u    = split(x_proj_i n + e_proj_i embed(t_i))          (gate half first)
    x_{i+1} = x_i + down_proj_i (silu(g) * u)
    t_{i+1} = argmax lm_head(rms_norm(x_{i+1}) * out_norm_i)

x_0 is the target's final hidden row (after its final norm) at the position that produced t_0,
the embedding table and LM head are the target's (frozen, tied).

Training: random windows of the training stream, target frozen (bf16). At every position p of a
window, x_0 = h[p], and head i reads the text's token t_i = w[p + 1 + i] (teacher forcing) and is
fitted to the target's own next-token distribution at p + 1 + i: the loss is
sum_i 0.8^i KL(target || head_i), so the heads learn what the target would accept. AdamW,
warmup then cosine decay, bf16 autocast, clipping at 1.0, seeded.

Acceptance (the same protocol as eval.py's for the draft, on the same positions of
tests/data/eval/{code,prose}.txt): with the 256 preceding tokens as context, the context's last
token plays t_0 and the target's hidden row before it x_0; the heads propose K tokens greedily;
the target scores context + proposals; the accepted proposals are the longest prefix equal to the
target's greedy choices. With --draft the draft is measured on the same positions in the same run.

The file: safetensors, bf16 tensors heads.<i>.{in_norm,x_proj,e_proj,down_proj,out_norm}.weight and
the metadata spec_heads.h names (format tachyon-spec-heads, version 1).
"""
import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train import load_stream, log, lr_at, windows_at  # noqa: E402

EPS = 1e-5


def rms_norm(x, w, eps=EPS):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


def rope(x, theta=10000.0):
    """Rotary embedding of [B, H, T, hd] at positions 0..T-1 (pairs (j, j + hd/2), as Llama's)."""
    hd = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, hd, 2, device=x.device, dtype=torch.float32) / hd)
    ang = torch.arange(x.shape[-2], device=x.device, dtype=torch.float32)[:, None] * inv[None, :]
    cos, sin = torch.cat([ang.cos()] * 2, -1).to(x.dtype), torch.cat([ang.sin()] * 2, -1).to(x.dtype)
    x1, x2 = x[..., :hd // 2], x[..., hd // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


class Block(torch.nn.Module):
    """One decoder layer over the target's features (Clover-2's attention block, EAGLE's fusion):
    position q reads fuse([rms_norm(h_q); rms_norm(embed(t_{q+1}))]), the token the target produced
    there, then causal attention over every position so far and a SwiGLU MLP; x_0 = h + its output."""

    def __init__(self, hidden, n_heads, head_dim, ffn):
        super().__init__()
        self.n_heads, self.head_dim = n_heads, head_dim
        self.fuse = torch.nn.Linear(2 * hidden, hidden, bias=False)
        self.h_norm = torch.nn.Parameter(torch.ones(hidden))
        self.e_norm = torch.nn.Parameter(torch.ones(hidden))
        self.attn_norm = torch.nn.Parameter(torch.ones(hidden))
        self.q = torch.nn.Linear(hidden, n_heads * head_dim, bias=False)
        self.k = torch.nn.Linear(hidden, n_heads * head_dim, bias=False)
        self.v = torch.nn.Linear(hidden, n_heads * head_dim, bias=False)
        self.o = torch.nn.Linear(n_heads * head_dim, hidden, bias=False)
        self.mlp_norm = torch.nn.Parameter(torch.ones(hidden))
        self.gate = torch.nn.Linear(hidden, ffn, bias=False)
        self.up = torch.nn.Linear(hidden, ffn, bias=False)
        self.down = torch.nn.Linear(ffn, hidden, bias=False)
        for lin in (self.fuse, self.q, self.k, self.v, self.gate, self.up):
            torch.nn.init.normal_(lin.weight, std=lin.weight.shape[1] ** -0.5)
        torch.nn.init.zeros_(self.o.weight)
        torch.nn.init.zeros_(self.down.weight)
        with torch.no_grad():
            self.fuse.weight.mul_(0.1)

    def forward(self, h, e_next):
        b, t, _ = h.shape
        z = self.fuse(torch.cat([rms_norm(h, self.h_norm), rms_norm(e_next, self.e_norm)], -1))
        n = rms_norm(z, self.attn_norm)
        sh = lambda y: y.view(b, t, self.n_heads, self.head_dim).transpose(1, 2)  # noqa: E731
        q, k, v = rope(sh(self.q(n))), rope(sh(self.k(n))), sh(self.v(n))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        z = z + self.o(a.transpose(1, 2).reshape(b, t, -1))
        m = rms_norm(z, self.mlp_norm)
        z = z + self.down(F.silu(self.gate(m)) * self.up(m))
        return h + z


class Heads(torch.nn.Module):
    def __init__(self, k, hidden, ffn, init_out_norm, block=None):
        super().__init__()
        self.k, self.hidden, self.ffn = k, hidden, ffn
        self.block = Block(hidden, *block) if block else None  # (heads, head_dim, ffn)
        self.in_norm = torch.nn.ParameterList(
            [torch.nn.Parameter(torch.ones(hidden)) for _ in range(k)])
        self.out_norm = torch.nn.ParameterList(
            [torch.nn.Parameter(init_out_norm.clone().float()) for _ in range(k)])
        self.x_proj = torch.nn.ModuleList(
            [torch.nn.Linear(hidden, 2 * ffn, bias=False) for _ in range(k)])
        self.e_proj = torch.nn.ModuleList(
            [torch.nn.Linear(hidden, 2 * ffn, bias=False) for _ in range(k)])
        self.down_proj = torch.nn.ModuleList(
            [torch.nn.Linear(ffn, hidden, bias=False) for _ in range(k)])
        for i in range(k):
            for lin in (self.x_proj[i], self.e_proj[i]):
                torch.nn.init.normal_(lin.weight, std=hidden ** -0.5)
            torch.nn.init.zeros_(self.down_proj[i].weight)  # each head starts as the identity

    def step(self, i, x, tok_emb):
        n = rms_norm(x, self.in_norm[i])
        gu = self.x_proj[i](n) + self.e_proj[i](tok_emb)
        g, u = gu.split(self.ffn, dim=-1)
        x = x + self.down_proj[i](F.silu(g) * u)
        return x, rms_norm(x, self.out_norm[i])

    def features(self, h, tokens, emb):
        """x_0 for every position of h [B, T, d]; tokens [B, T] is what each position produced."""
        return h if self.block is None else self.block(h, F.embedding(tokens, emb))

    def state_dict_for_file(self):
        out = {}
        if self.block is not None:
            for name, t in self.block.named_parameters():
                out["block." + name.replace(".weight", "") + ".weight"] = t
        for i in range(self.k):
            out[f"heads.{i}.in_norm.weight"] = self.in_norm[i]
            out[f"heads.{i}.x_proj.weight"] = self.x_proj[i].weight
            out[f"heads.{i}.e_proj.weight"] = self.e_proj[i].weight
            out[f"heads.{i}.down_proj.weight"] = self.down_proj[i].weight
            out[f"heads.{i}.out_norm.weight"] = self.out_norm[i]
        return {k: v.detach().to(torch.bfloat16).contiguous().cpu() for k, v in out.items()}


def save_heads(heads, vocab, path):
    from safetensors.torch import save_file
    meta = {"format": "tachyon-spec-heads", "version": "1", "num_heads": str(heads.k),
            "hidden_size": str(heads.hidden), "ffn_size": str(heads.ffn),
            "vocab_size": str(vocab), "rms_norm_eps": str(EPS)}
    if heads.block is not None:  # version 2: the attention block (block.* tensors)
        b = heads.block
        meta.update({"version": "2", "block_heads": str(b.n_heads), "block_head_dim": str(b.head_dim),
                     "block_ffn": str(b.gate.weight.shape[0]), "rope_theta": "10000.0"})
    save_file(heads.state_dict_for_file(), path, metadata=meta)


def load_heads(path, dev):
    from safetensors import safe_open
    with safe_open(path, "pt") as f:
        meta = f.metadata()
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    k, hidden, ffn = int(meta["num_heads"]), int(meta["hidden_size"]), int(meta["ffn_size"])
    block = (int(meta["block_heads"]), int(meta["block_head_dim"]), int(meta["block_ffn"])) \
        if meta.get("version") == "2" else None
    heads = Heads(k, hidden, ffn, torch.ones(hidden), block)
    if block:
        for name, t in heads.block.named_parameters():
            t.data.copy_(tensors["block." + name.replace(".weight", "") + ".weight"].float())
    for i in range(k):
        heads.in_norm[i].data.copy_(tensors[f"heads.{i}.in_norm.weight"].float())
        heads.out_norm[i].data.copy_(tensors[f"heads.{i}.out_norm.weight"].float())
        heads.x_proj[i].weight.data.copy_(tensors[f"heads.{i}.x_proj.weight"].float())
        heads.e_proj[i].weight.data.copy_(tensors[f"heads.{i}.e_proj.weight"].float())
        heads.down_proj[i].weight.data.copy_(tensors[f"heads.{i}.down_proj.weight"].float())
    return heads.to(dev)


def target_pass(target, ids):
    """(final hidden rows after the final norm, logits) of the target."""
    h = target.model(input_ids=ids).last_hidden_state
    return h, target.lm_head(h)


def heads_loss(heads, target, w, weights):
    """sum_i weights[i] * KL(target at p+1+i || head i), over every position p of windows w."""
    k = heads.k
    with torch.no_grad():
        h, t_logits = target_pass(target, w)
    emb = target.get_input_embeddings().weight
    lm = target.lm_head
    p = w.shape[1] - k
    x = heads.features(h[:, :p], w[:, 1:1 + p], emb)
    total, per_head = 0.0, []
    for i in range(k):
        tok = w[:, 1 + i:1 + i + p]
        x, y = heads.step(i, x, F.embedding(tok, emb))
        s_logp = F.log_softmax(lm(y).float(), dim=-1)
        with torch.no_grad():
            t_logp = F.log_softmax(t_logits[:, 1 + i:1 + i + p].float(), dim=-1)
        kl = (t_logp.exp() * (t_logp - s_logp)).sum(-1).mean()
        with torch.no_grad():
            top1 = (s_logp.argmax(-1) == t_logp.argmax(-1)).float().mean()
        per_head.append((kl, top1))
        total = total + weights[i] * kl
    return total, per_head


@torch.no_grad()
def heads_propose(heads, target, x, k):
    """K greedy proposals after context x (its last token is t_0)."""
    h, _ = target_pass(target, x)
    emb = target.get_input_embeddings().weight
    cur, tok, props = heads.features(h[:, :-1], x[:, 1:], emb)[:, -1], x[:, -1], []
    for i in range(k):
        cur, y = heads.step(i, cur, F.embedding(tok, emb))
        tok = target.lm_head(y).float().argmax(-1)
        props.append(tok)
    return torch.stack(props, dim=1)


def heads_acceptance(heads, target, stream, k=4, positions=2000):
    """eval.py's acceptance() protocol with the heads as the proposer (the same positions)."""
    from eval import acceptance
    return acceptance(target, None, stream, k=k, positions=positions,
                      propose=lambda x: heads_propose(heads, target, x, k))


def evaluate(heads, target, args, dev, fh):
    from eval import acceptance, file_stream, load
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(os.path.join(args.target, "tokenizer.json"))
    draft = load(args.draft, dev, torch.bfloat16 if dev.type == "cuda" else torch.float32) \
        if args.draft else None
    out = {}
    heads.eval()
    for name in ("code", "prose"):
        s = file_stream(tok, os.path.join(args.eval_dir, name + ".txt"), dev)
        r = {"heads": heads_acceptance(heads, target, s, k=heads.k, positions=args.positions)}
        if draft is not None:
            r["draft"] = acceptance(target, draft, s, k=heads.k, positions=args.positions)
        out[name] = r
        log({"event": "acceptance", "file": name, **r}, fh)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=None, help="train.bin / val.bin / meta.json (not needed with --eval-only)")
    ap.add_argument("--target", required=True, help="the target's Hugging Face directory")
    ap.add_argument("--out", required=True, help="heads file to write (or read, with --eval-only)")
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--ffn", type=int, default=128)
    ap.add_argument("--block", default="", help="HEADS,HEAD_DIM,FFN: add the attention block (file version 2)")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--batch", type=int, default=64, help="windows per step")
    ap.add_argument("--window", type=int, default=256, help="tokens per window")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--wd", type=float, default=0.0)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--steps", type=int, default=0, help="fixed step count (overrides --budget-s)")
    ap.add_argument("--budget-s", type=float, default=150.0)
    ap.add_argument("--log-every", type=int, default=50)
    ap.add_argument("--eval-every", type=int, default=500)
    ap.add_argument("--log", default=None)
    ap.add_argument("--draft", default=None, help="also measure this draft on the same positions")
    ap.add_argument("--eval-dir", default="tests/data/eval")
    ap.add_argument("--positions", type=int, default=2000)
    ap.add_argument("--eval-only", action="store_true")
    ap.add_argument("--json", default=None)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()

    from transformers import AutoModelForCausalLM
    torch.manual_seed(args.seed)
    dev = torch.device(args.device)
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    fh = open(args.log, "a") if args.log else None
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    target = AutoModelForCausalLM.from_pretrained(args.target, dtype=dtype,
                                                  attn_implementation="sdpa").to(dev).eval()
    for p in target.parameters():
        p.requires_grad_(False)
    vocab = target.config.vocab_size
    hidden = target.config.hidden_size

    if args.eval_only:
        heads = load_heads(args.out, dev)
        res = evaluate(heads, target, args, dev, fh)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"acceptance": res}, f, indent=1)
        return

    train = load_stream(os.path.join(args.data, "train.bin"), dev)
    val = load_stream(os.path.join(args.data, "val.bin"), dev)
    gen = torch.Generator(device=dev)
    gen.manual_seed(args.seed)
    L = args.window + args.heads
    with torch.no_grad():  # out_norm starts at the scale of the target's final norm
        w = windows_at(train, torch.randint(0, train.numel() - L, (8,), device=dev, generator=gen), L)
        h, _ = target_pass(target, w)
        init = target.model.norm.weight.float().abs().mean() * torch.ones(hidden, device=dev)
    block = tuple(int(v) for v in args.block.split(",")) if args.block else None
    heads = Heads(args.heads, hidden, args.ffn, init, block).to(dev)
    n_params = sum(p.numel() for p in heads.parameters())
    weights = [0.8 ** i for i in range(args.heads)]
    log({"event": "start", "params": n_params, "args": vars(args), "torch": torch.__version__,
         "device": torch.cuda.get_device_name(0) if dev.type == "cuda" else "cpu",
         "train_tokens": train.numel()}, fh)
    decay = [p for n, p in heads.named_parameters() if p.dim() == 2]
    other = [p for n, p in heads.named_parameters() if p.dim() != 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.wd},
                             {"params": other, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8)
    ac = torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda")

    def val_loss(n_batches=8):
        g = torch.Generator(device=dev)
        g.manual_seed(7)
        heads.eval()
        tot, tops = 0.0, np.zeros(args.heads)
        with torch.no_grad(), ac:
            for _ in range(n_batches):
                w = windows_at(val, torch.randint(0, val.numel() - L, (args.batch,), device=dev,
                                                  generator=g), L)
                loss, ph = heads_loss(heads, target, w, weights)
                tot += loss.item()
                tops += np.array([t.item() for _, t in ph])
        heads.train()
        return tot / n_batches, (tops / n_batches).tolist()

    total = args.steps if args.steps else 10 ** 9
    t0 = time.time()
    step = 0
    t5 = None
    while step < total:
        lr = lr_at(step, total if args.steps or t5 is None or step > 35 else 10 ** 9, args.lr,
                   args.warmup)
        for g in opt.param_groups:
            g["lr"] = lr
        w = windows_at(train, torch.randint(0, train.numel() - L, (args.batch,), device=dev,
                                            generator=gen), L)
        with ac:
            loss, ph = heads_loss(heads, target, w, weights)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(heads.parameters(), 1.0)
        opt.step()
        step += 1
        if step == 5:
            if dev.type == "cuda":
                torch.cuda.synchronize()
            t5 = time.time()
        if step == 35 and not args.steps:
            if dev.type == "cuda":
                torch.cuda.synchronize()
            per = (time.time() - t5) / 30
            total = max(step + 1, int((args.budget_s - (time.time() - t0)) / (per * 1.05)) + step)
            log({"event": "schedule", "step_s": per, "total_steps": total}, fh)
        if step % args.log_every == 0 or step == total:
            log({"event": "train", "step": step, "lr": lr, "loss": loss.item(),
                 "kl": [k.item() for k, _ in ph], "top1": [t.item() for _, t in ph],
                 "gnorm": gnorm.item(), "elapsed_s": time.time() - t0}, fh)
        if step % args.eval_every == 0 and step != total:
            vl, vt = val_loss()
            log({"event": "val_partial", "step": step, "val_loss": vl, "val_top1": vt}, fh)
    vl, vt = val_loss(32)
    log({"event": "val", "step": step, "val_loss": vl, "val_top1": vt,
         "train_s": time.time() - t0, "tokens_seen": step * args.batch * L}, fh)
    save_heads(heads, vocab, args.out)
    log({"event": "exported", "out": args.out, "bytes": os.path.getsize(args.out)}, fh)
    res = evaluate(load_heads(args.out, dev), target, args, dev, fh) if args.positions > 0 else {}
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"val_loss": vl, "val_top1": vt, "acceptance": res}, f, indent=1)
    if fh:
        fh.close()


if __name__ == "__main__":
    sys.exit(main())
