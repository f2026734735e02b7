#!/bin/bash
# Runs the README's code blocks marked runnable (a `<!-- doctest -->` line right before the fence),
# in order, each in the same fresh directory, with the build's ringattn on the PATH.
# Usage: doc_test.sh README BIN_DIR
set -eu -o pipefail
readme=$(realpath "$1") bin=$(realpath "$2")
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
export PATH="$bin:/usr/bin:$PATH" OMP_NUM_THREADS=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
awk -v dir="$dir" '
  /^<!-- doctest -->$/ { marked = 1; next }
  marked && /^```/ && !inside { inside = 1; n++; file = dir "/block" n ".sh"; next }
  inside && /^```$/ { inside = 0; marked = 0; close(file); next }
  inside { print > file }
' "$readme"
count=$(ls "$dir"/block*.sh 2>/dev/null | wc -l)
[ "$count" -gt 0 ] || { echo "no runnable blocks found in $readme"; exit 1; }
cd "$dir"
for block in $(ls block*.sh | sort -V); do
  echo "--- $block"
  bash -eu -o pipefail "$block"
done
echo "doc test OK ($count blocks)"
