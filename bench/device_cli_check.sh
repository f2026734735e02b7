#!/bin/bash
# CLI round trips on the GPU for files made here (the GPU image has no h5py): run --backward on the device's
# kernels, then verify against the f64 reference, each file with the options it was made for. The files lie in
# PACK/inputs (carried with the pack); each summary line goes to $OUT/log.txt, every verify's lines to $OUT/cli.log.
#   bash .device/on-device.sh bash bench/device_cli_check.sh PACK [tests]    (tests: the GPU tests first)
set -u
b=${1:?pack from bench/pack_for_device.sh}; out=$OUT
source bench/device_tests.sh
[ "${2:-}" = tests ] && gpu_tests
ra=$b/bin/ringattn; work=$(mktemp -d)
# file | options of run and verify | ranks
cases=(
  "gpu_bhsd.h5|--qkv-format bhsd --causal|1"
  "gpu_sbhd.h5|--qkv-format sbhd|2"
  "gpu_sinks.h5|--causal|1"
  "gpu_sinks.h5||2"
)
for c in "${cases[@]}"; do
  IFS='|' read -r file options ranks <<<"$c"
  for impl in flash_attn2 sdpa; do
    if [ "$ranks" = 1 ]; then how=(--impl "$impl"); else how=(--impl ring --local-impl "$impl"); fi
    o=$work/out.h5
    # shellcheck disable=SC2086  # options are words
    mpirun -np "$ranks" "$ra" run --backend cuda "${how[@]}" --input "$b/inputs/$file" --output "$o" --overwrite \
      --backward --quiet $options > "$work/run.log" 2>&1
    rc=$?
    # shellcheck disable=SC2086
    mpirun -np "$ranks" "$ra" verify --input "$b/inputs/$file" --output "$o" $options > "$work/verify.log" 2>&1
    vrc=$?
    { echo "== $file $options ranks=$ranks ${how[*]}: run $rc verify $vrc"; cat "$work/verify.log"; } >> "$out/cli.log"
    echo "$file $options ranks=$ranks ${how[*]}: run $rc, verify $vrc, $(grep -c ' OK$' "$work/verify.log") OK lines" |
      tee -a "$out/log.txt"
  done
done
rm -rf "$work"
