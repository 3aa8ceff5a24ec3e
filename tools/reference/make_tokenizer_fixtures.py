"""Tokenizer conformance fixtures: a test corpus and the ids the reference implementations give
for it, for every real tokenizer under ../shared/tokenizers plus two small Hugging Face
tokenizer.json files trained here.

    /work/refvenv/bin/python tools/reference/make_tokenizer_fixtures.py [--shared ../shared] [--out tests/fixtures/tokenizer]

Needs `tokenizers`, `sentencepiece` (and nothing else: tiktoken files are read and merged by the
small rank-BPE below, checked against the `tiktoken` package when it is installed). Writes:

  corpus.json                  the test strings: {"name", "text"} or, for invalid UTF-8,
                               {"name", "hex"} (the raw bytes)
  expected_<tokenizer>.json    {"reference": how the ids were made, "parse_special": whether
                               special tokens in the text were recognized, "ids": one list per
                               corpus string (no BOS/EOS)}
  tiny_bytelevel/              a byte-level BPE tokenizer.json (Llama-3-style Split + ByteLevel,
                               NFC, ignore_merges, special and non-special added tokens,
                               TemplateProcessing BOS) + tokenizer_config.json
  tiny_metaspace/              a SentencePiece-style tokenizer.json (Metaspace prepend_scheme
                               "first", byte_fallback with <0x00>..<0xFF>, Metaspace decoder)
  expected_hf_variants.json    normalizer / pre-tokenizer variants over the GPT-2 and
                               tiny_metaspace vocabularies: their JSON and their ids

Invalid UTF-8 is replaced before tokenizing exactly as bytes.decode("utf-8", errors="replace")
does (each maximal invalid subpart becomes U+FFFD); the C++ tokenizer does the same.
"""

import argparse
import base64
import json
import os
import sys

import sentencepiece
import tokenizers
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                  r"\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                 r"\s*[\r\n]+|\s+(?!\S)|\s+")

ENGLISH = (
    "Once upon a time, in a small village at the edge of a great forest, there lived a girl named Lily. "
    "Every morning she walked to the river to fetch water, and every evening she told her little brother "
    "stories about the animals she had seen: a fox with a silver tail, two owls that argued like old men, "
    "and a bear who was afraid of bees. \"Is that true?\" he asked. \"Of course it isn't,\" she laughed, "
    "\"but it's a good story, isn't it?\" The villagers didn't believe her either; they'd heard it all "
    "before. Still, on the 3rd of May 1987, at 7:45 p.m., something happened that nobody could explain.\n"
)

GO_CODE = """package main

import (
\t"fmt"
\t"strings"
)

// Greet returns a greeting for name.
func Greet(name string) string {
\tif name == "" {
\t\treturn "Hello, World!"
\t}
\treturn fmt.Sprintf("Hello, %s!", strings.TrimSpace(name))
}
"""

PYTHON_CODE = """def fibonacci(n: int) -> list[int]:
    \"\"\"Return the first n Fibonacci numbers.\"\"\"
    a, b = 0, 1
    out = []
    for _ in range(n):
        out.append(a)
        a, b = b, a + b  # tuple swap
    return out


if __name__ == "__main__":
    print(fibonacci(10))  # [0, 1, 1, 2, 3, 5, 8, 13, 21, 34]
"""

C_CODE = """#include <stdio.h>

int main(int argc, char **argv) {
    for (int i = 0; i < argc; ++i) {
        printf("%d: %s\\n", i, argv[i]);
    }
    return argc > 1 ? 0 : -1;   /* done */
}
"""


