#!/usr/bin/env python3
"""Greedy sample continuations from exported model directories (CPU, float32).

  samples.py models/tachyon-demo [models/tachyon-demo-draft ...] [--max-new 80]
"""
import argparse

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

PROMPTS = [
    ("go", "func (s *Server) handleRequest(w http.ResponseWriter, r *http.Request) {\n"),
    ("go", "func (b *Buffer) WriteString(s string) (n int, err error) {\n"),
    ("python", "import os\n\ndef list_files(directory):\n"),
    ("english", "The old house at the end of the lane had been empty for many years, and"),
    ("english", "It was a bright cold day in April, and"),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="+")
    ap.add_argument("--max-new", type=int, default=80)
    ap.add_argument("--chat", action="store_true", help="also answer one chat turn")
    args = ap.parse_args()
    torch.manual_seed(0)
    for path in args.models:
        tok = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        for name, prompt in PROMPTS:
            ids = tok(prompt, return_tensors="pt").input_ids
            out = model.generate(ids, max_new_tokens=args.max_new, do_sample=False)
            text = tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
            print("=== %s | %s\n%s\u2588%s\n" % (path, name, prompt, text))
        if args.chat:
            msgs = [{"role": "user", "content": "Continue this text:\nIt was a fine morning in June"}]
            ids = tok.apply_chat_template(msgs, add_generation_prompt=True, return_tensors="pt",
                                          return_dict=True)["input_ids"]
            out = model.generate(ids, max_new_tokens=args.max_new, do_sample=False)
            print("=== %s | chat\n%s\n" % (path, tok.decode(out[0, ids.shape[1]:])))


if __name__ == "__main__":
    main()
