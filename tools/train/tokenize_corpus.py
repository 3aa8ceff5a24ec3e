#!/usr/bin/env python3
"""Tokenize the corpus into flat uint16 token streams.

Usage: tokenize_corpus.py TOKENIZER_DIR CORPUS_DIR OUT_DIR [--chat-fraction 0.03]

CORPUS_DIR holds train.jsonl and val.jsonl (from build_corpus.py).  Each
document becomes BOS + tokens + EOS.  A small, fixed (hash-chosen) fraction of
training documents is wrapped as a ChatML exchange -- the user gives the
opening of the document and asks for a continuation, the assistant answers
with the rest and closes with <|im_end|> -- so that the chat template the
tokenizer ships produces sensible turns.  Validation documents are never
wrapped.  Writes OUT_DIR/{train,val}.bin (uint16) and meta.json, and the same documents split
by kind: OUT_DIR/{train,val}.code.bin (Go and Python) and {train,val}.prose.bin (documentation
and literature), for drafts trained on one kind (train.py --split train.code).
"""
import argparse
import hashlib
import json
import os

import numpy as np
from tokenizers import Tokenizer

LANG = {"code-go": "Go code", "code-python": "Python code"}
KINDS = {"code": ("code-go", "code-python"), "prose": ("prose-docs", "prose-lit")}


def doc_hash(rec):
    h = hashlib.sha256(("chat\x1f" + rec["pkg"] + "\x1f" + rec["path"]).encode()).digest()
    return int.from_bytes(h[:8], "big") / 2 ** 64


def split_for_chat(text, max_prompt=400, max_answer=2000):
    """(prompt part, answer part) of a document, cut at line ends."""
    lines = text.splitlines(keepends=True)
    prompt, k = "", 0
    while k < len(lines) and len(prompt) + len(lines[k]) <= max_prompt:
        prompt += lines[k]
        k += 1
        if len(prompt) > max_prompt // 3 and lines[k - 1].strip() == "":
            break
    answer = ""
    while k < len(lines) and len(answer) + len(lines[k]) <= max_answer:
        answer += lines[k]
        k += 1
    return prompt.strip("\n"), answer.strip("\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("tokenizer_dir")
    ap.add_argument("corpus_dir")
    ap.add_argument("out_dir")
    ap.add_argument("--chat-fraction", type=float, default=0.03)
    args = ap.parse_args()

    tok = Tokenizer.from_file(os.path.join(args.tokenizer_dir, "tokenizer.json"))
    sp = {s: tok.token_to_id(s) for s in
          ["<|begin_of_text|>", "<|end_of_text|>", "<|im_start|>", "<|im_end|>"]}
    bos, eos = sp["<|begin_of_text|>"], sp["<|end_of_text|>"]
    ims, ime = sp["<|im_start|>"], sp["<|im_end|>"]
    os.makedirs(args.out_dir, exist_ok=True)

    def enc(texts):
        return [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]

    meta = {"vocab_size": tok.get_vocab_size(), "dtype": "uint16", "splits": {}}
    for split in ("train", "val"):
        with open(os.path.join(args.corpus_dir, split + ".jsonl")) as f:
            recs = [json.loads(line) for line in f]
        plain, chat = [], []
        for i, r in enumerate(recs):
            if split == "train" and doc_hash(r) < args.chat_fraction:
                p, a = split_for_chat(r["text"])
                if p and a:
                    what = LANG.get(r["cat"], "text")
                    chat.append((i, "Continue this %s:\n%s" % (what, p), a))
                    continue
            plain.append(i)
        pieces = {}
        ids = enc([recs[i]["text"] for i in plain])
        for i, t in zip(plain, ids):
            pieces[i] = [bos] + t + [eos]
        if chat:
            users = enc([u for _, u, _ in chat])
            answers = enc([a for _, _, a in chat])
            user_tag, asst_tag, nl = enc(["user\n", "assistant\n", "\n"])
            for (i, _, _), u, a in zip(chat, users, answers):
                pieces[i] = ([bos, ims] + user_tag + u + [ime] + nl + [ims] + asst_tag + a
                             + [ime] + nl + [eos])
        stream = np.fromiter((t for i in range(len(recs)) for t in pieces[i]), dtype=np.uint16)
        stream.tofile(os.path.join(args.out_dir, split + ".bin"))
        for kind, cats in KINDS.items():
            part = np.fromiter((t for i in range(len(recs)) if recs[i]["cat"] in cats for t in pieces[i]),
                               dtype=np.uint16)
            part.tofile(os.path.join(args.out_dir, split + "." + kind + ".bin"))
            meta.setdefault("kinds", {})[split + "." + kind] = int(part.size)
        nbytes = sum(len(r["text"].encode("utf-8")) for r in recs)
        meta["splits"][split] = {"docs": len(recs), "chat_docs": len(chat), "tokens": int(stream.size),
                                 "text_bytes": nbytes, "bytes_per_token": nbytes / stream.size}
        print(split, meta["splits"][split], flush=True)
    with open(os.path.join(args.out_dir, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1)


if __name__ == "__main__":
    main()