def corpus():
    """(name, bytes) pairs. Every category the tokenizers treat specially appears at least once."""
    t = []

    def add(name, value):
        t.append((name, value.encode("utf-8") if isinstance(value, str) else value))

    add("empty", "")
    add("hello", "Hello world")
    add("hello-leading-space", " Hello world")
    add("hello-trailing-space", "Hello world ")
    add("one-space", " ")
    add("three-spaces", "   ")
    add("space-runs", "multiple    spaces   between     words  ")
    add("leading-spaces", "    four leading spaces")
    add("tabs", "\tindented\twith\ttabs\t")
    add("only-tabs", "\t\t\t")
    add("mixed-indent", " \t  \t mixed\t \tindent")
    add("newline", "line one\nline two")
    add("crlf", "line one\r\nline two\r\n")
    add("many-newlines", "\n\n\n\nfour newlines then text\n\n\n\n\n\n\n\n\nnine")
    add("space-newline", " \n \n \n")
    add("trailing-newline", "ends with newline\n")
    add("cr-only", "old\rmac\rline\rends")
    add("long-number", "1234567890123456789012345678901234567890")
    add("numbers", "3.14159, 2,718,281 and 1e-10; 0x7FFF 0b1010 -42 +7 1/2 100% $19.99")
    add("digit-groups", "3 33 333 3333 33333 333333 3333333 33333333 333333333")
    add("phone", "Call +1 (555) 010-9999 or 555.010.1234 ext. 7")
    add("punctuation", "Hello, world! How's it going? (fine) [ok] {yes} <no> 'quoted' \"double\" ...!!! ???")
    add("unicode-punctuation", "-- \u2014 \u2013 \u2026 \u00ab\u00bb \u201e\u201c \u00bf\u00a1 \u2018x\u2019")
    add("contractions", "I'm sure it's what they've said: we'll, you'd, they're, don't, can't, won't.")
    add("contractions-upper", "IT'S I'M THEY'RE WE'LL YOU'D DON'T 'S 'T 'RE 'VE 'M 'LL 'D")
    add("apostrophes", "' era, ''double'', the '90s, rock 'n' roll")
    add("code-go", GO_CODE)
    add("code-python", PYTHON_CODE)
    add("code-c", C_CODE)
    add("json", '{"key": [1, 2.5, null, true], "nested": {"a": "b\\n"}}')
    add("url-email", "See https://example.com/path?q=1&r=two#frag or mail a.b+c@example.org.")
    add("accented", "D\u00e9j\u00e0 vu, na\u00efve caf\u00e9, \u00c6r\u00f8sk\u00f8bing, \u0141\u00f3d\u017a, "
                    "\u00c5ngstr\u00f6m, S\u00e3o Paulo, Cura\u00e7ao, Stra\u00dfe, \u00c4pfel")
    add("combining", "e\u0301 vs \u00e9, n\u0303 vs \u00f1, A\u030a vs \u00c5")
    add("vietnamese", "C\u1eeda Vi\u1ec7t, ti\u1ebfng Vi\u1ec7t c\u00f3 d\u1ea5u")
    add("chinese", "\u4f60\u597d\uff0c\u4e16\u754c\uff01\u8fd9\u662f\u4e00\u4e2a\u6d4b\u8bd5\u3002\u6211\u4eec"
                   "\u559c\u6b22\u81ea\u7136\u8bed\u8a00\u5904\u7406\u3002")
    add("japanese", "\u6771\u4eac\u306f\u65e5\u672c\u306e\u9996\u90fd\u3067\u3059\u3002\u3072\u3089\u304c\u306a"
                    "\u3068\u30ab\u30bf\u30ab\u30ca\u3002")
    add("korean", "\uc548\ub155\ud558\uc138\uc694, \uc138\uacc4! \ud55c\uad6d\uc5b4 \ud14c\uc2a4\ud2b8"
                  "\uc785\ub2c8\ub2e4.")
    add("arabic", "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645! \u0647\u0630\u0627 "
                  "\u0627\u062e\u062a\u0628\u0627\u0631 \u0661\u0662\u0663.")
    add("hebrew", "\u05e9\u05dc\u05d5\u05dd \u05e2\u05d5\u05dc\u05dd")
    add("hindi", "\u0928\u092e\u0938\u094d\u0924\u0947 \u0926\u0941\u0928\u093f\u092f\u093e")
    add("thai", "\u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35\u0e0a\u0e32\u0e27\u0e42\u0e25\u0e01")
    add("russian", "\u041f\u0440\u0438\u0432\u0435\u0442, \u043c\u0438\u0440! \u0421\u044a\u0435\u0448\u044c "
                   "\u0436\u0435 \u0435\u0449\u0451 \u044d\u0442\u0438\u0445 \u043c\u044f\u0433\u043a\u0438\u0445 "
                   "\u0444\u0440\u0430\u043d\u0446\u0443\u0437\u0441\u043a\u0438\u0445 \u0431\u0443\u043b\u043e\u043a.")
    add("greek", "\u0393\u03b5\u03b9\u03ac \u03c3\u03bf\u03c5 \u039a\u03cc\u03c3\u03bc\u03b5")
    add("khmer", "\u1780\u17b6\u1793\u17cb\u178f\u17c2\u1796\u17b7\u179f\u17c1\u179f")
    add("emoji", "\U0001F600\U0001F603\U0001F604 smile \U0001F680 rocket")
    add("emoji-zwj", "family: \U0001F468\u200D\U0001F469\u200D\U0001F467\u200D\U0001F466 and "
                     "\U0001F469\u200D\U0001F4BB coder \u2764\ufe0f\u200d\U0001F525")
    add("emoji-skin-tones", "\U0001F44D\U0001F3FD \U0001F44B\U0001F3FF \U0001F9D1\U0001F3FB\u200D\U0001F680")
    add("emoji-flags-keycaps", "\U0001F1FA\U0001F1F8 \U0001F1EF\U0001F1F5 1\ufe0f\u20e3 #\ufe0f\u20e3")
    add("math", "\u2211 \u222b \u221a\u221e \u2260 \u2264\u2265 \u2200x\u2208\u211d: x\u00b2 \u2265 0, "
                "\u00bd \u00bc \u00be \u00b3")
    add("ied-months", "ied 4 \u00bd months")
    add("whitespace-unicode", "nbsp\u00a0here, ideographic\u3000space, line\u2028sep, nel\u0085x, "
                              "zero\u200bwidth, thin\u2009space")
    add("controls", "null\x00byte, bell\x07, esc\x1b[0m, del\x7f")
    add("specials-llama", "<s>hello</s> <unk> <s> x")
    add("specials-chatml", "<|im_start|>user\nHi there!<|im_end|>\n<|im_start|>assistant\n")
    add("specials-gpt", "text<|endoftext|>more <|endoftext|> end")
    add("specials-llama3", "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>")
    add("added-tokens", "a [[note]] b  <|tool|>  c[[note]]d<|tool|>")
    add("special-lookalikes", "<|im_start <|endoftext| <s >|im_end|> <<s>>")
    add("metaspace-char", "\u2581leading and mid\u2581dle \u2581\u2581")
    add("long-word", "a" * 300)
    add("long-mixed-word", "Supercalifragilisticexpialidocious" * 8)
    add("long-spaces", " " * 100 + "x" + " " * 57)
    add("long-digits", "9876543210" * 20)
    add("long-newlines", "\n" * 64 + "end")
    add("english-paragraph", ENGLISH * 3)
    add("invalid-lone-continuation", b"lone \x80 continuation \xbf\xbf bytes")
    add("invalid-ff", b"abc\xffdef\xfe")
    add("invalid-truncated-3", b"truncated \xe4\xb8")
    add("invalid-truncated-middle", b"\xe4\xb8 middle \xf0\x9f\x98 x")
    add("invalid-overlong", b"overlong \xc0\xaf \xe0\x80\xaf \xf0\x80\x80\xaf \xc1\xbf")
    add("invalid-surrogates", b"surrogate \xed\xa0\x80\xed\xbf\xbf pair \xed\xa0\xbd\xed\xb8\x80")
    add("invalid-above-max", b"\xf4\x90\x80\x80 above max \xf5\x80\x80\x80 \xf8\x88\x80\x80\x80")
    add("invalid-at-end", b"mixed \xc3\xa9\xc3")
    add("invalid-only", b"\x80\x81\x82\xc2")
    return t


