#!/bin/bash
# The wgmma forward's warpgroups taking turns to issue their products (ping-pong) against the same kernel with
# both warpgroups in lockstep (RA_EXP_LOCKSTEP, the kernel before), interleaved in one call (bench/RESULTS.md, "The
# wgmma forward's warpgroups take turns"), at head_dim 128: the GPU tests first, then forward rows of `bench
# --backward` (the single-call forward; its backward, unchanged, is the control) and of `bench` (the carry path).
# The lockstep rows need the experiment's build (results/h200_2026-11-29_pingpong_lockstep_switch.patch); on the
# committed kernel RA_EXP_LOCKSTEP does nothing and both rows time the same kernel.
#   bash .device/on-device.sh bash bench/pingpong_check.sh PACK [ROUNDS [STAGES]]   (STAGES: tests,rows)
set -u
b=${1:-build-pack-new}; rounds=${2:-2}; stages=,${3:-tests,rows},; bin=$b/bin/ringattn; out=${OUT:-/tmp/out}
source bench/device_tests.sh
has() { [[ $stages == *,$1,* ]]; }
has tests && gpu_tests
row() {  # forward (and backward) ms and TFLOP/s of one configuration (--backward: the single-call forward)
  mpirun -np 1 $bin bench --backend cuda --impl flash_attn2 --batch 1 --dtype bf16 --seq 32768 "$@" 2>&1 |
    grep -v '^#' | grep -o "forward  *[0-9.]*  *[0-9.]*\|backward  *[0-9.]*  *[0-9.]*" | tr '\n' ' '
}
carry_row() {  # the carry path's forward (bench without --backward): ms and GFLOP/s
  mpirun -np 1 $bin bench --backend cuda --impl flash_attn2 --batch 1 --dtype bf16 --seq 32768 "$@" 2>&1 |
    awk '!/^#/ && $1 == "flash_attn2" {print "forward", $12, $13}'
}
set_mode() { if [ $1 = lockstep ]; then export RA_EXP_LOCKSTEP=1; else unset RA_EXP_LOCKSTEP; fi; }
if has rows; then  # head_dim 128, where the warpgroups take turns; RA_EXP_LOCKSTEP runs them in lockstep
  for round in $(seq $rounds); do
    for causal in "" "--causal"; do
      for mode in turns lockstep; do
        set_mode $mode
        echo "round $round $mode H=32 D=128 $causal: $(row --warmup 2 --iters 10 --heads 32 --head-dim 128 $causal \
          --backward)" | tee -a $out/log.txt
      done
      for flags in "--heads 32 --softcap 50" "--heads 16 --segments 16" "--heads 16 --segments 64" "--heads 32"; do
        for mode in turns lockstep; do
          set_mode $mode
          echo "round $round $mode carry D=128 $flags $causal: $(carry_row --warmup 2 --iters 20 --head-dim 128 \
            $flags $causal)" | tee -a $out/log.txt
        done
      done
    done
  done
  unset RA_EXP_LOCKSTEP
fi
