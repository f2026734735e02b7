#!/bin/bash
# Shared by the device scripts (documents_probe.sh, pingpong_check.sh), sourced after they set b (the pack from
# bench/pack_for_device.sh) and out ($OUT): unpacks the pack's library and tests, notes the GPU, and defines
# gpu_tests, which runs the wgmma convergence check on the library, the GPU unit tests and the GPU ring's tests on 2
# ranks (sharing the GPU where there is one), each summary line into $out/log.txt.
mkdir -p "$out"
[ -f $b/pack.tar.xz ] && tar xJf $b/pack.tar.xz -C $b
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader | tee $out/log.txt
gpu_tests() {
  python3 bench/check_wgmma_convergence.py $b/lib/*.so* 2>&1 | tail -1 | tee -a $out/log.txt
  $b/tests/cuda_attention_test --gtest_color=no > $out/unit.log 2>&1
  grep -E "^\[  (PASSED|FAILED) |FAILED  \]" $out/unit.log | head -20 | tee -a $out/log.txt
  for t in ring_mpi_test ring_backward_mpi_test; do
    mpirun -np 2 $b/tests/$t --backend=cuda --gtest_color=no > $out/$t.log 2>&1
    echo "$t: $(grep -E '^\[  (PASSED|FAILED) ' $out/$t.log | sort -u | tr '\n' ' ')" | tee -a $out/log.txt
    grep "FAILED  \]" $out/$t.log | head | tee -a $out/log.txt
  done
}