def sanitize(raw: bytes) -> str:
    return raw.decode("utf-8", errors="replace")


def write_json(path, value):
    """JSON with one id list per line: small diffs, still valid JSON."""
    if isinstance(value, dict) and "ids" in value:
        head = {k: v for k, v in value.items() if k != "ids"}
        lines = ",\n".join("    " + json.dumps(ids) for ids in value["ids"])
        text = json.dumps(head, indent=2, ensure_ascii=True)[:-2] + ',\n  "ids": [\n' + lines + "\n  ]\n}\n"
        json.loads(text)
    else:
        text = json.dumps(value, indent=1, ensure_ascii=True) + "\n"
    with open(path, "w", encoding="ascii") as f:
        f.write(text)


# ---------------------------------------------------------------------------------------------
# Rank BPE over raw bytes (tiktoken's algorithm, written out so that the fixture does not depend
# on tiktoken's download machinery).


def load_tiktoken_ranks(path):
    ranks = {}
    with open(path, "rb") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def rank_bpe(piece: bytes, ranks):
    if piece in ranks:
        return [ranks[piece]]
    parts = [piece[i:i + 1] for i in range(len(piece))]
    while len(parts) > 1:
        best, best_i = None, -1
        for i in range(len(parts) - 1):
            r = ranks.get(parts[i] + parts[i + 1])
            if r is not None and (best is None or r < best):
                best, best_i = r, i
        if best is None:
            break
        parts[best_i:best_i + 2] = [parts[best_i] + parts[best_i + 1]]
    return [ranks[p] for p in parts]


