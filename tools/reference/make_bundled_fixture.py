"""Greedy continuations of the bundled models (models/tachyon-demo and models/tachyon-demo-draft)
computed by transformers in float32 (bf16 weights upcast), with the token ids of each prompt from
the `tokenizers` package. The engine's test must reproduce the prompt ids and the greedy ids
exactly.

    /path/to/venv/bin/python tools/reference/make_bundled_fixture.py
"""

import json

import torch
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM

MODELS = {"models/tachyon-demo": "tests/fixtures/models/tachyon_demo_greedy.json",
          "models/tachyon-demo-draft": "tests/fixtures/models/tachyon_demo_draft_greedy.json"}
PROMPTS = ["func (s *Server) handleRequest(w http.ResponseWriter, r *http.Request) {",
           "It is a truth universally acknowledged, that",
           "def fibonacci(n):\n    "]
STEPS = 24


def make(MODEL: str, path: str) -> None:
    torch.manual_seed(0)
    tok = Tokenizer.from_file(f"{MODEL}/tokenizer.json")
    model = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32, attn_implementation="eager").eval()
    cases = []
    for prompt in PROMPTS:
        ids = tok.encode(prompt).ids
        out = list(ids)
        margins = []
        with torch.no_grad():
            for _ in range(STEPS):
                logits = model(torch.tensor([out])).logits[0, -1]
                top2 = torch.topk(logits, 2).values
                margins.append(float(top2[0] - top2[1]))
                out.append(int(torch.argmax(logits)))
        cases.append({"prompt": prompt, "prompt_ids": ids, "greedy_ids": out[len(ids):],
                      "min_top2_margin": min(margins)})
    with open(path, "w") as f:
        json.dump({"source": f"transformers float32, {MODEL}", "cases": cases}, f, indent=1)
        f.write("\n")
    print(json.dumps(cases)[:800])


def main() -> None:
    for model, path in MODELS.items():
        make(model, path)


if __name__ == "__main__":
    main()
