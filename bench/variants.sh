#!/bin/bash
# Kernel variants side by side in one call (build-sm90/variants/ringattn_*): single-GPU flash_attn2 rows
# at D=128, each variant in turn per row so that clocks and neighbours are shared.
#   bash .device/on-device.sh bash bench/variants.sh BUILD
set -u -o pipefail
build=${1:?build folder}; out=${OUT:-/tmp/out}; mkdir -p "$out"
for t in 8192 32768; do
  for causal in "" "--causal"; do
    for v in "$build"/variants/ringattn_*; do
      printf '%-16s' "$(basename "$v")" | tee -a "$out/variants.txt"
      mpirun -np 1 "$v" bench --backend cuda --batch 1 --heads 32 --head-dim 128 --dtype bf16 --warmup 2 --iters 10 \
        --impl flash_attn2 --seq $t $causal 2>&1 | grep -v '^#' | tee -a "$out/variants.txt"
    done
  done
done