def tiktoken_encode(text: str, pattern, ranks, specials, parse_special):
    import regex

    ids = []
    segments = [text]
    if parse_special and specials:
        alternation = "|".join(regex.escape(s) for s in sorted(specials, key=len, reverse=True))
        segments = regex.split("(" + alternation + ")", text)
    for i, segment in enumerate(segments):
        if parse_special and i % 2 == 1:
            ids.append(specials[segment])
            continue
        for m in regex.finditer(pattern, segment):
            ids.extend(rank_bpe(m.group(0).encode("utf-8"), ranks))
    return ids


def check_against_tiktoken(name, texts, pattern, ranks, specials, ours):
    try:
        import tiktoken
    except ImportError:
        print(f"  {name}: tiktoken not installed; cross-check skipped")
        return
    enc = tiktoken.Encoding(name=name, pat_str=pattern, mergeable_ranks=ranks, special_tokens=specials)
    for text, (plain, special) in zip(texts, ours):
        assert enc.encode(text, disallowed_special=()) == plain, (name, text)
        assert enc.encode(text, allowed_special="all") == special, (name, text)
    print(f"  {name}: tiktoken {tiktoken.__version__} agrees on all {len(texts)} strings, both modes")


# ---------------------------------------------------------------------------------------------
# llama2.c's run.c encode(), transcribed to Python (no BOS here; the test adds it).


def read_llama2c_tokenizer(path, vocab_size):
    import struct

    with open(path, "rb") as f:
        data = f.read()
    pos = 4
    vocab, scores = [], []
    for _ in range(vocab_size):
        score, length = struct.unpack_from("<fi", data, pos)
        pos += 8
        vocab.append(data[pos:pos + length])
        pos += length
        scores.append(score)
    return vocab, scores


def llama2c_encode(text: bytes, vocab, scores):
    lookup = {}
    for i, piece in enumerate(vocab):
        lookup.setdefault(piece, i)
    tokens = []
    if text:
        tokens.append(lookup[b" "])
    buffer = b""
    for k in range(len(text)):
        c = text[k:k + 1]
        if (c[0] & 0xC0) != 0x80:
            buffer = b""
        buffer += c
        nxt = text[k + 1] if k + 1 < len(text) else 0
        if (nxt & 0xC0) == 0x80 and len(buffer) < 4:
            continue
        if buffer in lookup:
            tokens.append(lookup[buffer])
        else:
            tokens.extend(b + 3 for b in buffer)
        buffer = b""
    while True:
        best_score, best_id, best_i = -1e10, -1, -1
        for i in range(len(tokens) - 1):
            merged = vocab[tokens[i]] + vocab[tokens[i + 1]]
            j = lookup.get(merged)
            if j is not None and scores[j] > best_score:
                best_score, best_id, best_i = scores[j], j, i
        if best_i < 0:
            break
        tokens[best_i:best_i + 2] = [best_id]
    return tokens


# ---------------------------------------------------------------------------------------------
# Small trained tokenizer.json files.


def training_text(texts):
    return [t for t in texts if t] + [ENGLISH] * 20 + [GO_CODE, PYTHON_CODE, C_CODE] * 5


