#!/usr/bin/env python3
"""Measure the exported models: perplexity and greedy speculative acceptance.

  eval.py --target models/tachyon-demo --draft models/tachyon-demo-draft \
          [--val DATA/val.bin] [--eval-dir tests/data/eval] [--positions 2000] [--json OUT]

Loads both directories with transformers' AutoModelForCausalLM (so this also
checks that the export is standard).  Perplexity is the mean next-token loss
over non-overlapping 512-token windows of a token stream: the validation split
(val.bin) and each evaluation file (BOS + its tokens).

Acceptance at K: at sampled positions p of an evaluation file, with the 256
preceding tokens as context, the draft proposes K tokens greedily; the target
scores context + proposals in one pass; the proposals accepted are the longest
prefix equal to the target's own greedy choices.  Reported: mean accepted
tokens per step, acceptance rate = accepted / proposed, and tokens per target
pass (accepted + 1).  With --gen-prompts N the same is also measured along
greedy speculative generation from N prompts per file (the context then grows
with the target's own output, as in an engine).
"""
import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train import SLICE_WINDOWS, stream_loss  # noqa: E402


def load(path, dev, dtype):
    from transformers import AutoModelForCausalLM
    m = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="sdpa")
    return m.to(dev).eval()


def file_stream(tok, path, dev):
    with open(path, encoding="utf-8") as f:
        ids = tok.encode(f.read()).ids  # the post-processor adds BOS
    return torch.tensor(ids, dtype=torch.int64, device=dev)


@torch.no_grad()
def acceptance(target, draft, stream, k=4, positions=2000, ctx=256, batch=128, seed=0, propose=None):
    """Greedy acceptance at sampled positions. The proposer is `draft` (a model, proposing greedily)
    or `propose(context) -> [n, k] tokens`; top-1 agreement on the text is reported for a draft."""
    dev = stream.device
    g = np.random.default_rng(seed)
    pos = g.choice(np.arange(ctx, stream.numel() - k), size=min(positions, stream.numel() - ctx - k),
                   replace=False)
    pos.sort()
    hist = np.zeros(k + 1, dtype=np.int64)
    agree, agree_n = 0, 0
    ac = torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda")
    for b in range(0, len(pos), batch):
        p = torch.tensor(pos[b:b + batch], device=dev)
        x = stream[p[:, None] + torch.arange(-ctx, 0, device=dev)[None, :]]
        with ac:
            if propose is not None:
                props = propose(x)
            else:
                cur = x
                for _ in range(k):
                    nxt = draft(input_ids=cur).logits[:, -1].float().argmax(-1)
                    cur = torch.cat([cur, nxt[:, None]], dim=1)
                props = cur[:, ctx:]
            cur = torch.cat([x, props], dim=1)
            tl = target(input_ids=cur).logits[:, ctx - 1:ctx - 1 + k].float().argmax(-1)
            if draft is not None:
                # teacher-forced top-1 agreement on the real text
                dl = draft(input_ids=x).logits.float().argmax(-1)
                tl2 = target(input_ids=x).logits.float().argmax(-1)
                agree += (dl == tl2).sum().item()
                agree_n += dl.numel()
        match = (props == tl).int()
        acc = match.cumprod(dim=1).sum(dim=1)
        hist += np.bincount(acc.cpu().numpy(), minlength=k + 1)
    n = hist.sum()
    mean_acc = float((hist * np.arange(k + 1)).sum() / n)
    out = {"k": k, "positions": int(n), "context": ctx, "mean_accepted": mean_acc,
           "acceptance_rate": mean_acc / k, "tokens_per_target_pass": mean_acc + 1,
           "accepted_histogram": hist.tolist()}
    if agree_n:
        out["top1_agreement"] = agree / agree_n
    return out


