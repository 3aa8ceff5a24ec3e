#!/usr/bin/env python3
"""Train the bundled Llama-architecture models (target, then a distilled draft).

  train.py target --data DATA --tokenizer TOK --out DIR [--budget-s 300 | --steps N]
  train.py draft  --data DATA --tokenizer TOK --out DIR --teacher TARGET_DIR [...]

DATA holds train.bin / val.bin (uint16 token streams from tokenize_corpus.py); --split train.code
(or train.prose) trains on one kind of text, validated on val.code (val.prose).
The model is transformers' LlamaForCausalLM (RMSNorm, RoPE, SwiGLU, GQA), so
the export is a plain Hugging Face directory: config.json, model.safetensors
(bf16), generation_config.json and the tokenizer files.

Training: seeded; random 512-token windows of the training stream; AdamW with
linear warmup then cosine decay to 10% of the peak rate; bf16 autocast over
fp32 master weights; gradient clipping at 1.0.  With --budget-s the number of
steps is fixed after a short timing phase (the step count is logged, and
--steps N replays the same schedule).  The draft minimises
  alpha * CE(labels) + (1 - alpha) * KL(teacher || draft)
on the teacher's (target's) logits.  On the GPU the KL term and its gradient
come from one Triton kernel (fused_kl.py; --no-fused for the eager version),
checked against the eager version at the start; with alpha = 0 the
cross-entropy is only computed, without gradient, for the logged steps.
Every log line is JSON on stdout; --log also writes them to a file.
"""
import argparse
import copy
import json
import math
import os
import shutil
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

PRESETS = {
    # hidden 256 and intermediate 640 are multiples of 128 (int4 group size)
    "target": dict(hidden_size=256, intermediate_size=640, num_hidden_layers=10,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=64),
    "draft": dict(hidden_size=128, intermediate_size=256, num_hidden_layers=6,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=32),
    # a deeper draft with a wider MLP (2.43 M parameters; 384 = 3 x 128)
    "draft7": dict(hidden_size=128, intermediate_size=384, num_hidden_layers=7,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=32),
    # for quick CPU checks of the pipeline
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=2, num_key_value_heads=1, head_dim=32),
}
CTX = 512
ROPE_THETA = 10000.0
SLICE_WINDOWS = 64  # the validation slice re-checked on the CPU after export
BOS, EOS, PAD, IM_END = 0, 1, 2, 4


def log(rec, fh=None):
    line = json.dumps(rec)
    print(line, flush=True)
    if fh:
        fh.write(line + "\n")
        fh.flush()


def make_config(preset, vocab):
    from transformers import LlamaConfig
    return LlamaConfig(
        vocab_size=vocab, max_position_embeddings=CTX, rms_norm_eps=1e-5, rope_theta=ROPE_THETA,
        hidden_act="silu", attention_bias=False, mlp_bias=False, tie_word_embeddings=True,
        bos_token_id=BOS, eos_token_id=EOS, pad_token_id=PAD, initializer_range=0.02,
        **PRESETS[preset])


def load_stream(path, device):
    arr = np.fromfile(path, dtype=np.uint16).astype(np.int64)
    return torch.from_numpy(arr).to(device)


def windows_at(stream, starts, length):
    return stream[starts[:, None] + torch.arange(length, device=stream.device)[None, :]]


@torch.no_grad()
def stream_loss(model, stream, batch=64, ctx=CTX, max_windows=None, autocast=True):
    """Mean next-token loss over non-overlapping ctx-token windows of a stream."""
    model.eval()
    n = (stream.numel() - 1) // ctx
    if max_windows:
        n = min(n, max_windows)
    total, count = 0.0, 0
    dev = stream.device
    for b in range(0, n, batch):
        starts = torch.arange(b, min(n, b + batch), device=dev) * ctx
        w = windows_at(stream, starts, ctx + 1)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=autocast and dev.type == "cuda"):
            logits = model(input_ids=w[:, :-1]).logits
        loss = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), w[:, 1:].reshape(-1),
                               reduction="sum")
        total += loss.item()
        count += w[:, 1:].numel()
    model.train()
    return total / count, count


def lr_at(step, total, peak, warmup, floor=0.1):
    if step < warmup:
        return peak * (step + 1) / warmup
    t = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * t)))


def param_groups(model, wd):
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (decay if p.dim() == 2 and "embed_tokens" not in name else no_decay).append(p)
    return [{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}]


