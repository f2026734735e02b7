#!/bin/bash
# Short packed documents on the wgmma kernels (bench/RESULTS.md, "Short packed documents: masked tiles by columns"):
# the kernels on packed documents against the same pairs as a batch of short sequences (no segment ids), a dense
# control row, PyTorch's FlexAttention on the same documents, and Nsight Compute on one forward / backward kernel.
#   bash .device/on-device.sh bash bench/documents_probe.sh PACK [ROUNDS [STAGES]]
# STAGES: a comma list of tests (the GPU tests), rows (wgmma), mma (mma.sync rows), flex, profile, profile_bwd (default
# rows,profile).
set -u
b=${1:-build-pack-new}; rounds=${2:-2}; stages=,${3:-rows,profile},; bin=$b/bin/ringattn; out=${OUT:-/tmp/out}
source bench/device_tests.sh
has() { [[ $stages == *,$1,* ]]; }
has tests && gpu_tests
bench() {
  mpirun -np 1 $bin bench --backend cuda --impl flash_attn2 --dtype bf16 --warmup 3 --iters 20 --heads 16 --head-dim 128 \
    --backward "$@" 2>&1 | grep -v '^#' | grep -o "forward  *[0-9.]*  *[0-9.]*\|backward  *[0-9.]*  *[0-9.]*" | head -2 |
    tr '\n' ' '
}
if has rows; then
  for round in $(seq $rounds); do
    echo "round $round dense 32768: $(bench --batch 1 --seq 32768)" | tee -a $out/log.txt
    for causal in "" "--causal"; do
      for n in 16 64; do
        echo "round $round docs $n $causal: $(bench --batch 1 --seq 32768 --segments $n $causal)" | tee -a $out/log.txt
        echo "round $round batch $n x $((32768 / n)) $causal: $(bench --batch $n --seq $((32768 / n)) $causal)" | tee -a $out/log.txt
      done
    done
  done
fi
if has mma; then  # the mma.sync kernels (every GPU before Hopper) on the same documents
  for round in $(seq $rounds); do
    for causal in "" "--causal"; do
      for n in 16 64; do
        echo "round $round mma_sync docs $n $causal: $(bench --batch 1 --seq 32768 --segments $n --flash-kernel mma_sync \
          $causal)" | tee -a $out/log.txt
      done
    done
  done
fi
if has flex; then  # PyTorch's FlexAttention and FlashAttention-2's variable-length kernel on the same documents
  timeout 300 python3 bench/torch_documents.py 16x128x16 16x128x64 --runs flex,varlen 2>&1 |
    grep -v "Warning\|is_fx_tracing" | tee -a $out/log.txt
fi
profile() {  # Nsight Compute on one launch of a kernel: name, kernel regex, bench's arguments
  local name=$1 kernel=$2 ncu=/usr/local/cuda/bin/ncu; shift 2
  $ncu --kernel-name regex:$kernel --launch-skip 3 --launch-count 1 --set full --import-source no -o /tmp/$name \
    $bin bench --backend cuda --impl flash_attn2 --dtype bf16 --warmup 3 --iters 2 --heads 16 --head-dim 128 \
    "$@" > /dev/null 2>&1
  $ncu --import /tmp/$name.ncu-rep --print-details all > $out/$name.details.txt 2>&1
  $ncu --import /tmp/$name.ncu-rep --page source --csv --print-source sass > $out/$name.sass.csv 2>&1
  grep -E "Duration|Warp Cycles Per Issued|Issue Slots Busy|Executed Instructions  " $out/$name.details.txt | head -6 |
    sed "s/^/$name /" | tee -a $out/log.txt
}
if has profile; then
  profile docs64c flash_wgmma_kernel --causal --batch 1 --seq 32768 --segments 64 --backward
  profile docs16c_bwd flash_wgmma_backward_kernel --causal --batch 1 --seq 32768 --segments 16 --backward
fi
if has profile_bwd; then  # the backward on 16 packed documents against the same pairs as a batch (no segment ids)
  profile docs16_bwd flash_wgmma_backward_kernel --batch 1 --seq 32768 --segments 16 --backward
  profile batch16_bwd flash_wgmma_backward_kernel --batch 16 --seq 2048 --backward
fi
