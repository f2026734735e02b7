#!/bin/bash
# Writes OUT, the experimental copy of the committed wgmma backward kernel that the kernel lab times against it:
# the same kernel in namespace ra::exp_backward, named exp_backward_kernel, with a compile-time knob kKnob to branch on.
#   bash bench/kernel_lab/make_exp_kernel.sh OUT
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
sed -e 's/namespace ra::wgmma_backward/namespace ra::exp_backward/' \
    -e 's/flash_wgmma_backward_kernel(/exp_backward_kernel(/' \
    -e 's/bool kMask = false, bool kDropout = false>$/bool kMask = false, bool kDropout = false, int kKnob = 0>/' \
    "$root/attention/cuda/flash_wgmma_backward_kernel.cuh" > "${1:?output header}"
grep -q "int kKnob = 0>" "$1" || { echo "make_exp_kernel.sh: the kernel's template line moved; update the sed" >&2; exit 1; }
