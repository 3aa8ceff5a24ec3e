#!/usr/bin/env python3
"""Train the byte-level BPE tokenizer shared by the bundled models.

Usage: train_tokenizer.py TRAIN_JSONL OUT_DIR [--vocab 8192]

Writes OUT_DIR/tokenizer.json (Hugging Face `tokenizers` format) and
OUT_DIR/tokenizer_config.json.  Pre-tokenization: the Llama-3 style split
regex, then GPT-2 byte-to-unicode mapping; the post-processor adds BOS.
"""
import argparse
import json
import os

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

BOS = "<|begin_of_text|>"
EOS = "<|end_of_text|>"
PAD = "<|pad|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIALS = [BOS, EOS, PAD, IM_START, IM_END]

SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

MAX_LEN = 512


def build(vocab_size):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    return tok, trainer


def finish(tok):
    bos_id = tok.token_to_id(BOS)
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(
            single=BOS + " $A",
            pair=BOS + " $A " + BOS + " $B",
            special_tokens=[(BOS, bos_id)],
        ),
    ])
    return tok


def tokenizer_config():
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": PAD,
        "unk_token": None,
        "add_bos_token": True,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": MAX_LEN,
        "chat_template": CHAT_TEMPLATE,
    }


def texts(path):
    with open(path) as f:
        for line in f:
            yield json.loads(line)["text"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("train_jsonl")
    ap.add_argument("out_dir")
    ap.add_argument("--vocab", type=int, default=8192)
    args = ap.parse_args()

    tok, trainer = build(args.vocab)
    tok.train_from_iterator(texts(args.train_jsonl), trainer=trainer)
    finish(tok)
    assert tok.get_vocab_size() == args.vocab, tok.get_vocab_size()
    for i, s in enumerate(SPECIALS):
        assert tok.token_to_id(s) == i
    os.makedirs(args.out_dir, exist_ok=True)
    tok.save(os.path.join(args.out_dir, "tokenizer.json"))
    with open(os.path.join(args.out_dir, "tokenizer_config.json"), "w") as f:
        json.dump(tokenizer_config(), f, indent=2)
        f.write("\n")
    print("vocab", tok.get_vocab_size(), "->", args.out_dir)


if __name__ == "__main__":
    main()
