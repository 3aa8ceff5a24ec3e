#!/usr/bin/env bash
# Pack the tokenized corpus and the tokenizer for the GPU machine:
#   tools/train/pack.sh DATA_DIR TOKENIZER_DIR [PACK_DIR]    (default PACK_DIR: .pack)
# DATA_DIR is tokenize_corpus.py's output (train.bin, val.bin, meta.json).
set -euo pipefail
data="$1"; tok="$2"; pack="${3:-.pack}"
mkdir -p "$pack/tok"
xz -T0 -6 -c "$data/train.bin" > "$pack/train.bin.xz"
cp "$data/val.bin" "$data/meta.json" "$pack/"
# the streams of one kind of text (code, prose), when tokenize_corpus.py wrote them
for kind in code prose; do
  if [ -e "$data/train.$kind.bin" ]; then
    xz -T0 -6 -c "$data/train.$kind.bin" > "$pack/train.$kind.bin.xz"
    cp "$data/val.$kind.bin" "$pack/"
  fi
done
cp "$tok/tokenizer.json" "$tok/tokenizer_config.json" "$pack/tok/"
sha256sum "$data/train.bin" "$data/val.bin" "$pack/train.bin.xz" > "$pack/SHA256SUMS"
ls -la "$pack" "$pack/tok"