@torch.no_grad()
def generation_acceptance(target, draft, stream, k=4, prompts=16, prompt_len=128, new_tokens=64,
                          seed=1):
    """Greedy speculative decoding from prompts cut out of a stream.

    Unlike acceptance(), the context grows with the target's own greedy output,
    as it does when an engine decodes with a draft: each step the draft proposes
    k tokens, the target keeps the longest matching prefix plus its own next
    token.  The output is the target's greedy continuation by construction.
    """
    dev = stream.device
    g = np.random.default_rng(seed)
    starts = g.choice(np.arange(0, stream.numel() - prompt_len), size=prompts, replace=False)
    ac = torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda")
    accepted = proposed = steps = produced = 0
    hist = np.zeros(k + 1, dtype=np.int64)
    same_as_greedy = None
    for i, s0 in enumerate(sorted(starts.tolist())):
        seq = stream[s0:s0 + prompt_len][None, :]
        made = 0
        while made < new_tokens:
            cur = seq
            with ac:
                for _ in range(k):
                    nxt = draft(input_ids=cur).logits[:, -1].float().argmax(-1)
                    cur = torch.cat([cur, nxt[:, None]], dim=1)
                n = seq.shape[1]
                tl = target(input_ids=cur).logits[0, n - 1:n + k].float().argmax(-1)
            props = cur[0, n:]
            a = int((props == tl[:k]).int().cumprod(0).sum().item())
            seq = torch.cat([seq, props[None, :a], tl[None, a:a + 1]], dim=1)
            accepted += a
            proposed += k
            steps += 1
            made += a + 1
            hist[a] += 1
        produced += made
        if i == 0:
            # the first prompt again with plain greedy decoding: must be identical
            ref = stream[s0:s0 + prompt_len][None, :]
            while ref.shape[1] < seq.shape[1]:
                with ac:
                    nxt = target(input_ids=ref).logits[:, -1].float().argmax(-1)
                ref = torch.cat([ref, nxt[:, None]], dim=1)
            same_as_greedy = bool(torch.equal(ref, seq))
    return {"same_as_plain_greedy_first_prompt": same_as_greedy,"k": k, "prompts": prompts, "prompt_tokens": prompt_len, "new_tokens_each": new_tokens,
            "steps": steps, "mean_accepted": accepted / steps, "acceptance_rate": accepted / proposed,
            "tokens_per_target_pass": produced / steps, "accepted_histogram": hist.tolist()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", required=True)
    ap.add_argument("--draft", required=True)
    ap.add_argument("--val", default=None, help="val.bin token stream")
    ap.add_argument("--val-windows", type=int, default=0, help="only the first N windows of val")
    ap.add_argument("--eval-dir", default="tests/data/eval")
    ap.add_argument("--eval-windows", type=int, default=0, help="only the first N windows per file")
    ap.add_argument("--positions", type=int, default=2000)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--fp32", action="store_true", help="load weights as float32 (CPU check)")
    ap.add_argument("--gen-prompts", type=int, default=0,
                    help="also measure acceptance along greedy generation from N prompts per file")
    ap.add_argument("--skip-ppl", action="store_true")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    from tokenizers import Tokenizer
    dev = torch.device(args.device)
    dtype = torch.float32 if args.fp32 or dev.type == "cpu" else torch.bfloat16
    models = {"target": load(args.target, dev, dtype), "draft": load(args.draft, dev, dtype)}
    tok = Tokenizer.from_file(os.path.join(args.target, "tokenizer.json"))
    out = {"device": str(dev), "dtype": str(dtype), "perplexity": {}, "acceptance": {}}
    t0 = time.time()

    streams = {}
    if args.val:
        arr = np.fromfile(args.val, dtype=np.uint16).astype(np.int64)
        streams["val"] = (torch.from_numpy(arr).to(dev), args.val_windows or None)
        streams["val_slice"] = (streams["val"][0], SLICE_WINDOWS)
    for name in ("code", "prose"):
        path = os.path.join(args.eval_dir, name + ".txt")
        streams["eval_" + name] = (file_stream(tok, path, dev), args.eval_windows or None)
    for sname, (s, nwin) in streams.items() if not args.skip_ppl else ():
        for mname, m in models.items():
            loss, n = stream_loss(m, s, max_windows=nwin, autocast=dtype != torch.float32)
            out["perplexity"].setdefault(sname, {})[mname] = {
                "loss": loss, "ppl": math.exp(loss), "tokens": n}
            print(sname, mname, "loss %.4f ppl %.2f (%d tokens)" % (loss, math.exp(loss), n),
                  flush=True)
    for name in ("code", "prose") if args.positions > 0 else ():
        s = streams["eval_" + name][0]
        r = acceptance(models["target"], models["draft"], s, k=args.k, positions=args.positions)
        out["acceptance"][name] = r
        print("acceptance", name, json.dumps(r), flush=True)
    for name in ("code", "prose") if args.gen_prompts > 0 else ():
        s = streams["eval_" + name][0]
        r = generation_acceptance(models["target"], models["draft"], s, k=args.k,
                                  prompts=args.gen_prompts)
        out.setdefault("generation_acceptance", {})[name] = r
        print("generation acceptance", name, json.dumps(r), flush=True)
    out["seconds"] = time.time() - t0
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
