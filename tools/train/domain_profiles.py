#!/usr/bin/env python3
"""Token profiles of the corpus's text kinds, for the engine's choice of a draft per request.

  domain_profiles.py --corpus CORPUS/out --tokenizer models/tachyon-demo \
                     --out models/tachyon-demo/domains.safetensors [--eval-dir tests/data/eval]

Each kind ("code": Go and Python sources; "prose": documentation and literature) gets the
unigram log-probabilities of its training documents' tokens (BOS + text + EOS, as trained),
smoothed by adding ALPHA to every count, stored as f16 [vocab] tensors named after the kind, with
metadata format = tachyon-domain-profiles, version = 1, vocab_size, kinds, and the token count
of each kind. The engine (speculative/domain_classifier.h) scores a prompt with each profile and
picks the kind of the largest sum; a draft named after that kind drafts for the request.

With --eval-dir the choice is measured on the held-out evaluation files: every chunk of
MANIFEST.tsv, cut to its first N tokens for several N, scored by the same rule (f16 tables, sums
in f32 as the engine does), and the accuracy per kind printed and written (--json).
"""
import argparse
import json
import os
import sys

import numpy as np

KINDS = {"code": ("code-go", "code-python"), "prose": ("prose-docs", "prose-lit")}
ALPHA = 0.5


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", required=True, help="build_corpus.py's output (train.jsonl)")
    ap.add_argument("--tokenizer", required=True, help="directory holding tokenizer.json")
    ap.add_argument("--out", required=True)
    ap.add_argument("--eval-dir", default=None)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    from safetensors.numpy import save_file
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(os.path.join(args.tokenizer, "tokenizer.json"))
    vocab = tok.get_vocab_size()
    eos = tok.token_to_id("<|end_of_text|>")
    texts = {k: [] for k in KINDS}
    with open(os.path.join(args.corpus, "train.jsonl"), encoding="utf-8") as f:
        for line in f:
            rec = json.loads(line)
            for kind, cats in KINDS.items():
                if rec["cat"] in cats:
                    texts[kind].append(rec["text"])
    tables, meta = {}, {"format": "tachyon-domain-profiles", "version": "1", "vocab_size": str(vocab),
                        "kinds": ",".join(KINDS), "smoothing": str(ALPHA)}
    for kind, docs in texts.items():
        counts = np.zeros(vocab, np.float64)
        for i in range(0, len(docs), 256):
            for enc in tok.encode_batch(docs[i:i + 256]):
                counts += np.bincount(np.array(enc.ids + [eos]), minlength=vocab)
        meta["tokens_" + kind] = str(int(counts.sum()))
        p = (counts + ALPHA) / (counts.sum() + ALPHA * vocab)
        tables[kind] = np.log(p).astype(np.float16)
        print(f"{kind}: {len(docs)} documents, {int(counts.sum())} tokens", flush=True)
    save_file(tables, args.out, metadata=meta)
    print(f"wrote {args.out} ({os.path.getsize(args.out)} bytes)")

    if not args.eval_dir:
        return
    result = {}
    with open(os.path.join(args.eval_dir, "MANIFEST.tsv"), encoding="utf-8") as f:
        rows = [line.rstrip("\n").split("\t") for line in f][1:]
    blobs = {}
    for name in ("code.txt", "prose.txt"):
        with open(os.path.join(args.eval_dir, name), "rb") as f:
            blobs[name] = f.read()
    names = list(KINDS)
    t = np.stack([tables[k].astype(np.float32) for k in names])
    for n in (16, 32, 64, 128, 256):
        right, total = {k: 0 for k in names}, {k: 0 for k in names}
        for file, off, size, cat, *_ in rows:
            want = next(k for k, cats in KINDS.items() if cat in cats)
            text = blobs[file][int(off):int(off) + int(size)].decode("utf-8")
            ids = tok.encode(text).ids[:n + 1]  # BOS + the first n tokens
            got = names[int(np.argmax(t[:, ids].sum(axis=1)))]
            right[want] += got == want
            total[want] += 1
        result[str(n)] = {k: {"right": right[k], "chunks": total[k], "accuracy": right[k] / total[k]}
                          for k in names}
        print(f"prompt of {n} tokens: " + ", ".join(
            f"{k} {right[k]}/{total[k]} ({100 * right[k] / total[k]:.1f}%)" for k in names), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"accuracy": result, "metadata": meta}, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