def export(model, tok_dir, out_dir):
    """Write a Hugging Face directory with bf16 weights."""
    from transformers import GenerationConfig
    os.makedirs(out_dir, exist_ok=True)
    m = copy.deepcopy(model).to(torch.bfloat16)
    m.config.use_cache = True
    m.save_pretrained(out_dir, safe_serialization=True)
    cfg_path = os.path.join(out_dir, "config.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    # Spell out the fields that readers of older transformers versions look
    # for, next to the ones the writing version uses.
    cfg["torch_dtype"] = "bfloat16"
    cfg["dtype"] = "bfloat16"
    cfg["rope_theta"] = ROPE_THETA
    cfg.setdefault("rope_scaling", None)
    with open(cfg_path, "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")
    os.chmod(os.path.join(out_dir, "model.safetensors"), 0o644)
    GenerationConfig(bos_token_id=BOS, eos_token_id=[EOS, IM_END], pad_token_id=PAD,
                     do_sample=False).save_pretrained(out_dir)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(tok_dir, name), os.path.join(out_dir, name))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("role", choices=["target", "draft"])
    ap.add_argument("--data", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--preset", default=None, help="model shape (default: the role's)")
    ap.add_argument("--teacher", default=None, help="exported target directory (draft only)")
    ap.add_argument("--alpha", type=float, default=0.0, help="weight of the hard-label loss (draft)")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--batch", type=int, default=256, help="sequences per step")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--wd", type=float, default=0.1)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--steps", type=int, default=0, help="fixed step count (overrides --budget-s)")
    ap.add_argument("--budget-s", type=float, default=300.0, help="training wall-clock budget")
    ap.add_argument("--max-epochs", type=float, default=0.0,
                    help="with --budget-s: stop the schedule at this many passes over the data")
    ap.add_argument("--eval-every", type=int, default=250)
    ap.add_argument("--log-every", type=int, default=50)
    ap.add_argument("--log", default=None)
    ap.add_argument("--no-fused", action="store_true", help="eager KL (draft)")
    ap.add_argument("--init", default=None,
                    help="start from this exported model's weights (same preset): fine-tune a draft on one kind")
    ap.add_argument("--split", default="train",
                    help="training stream: train, train.code or train.prose (validated on the matching val)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()

    from transformers import AutoModelForCausalLM, LlamaForCausalLM

    torch.manual_seed(args.seed)
    np.random.seed(args.seed)
    dev = torch.device(args.device)
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    fh = open(args.log, "a") if args.log else None

    with open(os.path.join(args.data, "meta.json")) as f:
        meta = json.load(f)
    vocab = meta["vocab_size"]
    train = load_stream(os.path.join(args.data, args.split + ".bin"), dev)
    val = load_stream(os.path.join(args.data, args.split.replace("train", "val", 1) + ".bin"), dev)

    preset = args.preset or args.role
    cfg = make_config(preset, vocab)
    model = LlamaForCausalLM._from_config(cfg, attn_implementation="sdpa").to(dev)
    if args.init:
        init = AutoModelForCausalLM.from_pretrained(args.init, dtype=torch.float32)
        missing, unexpected = model.load_state_dict(init.state_dict(), strict=False)
        # a tied LM head is not a separate tensor; anything else missing is a shape mismatch
        bad = [k for k in missing if k != "lm_head.weight"] + list(unexpected)
        assert not bad, "--init %s does not match preset %s: %s" % (args.init, preset, bad[:4])
        del init
    model.train()
    n_params = sum(p.numel() for p in model.parameters())
    teacher = None
    if args.role == "draft":
        assert args.teacher, "--teacher is required for the draft"
        teacher = AutoModelForCausalLM.from_pretrained(args.teacher, dtype=torch.bfloat16,
                                                       attn_implementation="sdpa").to(dev)
        teacher.eval()
        for p in teacher.parameters():
            p.requires_grad_(False)
    fused = None
    if teacher is not None and not args.no_fused and (
            dev.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"):
        # The fused kernel, if it builds and agrees with the eager version on
        # real logits (bf16 rounding of the gradient aside); else eager.
        try:
            from fused_kl import check, fused_kl
            g0 = torch.Generator(device=dev)
            g0.manual_seed(args.seed + 1)
            starts = torch.randint(0, train.numel() - CTX - 1, (2,), device=dev, generator=g0)
            w = windows_at(train, starts, CTX)
            with torch.no_grad(), torch.autocast(dev.type, dtype=torch.bfloat16,
                                                 enabled=dev.type == "cuda"):
                s_l = model(input_ids=w).logits
                t_l = teacher(input_ids=w).logits
            dl, dg = check(s_l, t_l)
            ok = dl < 1e-3 and dg < 2e-2
            log({"event": "fused_kl_check", "loss_rel_diff": dl, "grad_rel_diff": dg, "used": ok}, fh)
            if ok:
                fused = fused_kl
        except Exception as e:  # noqa: BLE001
            log({"event": "fused_kl_check", "error": repr(e), "used": False}, fh)
    log({"event": "start", "role": args.role, "preset": preset, "params": n_params,
         "config": PRESETS[preset], "train_tokens": train.numel(), "val_tokens": val.numel(),
         "args": vars(args), "torch": torch.__version__,
         "device": torch.cuda.get_device_name(0) if dev.type == "cuda" else "cpu"}, fh)

    opt = torch.optim.AdamW(param_groups(model, args.wd), lr=args.lr, betas=(0.9, 0.95), eps=1e-8,
                            fused=dev.type == "cuda")
    gen = torch.Generator(device=dev)
    gen.manual_seed(args.seed)
    n_windows = train.numel() - CTX - 1
    total = args.steps if args.steps else 10 ** 9
    timing_steps = 30
    t0 = time.time()
    t_timing = None
    t5 = t0
    step = 0
    tokens = 0
    while step < total:
        lr = lr_at(step, total if args.steps or t_timing else 10 ** 9, args.lr, args.warmup)
        for g in opt.param_groups:
            g["lr"] = lr
        starts = torch.randint(0, n_windows, (args.batch,), device=dev, generator=gen)
        w = windows_at(train, starts, CTX + 1)
        x, y = w[:, :-1], w[:, 1:]
        logged = (step + 1) % args.log_every == 0 or step + 1 == total
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
            logits = model(input_ids=x).logits
            if teacher is None or args.alpha > 0:
                ce = F.cross_entropy(logits.float().reshape(-1, vocab), y.reshape(-1))
            elif logged:
                with torch.no_grad():  # for the log only
                    ce = F.cross_entropy(logits.detach().float().reshape(-1, vocab), y.reshape(-1))
            else:
                ce = None
            if teacher is not None:
                with torch.no_grad():
                    t_logits = teacher(input_ids=x).logits
                if fused is not None:
                    kl = fused(logits, t_logits)
                else:
                    t_logp = F.log_softmax(t_logits.float(), dim=-1)
                    s_logp = F.log_softmax(logits.float(), dim=-1)
                    kl = (t_logp.exp() * (t_logp - s_logp)).sum(-1).mean()
                del t_logits
                loss = args.alpha * ce + (1 - args.alpha) * kl if args.alpha > 0 else kl
            else:
                kl = None
                loss = ce
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        tokens += x.numel()

        if step == 5:
            if dev.type == "cuda":
                torch.cuda.synchronize()
            t5 = time.time()
        if step == 5 + timing_steps and not args.steps:
            if dev.type == "cuda":
                torch.cuda.synchronize()
            per_step = (time.time() - t5) / timing_steps
            # evaluation passes cost time too: allow ~4% for them
            total = max(step + 1, int((args.budget_s - (time.time() - t0)) / (per_step * 1.04)) + step)
            by_budget = total
            if args.max_epochs:
                total = max(step + 1, min(total, int(args.max_epochs * train.numel() / x.numel())))
            t_timing = per_step
            log({"event": "schedule", "step_s": per_step, "tokens_per_s": x.numel() / per_step,
                 "total_steps": total, "steps_by_budget": by_budget}, fh)
        if logged:
            rec = {"event": "train", "step": step, "lr": lr, "loss": loss.item(), "ce": ce.item(),
                   "gnorm": gnorm.item(), "tokens": tokens, "elapsed_s": time.time() - t0}
            if kl is not None:
                rec["kl"] = kl.item()
            log(rec, fh)
        if step % args.eval_every == 0 and step != total:
            vl, _ = stream_loss(model, val, max_windows=128)
            log({"event": "val_partial", "step": step, "val_loss": vl, "elapsed_s": time.time() - t0}, fh)

    train_s = time.time() - t0
    vl, vn = stream_loss(model, val)
    sl, sn = stream_loss(model, val, max_windows=SLICE_WINDOWS)
    log({"event": "val", "step": step, "val_loss": vl, "val_ppl": math.exp(vl), "val_tokens": vn,
         "val_slice_loss": sl, "val_slice_tokens": sn,
         "train_tokens_seen": tokens, "train_s": train_s, "epochs": tokens / train.numel()}, fh)
    export(model, args.tokenizer, args.out)
    log({"event": "exported", "out": args.out}, fh)
    if fh:
        fh.close()


if __name__ == "__main__":
    sys.exit(main())
