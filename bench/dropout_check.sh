#!/bin/bash
# Dropout on the flash kernels (bench/RESULTS.md, "Dropout's own wgmma instances", "mma.sync's dropout instances"): the
# GPU tests, then dropout's rows beside the same shapes without it, each on the kernel auto picks and on the mma.sync
# kernel forced (Ampere's), and PyTorch's SDPA FlashAttention-2 with dropout. A pack of another build gives its rows
# alone ("rows" only), so that two calls on one warm machine compare builds.
#   [HEAD_DIMS="128 64 256"] bash .device/on-device.sh bash bench/dropout_check.sh PACK [STAGES]   (STAGES, in this
# order: quick (the unit tests with dropout), rows, extras (beside a bias, a mask or a soft cap), docs (16 packed
# documents with and without dropout), torch, tests (all the GPU tests); carry PACK)
set -u
b=${1:-pack}; stages=,${2:-quick,rows,torch,tests},; bin=$b/bin/ringattn; out=${OUT:-/tmp/out}
# The rows' shapes: every one, or those with HEAD_DIMS' head dims (e.g. HEAD_DIMS=256).
SHAPES=()
for shape in "--heads 32 --head-dim 128" "--heads 64 --head-dim 64" "--heads 16 --head-dim 256"; do
  [[ " ${HEAD_DIMS:-128 64 256} " == *" ${shape##* } "* ]] && SHAPES+=("$shape")
done
source bench/device_tests.sh
has() { [[ $stages == *,$1,* ]]; }
if has quick; then
  $b/tests/cuda_attention_test --gtest_color=no --gtest_filter='*ropout*' > $out/unit_dropout.log 2>&1
  grep -E "^\[  (PASSED|FAILED) |FAILED  \]" $out/unit_dropout.log | head -20 | tee -a $out/log.txt
fi
row() {  # the single-call forward and backward: TFLOP/s
  mpirun -np 1 $bin bench --backend cuda --impl flash_attn2 --batch 1 --dtype bf16 --seq 16384 --backward --warmup 2 "$@" 2>&1 |
    grep -v '^#' | grep -o "forward  *[0-9.]*  *[0-9.]*\|backward  *[0-9.]*  *[0-9.]*" | tr '\n' ' '
}
if has rows; then
  for shape in "${SHAPES[@]}"; do
    for causal in "" "--causal"; do
    for flags in "" "--dropout 0.1" "--flash-kernel mma_sync" "--dropout 0.1 --flash-kernel mma_sync"; do
      iters=10; [[ $flags == *mma_sync* ]] && iters=4
      echo "$b $shape $causal $flags: $(row $shape $causal $flags --iters $iters)" | tee -a $out/rows.txt
    done
  done; done
fi
if has extras; then  # dropout beside a bias, a mask (wgmma: their own instances) or a soft cap (the extras), D = 128
  causals=("" "--causal"); [[ ${NO_CAUSAL:-0} == 1 ]] && causals=("")  # NO_CAUSAL=1: the rows without causal only
  for causal in "${causals[@]}"; do
    for flags in "--bias" "--bias --dropout 0.1" "--mask" "--mask --dropout 0.1" "--softcap 30 --dropout 0.1" \
      "--bias --dropout 0.1 --flash-kernel mma_sync"; do
      echo "$b --heads 32 --head-dim 128 $causal $flags: $(row --heads 32 --head-dim 128 $causal $flags --iters 3)" |
        tee -a $out/extras.txt
    done
    [[ -n $causal ]] && c=1 || c=0
    python3 bench/torch_extras.py --seq 16384 --heads 32 --head-dim 128 --causal $c --only bias_dropout 2>&1 | tail -1 |
      tee -a $out/extras.txt
  done
fi
if has docs; then
  for shape in "--heads 32 --head-dim 128" "--heads 64 --head-dim 64"; do for causal in "" "--causal"; do
    for flags in "--segments 16" "--segments 16 --dropout 0.1"; do
      echo "$b $shape $causal $flags: $(row $shape $causal $flags --iters 10)" | tee -a $out/docs.txt
    done
  done; done
fi
if has torch; then
  for causal in 0 1; do
    for shape in "${SHAPES[@]}"; do
      python3 bench/torch_extras.py --seq 16384 $shape --causal $causal --only dropout 2>&1 | tail -1 | tee -a $out/torch.txt
    done
  done
fi
if has tests; then gpu_tests; fi
