#!/bin/bash
# One device call's check of the soft cap's kernels (bench/RESULTS.md, "The soft cap's tanh in one MUFU operation"):
# the GPU ring's soft-cap tests, CLI round trips with a cap on both flash kernels, then rows with and without the cap.
#   bash .device/on-device.sh bash bench/softcap_tanh_check.sh   (carry .device and build-pack-new, from
#   bench/pack_for_device.sh, its lib packed as pack.tar.xz to fit the carry)
set -u
b=build-pack-new; bin=$b/bin/ringattn; out=${OUT:-/tmp/out}
tar xJf $b/pack.tar.xz -C $b
mpirun -np 2 $b/tests/ring_backward_mpi_test --backend=cuda --gtest_filter='*softcap*cuda*' --gtest_color=no 2>&1 | grep -E "(OK|FAILED|PASSED) " | tee $out/ring.log | tail -4
d=$(mktemp -d)
$bin generate --output $d/docs.h5 --batch 1 --seq 2000 --heads 8 --kv-heads 2 --head-dim 128 --dtype bf16 --with-grad --segments 7 >/dev/null
$bin generate --output $d/plain.h5 --batch 2 --seq 777 --kv-seq 901 --heads 4 --kv-heads 4 --head-dim 64 --dtype f16 --with-grad >/dev/null
for f in docs plain; do for kernel in wgmma mma_sync; do for causal in "" "--causal"; do
  $bin run --backend cuda --impl flash_attn2 --flash-kernel $kernel --input $d/$f.h5 --output $d/o.h5 --softcap 30 $causal --backward --quiet --overwrite &&
  $bin verify --input $d/$f.h5 --output $d/o.h5 --softcap 30 $causal | grep -c "#wrong 0" | sed "s/^/$f $kernel $causal verified outputs: /" | tee -a $out/cli.log
done; done; done
bench() { mpirun -np 1 $bin bench --backend cuda --batch 1 --heads 32 --head-dim 128 --dtype bf16 --warmup 2 --backward --impl flash_attn2 "$@" 2>&1 | grep -v '^#' | grep -o "forward  *[0-9.]*  *[0-9.]*\|backward  *[0-9.]*  *[0-9.]*" | tr '\n' ' '; }
for causal in "" "--causal"; do for flags in "" "--softcap 50" "--segments 16" "--softcap 50 --segments 16"; do
  echo "wgmma T=32768 $flags $causal: $(bench --seq 32768 --iters 8 $flags $causal)" | tee -a $out/bench.txt
done; done
for flags in "" "--softcap 50"; do
  echo "mma_sync T=16384 $flags: $(bench --seq 16384 --iters 5 --flash-kernel mma_sync $flags)" | tee -a $out/bench.txt
done
