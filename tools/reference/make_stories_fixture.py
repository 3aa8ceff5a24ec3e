"""Greedy continuation of stories260K computed by the independent float64 numpy forward of
gguf_numpy_forward.py over ../shared/models/stories260K-gguf/stories260K.gguf (the same weights as
the llama2.c checkpoint). The engine's test runs the llama2.c checkpoint and must reproduce these
ids exactly.

    /path/to/venv/bin/python tools/reference/make_stories_fixture.py ../shared/models/stories260K-gguf/stories260K.gguf
"""

import json
import sys

import numpy as np

import gguf_numpy_forward as ref

# "Once upon a time" through the stories260K tokenizer (tok512.bin): BOS, then the pieces.
PROMPT_IDS = [1, 403, 407, 261, 378]
STEPS = 64


def main(path: str, out: str) -> None:
    meta, tensors, _ = ref.read_gguf(path)
    ids = list(PROMPT_IDS)
    margins = []
    for _ in range(STEPS):
        logits = ref.forward(meta, tensors, ids)[-1]
        top2 = np.sort(logits)[-2:]
        margins.append(float(top2[1] - top2[0]))
        ids.append(int(np.argmax(logits)))
    result = {
        "source": "numpy float64 forward over stories260K.gguf (tools/reference/gguf_numpy_forward.py)",
        "prompt_ids": PROMPT_IDS,
        "greedy_ids": ids[len(PROMPT_IDS):],
        "min_top2_margin": min(margins),
    }
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "tests/fixtures/models/stories260K_greedy.json")
