#!/usr/bin/env bash
# The whole training run on the GPU machine, in one command:
#   bash tools/train/run_device.sh [PACK_DIR] [OUT_DIR]
# PACK_DIR (default .pack) holds what tools/train/pack.sh made here:
# train.bin.xz, val.bin, meta.json and tok/ (tokenizer.json, tokenizer_config.json).
# OUT_DIR (default $OUT) receives the logs, the GPU evaluation and one .tar per
# exported model.  Budgets (seconds of training): TARGET_S, DRAFT_S.
# SKIP_TARGET=1 trains the draft alone, distilled from the committed
# models/tachyon-demo (copied, not retrained; no target archive).
# DRAFT_PRESET (default draft), DRAFT_LR (3e-3) choose the draft's shape and peak rate;
# DRAFT_SPLIT (default train; train.code or train.prose) the text it is distilled on, DRAFT_NAME
# (default tachyon-demo-draft) the directory it is written to, DRAFT_INIT a draft to start from
# (fine-tuning the bundled draft on one kind: DRAFT_INIT=models/tachyon-demo-draft DRAFT_PRESET=draft7).
# EXTRA_TARGET, EXTRA_DRAFT, EXTRA_EVAL append arguments (for a quick CPU dry run);
# WORK_DIR (default /tmp) holds the unpacked data and the exported models.
set -euo pipefail
export PYTHONUNBUFFERED=1
pack="${1:-.pack}"
out="${2:-${OUT:?set OUT or pass OUT_DIR}}"
TARGET_S="${TARGET_S:-270}"
DRAFT_S="${DRAFT_S:-185}"
SEED="${SEED:-1234}"
draft_name="${DRAFT_NAME:-tachyon-demo-draft}"
data="${WORK_DIR:-/tmp}/tachyon-data"
models="${WORK_DIR:-/tmp}/tachyon-models"
mkdir -p "$data" "$models" "$out"
exec > >(tee -a "$out/run.log") 2>&1

t0=$(date +%s)
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
python3 -c 'import torch, transformers, tokenizers, safetensors; print("torch", torch.__version__, "transformers", transformers.__version__, "tokenizers", tokenizers.__version__, "safetensors", safetensors.__version__)'
# (a pack of the kind streams alone serves a draft of one kind: SKIP_TARGET=1, DRAFT_SPLIT)
if [ -e "$pack/train.bin.xz" ]; then xz -d -T0 -c "$pack/train.bin.xz" > "$data/train.bin"; fi
cp "$pack/val.bin" "$pack/meta.json" "$data/"
for kind in code prose; do
  if [ -e "$pack/train.$kind.bin.xz" ]; then
    xz -d -T0 -c "$pack/train.$kind.bin.xz" > "$data/train.$kind.bin"
    cp "$pack/val.$kind.bin" "$data/"
  fi
done
sha256sum "$data"/*.bin

if [ "${SKIP_TARGET:-0}" = 1 ]; then
  rm -rf "$models/tachyon-demo"
  cp -r models/tachyon-demo "$models/tachyon-demo"
  sha256sum "$models/tachyon-demo"/*
  echo "target: committed models/tachyon-demo"
else
python3 tools/train/train.py target --data "$data" --tokenizer "$pack/tok" \
  --out "$models/tachyon-demo" --seed "$SEED" --budget-s "$TARGET_S" --steps "${TARGET_STEPS:-0}" \
  --max-epochs 16 \
  --batch 256 --lr 2e-3 --warmup 200 --log "$out/train_target.jsonl" ${EXTRA_TARGET:-}
# at most 16 MiB per returned file: split the target's archive in two
tar -C "$models" -cf - tachyon-demo | split -b 15000000 -d - "$out/tachyon-demo.tar.part"
echo "target done at $(( $(date +%s) - t0 )) s"
fi

python3 tools/train/train.py draft --data "$data" --tokenizer "$pack/tok" \
  --teacher "$models/tachyon-demo" --out "$models/$draft_name" --seed "$SEED" \
  --preset "${DRAFT_PRESET:-draft}" --split "${DRAFT_SPLIT:-train}" ${DRAFT_INIT:+--init "$DRAFT_INIT"} \
  --budget-s "$DRAFT_S" --batch 256 --lr "${DRAFT_LR:-3e-3}" --warmup 200 --alpha "${ALPHA:-0.0}" \
  --log "$out/train_draft.jsonl" ${EXTRA_DRAFT:-}
tar -C "$models" -cf "$out/$draft_name.tar" "$draft_name"
echo "draft done at $(( $(date +%s) - t0 )) s"

python3 tools/train/eval.py --target "$models/tachyon-demo" --draft "$models/$draft_name" \
  --val "$data/val.bin" --positions "${POSITIONS:-2000}" --json "$out/eval_gpu.json" ${EXTRA_EVAL:-}
echo "all done at $(( $(date +%s) - t0 )) s"
