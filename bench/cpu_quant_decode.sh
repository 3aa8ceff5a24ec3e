#!/usr/bin/env bash
# Batch-1 CPU decode of synthetic:qwen2.5-0.5b in each weight format against the read bandwidth
# measured in the same run (`tachyon_bench bandwidth`): one line per format and thread count, the
# share of the roofline being the weights' GB/s over the read GB/s at that thread count.
#   bench/cpu_quant_decode.sh [BUILD_DIR] [ROUNDS]
# Each quantized format also quantizes the LM head (int8 for int8/int4, q8_0 for the GGUF
# formats, as Q4_K_M files store a 896-wide head), so that the head is not a 16-bit constant that
# hides the layers' speed.
set -euo pipefail
build=${1:-build}
rounds=${2:-2}
model=${MODEL:-synthetic:qwen2.5-0.5b}
formats=${FORMATS:-"bf16 q8_0 q4_k q4_0 int8 int4"}
declare -A read
for t in 1 2; do
  read[$t]=$("$build/tachyon_bench" bandwidth --threads "$t" 2>&1 | sed -n 's/.*read \([0-9.]*\) GB\/s best.*/\1/p' | head -1)
  echo "read bandwidth, $t thread(s): ${read[$t]} GB/s"
done
for r in $(seq 1 "$rounds"); do
  for t in 1 2; do
    for f in $formats; do
      case $f in
        bf16) q=() ;;
        int8|int4) q=(--quant "$f" --quant-lm-head int8) ;;
        *) q=(--quant "$f" --quant-lm-head q8_0) ;;
      esac
      line=$("$build/tachyon" bench -m "$model" "${q[@]}" --workload latency --prompt-len 16 --output-len 32 \
        --iters 4 -t "$t" 2>&1 | grep '^latency')
      tps=$(sed -n 's/.*(\([0-9.]*\) tok\/s.*/\1/p' <<<"$line")
      gbs=$(sed -n 's/.*tok\/s, \([0-9.]*\) GB\/s.*/\1/p' <<<"$line")
      share=$(awk -v g="$gbs" -v r="${read[$t]}" 'BEGIN { printf "%.0f", 100 * g / r }')
      echo "round $r, $t thread(s), $f: $tps tok/s, $gbs GB/s of weights, ${share} % of read"
    done
  done
done
