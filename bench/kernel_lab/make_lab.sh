#!/bin/bash
# Builds the wgmma backward kernel lab (wgmma_backward_lab.cu) into DIR: the committed kernel against an experimental
# copy of it (DIR/exp_kernel.cuh, made from the committed one on the first run: edit it, add compile-time knobs
# through its kKnob parameter), both on synthetic inputs, outside the library's build (one sm_90a program, seconds
# to compile). Then on the device: `DIR/wgmma_backward_lab D H T causal iters knob...` prints each knob's time
# against the committed kernel's, interleaved, and its gradients' largest difference from the committed kernel's.
#   bash bench/kernel_lab/make_lab.sh DIR "KNOB KNOB ..."      (DIR git-ignored, e.g. .lab; carry it along)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
dir=${1:?lab folder}; knobs=${2:-0}
mkdir -p "$dir"
[ -f "$dir/exp_kernel.cuh" ] || bash "$root/bench/kernel_lab/make_exp_kernel.sh" "$dir/exp_kernel.cuh"
list=""
for k in $knobs; do list="$list RA_LAB_KNOB($k)"; done
nvcc -O3 -DNDEBUG -DRA_HAVE_CUDA=1 -DRA_LAB_D128 --generate-code=arch=compute_90a,code=sm_90a -std=c++20 \
  --expt-relaxed-constexpr -I"$root" -I"$root/include" -I"$dir" "-DRA_LAB_KNOBS=$list" -Xptxas -v \
  -o "$dir/wgmma_backward_lab" "$root/bench/kernel_lab/wgmma_backward_lab.cu" "$root/runtime/error.cc" "$root/attention/cuda/tensor_map.cc" 2>&1 | grep -E "error|spill|C75" || true
