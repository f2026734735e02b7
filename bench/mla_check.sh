#!/bin/bash
# MLA's head dims (192 / 128) on the wgmma forward: the instance whose V and O hold 128 columns against the 192
# instance that forms O's last 64 columns from zeros (RA_MLA_AB=old) and against the new instance with its
# warpgroups in lockstep (RA_MLA_AB=lockstep), interleaved in one call (bench/RESULTS.md, "MLA's forward: V and O
# of 128 columns"). RA_MLA_AB needs the experiment's build (results/h200_2026-11-29_mla_ab_switch.patch); on the
# committed kernel it does nothing and the three rows time the same kernel.
#   bash .device/on-device.sh bash bench/mla_check.sh PACK [ROUNDS [STAGES]]   (STAGES: tests,mla_tests,rows,torch;
# torch: PyTorch's SDPA forward at 192 / 128 (cuDNN; FlashAttention-2 refuses Dv != D) after the rows)
set -u
b=${1:-build-pack-new}; rounds=${2:-2}; stages=,${3:-tests,rows},; bin=$b/bin/ringattn; out=${OUT:-/tmp/out}
source bench/device_tests.sh
has() { [[ $stages == *,$1,* ]]; }
has tests && gpu_tests
if has mla_tests; then  # the unit tests of the head dims this instance serves, and the carry's
  $b/tests/cuda_attention_test --gtest_color=no --gtest_filter='*_D1??_Dv*:*_D192_*:*SplitKeys*' > $out/unit_mla.log 2>&1
  grep -E "^\[  (PASSED|FAILED) |FAILED  \]" $out/unit_mla.log | head -20 | tee -a $out/log.txt
fi
row() {  # the single-call forward and backward: ms and TFLOP/s
  mpirun -np 1 $bin bench --backend cuda --impl flash_attn2 --batch 1 --dtype bf16 --seq 32768 --backward "$@" 2>&1 |
    grep -v '^#' | grep -o "forward  *[0-9.]*  *[0-9.]*\|backward  *[0-9.]*  *[0-9.]*" | tr '\n' ' '
}
carry_row() {  # the carry path's forward (bench without --backward): ms and GFLOP/s
  mpirun -np 1 $bin bench --backend cuda --impl flash_attn2 --batch 1 --dtype bf16 --seq 32768 "$@" 2>&1 |
    awk '!/^#/ && $1 == "flash_attn2" {print "forward", $12, $13}'
}
set_mode() { if [ $1 = new ]; then unset RA_MLA_AB; else export RA_MLA_AB=$1; fi; }
if has rows; then
  for round in $(seq $rounds); do
    for causal in "" "--causal"; do
      for mode in new lockstep old; do
        set_mode $mode
        echo "round $round $mode H=16 D=192 Dv=128 $causal: $(row --warmup 2 --iters 10 --heads 16 --head-dim 192 \
          --v-head-dim 128 $causal)" | tee -a $out/log.txt
        echo "round $round $mode carry H=16 D=192 Dv=128 $causal: $(carry_row --warmup 2 --iters 20 --heads 16 \
          --head-dim 192 --v-head-dim 128 $causal)" | tee -a $out/log.txt
      done
      unset RA_MLA_AB
      echo "round $round control H=16 D=192 $causal: $(row --warmup 2 --iters 10 --heads 16 --head-dim 192 $causal)" |
        tee -a $out/log.txt
    done
  done
fi
if has torch; then
  python3 bench/torch_backward.py --forward 16x192x128 2>&1 | grep -v Warning | tee -a $out/log.txt
fi