def make_tiny_bytelevel(texts, out_dir):
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(vocab_size=700, min_frequency=2, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(training_text(texts), trainer=trainer)
    tok.add_tokens([tokenizers.AddedToken("[[note]]", special=False, normalized=False)])
    tok.add_special_tokens([tokenizers.AddedToken("<|tool|>", special=True, lstrip=True, rstrip=True,
                                                  normalized=False)])
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A $B",
                                      special_tokens=[("<|begin_of_text|>", bos)]),
    ])
    os.makedirs(out_dir, exist_ok=True)
    tok.save(os.path.join(out_dir, "tokenizer.json"))
    config = {
        "bos_token": "<|begin_of_text|>",
        "eos_token": {"content": "<|im_end|>", "special": True},
        "chat_template": "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                         "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
    }
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w", encoding="ascii") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    return Tokenizer.from_file(os.path.join(out_dir, "tokenizer.json"))


def make_tiny_metaspace(texts, out_dir):
    meta = "\u2581"
    trainer_tok = Tokenizer(models.BPE())
    trainer_tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement=meta, prepend_scheme="first", split=True)
    trainer = trainers.BpeTrainer(vocab_size=500, min_frequency=2, show_progress=False)
    trainer_tok.train_from_iterator(training_text(texts), trainer=trainer)
    trained = json.loads(trainer_tok.to_str())
    # Llama layout: <unk> <s> </s>, then the 256 byte-fallback pieces, then the trained ones.
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for piece, _ in sorted(trained["model"]["vocab"].items(), key=lambda kv: kv[1]):
        if piece not in vocab:
            vocab[piece] = len(vocab)
    merges = trained["model"]["merges"]
    spec = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {"id": i, "content": c, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
             "special": True} for i, c in enumerate(["<unk>", "<s>", "</s>"])
        ],
        "normalizer": None,
        "pre_tokenizer": {"type": "Metaspace", "replacement": meta, "prepend_scheme": "first", "split": False},
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}},
        },
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "ByteFallback"},
            {"type": "Metaspace", "replacement": meta, "prepend_scheme": "first", "split": False},
        ]},
        "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                  "vocab": vocab, "merges": merges},
    }
    os.makedirs(out_dir, exist_ok=True)
    text = json.dumps(spec, ensure_ascii=False, indent=None, separators=(",", ":"))
    tok = Tokenizer.from_str(text)  # proves the file is valid for the reference
    with open(os.path.join(out_dir, "tokenizer.json"), "w", encoding="utf-8") as f:
        f.write(text + "\n")
    return tok


def hf_variants(tdir, out_dir):
    """Pipelines the real files do not exercise, over the GPT-2 vocabulary (byte-level) and the
    tiny_metaspace one. Returns {name: (base, normalizer json, pre_tokenizer json, tokenizer)}."""
    def gpt2(pre, norm=None):
        t = Tokenizer(models.BPE.from_file(os.path.join(tdir, "gpt2", "encoder.json"),
                                           os.path.join(tdir, "gpt2", "vocab.bpe")))
        t.pre_tokenizer = pre
        if norm is not None:
            t.normalizer = norm
        t.decoder = decoders.ByteLevel()
        t.add_special_tokens(["<|endoftext|>"])
        return "gpt2", t

    def metaspace(scheme, split):
        t = Tokenizer.from_file(os.path.join(out_dir, "tiny_metaspace", "tokenizer.json"))
        t.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme=scheme, split=split)
        return "tiny_metaspace", t

    P, N = pre_tokenizers, normalizers
    no_regex = P.ByteLevel(add_prefix_space=False, use_regex=False)
    variants = {
        "bytelevel_prefix_space": gpt2(P.ByteLevel(add_prefix_space=True)),
        "digits_individual": gpt2(P.Sequence([P.Digits(individual_digits=True), P.ByteLevel(add_prefix_space=False)])),
        "digits_runs": gpt2(P.Sequence([P.Digits(individual_digits=False), P.ByteLevel(add_prefix_space=False)])),
        "punctuation_contiguous": gpt2(P.Sequence([P.Punctuation(behavior="contiguous"),
                                                   P.ByteLevel(add_prefix_space=False)])),
        "whitespace_split": gpt2(P.Sequence([P.WhitespaceSplit(), no_regex])),
        "whitespace": gpt2(P.Sequence([P.Whitespace(), no_regex])),
        "split_merged_with_previous": gpt2(P.Sequence([P.Split(Regex(r"\s+"), "merged_with_previous"), no_regex])),
        "split_removed_inverted": gpt2(P.Sequence([P.Split(Regex(r"\p{L}+"), "removed", invert=True), no_regex])),
        "nfkc_lowercase": gpt2(P.ByteLevel(add_prefix_space=False), N.Sequence([N.NFKC(), N.Lowercase()])),
        "strip_replace_regex": gpt2(P.ByteLevel(add_prefix_space=False),
                                    N.Sequence([N.Strip(), N.Replace(Regex(r"\d+"), "#")])),
        "nfd": gpt2(P.ByteLevel(add_prefix_space=False), N.NFD()),
        "metaspace_always_split": metaspace("always", True),
        "metaspace_never": metaspace("never", False),
        "metaspace_first_split": metaspace("first", True),
    }
    out = {}
    for name, (base, tok) in variants.items():
        spec = json.loads(tok.to_str())
        out[name] = (base, spec["normalizer"], spec["pre_tokenizer"], tok)
    return out


