#!/bin/bash
# Builds the fuzz targets with clang and runs each for a bounded time from a seed corpus (a valid
# input file, valid command lines). Fails on any crash, sanitizer report or leak.
# Usage: tests/fuzz/run.sh RINGATTN [SECONDS]
set -eu -o pipefail
ra=$1 seconds=${2:-30}
src=$(cd "$(dirname "$0")" && pwd)
command -v clang++ >/dev/null || { echo "no clang++: fuzz targets not built"; exit 77; }
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
CC=clang CXX=clang++ cmake -S "$src" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$work/build" >/dev/null
mkdir -p "$work/h5" "$work/cli"
"$ra" generate --output "$work/h5/seed.h5" --seq 16 --heads 2 --head-dim 8 --with-mask --segments 2 >/dev/null
"$ra" generate --output "$work/h5/seed16.h5" --seq 8 --kv-seq 16 --heads 4 --kv-heads 2 --head-dim 8 --dtype bf16 >/dev/null
printf -- '--causal\n--window\n5,0\n--mesh\ndp=2,sp=2\n' > "$work/cli/a"
printf -- '--layout\nzigzag\n--softcap\n30\n--scale\n0.1\n' > "$work/cli/b"
# allocator_may_return_null: HDF5 asks malloc for absurd sizes read from corrupt headers and handles
# the NULL it gets outside ASan; with ASan that must stay a NULL, not an abort.
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:allocator_may_return_null=1 UBSAN_OPTIONS=print_stacktrace=1
export LSAN_OPTIONS=suppressions=$src/lsan.supp:print_suppressions=0
cd "$work"  # crash and leak artifacts land here, not in the caller's tree
"$work/build/cli_fuzz" -seed=1 -max_total_time="$seconds" -max_len=256 "$work/cli" 2>&1 | tail -n 3
"$work/build/hdf5_fuzz" -seed=1 -max_total_time="$seconds" -max_len=65536 -rss_limit_mb=4096 "$work/h5" 2>&1 | tail -n 3
echo "fuzz OK"
