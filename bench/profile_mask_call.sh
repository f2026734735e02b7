#!/bin/bash
# The device time of a masked call's kernels under Nsight Compute (ncu, on the device image): the mask's tile summary
# (mask_tiles_kernel, attention/cuda/mask_tiles.cu) beside the wgmma forward's mask instance, H=32 D=128 T=16384 bf16
# with `bench --mask`'s dense mask (256 MB). ncu fixes the clocks: compare kernels within one run only.
#   bash .device/on-device.sh bash bench/profile_mask_call.sh PACK
set -u
bin=${1:?a pack or build folder}/bin/ringattn
ncu --metrics gpu__time_duration.sum --launch-count 12 $bin bench --backend cuda --impl flash_attn2 --batch 1 --heads 32 \
  --head-dim 128 --dtype bf16 --seq 16384 --warmup 1 --iters 3 --mask 2>&1 | grep -E "mask_tiles_kernel|flash_wgmma_kernel|gpu__time"