def hf_ids(tok, texts, parse_special):
    tok.encode_special_tokens = not parse_special
    out = [tok.encode(t, add_special_tokens=False).ids for t in texts]
    tok.encode_special_tokens = False
    return out


# ---------------------------------------------------------------------------------------------


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(here))
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shared", default=os.path.join(os.path.dirname(root), "shared"))
    parser.add_argument("--out", default=os.path.join(root, "tests", "fixtures", "tokenizer"))
    args = parser.parse_args()
    tdir = os.path.join(args.shared, "tokenizers")
    os.makedirs(args.out, exist_ok=True)

    entries = corpus()
    names = [n for n, _ in entries]
    assert len(set(names)) == len(names)
    texts = [sanitize(raw) for _, raw in entries]
    corpus_json = []
    for (name, raw), text in zip(entries, texts):
        valid = text.encode("utf-8") == raw
        corpus_json.append({"name": name, "text": text} if valid else {"name": name, "hex": raw.hex()})
    write_json(os.path.join(args.out, "corpus.json"), corpus_json)
    print(f"corpus: {len(entries)} strings, {sum(len(r) for _, r in entries)} bytes")

    def emit(name, reference, parse_special, ids):
        assert len(ids) == len(texts)
        write_json(os.path.join(args.out, f"expected_{name}.json"),
                   {"reference": reference, "parse_special": parse_special, "ids": ids})
        print(f"  expected_{name}.json: {sum(len(x) for x in ids)} ids")

    tv = tokenizers.__version__

    # GPT-2: the HF BPE built straight from OpenAI's files.
    gpt2 = Tokenizer(models.BPE.from_file(os.path.join(tdir, "gpt2", "encoder.json"),
                                          os.path.join(tdir, "gpt2", "vocab.bpe")))
    gpt2.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    gpt2.decoder = decoders.ByteLevel()
    gpt2.add_special_tokens(["<|endoftext|>"])
    assert gpt2.token_to_id("<|endoftext|>") == 50256
    emit("gpt2", f"tokenizers {tv}: BPE.from_file(encoder.json, vocab.bpe) + ByteLevel(add_prefix_space=False), "
         "<|endoftext|> special", True, hf_ids(gpt2, texts, True))

    # Code Llama tokenizer.json as is.
    codellama = Tokenizer.from_file(os.path.join(tdir, "codellama-hf", "tokenizer.json"))
    emit("codellama", f"tokenizers {tv}: Tokenizer.from_file(codellama-hf/tokenizer.json), "
         "encode(add_special_tokens=False)", True, hf_ids(codellama, texts, True))

    # Llama 2 SentencePiece model.
    sp = sentencepiece.SentencePieceProcessor(model_file=os.path.join(tdir, "llama2-sentencepiece", "tokenizer.model"))
    emit("llama2_sentencepiece", f"sentencepiece {sentencepiece.__version__}: llama2-sentencepiece/tokenizer.model, "
         "encode(text) (specials never parsed)", False, [sp.encode(t) for t in texts])

    # tiktoken files.
    llama3_ranks = load_tiktoken_ranks(os.path.join(tdir, "llama3", "tokenizer.model"))
    with open(os.path.join(tdir, "llama3", "tokenizer_config.json"), encoding="utf-8") as f:
        llama3_specials = {v["content"]: int(k) for k, v in json.load(f)["added_tokens_decoder"].items()}
    qwen_ranks = load_tiktoken_ranks(os.path.join(tdir, "qwen", "qwen.tiktoken"))
    qwen_specials = {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645}
    qwen_specials.update({f"<|extra_{i}|>": 151646 + i for i in range(205)})
    for name, pattern, ranks, specials in (("llama3", LLAMA3_PATTERN, llama3_ranks, llama3_specials),
                                           ("qwen", QWEN2_PATTERN, qwen_ranks, qwen_specials)):
        plain = [tiktoken_encode(t, pattern, ranks, specials, False) for t in texts]
        special = [tiktoken_encode(t, pattern, ranks, specials, True) for t in texts]
        check_against_tiktoken(name, texts, pattern, ranks, specials, list(zip(plain, special)))
        emit(f"{name}_tiktoken", f"rank BPE over {name} tiktoken file (regex {__import__('regex').__version__}), "
             "specials not parsed", False, plain)
        emit(f"{name}_tiktoken_special", f"rank BPE over {name} tiktoken file, specials parsed", True, special)

    # stories260K's tok512.bin through llama2.c's encode().
    vocab, scores = read_llama2c_tokenizer(os.path.join(args.shared, "models", "stories260K", "tok512.bin"), 512)
    stories = [llama2c_encode(t.encode("utf-8"), vocab, scores) for t in texts]
    assert llama2c_encode(b"Once upon a time", vocab, scores) == [403, 407, 261, 378]
    emit("stories260k", "llama2.c run.c encode() transcribed to Python over tok512.bin (no BOS)", False, stories)

    # Small trained tokenizer.json files.
    tiny_bl = make_tiny_bytelevel(texts, os.path.join(args.out, "tiny_bytelevel"))
    emit("tiny_bytelevel", f"tokenizers {tv}: tiny_bytelevel/tokenizer.json", True, hf_ids(tiny_bl, texts, True))
    emit("tiny_bytelevel_plain", f"tokenizers {tv}: tiny_bytelevel/tokenizer.json, encode_special_tokens=True",
         False, hf_ids(tiny_bl, texts, False))
    tiny_ms = make_tiny_metaspace(texts, os.path.join(args.out, "tiny_metaspace"))
    emit("tiny_metaspace", f"tokenizers {tv}: tiny_metaspace/tokenizer.json", True, hf_ids(tiny_ms, texts, True))

    # Pipeline variants: the test rebuilds each tokenizer.json from the base vocabulary plus the
    # normalizer and pre_tokenizer recorded here.
    variants = {}
    for name, (base, normalizer, pre_tokenizer, tok) in hf_variants(tdir, args.out).items():
        variants[name] = {"base": base, "normalizer": normalizer, "pre_tokenizer": pre_tokenizer,
                          "ids": hf_ids(tok, texts, True)}
    with open(os.path.join(args.out, "expected_hf_variants.json"), "w", encoding="ascii") as f:
        f.write("{\n")
        for k, (name, v) in enumerate(variants.items()):
            head = json.dumps({key: v[key] for key in ("base", "normalizer", "pre_tokenizer")}, ensure_ascii=True)
            ids = ",\n".join("    " + json.dumps(x) for x in v["ids"])
            f.write(f'  {json.dumps(name)}: {{"reference": "tokenizers {tv}", "spec": {head}, "ids": [\n{ids}\n  ]}}')
            f.write(",\n" if k + 1 < len(variants) else "\n")
        f.write("}\n")
    json.load(open(os.path.join(args.out, "expected_hf_variants.json")))
    print(f"  expected_hf_variants.json: {len(variants)} pipelines")

    total = sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(args.out) for f in fs)
    print(f"fixtures: {total} bytes under {args.out}")


if __name__ == "__main__":
    sys.exit(main())
