#!/bin/bash
# Installs the build into a temporary prefix, builds examples/ against it with find_package(ringattn)
# (and checks the pkg-config file compiles a program too), then runs the CPU example on 2 ranks and
# the CUDA examples where a GPU is present. Usage: install_test.sh BUILD_DIR SOURCE_DIR MPIEXEC
set -eu -o pipefail
build=$1 src=$2 mpiexec=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
test -x "$tmp/prefix/bin/ringattn"
test -f "$tmp/prefix/include/ringattn/ringattn.h"
cmake -S "$src/examples" -B "$tmp/examples" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$tmp/prefix" >/dev/null
cmake --build "$tmp/examples" >/dev/null
"$mpiexec" --oversubscribe -np 2 "$tmp/examples/ring_cpu"
"$mpiexec" --oversubscribe -np 2 "$tmp/examples/train_ring_cpu"
# pkg-config: the same example, compiled and linked from the .pc file alone.
PKG_CONFIG_PATH="$tmp/prefix/lib/pkgconfig" g++ "$src/examples/ring_cpu.cc" -o "$tmp/ring_cpu_pc" \
  $(PKG_CONFIG_PATH="$tmp/prefix/lib/pkgconfig" pkg-config --cflags --libs ringattn)
"$mpiexec" --oversubscribe -np 2 "$tmp/ring_cpu_pc"
for example in ring_cuda train_ring_cuda; do
  [ -x "$tmp/examples/$example" ] || continue
  set +e
  "$mpiexec" --oversubscribe -np 2 "$tmp/examples/$example"
  code=$?
  set -e
  [ $code -eq 0 ] || [ $code -eq 77 ] || exit $code
done
echo "install test OK"
